//! Billing of the answers no dialect plugin reads: embeddings, rerank, audio and image routes
//! are forwarded as the replica wrote them, so billing estimates their hold from the request
//! and reads the replica's `usage` from the answer itself (decision 153).

use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;

use tollgate::config::ModelEntry;
use tollgate::ctx::RequestCtx;
use tollgate::routes::Route;
use tollgate::usage::UsageFigures;

/// Largest answer read for its usage; a longer one is billed at the request's estimate.
const MAX_READ: usize = 32 << 20;

/// Routes that reach a replica with their body forwarded unchanged apart from `model`.
pub(super) fn is_forwarded(route: Option<Route>) -> bool {
    route.is_some_and(|r| r.is_inference() && !r.is_generation())
}

/// Input tokens of a forwarded request before the replica counts them: about four bytes a
/// token of its body, the documented rule without a tokenizer (a ceiling: JSON syntax counts).
pub(super) fn input_estimate(cx: &RequestCtx) -> u64 {
    cx.raw_body.as_ref().map_or(0, |b| u64::try_from(b.len().div_ceil(4)).unwrap_or(u64::MAX))
}

/// Output tokens the hold covers: embeddings and rerank produce none.
pub(super) fn output_ceiling(route: Option<Route>, model: Option<&ModelEntry>, default: u64) -> u64 {
    match route {
        Some(Route::Embeddings | Route::Rerank) => 0,
        _ => model.and_then(|m| m.max_output_tokens).unwrap_or(default),
    }
}

/// A forwarded answer as it passes to the client: its chunks are shared, never copied, until
/// the end, when the usage is read once.
#[derive(Debug, Default)]
pub(super) struct Forwarded {
    chunks: Vec<Bytes>,
    len: usize,
    too_long: bool,
    complete: bool,
}

impl Forwarded {
    pub(super) fn push(&mut self, chunk: Option<&Bytes>, eos: bool) {
        if let Some(c) = chunk.filter(|_| !self.too_long) {
            self.len += c.len();
            if self.len > MAX_READ {
                self.too_long = true;
                self.chunks = Vec::new();
            } else {
                self.chunks.push(c.clone());
            }
        }
        self.complete |= eos;
    }

    /// The usage to settle once the answer is whole; `None` before (a client gone before
    /// the end is billed nothing, as for a non-streamed chat answer).
    pub(super) fn figures(&self, model: &ModelEntry, priced_at: i64, input_estimate: u64) -> Option<UsageFigures> {
        if !self.complete {
            return None;
        }
        let usage = if self.too_long { None } else { self.usage() };
        Some(tollgate::usage::from_forwarded(model, priced_at, usage.as_ref(), input_estimate))
    }

    /// The answer's top-level `usage` object, if it is JSON and has one.
    fn usage(&self) -> Option<Value> {
        #[derive(Deserialize)]
        struct Answer {
            usage: Option<Value>,
        }
        let answer: Answer = match self.chunks.as_slice() {
            [one] => serde_json::from_slice(one).ok()?,
            many => serde_json::from_slice(&many.concat()).ok()?,
        };
        answer.usage
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(parts: &[&str], eos: bool) -> Forwarded {
        let mut f = Forwarded::default();
        for p in parts {
            f.push(Some(&Bytes::copy_from_slice(p.as_bytes())), false);
        }
        f.push(None, eos);
        f
    }

    #[test]
    fn the_usage_is_read_across_chunks_and_only_from_a_whole_answer() {
        let f = read(&[r#"{"object":"list","data":[{"embedding":[0.1]}],"#, r#""usage":{"prompt_tokens":7}}"#], true);
        assert_eq!(f.usage().and_then(|u| u["prompt_tokens"].as_u64()), Some(7));
        let cut = read(&[r#"{"object":"list","usage":{"prompt_tokens":7}"#], false);
        assert!(!cut.complete, "no end, nothing to settle");
        let audio = read(&["RIFF\0\0WAVE"], true);
        assert!(audio.usage().is_none(), "not JSON: no usage, billed at the estimate");
    }

    #[test]
    fn an_answer_past_the_cap_keeps_nothing() {
        let mut f = Forwarded::default();
        let big = Bytes::from(vec![b' '; MAX_READ / 2 + 1]);
        f.push(Some(&big), false);
        f.push(Some(&big), true);
        assert!(f.too_long && f.chunks.is_empty() && f.complete);
    }
}
