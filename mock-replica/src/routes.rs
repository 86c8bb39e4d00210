//! Request routing and the per-endpoint answers.
//!
//! Every `/v1` request is counted and recorded first, then the failure knobs
//! (hang, status, malformed) are played, then the endpoint answers. The
//! `/mock/*` endpoints are the tests' window into the replica and are never
//! recorded themselves.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{Value, json};

use crate::body::MockBody;
use crate::completion::{Completion, unix_now};
use crate::json::error_body;
use crate::knobs::{Abort, AfterDone, Knobs};
use crate::request::ChatRequest;
use crate::sse::SseStream;
use crate::state::State;

/// Model name when neither `--model-name` nor the request gives one.
const DEFAULT_MODEL: &str = "mock";

/// hyper service entry point. `Err(Abort)` closes the connection without
/// any response.
pub async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Response<MockBody>, Abort> {
    let path = req.uri().path();
    if path == "/v1" || path.starts_with("/v1/") {
        return handle_v1(state, req).await;
    }
    if req.method() == Method::POST && path == "/mock/otlp/v1/traces" {
        // An OTLP/HTTP traces sink for the benches (the gateway's `tracing.otlp_endpoint`):
        // the export is read whole and counted, as a collector would take it.
        let body = req.into_body().collect().await.map_err(|_| Abort)?.to_bytes();
        state.otlp_exports.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        state.otlp_bytes.fetch_add(body.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let mut resp = plain(StatusCode::OK, "");
        resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/x-protobuf"));
        return Ok(resp);
    }
    Ok(match (req.method(), path) {
        (&Method::GET, "/health") => {
            state.health_checks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let status = state.health_status.load(std::sync::atomic::Ordering::Relaxed);
            plain(StatusCode::from_u16(status).unwrap_or(StatusCode::OK), "health")
        }
        (&Method::POST, "/mock/health") => {
            // `?status=N`: what `/health` answers from now on (the tests' way to fail a replica).
            let status = req.uri().query().and_then(|q| q.strip_prefix("status=")).and_then(|s| s.parse::<u16>().ok());
            match status.filter(|s| (100..600).contains(s)) {
                Some(s) => {
                    state.health_status.store(s, std::sync::atomic::Ordering::Relaxed);
                    plain(StatusCode::OK, "set")
                }
                None => plain(StatusCode::BAD_REQUEST, "use ?status=N"),
            }
        }
        (&Method::GET, "/mock/last-request") => json(StatusCode::OK, state.last_request_json()),
        (&Method::GET, "/mock/stats") => json(StatusCode::OK, state.stats_json()),
        _ => not_found(path),
    })
}

async fn handle_v1(state: Arc<State>, req: Request<Incoming>) -> Result<Response<MockBody>, Abort> {
    // Dropped with the response body, or with this future if the client
    // leaves first (hyper drops the service future of a closed connection).
    let in_flight = state.begin();
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            log::debug!("reading request body: {e}");
            return Err(Abort);
        }
    };
    state.record(&parts.method, parts.uri.path(), &parts.headers, &body);

    let response = match Knobs::parse(&parts.headers) {
        Ok(knobs) => answer_v1(&state, &parts.method, parts.uri.path(), &knobs, &body).await?,
        Err(msg) => error(StatusCode::BAD_REQUEST, &msg),
    };
    Ok(response.map(|b| b.with_in_flight(in_flight)))
}

async fn answer_v1(
    state: &State,
    method: &Method,
    path: &str,
    knobs: &Knobs,
    body: &Bytes,
) -> Result<Response<MockBody>, Abort> {
    if knobs.hang {
        // Never answer; hyper drops this future when the client goes.
        std::future::pending::<()>().await;
    }
    if let Some(status) = knobs.status {
        let mut response = error(status, "mock failure");
        if let Some(Ok(value)) = knobs.retry_after.as_deref().map(HeaderValue::from_str) {
            response.headers_mut().insert(RETRY_AFTER, value);
        }
        return Ok(response);
    }
    if knobs.malformed {
        return Ok(json(StatusCode::OK, Bytes::from_static(b"not json{")));
    }
    if let Some(raw) = &knobs.raw_body {
        let status = knobs.raw_status.unwrap_or(StatusCode::OK);
        if knobs.body_delay.is_zero() {
            return Ok(json(status, raw.clone()));
        }
        let mut response = Response::new(MockBody::delayed(raw.clone(), knobs.body_delay));
        *response.status_mut() = status;
        response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return Ok(response);
    }
    if knobs.raw_frame.is_some() && knobs.after_done == AfterDone::Cut {
        let msg = "x-mock-after-done: cut works on generated streams, not with x-mock-raw-frame";
        return Ok(with_type(StatusCode::BAD_REQUEST, "text/plain", Bytes::from(msg)));
    }
    if let Some(frame) = &knobs.raw_frame {
        let stream = Bytes::from(format!("data: {frame}\n\ndata: [DONE]\n\n"));
        let mut response = with_type(StatusCode::OK, "text/event-stream", stream.clone());
        if knobs.after_done == AfterDone::Hold {
            *response.body_mut() = MockBody::then_hold(stream);
        }
        response.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return Ok(response);
    }
    if method == Method::POST && path == "/v1/chat/completions" {
        return chat(state, knobs, body).await;
    }

    // The other endpoints answer at once; the timing knobs still apply so
    // slow or dying replicas can be played on any route.
    sleep(knobs.ttft).await;
    if knobs.abort_after.is_some() {
        return Err(Abort);
    }
    Ok(match (method, path) {
        (&Method::POST, "/v1/embeddings") => embeddings(state, knobs, body),
        (&Method::POST, "/v1/rerank" | "/v1/audio/speech" | "/v1/audio/transcriptions" | "/v1/images/generations") => {
            json(StatusCode::OK, json!({"object": "mock", "path": path}).to_string())
        }
        (&Method::GET, "/v1/models") => models(state),
        _ => not_found(path),
    })
}

