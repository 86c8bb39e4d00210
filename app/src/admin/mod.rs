//! The admin API (`../shared/spec/admin-api.md`) on its own listener: workspaces, keys,
//! model pause/resume, config reload, health and metrics. Every call needs `Authorization: Bearer <admin
//! token>`; with no token configured every call is refused with 401, so the listener never
//! runs open. JSON in and out; errors are `{"error": {"code", "message"}}`, and key
//! operation errors also carry a top-level `code`.

mod credits;
mod fields;
mod handlers;
pub mod model_states;
mod plans;
mod pools;

pub use pools::reload_answer;

use std::sync::Arc;

use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;

use tollgate::config::LiveConfig;
use tollgate::identity::service::Identity;

/// Largest admin request body.
const MAX_BODY: usize = 64 * 1024;

/// An admin error: status, code, message, and whether `code` is repeated at top level.
#[derive(Debug)]
pub struct AdminError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
    pub top_level_code: bool,
    pub retry_after: Option<u64>,
    /// The methods of the path, for a `405`.
    pub allow: Option<&'static str>,
}

impl AdminError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        AdminError { status, code, message: message.into(), top_level_code: false, retry_after: None, allow: None }
    }

    pub fn with_allow(mut self, methods: &'static str) -> Self {
        self.allow = Some(methods);
        self
    }

    /// 400 naming the field at fault.
    pub fn bad(field: &str, problem: &str) -> Self {
        Self::new(400, "invalid_field", format!("`{field}`: {problem}"))
    }

    /// 503 with a retry hint: the store could not answer.
    pub fn store(e: tollgate::store::StoreError) -> Self {
        let mut err = Self::new(503, "store_unavailable", e.to_string());
        err.retry_after = Some(2);
        err
    }

    pub fn not_found(what: &str) -> Self {
        Self::new(404, "not_found", format!("no such {what}"))
    }

    pub fn key_op(mut self) -> Self {
        self.top_level_code = true;
        self
    }
}

/// What the admin app serves from.
pub struct AdminApp {
    /// The catalog and pools in force (pause, reload, health).
    pub live: Arc<LiveConfig>,
    pub identity: Option<Arc<Identity>>,
    pub ledger: Option<Arc<dyn tollgate::store::ledger::LedgerStore>>,
    /// The shared Redis of the limiter, idempotency records and placements, when configured.
    pub redis: Option<Arc<tollgate::state::redis_conn::LazyRedis>>,
    /// Model pauses shared through the identity store; `None` without one (this node only).
    pub model_states: Option<Arc<model_states::ModelStates>>,
    /// `None`: no token configured, every call is refused.
    pub token: Option<String>,
}

pub(crate) fn json_response(status: u16, body: &Value) -> Response<Vec<u8>> {
    let bytes = body.to_string().into_bytes();
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("content-length", bytes.len())
        .body(bytes)
        .unwrap_or_default()
}

fn error_response(e: &AdminError) -> Response<Vec<u8>> {
    let mut body = json!({ "error": { "code": e.code, "message": e.message } });
    if e.top_level_code {
        body["code"] = json!(e.code);
    }
    let mut resp = json_response(e.status, &body);
    if let Some(allow) = e.allow {
        resp.headers_mut().insert(http::header::ALLOW, http::HeaderValue::from_static(allow));
    }
    if let Some(s) = e.retry_after {
        if let Ok(v) = http::HeaderValue::from_str(&s.to_string()) {
            resp.headers_mut().insert("retry-after", v);
        }
    }
    resp
}

impl AdminApp {
    fn authorized(&self, session: &ServerSession) -> bool {
        let Some(token) = &self.token else {
            return false;
        };
        let presented = session
            .req_header()
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            // The scheme is case-insensitive (RFC 9110 11.1), as on the public listener.
            .and_then(|(scheme, rest)| scheme.eq_ignore_ascii_case("bearer").then_some(rest))
            .unwrap_or("")
            .trim();
        // Constant-time: the answer time does not depend on how much of the token matches.
        presented.len() == token.len() && bool::from(presented.as_bytes().ct_eq(token.as_bytes()))
    }

    async fn read_body(session: &mut ServerSession) -> Result<Value, AdminError> {
        let mut buf = Vec::new();
        loop {
            match session.read_request_body().await {
                Ok(Some(chunk)) => {
                    if buf.len() + chunk.len() > MAX_BODY {
                        return Err(AdminError::new(413, "payload_too_large", "admin bodies are at most 64 KiB"));
                    }
                    buf.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(_) => {
                    return Err(AdminError::new(400, "invalid_body", "the body could not be read"));
                }
            }
        }
        if buf.iter().all(u8::is_ascii_whitespace) {
            return Ok(json!({}));
        }
        serde_json::from_slice(&buf)
            .map_err(|e| AdminError::new(400, "invalid_json", format!("the body is not valid JSON: {e}")))
    }
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        // A graceful stop waits for an admin call as for a request (a top-up cut after its
        // commit would be retried and credited twice; decision 166).
        let _in_flight = tollgate::runtime::drain::request();
        if !self.authorized(session) {
            // One answer whether or not a token is configured: the caller learns nothing of the
            // setup (the operator sees the missing token in the log and in `check-config`).
            return error_response(&AdminError::new(401, "unauthorized", "missing or wrong admin token"));
        }
        let method = session.req_header().method.as_str().to_string();
        let path = session.req_header().uri.path().to_string();
        let body = if matches!(method.as_str(), "POST" | "PATCH" | "PUT" | "DELETE") {
            match Self::read_body(session).await {
                Ok(b) => b,
                Err(e) => return error_response(&e),
            }
        } else {
            Value::Null
        };
        let resp = match handlers::route(self, &method, &path, &body).await {
            Ok(resp) => resp,
            Err(e) => error_response(&e),
        };
        // An audit line per change (never a body: it may hold a key); reads stay quiet.
        if method != "GET" {
            log::info!("admin: {method} {path} -> {}", resp.status().as_u16());
        }
        resp
    }
}
