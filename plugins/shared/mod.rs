//! Helpers shared by the chat path and the dialect translators, so neither plugin reaches
//! into the other for them: inline image checks, reasoning efforts, prompt token counting.

pub mod effort;
pub mod images;
pub mod prompt_tokens;
