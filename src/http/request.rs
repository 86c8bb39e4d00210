//! The request side handled by the core: route and trace header, the body (size limit,
//! `Expect: 100-continue`, JSON), the model (catalog, pause, capability) and placement.

use bytes::{Bytes, BytesMut};
use jiff::Timestamp;
use pingora::proxy::Session;
use serde_json::Value;

use crate::http::error::{ErrorKind, GatewayError};
use crate::http::routes::{self, Route, RouteMatch};
use crate::http::text::{printable_ascii, truncate};
use crate::proxy::ctx::RequestCtx;
use crate::proxy::placement::{self, NoSlot};

/// Match the route; unknown paths and wrong methods are errors in the right envelope.
pub fn route(s: &Session, cx: &mut RequestCtx) -> Result<Route, GatewayError> {
    let req = s.req_header();
    match routes::classify(req.method.as_str(), req.uri.path()) {
        RouteMatch::Found(r) => {
            cx.route = Some(r);
            cx.envelope = r.envelope();
            Ok(r)
        }
        RouteMatch::WrongMethod(r, allow) => {
            cx.envelope = r.envelope();
            Err(GatewayError::new(
                ErrorKind::MethodNotAllowed,
                format!("Method {} is not allowed on this endpoint; use {allow}.", req.method),
            )
            .with_header("allow", allow))
        }
        RouteMatch::Unknown => {
            cx.envelope = crate::http::envelope::Envelope::Chat;
            let base = base_url(s, cx);
            Err(GatewayError::new(
                ErrorKind::UnknownEndpoint,
                format!(
                    "`{}` is not an endpoint. Chat-dialect clients use `{base}/v1` as their base URL; \
                     messages-dialect clients use `{base}`.",
                    req.uri.path()
                ),
            )
            .with_field("base_url", format!("{base}/v1")))
        }
    }
}

/// `{base_url}`: from config, else from the request's `Host`.
fn base_url(s: &Session, cx: &RequestCtx) -> String {
    if let Some(b) = &cx.config.gateway.public_base_url {
        return b.clone();
    }
    let host = s
        .req_header()
        .headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty() && h.len() <= 255 && h.bytes().all(|b| b.is_ascii_graphic()))
        .unwrap_or("localhost");
    format!("http://{host}")
}

/// `vendor-version` / `anthropic-version`: echoed under the name it came with on every answer
/// (clarification 10), refusals before any plugin ran included.
pub fn echo_version(s: &Session, cx: &mut RequestCtx) {
    const VERSION_HEADERS: [(&str, http::HeaderName); 2] = [
        ("vendor-version", http::HeaderName::from_static("vendor-version")),
        ("anthropic-version", http::HeaderName::from_static("anthropic-version")),
    ];
    for (name, header) in VERSION_HEADERS {
        if let Some(v) = s.req_header().headers.get(header).and_then(|v| v.to_str().ok()) {
            if printable_ascii(v.as_bytes(), 128) {
                cx.response_headers.push((name, v.to_string()));
            }
        }
    }
}

const CLIENT_REQUEST_ID: http::HeaderName = http::HeaderName::from_static("x-client-request-id");

/// Validate `X-Client-Request-Id` (echoed back when valid).
pub fn client_request_id(s: &Session, cx: &mut RequestCtx) -> Result<(), GatewayError> {
    let Some(v) = s.req_header().headers.get(CLIENT_REQUEST_ID) else {
        return Ok(());
    };
    if !printable_ascii(v.as_bytes(), 512) {
        return Err(GatewayError::new(
            ErrorKind::InvalidTraceHeader,
            "`X-Client-Request-Id` must be non-blank printable ASCII of at most 512 characters.",
        )
        .with_param("X-Client-Request-Id"));
    }
    cx.client_request_id = Some(String::from_utf8_lossy(v.as_bytes()).into_owned());
    Ok(())
}

fn too_large(limit: u64) -> GatewayError {
    GatewayError::new(ErrorKind::PayloadTooLarge, format!("The request body is larger than {limit} bytes."))
}

/// Read the whole body under the size limit and parse it as a JSON object.
/// Returns the raw bytes too (forwarded unchanged where no plugin rewrites them).
/// Bytes of request bodies being read now, across the node (`client.body_buffer_budget_bytes`).
static BODY_BYTES_READING: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bytes a body being read holds of the node's budget, given back when the read ends.
struct BudgetShare(u64);

impl BudgetShare {
    /// Take `n` more bytes of `budget`, or refuse (nothing taken).
    fn take(&mut self, n: u64, budget: u64) -> bool {
        use std::sync::atomic::Ordering;
        let taken = BODY_BYTES_READING.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
            held.checked_add(n).filter(|&total| total <= budget)
        });
        if taken.is_ok() {
            self.0 += n;
        }
        taken.is_ok()
    }
}

