//! Answers the core writes itself: error responses in the route's envelope, the model reads,
//! and the headers every response carries (`X-Request-Id`, the trace echo).

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use serde_json::{Value, json};

use crate::ctx::RequestCtx;
use crate::envelope::{self, Envelope};
use crate::error::{ErrorKind, GatewayError};
use crate::plugin::Chain;
use crate::routes;

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

/// Write a complete JSON response.
pub async fn json(
    s: &mut Session,
    cx: &RequestCtx,
    status: u16,
    body: Bytes,
    extra: &[(&'static str, String)],
) -> pingora::Result<()> {
    let mut resp = ResponseHeader::build(status, Some(6 + extra.len()))?;
    resp.insert_header("content-type", "application/json")?;
    resp.insert_header("content-length", body.len().to_string())?;
    common_headers(&mut resp, cx)?;
    for (k, v) in extra {
        resp.insert_header(*k, v.as_str())?;
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
    let id = routes::model_id_from_path(&path).unwrap_or_default();
    let model = cx.config.catalog.get(id).cloned().ok_or_else(|| {
        GatewayError::new(
            ErrorKind::ModelNotFound,
            format!("The model `{}` does not exist. Use an id from GET /v1/models.", crate::request::truncate(id, 200)),
        )
        .with_param("model")
    })?;
    let body = to_bytes(&chain.model_object(&model, cx));
    json(s, cx, 200, body, &[]).await.map_err(|e| GatewayError::internal(format!("write failed: {e}")))
}
