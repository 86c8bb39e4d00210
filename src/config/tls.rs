//! TLS files named in the config, read and checked when the config loads: a missing or bad
//! file is a config problem naming the field, not a panic at start (Pingora's listener
//! panics on a file it cannot read).

use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::Problems;

/// The public listener's certificate chain and key (`tls:` in `tollgate.yaml`).
#[derive(Debug, Clone)]
pub struct ListenerTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// The DER certificates of a PEM file (at least one).
pub(super) fn pem_certificates(path: &Path) -> Result<Vec<Vec<u8>>, String> {
    let certs: Vec<Vec<u8>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read certificates: {e}"))?
        .map(|c| c.map(|c| c.as_ref().to_vec()))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("not a PEM certificate file: {e}"))?;
    if certs.is_empty() {
        return Err("holds no PEM certificate".into());
    }
    Ok(certs)
}

/// The per-peer CA list Pingora's connector verifies a replica against.
pub(super) fn ca_list(der: Vec<Vec<u8>>) -> Result<std::sync::Arc<pingora::protocols::tls::CaType>, String> {
    use pingora::utils::tls::{WrappedX509, parse_x509};
    // `parse_x509` panics on a certificate it cannot parse: a config problem, not a crash.
    std::panic::catch_unwind(|| der.into_iter().map(|c| WrappedX509::new(c, parse_x509)).collect::<Vec<_>>())
        .map(std::sync::Arc::from)
        .map_err(|_| "holds a certificate that does not parse".to_string())
}

/// Check `tls.cert_file` and `tls.key_file` (relative to `tollgate.yaml`'s folder).
pub(super) fn listener(p: &mut Problems, settings_file: &Path, cert: &str, key: &str) -> Option<ListenerTls> {
    let cert_file = super::sibling(settings_file, cert);
    let key_file = super::sibling(settings_file, key);
    let certs =
        pem_certificates(&cert_file).map_err(|e| p.add("tls.cert_file", format!("{}: {e}", cert_file.display())));
    let key = PrivateKeyDer::from_pem_file(&key_file).map_err(|e| {
        p.add("tls.key_file", format!("{}: not a readable PEM private key: {e}", key_file.display()));
    });
    let (Ok(certs), Ok(key)) = (certs, key) else { return None };
    // The pair as Pingora's listener will build it: a key that is not the certificate's
    // would panic there at start (a renewal deployed with the wrong key).
    pingora::tls::install_default_crypto_provider();
    let chain = certs.into_iter().map(CertificateDer::from).collect();
    if let Err(e) = pingora::tls::ServerConfig::builder().with_no_client_auth().with_single_cert(chain, key) {
        let problem = format!("{}: does not go with the certificate in tls.cert_file ({e})", key_file.display());
        p.add("tls.key_file", problem);
        return None;
    }
    Some(ListenerTls { cert_file, key_file })
}

/// `tls:` of a store link (`identity.store`, `limits.store`): files relative to
/// `tollgate.yaml`'s folder.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStoreTls {
    /// CA certificates (PEM) the server must be signed by; default the system's roots.
    ca_file: Option<String>,
    /// A client certificate (PEM chain) and its key, for a service that asks for one.
    cert_file: Option<String>,
    key_file: Option<String>,
}

/// Read and check a store link's TLS files; problems name `{field}.ca_file` and so on.
pub(super) fn store_tls(
    p: &mut Problems,
    settings_file: &Path,
    field: &str,
    raw: &RawStoreTls,
) -> Option<crate::store::tls::StoreTls> {
    let mut read = |name: &str, file: &Option<String>| -> Option<Vec<u8>> {
        let path = super::sibling(settings_file, file.as_deref()?);
        std::fs::read(&path).map_err(|e| p.add(format!("{field}.{name}"), format!("{}: {e}", path.display()))).ok()
    };
    let ca_pem = read("ca_file", &raw.ca_file);
    let cert = read("cert_file", &raw.cert_file);
    let key = read("key_file", &raw.key_file);
    if raw.ca_file.is_some() && ca_pem.is_none() {
        return None;
    }
    let client_pem = match (cert, key, raw.cert_file.is_some(), raw.key_file.is_some()) {
        (Some(c), Some(k), _, _) => Some((c, k)),
        (None, None, false, false) => None,
        (_, _, true, false) | (_, _, false, true) => {
            p.add(field, "give both `cert_file` and `key_file`, or neither");
            return None;
        }
        _ => return None, // a file that could not be read: said above
    };
    let tls = crate::store::tls::StoreTls { ca_pem, client_pem };
    match tls.client_config() {
        Ok(_) => Some(tls),
        Err(e) => {
            let at = if e.starts_with("client") { "cert_file" } else { "ca_file" };
            p.add(format!("{field}.{at}"), e);
            None
        }
    }
}
