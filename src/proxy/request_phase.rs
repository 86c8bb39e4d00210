//! What `request_filter` does for a request: route and read it, run the plugin chain, place
//! it on a replica and hand the rewritten body to the proxy; or answer it here.

use pingora::proxy::Session;

use super::{Gateway, affinity, forward};
use crate::http::error::{ErrorKind, GatewayError};
use crate::http::request::{self, read_json_body};
use crate::http::responder;
use crate::http::routes::Route;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::plugin::Flow;

impl Gateway {
    pub(super) async fn handle(&self, s: &mut Session, cx: &mut RequestCtx) -> Result<Flow, GatewayError> {
        // A socket the body replay wraps times its writes by their progress (a slow reader
        // is not cut); another gets the same bound on each write (an HTTP/2 stream's write
        // waits for window a piece at a time, so it too measures progress).
        let wrapped = cx.carried_output.is_some();
        let write_timeout = (!wrapped).then_some(self.settings.client.stalled_reader);
        s.downstream_session.set_write_timeout(write_timeout);
        request::echo_version(s, cx);
        // HTTP/1.1 keeps a connection alive with no limit by default: bound its idle wait for
        // the next request (issue 49).
        if s.get_keepalive() == Some(0) {
            s.set_keepalive(Some(self.settings.client.idle_timeout_seconds));
        }
        cx.client_ip = crate::transport::client_address::of_request(s, &self.settings.client_addressing);
        if let Some(traces) = &self.traces {
            let h = &s.req_header().headers;
            let header = |name: &str| h.get(name).and_then(|v| v.to_str().ok());
            cx.trace = Some(crate::observe::traces::RequestTrace::start(
                header("traceparent"),
                header("tracestate"),
                traces.sample_ratio,
            ));
        }
        let route = request::route(s, cx)?;
        request::check_header_limits(s, &self.settings.client)?;
        request::client_request_id(s, cx)?;
        if self.chain.on_request_headers(s, cx).await? == Flow::Handled {
            return Ok(Flow::Handled);
        }
        match route {
            Route::ListModels => {
                responder::models_list(s, cx, &self.chain).await?;
                return Ok(Flow::Handled);
            }
            Route::GetModel => {
                responder::model_get(s, cx, &self.chain).await?;
                return Ok(Flow::Handled);
            }
            Route::Credits | Route::Usage => {
                return Err(GatewayError::new(
                    ErrorKind::DatastoreUnavailable,
                    "This gateway has no store configured for this read.",
                ));
            }
            _ => {}
        }
        let keepalive = s.get_keepalive();
        let in_place = forward::prepare(s, cx);
        let raw = read_json_body(s, cx).await?;
        if route.is_forwarded() {
            // No dialect estimates these: about four bytes a token of the body (a ceiling,
            // JSON syntax included), read by admission and the hold (decision 153).
            cx.prompt_estimate = u64::try_from(raw.len().div_ceil(4)).unwrap_or(u64::MAX);
        }
        cx.raw_body = Some(raw);
        request::resolve_model(cx, route)?;
        affinity::identify(&s.req_header().headers, cx);
        crate::runtime::faults::panic_point("request");
        let lookup = affinity::lookup(&*self.placements, cx);
        let (flow, looked_up) = tokio::join!(self.chain.on_request(s, cx), lookup);
        let rewritten = match flow? {
            Flow::Handled => return Ok(Flow::Handled),
            Flow::Forward(body) => Some(body),
            Flow::Continue => None,
        };
        let raw = cx.raw_body.take().unwrap_or_default(); // not kept while the answer streams
        if route.is_generation() && rewritten.is_none() {
            // Generation routes must be translated by a dialect plugin (upstream model name,
            // usage always requested); none in the chain took this one.
            return Err(GatewayError::new(
                ErrorKind::HostedInferenceUnavailable,
                "This endpoint's dialect is not enabled on this gateway.",
            ));
        }
        affinity::place(&*self.placements, cx, looked_up).await?;
        let body = match rewritten {
            Some(b) => b,
            None => request::forwarded_body(cx, raw)?,
        };
        forward::forward(s, cx, body, keepalive, in_place).await?;
        Ok(Flow::Continue)
    }
}
