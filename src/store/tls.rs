//! TLS to the stores (issue 52): managed PostgreSQL and Redis services require it. The server
//! is verified against a configured CA (or the system's roots), and a client certificate is
//! presented where the service asks for one. Files are read when the config loads.

use std::sync::Arc;

use pingora::tls::{CertificateDer, ClientConfig, PrivateKeyDer, RootCertStore};
use rustls_pki_types::pem::PemObject;

/// The TLS settings of one store link, as PEM bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreTls {
    /// CA certificates the server's chain must lead to; `None`: the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// A client certificate chain and its key, for services that ask for one.
    pub client_pem: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for StoreTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tls (ca: {}, client certificate: {})", self.ca_pem.is_some(), self.client_pem.is_some())
    }
}

impl StoreTls {
    /// The client configuration these settings make (also their check when the config loads).
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, String> {
        pingora::tls::install_default_crypto_provider();
        let mut roots = RootCertStore::empty();
        match &self.ca_pem {
            Some(pem) => {
                for cert in CertificateDer::pem_slice_iter(pem) {
                    let cert = cert.map_err(|e| format!("not a PEM certificate file: {e}"))?;
                    roots.add(cert).map_err(|e| format!("a CA certificate is not usable: {e}"))?;
                }
                if roots.is_empty() {
                    return Err("holds no PEM certificate".into());
                }
            }
            None => {
                let native = pingora::tls::load_native_certs().map_err(|e| format!("the system's roots: {e}"))?;
                for cert in native {
                    let _ = roots.add(cert);
                }
            }
        }
        let builder = ClientConfig::builder().with_root_certificates(roots);
        let config = match &self.client_pem {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("client certificate: {e}"))?;
                let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("client key: {e}"))?;
                builder.with_client_auth_cert(chain, key).map_err(|e| format!("client certificate and key: {e}"))?
            }
        };
        Ok(Arc::new(config))
    }
}
