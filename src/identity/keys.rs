//! Key material: the `rp_` + 40 `[a-z0-9]` format drawn from the OS CSPRNG, the versioned
//! keyed digest the stores index (`v1:` + hex HMAC-SHA256 under a pepper held outside the
//! data store), and the AES-256-GCM encrypted copy that makes a key copyable. The plaintext
//! is never stored and never logged: `Debug` of the secrets prints nothing secret.

use aes_gcm::aead::{Aead, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// The key format minted now. Keys of a lower version still authenticate, flagged.
pub const CURRENT_FORMAT: i32 = 1;
pub const KEY_PREFIX: &str = "rp_";
pub const KEY_BODY_LEN: usize = 40;
const ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";
const NONCE_LEN: usize = 12;

/// Why key material could not be made or read.
#[derive(Debug, PartialEq, Eq)]
pub enum KeyMaterialError {
    Random,
    Crypto,
    BadSecret(String),
}

impl std::fmt::Display for KeyMaterialError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyMaterialError::Random => write!(f, "the OS random generator failed"),
            KeyMaterialError::Crypto => write!(f, "encryption or decryption failed"),
            KeyMaterialError::BadSecret(m) => write!(f, "{m}"),
        }
    }
}

/// A new key: `rp_` + 40 characters of `a-z0-9`, uniformly drawn (rejection sampling, so
/// no character is more likely than another).
pub fn generate() -> Result<String, KeyMaterialError> {
    let mut out = String::with_capacity(KEY_PREFIX.len() + KEY_BODY_LEN);
    out.push_str(KEY_PREFIX);
    let mut buf = [0u8; 64];
    while out.len() < KEY_PREFIX.len() + KEY_BODY_LEN {
        getrandom::fill(&mut buf).map_err(|_| KeyMaterialError::Random)?;
        for &b in &buf {
            // 252 = 7 * 36: bytes at or above it would bias the first characters.
            if b < 252 && out.len() < KEY_PREFIX.len() + KEY_BODY_LEN {
                out.push(ALPHABET[usize::from(b % 36)] as char);
            }
        }
    }
    Ok(out)
}

/// `rp_` followed by exactly 40 of `a-z0-9`.
pub fn well_formed(key: &str) -> bool {
    key.strip_prefix(KEY_PREFIX).is_some_and(|body| {
        body.len() == KEY_BODY_LEN && body.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    })
}

/// The secrets key material depends on, loaded from outside the data store.
pub struct KeySecrets {
    /// HMAC-SHA256 keyed with the pepper once: each digest clones it instead of hashing the
    /// pepper's inner and outer pads again (two of a digest's four SHA-256 blocks).
    keyed: Hmac<Sha256>,
    cipher: Aes256Gcm,
}

impl std::fmt::Debug for KeySecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeySecrets(<redacted>)")
    }
}

impl KeySecrets {
    /// `pepper`: at least 32 bytes; `encryption_key_hex`: 64 hex characters (32 bytes).
    pub fn new(pepper: &[u8], encryption_key_hex: &str) -> Result<KeySecrets, KeyMaterialError> {
        if pepper.len() < 32 {
            return Err(KeyMaterialError::BadSecret("the key pepper must be at least 32 bytes".into()));
        }
        let key = hex::decode(encryption_key_hex.trim())
            .ok()
            .filter(|k| k.len() == 32)
            .ok_or_else(|| KeyMaterialError::BadSecret("the key encryption key must be 64 hex characters".into()))?;
        let cipher = Aes256Gcm::new_from_slice(&key).map_err(|_| KeyMaterialError::Crypto)?;
        let keyed = <Hmac<Sha256> as Mac>::new_from_slice(pepper).map_err(|_| KeyMaterialError::Crypto)?;
        Ok(KeySecrets { keyed, cipher })
    }

    /// The stored, indexed form of a key: `v1:` + hex HMAC-SHA256(pepper, key).
    pub fn digest(&self, key: &str) -> String {
        self.digest_version(key, CURRENT_FORMAT)
    }

