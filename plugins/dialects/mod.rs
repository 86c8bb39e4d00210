//! The messages dialect (`POST /v1/messages`, `POST /v1/messages/count_tokens`) and the
//! Responses adapter (`POST /v1/responses`): the `dialects` plugin (`plugin.rs`, the proxy
//! wiring) and the pure translators over the chat path it calls.
//!
//! Both dialects are served by the chat serving path (spec "What the service does" 2): a
//! request is translated into a chat-completions body, the chat plugin forwards and
//! normalises it, and the chat answer is translated back. Keeping the translators pure
//! (JSON in, JSON or SSE bytes out, no context, no I/O) lets them be tested exhaustively and
//! lets the proxy wiring stay a thin adapter. Decisions taken where the spec is silent are
//! listed in `docs/decisions.md` (66-88).

mod caps;
mod count_tokens;
mod fields;
mod images;
mod messages_blocks;
mod messages_request;
mod messages_response;
mod messages_stream;
mod messages_tools;
mod plugin;
mod render;
mod responses;
mod responses_request;
mod responses_stream;
mod signature;

#[cfg(test)]
mod tests;

use serde_json::Value;

pub use caps::{Effort, EffortChoice, ModelCaps, ReasoningOff};
pub use count_tokens::estimate_input_tokens;
pub use messages_request::{to_chat, to_chat_with};
pub use messages_response::{from_answer as messages_from_answer, stop_reason};
pub use messages_stream::{MessagesStream, ping};
pub use plugin::{DIALECTS_PRIORITY, Dialects, signing_key};
pub use render::to_vec as render_json;
pub use responses::from_answer as responses_from_answer;
pub use responses_request::{responses_to_chat, responses_to_chat_with};
pub use responses_stream::ResponsesStream;
pub use signature::{sign_thinking, verify_thinking};

/// Warning for `X-Service-Hint-Warnings` when `thinking: disabled` cannot be honoured.
pub const WARN_THINKING_NOT_DISABLED: &str = "thinking cannot be disabled on this model";
/// Warning for `X-Service-Hint-Warnings` when a requested effort moved to a supported one.
pub const WARN_EFFORT_CLAMPED: &str = "reasoning_effort_clamped";

/// A dialect request translated into a chat-completions request body.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatTranslation {
    /// The chat body; `model` is left as the client gave it (the chat path renames it).
    pub body: Value,
    /// Values for the `X-Service-Hint-Warnings` response header, in the order raised.
    pub warnings: Vec<String>,
    /// The client asked for a stream (the chat body then also asks for usage).
    pub stream: bool,
}

/// Why a messages body is translated: the two routes differ only in whether `max_tokens`
/// is required (spec "POST /v1/messages/count_tokens").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// `POST /v1/messages`: `max_tokens` is required.
    Generate,
    /// `POST /v1/messages/count_tokens`: `max_tokens` is optional.
    CountTokens,
}
