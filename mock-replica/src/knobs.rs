//! The `x-mock-*` request headers that script the mock's behaviour.
//!
//! Tests and benches steer each request individually through headers, so one
//! mock process can play a healthy replica, a slow one and a broken one at
//! the same time. A knob that is present but unparsable is rejected with 400
//! rather than ignored: a typo in a test should fail loudly.

use std::time::Duration;

use http::{HeaderMap, StatusCode};

/// Output tokens when neither `x-mock-tokens` nor a max-tokens cap says otherwise.
pub const DEFAULT_TOKENS: u64 = 16;

/// Every knob of one request, parsed once up front.
#[derive(Debug, Default)]
pub struct Knobs {
    pub tokens: Option<u64>,
    pub reasoning: u64,
    pub tool_call: Option<String>,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: u64,
    pub split: Option<usize>,
    pub ttft: Duration,
    pub token_delay: Duration,
    pub status: Option<StatusCode>,
    pub retry_after: Option<String>,
    pub abort_after: Option<u64>,
    pub no_usage: bool,
    pub no_done: bool,
    pub hang: bool,
    pub malformed: bool,
    /// Answer 200 with exactly this body (`x-mock-raw-body`; empty is allowed).
    pub raw_body: Option<String>,
    /// With `x-mock-raw-body`: the status to answer it with (`x-mock-raw-status`, default 200).
    pub raw_status: Option<StatusCode>,
    /// With `x-mock-raw-body`: send the header, then the body after this long.
    pub body_delay: Duration,
    /// Stream this one `data:` payload, then `[DONE]` (`x-mock-raw-frame`).
    pub raw_frame: Option<String>,
    /// What a stream does after its `[DONE]` frame (`x-mock-after-done`): end properly (absent),
    /// cut the connection without the chunked terminator (`cut`), or keep it open (`hold`).
    pub after_done: AfterDone,
    /// Send a stream's whole body in one write with `Content-Length` (`x-mock-sse-whole`), as
    /// a replica that buffers its stream does: the worst case for frame-by-frame work.
    pub sse_whole: bool,
}

/// How a stream's HTTP body ends once its `[DONE]` frame is out.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum AfterDone {
    #[default]
    End,
    /// Broken framing: the connection drops with no terminating chunk.
    Cut,
    /// The body never ends: the connection stays open with nothing more on it.
    Hold,
}

impl Knobs {
    /// Parses the knobs; `Err` carries the message for a 400 answer.
    pub fn parse(headers: &HeaderMap) -> Result<Self, String> {
        let status = match number(headers, "x-mock-status")? {
            Some(code) => Some(
                u16::try_from(code)
                    .ok()
                    .and_then(|c| StatusCode::from_u16(c).ok())
                    .ok_or_else(|| format!("invalid x-mock-status: {code}"))?,
            ),
            None => None,
        };
        let split = match number(headers, "x-mock-split")? {
            Some(0) => return Err("x-mock-split must be at least 1".to_owned()),
            Some(k) => Some(usize::try_from(k).map_err(|e| format!("x-mock-split: {e}"))?),
            None => None,
        };
        Ok(Self {
            tokens: number(headers, "x-mock-tokens")?,
            reasoning: number(headers, "x-mock-reasoning")?.unwrap_or(0),
            tool_call: text(headers, "x-mock-tool-call")?,
            prompt_tokens: number(headers, "x-mock-prompt-tokens")?,
            cached_tokens: number(headers, "x-mock-cached-tokens")?.unwrap_or(0),
            split,
            ttft: millis(headers, "x-mock-ttft-ms")?,
            token_delay: millis(headers, "x-mock-token-delay-ms")?,
            status,
            retry_after: text(headers, "x-mock-retry-after")?,
            abort_after: number(headers, "x-mock-abort-after")?,
            no_usage: flag(headers, "x-mock-no-usage"),
            sse_whole: flag(headers, "x-mock-sse-whole"),
            no_done: flag(headers, "x-mock-no-done"),
            hang: flag(headers, "x-mock-hang"),
            malformed: flag(headers, "x-mock-malformed"),
            raw_body: text(headers, "x-mock-raw-body")?,
            raw_frame: text(headers, "x-mock-raw-frame")?,
            after_done: match text(headers, "x-mock-after-done")?.as_deref() {
                None => AfterDone::End,
                Some("cut") => AfterDone::Cut,
                Some("hold") => AfterDone::Hold,
                Some(other) => return Err(format!("x-mock-after-done must be cut or hold, not {other}")),
            },
            body_delay: millis(headers, "x-mock-body-delay-ms")?,
            raw_status: match number(headers, "x-mock-raw-status")? {
                Some(code) => Some(
                    u16::try_from(code)
                        .ok()
                        .and_then(|c| StatusCode::from_u16(c).ok())
                        .ok_or_else(|| format!("invalid x-mock-raw-status: {code}"))?,
                ),
                None => None,
            },
        })
    }
}

fn text(headers: &HeaderMap, name: &str) -> Result<Option<String>, String> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => v.to_str().map(|s| Some(s.trim().to_owned())).map_err(|_| format!("{name} is not valid text")),
    }
}

fn number(headers: &HeaderMap, name: &str) -> Result<Option<u64>, String> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(Some)
            .ok_or_else(|| format!("{name} must be a non-negative integer")),
    }
}

fn millis(headers: &HeaderMap, name: &str) -> Result<Duration, String> {
    Ok(Duration::from_millis(number(headers, name)?.unwrap_or(0)))
}

/// A flag is on for `1`/`true`/`yes`; `0` (or anything else) leaves it off.
fn flag(headers: &HeaderMap, name: &str) -> bool {
    headers.get(name).is_some_and(|v| matches!(v.as_bytes().trim_ascii(), b"1" | b"true" | b"TRUE" | b"True" | b"yes"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(*k, v.parse().unwrap());
        }
        map
    }

    #[test]
    fn defaults_when_absent() {
        let k = Knobs::parse(&HeaderMap::new()).unwrap();
        assert_eq!(k.tokens, None);
        assert_eq!(k.reasoning, 0);
        assert!(!k.hang && !k.no_done && k.status.is_none());
    }

    #[test]
    fn parses_values() {
        let k = Knobs::parse(&headers(&[
            ("x-mock-tokens", "5"),
            ("x-mock-status", "503"),
            ("x-mock-no-usage", "1"),
            ("x-mock-hang", "0"),
            ("x-mock-ttft-ms", "20"),
        ]))
        .unwrap();
        assert_eq!(k.tokens, Some(5));
        assert_eq!(k.status, Some(StatusCode::SERVICE_UNAVAILABLE));
        assert!(k.no_usage);
        assert!(!k.hang);
        assert_eq!(k.ttft, Duration::from_millis(20));
    }

    #[test]
    fn rejects_garbage() {
        assert!(Knobs::parse(&headers(&[("x-mock-tokens", "many")])).is_err());
        assert!(Knobs::parse(&headers(&[("x-mock-status", "42")])).is_err());
        assert!(Knobs::parse(&headers(&[("x-mock-split", "0")])).is_err());
    }
}

/// Returned as a body (or service) error to make hyper drop the connection
/// without finishing the response: that is how the abort knob is played.
#[derive(Debug)]
pub struct Abort;

impl std::fmt::Display for Abort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("mock abort requested")
    }
}

impl std::error::Error for Abort {}
