//! The chat-completions dialect and the chat serving path: the request rewrite for the
//! replica, and the one response pipeline on the way back. Every body or stream frame is read
//! once into a borrowed view (`shared::answer`), accounted once (`account.rs`: delivered
//! output, answered choices), priced from the replica's usage (`tollgate::money::usage`), then
//! either edited in place for the chat dialect (`edits.rs`: reasoning on `reasoning`,
//! `service.output_status`, the hosted Usage object with cost) or handed as typed pieces to
//! the translator a dialect registered (`RequestCtx::answer_translator`). A stream's content
//! frame that repeats the last one's text around another string skips the parse
//! (`content_frame.rs`).

mod account;
mod capability;
mod content_frame;
mod context;
mod edits;
mod effort;
mod images;
mod messages;
mod request;
mod response;
mod schema;
mod stream;
mod upstream_body;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod content_frame_tests;
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod pipeline_reference;
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod pipeline_tests;

// The pure phases, public for the benches.
pub use request::rewrite as rewrite_request;
pub use response::on_chunk as on_json_chunk;
pub use stream::on_chunk as on_stream_chunk;

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;

use tollgate::http::error::GatewayError;
use tollgate::http::routes::Route;
use tollgate::proxy::ctx::RequestCtx;
use tollgate::proxy::plugin::{Flow, Plugin};

pub struct ChatCompletions;

/// After the dialects (300) translate onto the chat path; before admission (150), which needs
/// the token estimate this phase makes.
pub const CHAT_PRIORITY: i16 = 200;

/// The chat serving path: chat completions, and the dialects a plugin translated onto it.
fn is_chat(cx: &RequestCtx) -> bool {
    cx.route == Some(Route::ChatCompletions) || cx.answer_translator.is_some()
}

#[async_trait]
impl Plugin for ChatCompletions {
    fn name(&self) -> &'static str {
        "chat_completions"
    }

    fn priority(&self) -> i16 {
        CHAT_PRIORITY
    }

    async fn on_request(&self, _s: &mut Session, cx: &mut RequestCtx) -> Result<Flow, GatewayError> {
        if is_chat(cx) {
            return request::rewrite(cx).map(Flow::Forward);
        }
        Ok(Flow::Continue)
    }

    fn on_response_header(&self, resp: &mut ResponseHeader, cx: &mut RequestCtx) -> Result<(), GatewayError> {
        if !is_chat(cx) {
            return Ok(());
        }
        // A stream asked for and a whole answer given, or the reverse, is not an answer the
        // client can read: `502 upstream_error`, nothing charged (decisions 47 and 180).
        if resp.status.is_success() && cx.response.streaming != cx.stream {
            return Err(GatewayError::new(
                tollgate::http::error::ErrorKind::UpstreamFailed,
                "The model server answered in the wrong form (a stream for a whole answer, or the reverse).",
            ));
        }
        // The body is rewritten, so its length changes: pingora then sends it chunked.
        resp.remove_header("content-length");
        if cx.response.streaming {
            let _ = resp.insert_header("cache-control", "no-cache");
        }
        Ok(())
    }

    fn stream_failure_frame(&self, err: &GatewayError, cx: &mut RequestCtx) -> Option<Bytes> {
        if !is_chat(cx) || !cx.response.streaming {
            return None;
        }
        let t = cx.answer_translator.as_mut()?;
        let mut out = bytes::BytesMut::new();
        t.on_failure(err, &cx.request_id, &mut out);
        Some(out.freeze())
    }

    fn on_response_chunk(&self, body: &mut Option<Bytes>, eos: bool, cx: &mut RequestCtx) -> Result<(), GatewayError> {
        if !is_chat(cx) {
            return Ok(());
        }
        if cx.response.streaming {
            stream::on_chunk(body, eos, cx);
            Ok(())
        } else {
            response::on_chunk(body, eos, cx)
        }
    }
}
