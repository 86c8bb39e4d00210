//! Active replica health checks (decision 123): every pool with `health_check` in
//! `upstreams.yaml` has each replica asked `GET <path>` every interval (as vLLM and SGLang
//! serve `/health`). After `unhealthy_after` failed checks in a row the replica gets no new
//! request; after `healthy_after` passed checks in a row it takes requests again. A check
//! passes on a 2xx answer within the timeout. The checker reads the config in force at each
//! tick, so a reload's new replicas are checked from then on and removed ones are dropped.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pingora::connectors::http::Connector;
use pingora::http::RequestHeader;

use crate::config::{HealthCheck, LiveConfig, Pool, Replica};

/// How often the checker looks for checks that are due.
const TICK: Duration = Duration::from_millis(100);

/// Start the checker on its own thread (it never touches the request path).
pub fn spawn(live: Arc<LiveConfig>) {
    crate::runtime::background::spawn("health-check", run(live));
}

async fn run(live: Arc<LiveConfig>) {
    let connector = Arc::new(Connector::new(None));
    // When each replica (model and address) is next due; absent: due now.
    let mut due: HashMap<(String, String), Instant> = HashMap::new();
    let mut ticker = tokio::time::interval(TICK);
    loop {
        ticker.tick().await;
        let config = live.current();
        let now = Instant::now();
        // Rebuilt each tick from the pools in force: a replica a reload removed drops out.
        let mut next = HashMap::with_capacity(due.len());
        for (model, pool) in config.pools.iter() {
            let Some(check) = &pool.health_check else { continue };
            for replica in &pool.replicas {
                let key = (model.clone(), replica.authority.clone());
                let at = match due.remove(&key) {
                    Some(at) if at > now => at,
                    _ => {
                        tokio::spawn(probe_and_record(connector.clone(), pool.clone(), replica.clone(), check.clone()));
                        now + check.interval
                    }
                };
                next.insert(key, at);
            }
        }
        due = next;
    }
}

async fn probe_and_record(connector: Arc<Connector>, pool: Arc<Pool>, replica: Arc<Replica>, check: HealthCheck) {
    let outcome = match tokio::time::timeout(check.timeout, probe(&connector, &pool, &replica, &check.path)).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {} ms", check.timeout.as_millis())),
    };
    record(&pool.model_id, &replica, &check, outcome);
}

/// Fold one check's outcome into the replica's health.
pub fn record(model: &str, replica: &Replica, check: &HealthCheck, outcome: Result<(), String>) {
    let h = &replica.state.checks;
    let passed = outcome.is_ok();
    let was_down = h.down.load(Ordering::Relaxed);
    // The streak counts checks whose outcome disagrees with the current state.
    let streak = if passed == was_down {
        h.streak.fetch_add(1, Ordering::Relaxed) + 1
    } else {
        h.streak.store(0, Ordering::Relaxed);
        0
    };
    h.last_check_ms.store(crate::runtime::clock::now_ms(), Ordering::Relaxed);
    if let Err(e) = &outcome {
        *h.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
    }
    if was_down && passed && streak >= check.healthy_after {
        h.down.store(false, Ordering::Relaxed);
        h.streak.store(0, Ordering::Relaxed);
        log::info!("replica {} of {model} passed {streak} health checks: back in service", replica.authority);
    } else if !was_down && !passed && streak >= check.unhealthy_after {
        h.down.store(true, Ordering::Relaxed);
        h.streak.store(0, Ordering::Relaxed);
        let why = outcome.err().unwrap_or_default();
        log::warn!("replica {} of {model} failed {streak} health checks ({why}): out of service", replica.authority);
    }
}

async fn probe(connector: &Connector, pool: &Pool, replica: &Replica, path: &str) -> Result<(), String> {
    let mut peer = pool.peer(replica);
    peer.options.connection_timeout = Some(pool.connect_timeout);
    let (mut session, _reused) = connector.get_http_session(&peer).await.map_err(|e| format!("connect: {e}"))?;
    let mut req = RequestHeader::build("GET", path.as_bytes(), None).map_err(|e| e.to_string())?;
    req.insert_header("host", replica.authority.as_str()).map_err(|e| e.to_string())?;
    req.insert_header("user-agent", "tollgate-health-check").map_err(|e| e.to_string())?;
    if let Some(auth) = &pool.authorization {
        req.insert_header("authorization", auth.as_str()).map_err(|e| e.to_string())?;
    }
    session.write_request_header(Box::new(req)).await.map_err(|e| format!("send: {e}"))?;
    session.finish_request_body().await.map_err(|e| format!("send: {e}"))?;
    session.read_response_header().await.map_err(|e| format!("answer: {e}"))?;
    let status = session.response_header().map_or(0, |h| h.status.as_u16());
    // Read the (small) body so the connection can be reused for the next check.
    while let Ok(Some(_)) = session.read_response_body().await {}
    connector.release_http_session(session, &peer, Some(Duration::from_secs(60))).await;
    if (200..300).contains(&status) { Ok(()) } else { Err(format!("status {status}")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check() -> HealthCheck {
        HealthCheck {
            path: "/health".into(),
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(100),
            unhealthy_after: 3,
            healthy_after: 2,
        }
    }

    fn replica() -> Replica {
        Replica {
            addr: ([127, 0, 0, 1], 1).into(),
            authority: "127.0.0.1:1".into(),
            max_concurrency: 1,
            state: Default::default(),
        }
    }

    #[test]
    fn a_replica_goes_down_after_the_failure_threshold_and_returns_after_the_pass_threshold() {
        let (r, c) = (replica(), check());
        let fail = || Err("status 503".to_string());
        record("m", &r, &c, fail());
        record("m", &r, &c, Ok(()));
        record("m", &r, &c, fail());
        record("m", &r, &c, fail());
        assert!(r.up(0), "two failures in a row (a pass between) keep it in service");
        record("m", &r, &c, fail());
        assert!(!r.up(0), "the third failure in a row takes it out");
        record("m", &r, &c, Ok(()));
        record("m", &r, &c, fail());
        record("m", &r, &c, Ok(()));
        assert!(!r.up(0), "passes must be consecutive");
        record("m", &r, &c, Ok(()));
        assert!(r.up(0), "two passes in a row bring it back");
        assert_eq!(r.state.checks.last_error.lock().unwrap().as_deref(), Some("status 503"));
    }
}