impl Drop for BudgetShare {
    fn drop(&mut self) {
        BODY_BYTES_READING.fetch_sub(self.0, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Read the body into a buffer that grows with the bytes that arrived (never sized by what a
/// client declares: a declared 3.5 MB pins nothing before the bytes come), each arriving
/// chunk counted against the node's budget for bodies being read; over it, the request is
/// shed (`429 hosted_admission_congested`), issue 49.
async fn read_body(s: &mut Session, limit: u64, declared: Option<u64>, budget: u64) -> Result<BytesMut, GatewayError> {
    const FIRST: u64 = 16 * 1024;
    let mut share = BudgetShare(0);
    let mut buf = BytesMut::with_capacity(usize::try_from(declared.unwrap_or(FIRST).min(FIRST)).unwrap_or(0));
    loop {
        match s.read_request_body().await {
            Ok(Some(chunk)) => {
                let len = u64::try_from(chunk.len()).unwrap_or(u64::MAX);
                if u64::try_from(buf.len()).unwrap_or(u64::MAX).saturating_add(len) > limit {
                    return Err(too_large(limit));
                }
                if !share.take(len, budget) {
                    log::warn!("request bodies being read hold the node's budget of {budget} bytes; one is shed");
                    crate::observe::metrics::admission_refused("body_budget");
                    return Err(GatewayError::new(
                        ErrorKind::HostedAdmissionCongested,
                        "Capacity is being shed under momentary load; retry shortly. This is not a quota.",
                    )
                    .with_retry_after(1));
                }
                buf.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(buf),
            Err(e) => {
                return Err(GatewayError::invalid_request(
                    "body",
                    format!("The request body could not be read: {}", e.etype().as_str()),
                ));
            }
        }
    }
}

/// A request whose header lines exceed the client limits is refused before anything reads
/// them, and never reaches a replica: `431 request_header_fields_too_large` (issue 49).
pub fn check_header_limits(s: &Session, limits: &crate::config::ClientLimits) -> Result<(), GatewayError> {
    let headers = &s.req_header().headers;
    let count = u64::try_from(headers.len()).unwrap_or(u64::MAX);
    // As on the wire: name, `: `, value, CRLF.
    let bytes: usize = headers.iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum();
    if count > limits.max_headers || u64::try_from(bytes).unwrap_or(u64::MAX) > limits.max_header_bytes {
        return Err(GatewayError::new(
            ErrorKind::HeadersTooLarge,
            format!(
                "The request's headers are too large: {count} lines of {bytes} bytes, at most {} lines of {} bytes.",
                limits.max_headers, limits.max_header_bytes
            ),
        ));
    }
    Ok(())
}

pub async fn read_json_body(s: &mut Session, cx: &mut RequestCtx) -> Result<Bytes, GatewayError> {
    let limit = cx.config.gateway.max_request_bytes;
    let client = cx.config.gateway.client;
    let declared = s
        .req_header()
        .headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large(limit));
    }
    let expects_continue = s
        .req_header()
        .headers
        .get(http::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if expects_continue {
        s.write_continue_response()
            .await
            .map_err(|e| GatewayError::internal(format!("could not answer 100-continue: {e}")))?;
    }
    let deadline = client.body_deadline(declared.unwrap_or(limit));
    let read = tokio::time::timeout(deadline, read_body(s, limit, declared, client.body_buffer_budget));
    let buf = match read.await {
        Ok(read) => read?,
        Err(_) => {
            return Err(GatewayError::new(
                ErrorKind::RequestTimeout,
                format!("The request body did not arrive within {} s.", deadline.as_secs()),
            ));
        }
    };
    cx.body_read = true;
    let raw = buf.freeze();
    let value: Value = crate::http::json_raw::from_text(&raw)
        .map_err(|e| GatewayError::new(ErrorKind::InvalidJson, format!("The request body is not valid JSON: {e}.")))?;
    if !value.is_object() {
        return Err(GatewayError::new(ErrorKind::InvalidJson, "The request body must be a JSON object."));
    }
    cx.body = Some(value);
    Ok(raw)
}

/// Resolve `model` in the catalog: known, not paused, supporting this route, with a pool.
pub fn resolve_model(cx: &mut RequestCtx, route: Route) -> Result<(), GatewayError> {
    let body = cx.body.as_ref().ok_or_else(|| GatewayError::internal("body not read"))?;
    let name = match body.get("model") {
        None | Some(Value::Null) => return Err(GatewayError::missing_field("model")),
        Some(Value::String(s)) => s.as_str(),
        Some(_) => {
            return Err(GatewayError::invalid_request("model", "`model` must be a string."));
        }
    };
    let config = cx.config.clone();
    let model = config.catalog.get(name).ok_or_else(|| {
        GatewayError::new(
            ErrorKind::ModelNotFound,
            format!("The model `{}` does not exist. Use an id from GET /v1/models.", truncate(name, 200)),
        )
        .with_param("model")
    })?;
    if let Some(until) = model.paused_until() {
        return Err(paused(&model.id, until));
    }
    if !model.supports(route.endpoint_name()) {
        return Err(GatewayError::new(
            ErrorKind::UnsupportedModelOperation,
            format!("The model `{}` does not support this endpoint.", model.id),
        )
        .with_param("model"));
    }
    let pool = config.pools.get(&model.id).ok_or_else(|| {
        GatewayError::new(
            ErrorKind::HostedInferenceUnavailable,
            format!("The model `{}` has no replicas serving it on this gateway.", model.id),
        )
    })?;
    cx.placement = Some(crate::proxy::ctx::Placement::new(model.clone(), pool.clone()));
    Ok(())
}

/// `503 hosted_model_paused`: Retry-After is the time to the next check, capped at one
/// hour, and 60 seconds once that time has passed.
pub fn paused(id: &str, until: Timestamp) -> GatewayError {
    let left = until.as_second() - Timestamp::now().as_second();
    let retry = if left <= 0 { 60 } else { left.min(3600) as u64 };
    GatewayError::new(
        ErrorKind::HostedModelPaused,
        format!("The model `{id}` is paused; availability is checked again at {until}."),
    )
    .with_field("paused_until", until.to_string())
    .with_retry_after(retry)
}

/// Reserve a replica slot (`429 hosted_model_at_capacity` when the replicas tried are full).
pub fn place(cx: &mut RequestCtx) -> Result<(), GatewayError> {
    let p = cx.placement.as_mut().ok_or_else(|| GatewayError::internal("no pool resolved"))?;
    match placement::place_home(&p.pool, &p.tried, p.home) {
        Ok((slot, spilled)) => {
            p.ran_on = Some(slot.index);
            p.slot = Some(slot);
            p.spilled |= spilled;
            p.placed = true;
            Ok(())
        }
        Err(NoSlot::Unhealthy) => Err(GatewayError::new(
            ErrorKind::UpstreamUnreachable,
            "No replica of the model is reachable right now (each refused a connection or failed repeatedly moments ago).",
        )),
        Err(NoSlot::AtCapacity | NoSlot::Exhausted) => Err(GatewayError::new(
            ErrorKind::HostedModelAtCapacity,
            "Every replica reached is at its concurrency; retry shortly.",
        )
        .with_retry_after(1)),
    }
}

/// The body for routes no plugin rewrote: unchanged, except the model name the replicas
/// serve (they would not know the catalog id).
pub fn forwarded_body(cx: &mut RequestCtx, raw: Bytes) -> Result<Bytes, GatewayError> {
    let (Some(pool), Some(body)) = (cx.placement.as_ref().map(|p| &p.pool), cx.body.as_mut()) else {
        return Ok(raw);
    };
    if body.get("model").and_then(Value::as_str) == Some(pool.to_upstream()) {
        return Ok(raw);
    }
    body["model"] = Value::String(pool.to_upstream().to_string());
    serde_json::to_vec(body)
        .map(Bytes::from)
        .map_err(|e| GatewayError::internal(format!("could not serialize the body: {e}")))
}

/// Our `400 upstream_error` from a replica's 4xx body (vLLM/OpenAI error shapes).
pub fn refusal_from_upstream(body: &[u8]) -> GatewayError {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let inner = v.get("error").filter(|e| e.is_object()).unwrap_or(&v);
    let message = inner
        .get("message")
        .and_then(Value::as_str)
        .map(|m| truncate(m, 500).to_string())
        .unwrap_or_else(|| "no detail given".to_string());
    let mut err =
        GatewayError::new(ErrorKind::UpstreamRefused, format!("The model server refused the request: {message}"));
    if let Some(p) = inner.get("param").and_then(Value::as_str) {
        err = err.with_param(truncate(p, 200));
    }
    err
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paused_retry_after_is_capped_and_60_once_passed() {
        let soon = Timestamp::now() + jiff::SignedDuration::from_secs(120);
        let e = paused("m", soon);
        let r = e.retry_after_seconds().unwrap_or(0);
        assert!((118..=120).contains(&r), "{r}");
        let far = Timestamp::now() + jiff::SignedDuration::from_secs(90_000);
        assert_eq!(paused("m", far).retry_after_seconds(), Some(3600));
        let past = Timestamp::now() - jiff::SignedDuration::from_secs(10);
        assert_eq!(paused("m", past).retry_after_seconds(), Some(60));
        assert!(e.extra.contains_key("paused_until"));
    }

    #[test]
    fn upstream_refusal_keeps_message_and_param() {
        let e = refusal_from_upstream(
            br#"{"object":"error","message":"bad temp","type":"BadRequestError","param":"temperature","code":400}"#,
        );
        assert_eq!(e.kind, ErrorKind::UpstreamRefused);
        assert_eq!(e.param.as_deref(), Some("temperature"));
        assert!(e.message.contains("bad temp"));
        let e = refusal_from_upstream(b"not json");
        assert!(e.param.is_none());
    }
}
