//! Answers the core writes itself: error responses in the route's envelope, the model reads,
//! and the headers every response carries (`X-Request-Id`, the trace echo).

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use serde_json::{Value, json};

use crate::http::envelope::{self, Envelope};
use crate::http::error::{ErrorKind, GatewayError};
use crate::http::routes;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::plugin::Chain;

/// Headers on every response: the request id (both spellings on messages routes), the
/// validated trace header echo, and what phases asked for.
pub fn common_headers(resp: &mut ResponseHeader, cx: &RequestCtx) -> pingora::Result<()> {
    resp.insert_header("x-request-id", cx.request_id.as_str())?;
    if cx.envelope == Envelope::Messages {
        resp.insert_header("request-id", cx.request_id.as_str())?;
    }
    if let Some(c) = &cx.client_request_id {
        resp.insert_header("x-client-request-id", c.as_str())?;
    }
    for (k, v) in &cx.response_headers {
        resp.insert_header(*k, v.as_str())?;
    }
    Ok(())
}

fn json_header(
    cx: &RequestCtx,
    status: u16,
    len: usize,
    extra: &[(&'static str, String)],
) -> pingora::Result<ResponseHeader> {
    let mut resp = ResponseHeader::build(status, Some(6 + extra.len()))?;
    resp.insert_header("content-type", "application/json")?;
    resp.insert_header("content-length", len.to_string())?;
    common_headers(&mut resp, cx)?;
    for (k, v) in extra {
        resp.insert_header(*k, v.as_str())?;
    }
    Ok(resp)
}

/// Write a complete JSON response.
pub async fn json(
    s: &mut Session,
    cx: &RequestCtx,
    status: u16,
    body: Bytes,
    extra: &[(&'static str, String)],
) -> pingora::Result<()> {
    whole(s, cx, status, "application/json", body, extra).await
}

/// Write a complete response of `content_type` (an event stream too: a short one, such as an
/// idempotent replay's, is sent whole with its length).
pub async fn whole(
    s: &mut Session,
    cx: &RequestCtx,
    status: u16,
    content_type: &str,
    body: Bytes,
    extra: &[(&'static str, String)],
) -> pingora::Result<()> {
    let mut resp = json_header(cx, status, body.len(), extra)?;
    if content_type != "application/json" {
        resp.insert_header("content-type", content_type)?;
        if content_type.starts_with("text/event-stream") {
            resp.insert_header("cache-control", "no-cache")?;
        }
    }
    // A POST whose body was not read to the end cannot be followed on this connection
    // (draining a 3.5 MB body just to refuse it is what the limit prevents).
    if cx.route.is_none_or(|r| r.method() == "POST") && !cx.body_read {
        s.set_keepalive(None);
    }
    s.write_response_header(Box::new(resp), false).await?;
    s.write_response_body(Some(body), true).await?;
    Ok(())
}

/// Write `err` in the route's envelope.
pub async fn error(s: &mut Session, cx: &mut RequestCtx, err: &GatewayError) -> pingora::Result<()> {
    let r = envelope::render(err, cx.envelope, &cx.request_id);
    if cx.failure.is_none() {
        cx.failure = Some(err.clone());
    }
    json(s, cx, r.status, r.body, &r.headers).await
}

/// `err` in the route's envelope as the bytes of a whole HTTP/1.1 response that closes the
/// connection: written straight to the socket in place of a held response (`held_output.rs`),
/// where Pingora already counts its own response header as written.
pub fn error_wire(cx: &mut RequestCtx, err: &GatewayError) -> pingora::Result<Vec<u8>> {
    let r = envelope::render(err, cx.envelope, &cx.request_id);
    if cx.failure.is_none() {
        cx.failure = Some(err.clone());
    }
    let mut resp = json_header(cx, r.status, r.body.len(), &r.headers)?;
    resp.insert_header("connection", "close")?;
    let reason = resp.status.canonical_reason().unwrap_or("");
    let mut out = format!("HTTP/1.1 {} {reason}\r\n", resp.status.as_u16()).into_bytes();
    for (name, value) in resp.headers.iter() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&r.body);
    Ok(out)
}

fn to_bytes(v: &Value) -> Bytes {
    Bytes::from(v.to_string())
}

/// `GET /v1/models`: every public model, available or paused.
pub async fn models_list(s: &mut Session, cx: &mut RequestCtx, chain: &Chain) -> Result<(), GatewayError> {
    let data: Vec<Value> = cx.config.catalog.models.iter().map(|m| chain.model_object(m, cx)).collect();
    let body = to_bytes(&json!({ "object": "list", "data": data }));
    json(s, cx, 200, body, &[]).await.map_err(|e| GatewayError::internal(format!("write failed: {e}")))
}

/// `GET /v1/models/{model}`.
pub async fn model_get(s: &mut Session, cx: &mut RequestCtx, chain: &Chain) -> Result<(), GatewayError> {
    let path = s.req_header().uri.path().to_string();
    let raw = routes::model_id_from_path(&path).unwrap_or_default();
    // The official clients encode the `/` of a repository id (`org%2Fmodel`) as the path
    // segment it is; an id that does not decode to UTF-8 is looked up as sent.
    let decoded = percent_encoding::percent_decode_str(raw).decode_utf8().unwrap_or(raw.into());
    let id = decoded.as_ref();
    let model = cx.config.catalog.get(id).cloned().ok_or_else(|| {
        GatewayError::new(
            ErrorKind::ModelNotFound,
            format!(
                "The model `{}` does not exist. Use an id from GET /v1/models.",
                crate::http::text::truncate(id, 200)
            ),
        )
        .with_param("model")
    })?;
    let body = to_bytes(&chain.model_object(&model, cx));
    json(s, cx, 200, body, &[]).await.map_err(|e| GatewayError::internal(format!("write failed: {e}")))
}
