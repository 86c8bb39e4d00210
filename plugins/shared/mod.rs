//! What the chat path and the dialect translators share, so neither plugin reaches into the
//! other: the typed chat answer and the translator contract (`answer`), inline image checks,
//! reasoning efforts, prompt token counting, and the retry timing and momentary shed of
//! limits and billing (`shed`).

pub mod answer;
pub mod effort;
pub mod images;
pub mod prompt_tokens;
pub mod shed;

/// What the chat serving path decided about a request, for the phases after it: the chat
/// response phases read `include_usage`; admission (limits) and the hold (billing) read the
/// output ceiling. Kept in `cx.ext` (the core never reads it); absent off the chat path.
#[derive(Debug, Default, Clone, Copy)]
pub struct ChatRequest {
    /// The client asked for `stream_options.include_usage: true`.
    pub include_usage: bool,
    /// Output tokens the request may generate (`max_tokens` after clamping), when given.
    pub output_ceiling: Option<u64>,
}

impl ChatRequest {
    pub fn of(cx: &tollgate::proxy::ctx::RequestCtx) -> ChatRequest {
        cx.ext.get::<ChatRequest>().copied().unwrap_or_default()
    }
}

/// In `cx.ext` after admission (limits): the model was busy (its shared in-flight count at
/// the busy threshold of clarification 5). Billing refuses Standby on a busy model
/// (`hosted_standby_pressure`, decision 103).
#[derive(Debug, Default, Clone, Copy)]
pub struct ModelLoad {
    pub busy: bool,
}
