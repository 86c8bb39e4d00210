//! The opaque `signature` of a `thinking` block.
//!
//! Clients must send prior thinking blocks back unchanged with their signature, so the
//! signature has to be something the gateway can recognise as its own: HMAC-SHA256 over the
//! thinking text under a server key, hex encoded. Today prior thinking is dropped whatever
//! its signature (spec "Content blocks"), so verification is offered, not enforced.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

type HmacSha256 = Hmac<Sha256>;

fn mac(key: &[u8], text: &str) -> Option<[u8; 32]> {
    // HMAC takes keys of any length, so this never fails; `None` keeps the signature empty
    // rather than panicking should that ever change.
    let mut m = HmacSha256::new_from_slice(key).ok()?;
    m.update(text.as_bytes());
    Some(m.finalize().into_bytes().into())
}

/// The signature of `text` under `key` (64 lowercase hex characters).
pub fn sign_thinking(key: &[u8], text: &str) -> String {
    mac(key, text).map(hex::encode).unwrap_or_default()
}

/// Whether `signature` is this gateway's signature of `text` under `key`, compared in
/// constant time.
pub fn verify_thinking(key: &[u8], text: &str, signature: &str) -> bool {
    let (Some(expected), Ok(given)) = (mac(key, text), hex::decode(signature)) else {
        return false;
    };
    given.len() == expected.len() && bool::from(given.ct_eq(&expected))
}
