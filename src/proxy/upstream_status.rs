//! The replica's status, judged once when its header arrives (clarification 11, decisions
//! 153 and 156): a full replica is `429 hosted_model_at_capacity`, a 5xx is `502
//! upstream_http_error`, a refusal of the gateway itself (401, 403, 404, ...) and an answer
//! that cannot carry a body are `502 upstream_error`, and a 4xx about the content becomes our
//! `400` once its message is read.

use pingora::http::ResponseHeader;
use pingora::{Error, ErrorType, Result};

use super::failure::has_no_body;
use crate::http::error::{ErrorKind, GatewayError};
use crate::http::request;
use crate::http::routes::Route;
use crate::proxy::ctx::RequestCtx;

/// `Ok(true)`: the answer goes on to the plugins; `Ok(false)`: a refusal to rewrite (its body
/// is read in the body phase); `Err`: a failure, already in `cx.failure`.
pub(super) fn judge(resp: &mut ResponseHeader, cx: &mut RequestCtx) -> Result<bool> {
    let status = resp.status.as_u16();
    let retry = || {
        resp.headers
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    if status == 429 {
        // The replica is full: a capacity refusal, not a fault of the content (clarification
        // 11's 400 is for those), so clients wait and retry (decision 156). Uncharged.
        cx.failure = Some(
            GatewayError::new(ErrorKind::HostedModelAtCapacity, "The model server is at capacity; retry shortly.")
                .with_retry_after(retry().unwrap_or(1)),
        );
        return Error::e_explain(ErrorType::HTTPStatus(429), "replica answered 429");
    }
    if status >= 500 {
        let mut err =
            GatewayError::new(ErrorKind::UpstreamHttpError, format!("The model server answered HTTP {status}."));
        if let Some(r) = retry() {
            err = err.with_retry_after(r);
        }
        cx.failure = Some(err);
        return Error::e_explain(ErrorType::HTTPStatus(502), "replica answered 5xx");
    }
    if matches!(status, 401 | 403 | 404 | 405 | 407 | 408 | 410 | 421) {
        // Not about the content (clarification 11's 400 is for those): the server refused the
        // gateway itself (its credential, the model name or path it was given). Fixing the
        // request cannot help, so it is the server side's failure (decision 181). Uncharged.
        cx.failure = Some(GatewayError::new(
            ErrorKind::UpstreamFailed,
            format!("The model server refused the gateway (HTTP {status}); this is not a fault of the request."),
        ));
        return Error::e_explain(ErrorType::HTTPStatus(502), "replica refused the gateway");
    }
    if cx.route.is_some_and(Route::is_inference) && has_no_body(resp) {
        // Clarification 11: the replica was reached and answered without a body (nothing
        // would reach the body phase to judge it).
        cx.failure = Some(if status >= 400 {
            request::refusal_from_upstream(b"")
        } else {
            GatewayError::new(ErrorKind::UpstreamFailed, "The model server sent an empty response.")
        });
        return Error::e_explain(ErrorType::HTTPStatus(502), "replica answered without a body");
    }
    if status >= 400 {
        // Rewritten into our 400 once the replica's message has been read.
        cx.response.upstream_refused = true;
        resp.set_status(400)?;
        resp.remove_header("content-length");
        resp.remove_header("retry-after"); // a 400 needs a changed request, not a wait
        resp.insert_header("content-type", "application/json")?;
        return Ok(false);
    }
    Ok(true)
}
