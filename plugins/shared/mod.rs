//! What the chat path and the dialect translators share, so neither plugin reaches into the
//! other: the typed chat answer and the translator contract (`answer`), inline image checks,
//! reasoning efforts, prompt token counting, and the retry timing and momentary shed of
//! limits and billing (`shed`). Facts one plugin hands another are typed fields of the
//! request context (`RequestCtx::chat_request`, `model_busy`, `answer_facts`).

pub mod answer;
pub mod effort;
pub mod images;
pub mod prompt_tokens;
pub mod shed;
