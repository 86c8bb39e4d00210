//! The Redis connection every shared store uses (limiter, idempotency records, session
//! placements): parsed at start, connected on first use, one multiplexed connection that the
//! gateway shares between the three (decision 150). No retries inside the manager: a failed attempt surfaces at once (each store bounds
//! its calls by its own timeout and says what a failure means for a request), and the next
//! call tries again.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::OnceCell;

pub struct LazyRedis {
    client: redis::Client,
    conn: OnceCell<ConnectionManager>,
    timeout: Duration,
}

impl LazyRedis {
    /// Parses the URL; does not connect.
    pub fn open(url: &str, timeout: Duration) -> Result<Self, String> {
        Self::open_tls(url, timeout, None)
    }

    /// Parses the URL; does not connect. A `rediss://` URL verifies the server against
    /// `tls`'s CA (the system's roots without one) and presents its client certificate.
    pub fn open_tls(url: &str, timeout: Duration, tls: Option<&crate::store::tls::StoreTls>) -> Result<Self, String> {
        let client = match tls {
            Some(tls) => {
                pingora::tls::install_default_crypto_provider();
                let certs = redis::TlsCertificates {
                    client_tls: tls
                        .client_pem
                        .clone()
                        .map(|(client_cert, client_key)| redis::ClientTlsConfig { client_cert, client_key }),
                    root_cert: tls.ca_pem.clone(),
                };
                redis::Client::build_with_tls(url, certs)
            }
            None => redis::Client::open(url),
        }
        .map_err(|e| format!("redis url: {e}"))?;
        Ok(LazyRedis { client, conn: OnceCell::new(), timeout })
    }

    /// The connection if one was made already (never connects).
    pub fn connected(&self) -> Option<ConnectionManager> {
        self.conn.get().cloned()
    }

    /// The connection, connecting the first time (within the timeout).
    pub async fn get(&self) -> Result<ConnectionManager, String> {
        let conn = self
            .conn
            .get_or_try_init(|| async {
                let cfg = ConnectionManagerConfig::new()
                    .set_connection_timeout(self.timeout)
                    .set_response_timeout(self.timeout)
                    .set_number_of_retries(0);
                ConnectionManager::new_with_config(self.client.clone(), cfg).await
            })
            .await
            .map_err(|e| e.to_string())?;
        Ok(conn.clone())
    }

    /// A `PING` round trip within the timeout (readiness, `GET /admin/v1/health`).
    pub async fn ping(&self) -> Result<(), String> {
        let round_trip = async {
            let mut conn = self.get().await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await.map(drop).map_err(|e| e.to_string())
        };
        tokio::time::timeout(self.timeout, round_trip).await.map_err(|_| "no answer within the timeout".to_string())?
    }
}
