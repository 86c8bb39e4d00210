//! Billing of the answers no dialect plugin reads: embeddings, rerank, audio and image routes
//! are forwarded as the replica wrote them, so billing estimates their hold from the request
//! and reads the replica's `usage` from the answer itself (decision 153).

use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;

use tollgate::config::ModelEntry;
use tollgate::http::routes::Route;
use tollgate::money::usage::UsageFigures;

/// Largest answer read for its usage; a longer one is billed at the request's estimate.
const MAX_READ: usize = 32 << 20;

/// Routes whose answers billing reads itself.
pub(super) fn is_forwarded(route: Option<Route>) -> bool {
    route.is_some_and(Route::is_forwarded)
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
    /// The answer declared JSON (`application/json` or `+json`): one that is not JSON is a
    /// malformed answer, never charged (clarification 11).
    json: bool,
}

impl Forwarded {
    /// A reader for an answer of this `Content-Type`.
    pub(super) fn new(content_type: Option<&[u8]>) -> Forwarded {
        let json = content_type
            .and_then(|t| std::str::from_utf8(t).ok())
            .map(|t| t.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
            .is_some_and(|t| t == "application/json" || t.ends_with("+json"));
        Forwarded { json, ..Forwarded::default() }
    }

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
        let usage = match self.read() {
            Read::Usage(u) => Some(u),
            Read::NoUsage => None,
            Read::Malformed if self.json => {
                log::warn!("a forwarded answer declared JSON and is not: not charged");
                return None;
            }
            Read::Malformed => None, // audio, images as bytes: billed at the estimate
        };
        Some(tollgate::money::usage::from_forwarded(model, priced_at, usage.as_ref(), input_estimate))
    }

    /// What the whole answer says about its usage.
    fn read(&self) -> Read {
        #[derive(Deserialize)]
        struct Answer {
            usage: Option<Value>,
        }
        if self.too_long {
            return Read::NoUsage;
        }
        let answer: Result<Answer, _> = match self.chunks.as_slice() {
            [one] => serde_json::from_slice(one),
            many => serde_json::from_slice(&many.concat()),
        };
        match answer {
            Ok(Answer { usage: Some(u) }) => Read::Usage(u),
            Ok(_) => Read::NoUsage,
            Err(_) => Read::Malformed,
        }
    }
}

#[derive(Debug)]
enum Read {
    Usage(Value),
    NoUsage,
    /// Not a JSON object (or not JSON at all).
    Malformed,
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
        assert!(matches!(f.read(), Read::Usage(u) if u["prompt_tokens"] == 7));
        let cut = read(&[r#"{"object":"list","usage":{"prompt_tokens":7}"#], false);
        assert!(!cut.complete, "no end, nothing to settle");
        let audio = read(&["RIFF\0\0WAVE"], true);
        assert!(matches!(audio.read(), Read::Malformed), "not JSON: billed at the estimate unless it declared JSON");
        assert!(matches!(read(&[r#"{"object":"list"}"#], true).read(), Read::NoUsage));
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