    fn digest_version(&self, key: &str, version: i32) -> String {
        let mut mac = self.keyed.clone();
        mac.update(key.as_bytes());
        // `v{version}:{hex}`, without the formatting machinery (every request's key lookup).
        let mut digits = [0u8; 64];
        let mut out = String::with_capacity(4 + digits.len());
        out.push('v');
        out.push_str(itoa::Buffer::new().format(version));
        out.push(':');
        if hex::encode_to_slice(mac.finalize().into_bytes(), &mut digits).is_ok() {
            out.push_str(std::str::from_utf8(&digits).unwrap_or_default());
        }
        out
    }

    /// Encrypted copy: random 96-bit nonce || ciphertext (with tag).
    pub fn encrypt(&self, key: &str) -> Result<Vec<u8>, KeyMaterialError> {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|_| KeyMaterialError::Random)?;
        let ct =
            self.cipher.encrypt(Nonce::from_slice(&nonce), key.as_bytes()).map_err(|_| KeyMaterialError::Crypto)?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&ct);
        Ok(out)
    }

    pub fn decrypt(&self, blob: &[u8]) -> Result<String, KeyMaterialError> {
        if blob.len() <= NONCE_LEN {
            return Err(KeyMaterialError::Crypto);
        }
        let (nonce, ct) = blob.split_at(NONCE_LEN);
        let pt = self.cipher.decrypt(Nonce::from_slice(nonce), ct).map_err(|_| KeyMaterialError::Crypto)?;
        String::from_utf8(pt).map_err(|_| KeyMaterialError::Crypto)
    }
}

/// Compare two digests in constant time: the time taken does not depend on how many
/// leading bytes match (`subtle::ConstantTimeEq`), so a caller cannot learn a digest byte
/// by byte from response timing.
pub fn digests_equal(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets() -> KeySecrets {
        KeySecrets::new(&[7u8; 32], &"ab".repeat(32)).unwrap()
    }

    #[test]
    fn generated_keys_have_the_spec_format_and_differ() {
        let a = generate().unwrap();
        let b = generate().unwrap();
        assert!(well_formed(&a), "{a}");
        assert_eq!(a.len(), 43);
        assert_ne!(a, b);
    }

    #[test]
    fn format_check_is_exact() {
        assert!(well_formed(&format!("rp_{}", "a1".repeat(20))));
        assert!(!well_formed(&format!("rp_{}", "a".repeat(39))));
        assert!(!well_formed(&format!("rp_{}", "a".repeat(41))));
        assert!(!well_formed(&format!("rp_{}", "A".repeat(40))));
        assert!(!well_formed(&format!("sk_{}", "a".repeat(40))));
    }

    #[test]
    fn digest_is_versioned_keyed_and_stable() {
        let s = secrets();
        let d = s.digest("rp_x");
        assert!(d.starts_with("v1:"));
        assert_eq!(d.len(), 3 + 64);
        // HMAC-SHA256(pepper = 32 bytes of 7, "rp_x"), computed outside Rust (Python's hmac):
        // the keyed state reused across digests gives the digests stored keys already have.
        assert_eq!(d, "v1:dd296465dc838057d36d4e7c22ec245ebe8bcb72f0c1a71c1fde1f0d302074ac");
        assert_eq!(d, s.digest("rp_x"));
        assert_ne!(d, s.digest("rp_y"));
        let other = KeySecrets::new(&[8u8; 32], &"ab".repeat(32)).unwrap();
        assert_ne!(d, other.digest("rp_x"), "the pepper keys the digest");
        assert!(!d.contains("rp_x"));
    }

    #[test]
    fn encrypted_copy_round_trips_and_hides_the_key() {
        let s = secrets();
        let key = generate().unwrap();
        let blob = s.encrypt(&key).unwrap();
        assert!(!blob.windows(10).any(|w| key.as_bytes().windows(10).any(|k| k == w)));
        assert_eq!(s.decrypt(&blob).unwrap(), key);
        let mut tampered = blob.clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        assert_eq!(s.decrypt(&tampered), Err(KeyMaterialError::Crypto));
    }

    #[test]
    fn weak_secrets_are_refused() {
        assert!(KeySecrets::new(&[1u8; 16], &"ab".repeat(32)).is_err());
        assert!(KeySecrets::new(&[1u8; 32], "abcd").is_err());
    }

    #[test]
    fn digest_comparison() {
        assert!(digests_equal("v1:abc", "v1:abc"));
        assert!(!digests_equal("v1:abc", "v1:abd"));
        assert!(!digests_equal("v1:abc", "v1:ab"));
    }
}
