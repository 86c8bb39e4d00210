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
    pub fn of(cx: &tollgate::ctx::RequestCtx) -> ChatRequest {
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

/// Routes that reach a replica with their body forwarded unchanged apart from `model`
/// (embeddings, rerank, audio, images; decision 153).
pub fn is_forwarded(route: Option<tollgate::routes::Route>) -> bool {
    route.is_some_and(|r| r.is_inference() && !r.is_generation())
}

/// Input tokens of a forwarded request before the replica counts them: about four bytes a
/// token of its body, the documented rule without a tokenizer (a ceiling: JSON syntax counts).
/// Admission (limits) and the hold (billing) both read it.
pub fn forwarded_input_estimate(cx: &tollgate::ctx::RequestCtx) -> u64 {
    cx.raw_body.as_ref().map_or(0, |b| u64::try_from(b.len().div_ceil(4)).unwrap_or(u64::MAX))
}
