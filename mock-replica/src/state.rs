//! Shared state the tests inspect: request counters and the last request.
//!
//! Integration tests check what the gateway actually forwarded (headers,
//! rewritten body) and how many requests reached the replica, so every `/v1`
//! request is counted and the latest one kept. The last request is stored raw
//! and only turned into JSON when someone asks, to keep the hot path cheap.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, Method};

/// State shared by all connections.
pub struct State {
    /// Echoed as the response `model` when set (`--model-name`).
    pub model_name: Option<String>,
    requests: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    last: Mutex<Option<Recorded>>,
    /// Status `GET /health` answers (set by `POST /mock/health?status=N`).
    pub health_status: std::sync::atomic::AtomicU16,
    /// `GET /health` calls so far.
    pub health_checks: AtomicU64,
    /// OTLP exports taken by the traces sink, and their bytes.
    pub otlp_exports: AtomicU64,
    pub otlp_bytes: AtomicU64,
}

/// One `/v1` request as received.
struct Recorded {
    method: Method,
    path: String,
    headers: HeaderMap,
    body: Bytes,
}

/// Marks one `/v1` request as running; dropping it (response fully sent,
/// or the client went away) ends it.
pub struct InFlight(Arc<State>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl State {
    pub fn new(model_name: Option<String>) -> Self {
        Self {
            model_name,
            requests: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            max_in_flight: AtomicU64::new(0),
            last: Mutex::new(None),
            health_status: std::sync::atomic::AtomicU16::new(200),
            health_checks: AtomicU64::new(0),
            otlp_exports: AtomicU64::new(0),
            otlp_bytes: AtomicU64::new(0),
        }
    }

    /// Counts a `/v1` request that starts now.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.max_in_flight.fetch_max(now, Ordering::Relaxed);
        InFlight(Arc::clone(self))
    }

    /// Keeps this request as the one `/mock/last-request` reports.
    pub fn record(&self, method: &Method, path: &str, headers: &HeaderMap, body: &Bytes) {
        let recorded =
            Recorded { method: method.clone(), path: path.to_owned(), headers: headers.clone(), body: body.clone() };
        // A poisoned lock only means another request panicked mid-store; the
        // slot is overwritten whole, so its content is still usable.
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(recorded);
    }

    /// `/mock/last-request` body, `null` before the first `/v1` request.
    pub fn last_request_json(&self) -> Bytes {
        let guard = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let Some(last) = guard.as_ref() else {
            return Bytes::from_static(b"null");
        };
        let mut headers = serde_json::Map::new();
        for name in last.headers.keys() {
            // Repeated headers are joined the way HTTP allows folding them.
            let joined = last
                .headers
                .get_all(name)
                .iter()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .collect::<Vec<_>>()
                .join(", ");
            headers.insert(name.as_str().to_owned(), joined.into());
        }
        let body = serde_json::from_slice::<serde_json::Value>(&last.body)
            .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&last.body).into_owned()));
        let json = serde_json::json!({
            "method": last.method.as_str(),
            "path": last.path,
            "headers": headers,
            "body": body,
            // The text as it arrived, for tests of what the gateway copies as sent.
            "raw_body": String::from_utf8_lossy(&last.body),
        });
        Bytes::from(json.to_string())
    }

    /// `/mock/stats` body.
    pub fn stats_json(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(96);
        out.put_slice(b"{\"requests\":");
        crate::json::push_u64(&mut out, self.requests.load(Ordering::Relaxed));
        out.put_slice(b",\"in_flight\":");
        crate::json::push_u64(&mut out, self.in_flight.load(Ordering::Relaxed));
        out.put_slice(b",\"max_in_flight\":");
        crate::json::push_u64(&mut out, self.max_in_flight.load(Ordering::Relaxed));
        out.put_slice(b",\"health_checks\":");
        crate::json::push_u64(&mut out, self.health_checks.load(Ordering::Relaxed));
        out.put_slice(b",\"otlp_exports\":");
        crate::json::push_u64(&mut out, self.otlp_exports.load(Ordering::Relaxed));
        out.put_slice(b",\"otlp_bytes\":");
        crate::json::push_u64(&mut out, self.otlp_bytes.load(Ordering::Relaxed));
        out.put_u8(b'}');
        out.freeze()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn in_flight_tracks_guards() {
        let state = Arc::new(State::new(None));
        let a = state.begin();
        let b = state.begin();
        drop(a);
        let _c = state.begin();
        drop(b);
        let v: serde_json::Value = serde_json::from_slice(&state.stats_json()).unwrap();
        assert_eq!(v["requests"], 3);
        assert_eq!(v["in_flight"], 1);
        assert_eq!(v["max_in_flight"], 2);
    }

    #[test]
    fn last_request_body_falls_back_to_string() {
        let state = State::new(None);
        assert_eq!(&state.last_request_json()[..], b"null");
        let mut headers = HeaderMap::new();
        headers.insert("x-a", "1".parse().unwrap());
        headers.append("x-a", "2".parse().unwrap());
        state.record(&Method::POST, "/v1/x", &headers, &Bytes::from_static(b"hi {"));
        let v: serde_json::Value = serde_json::from_slice(&state.last_request_json()).unwrap();
        assert_eq!(v["method"], "POST");
        assert_eq!(v["path"], "/v1/x");
        assert_eq!(v["headers"]["x-a"], "1, 2");
        assert_eq!(v["body"], "hi {");
        assert_eq!(v["raw_body"], "hi {");
    }
}
