//! One chat stream chunk read as the pieces both stream translators act on.
//!
//! Both the messages and the Responses stream turn the same chat deltas into their own
//! events; reading a chunk once, here, keeps what counts as output identical for both.
//! Only the first choice is read: neither dialect asks for more than one candidate.

use serde_json::Value;

use super::messages_response::reasoning_text;

/// One whole chat SSE frame as both translators read it.
pub enum ChatFrame {
    /// `data: [DONE]`.
    Done,
    /// An error object in place of a chunk (the chat path's error frame).
    Error(Value),
    /// A `chat.completion.chunk` or the usage frame.
    Chunk(Value),
}

/// Read a frame as `SseFramer` yields it; `None` for frames without data (comments) and data
/// that is not JSON.
pub fn read_frame(frame: &[u8]) -> Option<ChatFrame> {
    let data = tollgate::sse::data_payload(frame)?;
    let data = data.trim_ascii();
    if data == b"[DONE]" {
        return Some(ChatFrame::Done);
    }
    let v: Value = serde_json::from_slice(data).ok()?;
    Some(if v.get("error").is_some() && v.get("choices").is_none() { ChatFrame::Error(v) } else { ChatFrame::Chunk(v) })
}

#[derive(Debug, Clone, PartialEq)]
pub enum Piece<'a> {
    Reasoning(&'a str),
    Text(&'a str),
    /// A tool-call delta; `index` is the chat tool-call index within the choice.
    Tool {
        index: u64,
        id: Option<&'a str>,
        name: Option<&'a str>,
        args: Option<&'a str>,
    },
    Finish(&'a str),
    Usage(&'a Value),
}

/// The pieces of `frame` in the order they apply: reasoning, text, tool calls, finish,
/// usage. Empty strings are not output and give no piece.
pub fn pieces(frame: &Value) -> Vec<Piece<'_>> {
    let mut out = Vec::new();
    let first = frame
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|choices| choices.iter().find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0));
    if let Some(choice) = first {
        if let Some(delta) = choice.get("delta") {
            if let Some(r) = reasoning_text(delta).filter(|r| !r.is_empty()) {
                out.push(Piece::Reasoning(r));
            }
            if let Some(t) = delta.get("content").and_then(Value::as_str).filter(|t| !t.is_empty()) {
                out.push(Piece::Text(t));
            }
            let calls = delta.get("tool_calls").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]);
            for (pos, call) in calls.iter().enumerate() {
                let function = call.get("function");
                out.push(Piece::Tool {
                    index: call.get("index").and_then(Value::as_u64).unwrap_or(pos as u64),
                    id: str_of(call.get("id")),
                    name: str_of(function.and_then(|f| f.get("name"))),
                    args: str_of(function.and_then(|f| f.get("arguments"))),
                });
            }
        }
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            out.push(Piece::Finish(f));
        }
    }
    if let Some(u) = frame.get("usage").filter(|u| u.is_object()) {
        out.push(Piece::Usage(u));
    }
    out
}

fn str_of(v: Option<&Value>) -> Option<&str> {
    v.and_then(Value::as_str).filter(|s| !s.is_empty())
}
