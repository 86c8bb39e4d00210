//! The contract between the chat path and a dialect: a dialect (messages, Responses) that
//! puts a request on the chat path leaves its [`AnswerTranslator`] in the request context
//! (`RequestCtx::answer_translator`), and the chat path feeds it the answer as typed pieces.
//! Declared in the core because two plugins share it; how a chat answer is read into pieces
//! stays with the plugins.

use std::borrow::Cow;

use bytes::BytesMut;

use crate::http::error::GatewayError;
use crate::money::usage::UsageFigures;

/// What a whole answer or chunk says about itself, for the dialect envelopes.
#[derive(Debug, Default, Clone)]
pub struct ChunkMeta<'a> {
    pub id: Option<Cow<'a, str>>,
    pub created: Option<i64>,
}

/// Output of the first choice, in the order it applies. Empty strings are not output and
/// give no piece.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece<'a> {
    Reasoning(Cow<'a, str>),
    Text(Cow<'a, str>),
    /// A tool call (a stream: a fragment of one); `index` is the chat tool-call index.
    Tool {
        index: u64,
        id: Option<Cow<'a, str>>,
        name: Option<Cow<'a, str>>,
        /// The arguments' JSON text (a stream: a fragment of it).
        args: Option<Cow<'a, str>>,
    },
    Finish(Cow<'a, str>),
}

/// Usage as the chat path priced it, for a translator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PricedUsage {
    pub figures: UsageFigures,
    /// Every choice ended without answer content (adds `output_token_accounting`).
    pub no_answer: bool,
}

/// A dialect's translation of the chat answer, fed by the chat path with typed pieces. A
/// stream gets `on_chunk` per chunk, `on_usage` when the usage report arrives, then one of
/// `on_done` or `on_failure`; a whole answer gets `whole`. Writes go to `out` as whole SSE
/// events.
pub trait AnswerTranslator: Send + Sync {
    fn on_chunk(&mut self, meta: &ChunkMeta<'_>, pieces: &[Piece<'_>], out: &mut BytesMut);
    fn on_usage(&mut self, usage: PricedUsage);
    /// The chat stream's `[DONE]`.
    fn on_done(&mut self, out: &mut BytesMut);
    /// The stream ends with a failure; nothing follows.
    fn on_failure(&mut self, err: &GatewayError, request_id: &str, out: &mut BytesMut);
    /// A whole (non-streamed) answer as the dialect's body.
    fn whole(&self, meta: &ChunkMeta<'_>, pieces: &[Piece<'_>], usage: Option<PricedUsage>) -> Vec<u8>;
}