async fn chat(state: &State, knobs: &Knobs, body: &Bytes) -> Result<Response<MockBody>, Abort> {
    let req: ChatRequest = match serde_json::from_slice(body) {
        Ok(req) => req,
        Err(e) => {
            return Ok(error(StatusCode::BAD_REQUEST, &format!("invalid chat completion request: {e}")));
        }
    };
    let completion = Completion::plan(&req, knobs, state.model_name.as_deref());

    if req.wants_stream() {
        // Timing and abort knobs are played inside the stream.
        let stream = SseStream::new(completion, knobs, req.include_usage());
        let body = if knobs.sse_whole {
            // Only a stream without timing knobs can be had at once.
            let Some(whole) = stream.collect_now() else {
                return Ok(error(StatusCode::BAD_REQUEST, "x-mock-sse-whole takes no timing or abort knob"));
            };
            MockBody::full(whole)
        } else {
            MockBody::sse(stream)
        };
        let mut response = Response::new(body);
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return Ok(response);
    }

    // Non-streamed: the whole generation time passes before the header. An
    // aborting replica dies after its K-th token.
    let generated = knobs.abort_after.map_or(completion.tokens, |k| k.min(completion.tokens));
    let per_token = u32::try_from(generated).unwrap_or(u32::MAX);
    sleep(knobs.ttft + knobs.token_delay.saturating_mul(per_token)).await;
    if knobs.abort_after.is_some() {
        return Err(Abort);
    }
    Ok(json(StatusCode::OK, completion.to_json()))
}

/// One fixed 3-dimensional embedding per input.
fn embeddings(state: &State, knobs: &Knobs, body: &Bytes) -> Response<MockBody> {
    let req: Value = match serde_json::from_slice(body) {
        Ok(req) => req,
        Err(e) => {
            return error(StatusCode::BAD_REQUEST, &format!("invalid embedding request: {e}"));
        }
    };
    let inputs = EmbeddingInputs::measure(&req["input"]);
    let data: Vec<Value> =
        (0..inputs.count).map(|i| json!({"object": "embedding", "index": i, "embedding": [0.1, 0.2, 0.3]})).collect();
    let prompt = knobs.prompt_tokens.unwrap_or(inputs.bytes / 4 + 1 + inputs.token_ids);
    let mut answer = json!({
        "object": "list",
        "data": data,
        "model": response_model(state, req["model"].as_str()),
    });
    if !knobs.no_usage {
        answer["usage"] = json!({"prompt_tokens": prompt, "total_tokens": prompt});
    }
    json(StatusCode::OK, answer.to_string())
}

/// Shape of an embeddings `input`: a string, a list of strings, a list of
/// token ids, or a list of token-id lists.
#[derive(Debug, Default, PartialEq)]
struct EmbeddingInputs {
    count: u64,
    bytes: u64,
    token_ids: u64,
}

impl EmbeddingInputs {
    fn measure(input: &Value) -> Self {
        match input {
            Value::String(s) => Self { count: 1, bytes: s.len() as u64, token_ids: 0 },
            Value::Array(items) if items.iter().all(Value::is_number) => {
                Self { count: 1, bytes: 0, token_ids: items.len() as u64 }
            }
            Value::Array(items) => {
                let mut total = Self::default();
                for item in items {
                    let one = Self::measure(item);
                    total.count += 1;
                    total.bytes += one.bytes;
                    total.token_ids += one.token_ids;
                }
                total
            }
            _ => Self { count: 1, ..Self::default() },
        }
    }
}

fn models(state: &State) -> Response<MockBody> {
    let model = response_model(state, None);
    let answer = json!({
        "object": "list",
        "data": [{
            "id": model,
            "object": "model",
            "created": unix_now(),
            "owned_by": "vllm",
            "root": model,
            "parent": null,
        }],
    });
    json(StatusCode::OK, answer.to_string())
}

fn response_model<'a>(state: &'a State, requested: Option<&'a str>) -> &'a str {
    state.model_name.as_deref().or(requested).unwrap_or(DEFAULT_MODEL)
}

async fn sleep(duration: Duration) {
    if !duration.is_zero() {
        tokio::time::sleep(duration).await;
    }
}

fn json(status: StatusCode, body: impl Into<Bytes>) -> Response<MockBody> {
    with_type(status, "application/json", body.into())
}

fn plain(status: StatusCode, body: &'static str) -> Response<MockBody> {
    with_type(status, "text/plain", Bytes::from_static(body.as_bytes()))
}

fn error(status: StatusCode, message: &str) -> Response<MockBody> {
    json(status, error_body(status, message))
}

fn not_found(path: &str) -> Response<MockBody> {
    error(StatusCode::NOT_FOUND, &format!("Not Found: {path}"))
}

fn with_type(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<MockBody> {
    let mut response = Response::new(MockBody::full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn embedding_input_shapes() {
        let m = |v: Value| EmbeddingInputs::measure(&v);
        assert_eq!(m(json!("abcd")).count, 1);
        assert_eq!(m(json!("abcd")).bytes, 4);
        assert_eq!(m(json!(["ab", "cde"])).count, 2);
        assert_eq!(m(json!(["ab", "cde"])).bytes, 5);
        assert_eq!(m(json!([1, 2, 3])).count, 1);
        assert_eq!(m(json!([1, 2, 3])).token_ids, 3);
        assert_eq!(m(json!([[1, 2], [3]])).count, 2);
        assert_eq!(m(json!([[1, 2], [3]])).token_ids, 3);
        assert_eq!(m(Value::Null).count, 1);
    }
}
