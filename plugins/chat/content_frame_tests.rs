//! The content-frame pattern (`content_frame.rs`): which frames it takes, and that a stream
//! read with it gives the same output and ends in the same state as the plain `Value`
//! reference (`pipeline_reference.rs`), whatever the content strings hold.
use bytes::BytesMut;
use proptest::prelude::*;

use super::content_frame::ContentFrame;
use super::edits::Edits;
use super::pipeline_reference as reference;
use super::pipeline_tests::translated;
use super::pipeline_tests::{UP, ctx, json, state, without_nulls};
use super::stream::{on_frame, on_frame_in_full};
use crate::shared::answer::AnswerView;
use tollgate::http::sse::data_payload;

/// The texts around a content string that replicas write (vLLM's and SGLang's member
/// orders, a `null` reasoning member, a usage `null`, white space).
const SHAPES: [(&str, &str); 4] = [
    (
        r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"UP","choices":[{"index":0,"delta":{"content":"#,
        r#"},"logprobs":null,"finish_reason":null}]}"#,
    ),
    (
        r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"UP","choices":[{"index":0,"delta":{"role":null,"content":"#,
        r#","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}"#,
    ),
    (r#"{ "choices" : [ { "index" : 2 , "delta" : { "content" : "#, r#" } } ] , "model" : "UP" }"#),
    (r#"{"model":"other","choices":[{"delta":{"content":"#, r#"}}]}"#),
];

fn payload(shape: usize, content: &[u8]) -> Vec<u8> {
    let (before, after) = SHAPES[shape % SHAPES.len()];
    let mut p = before.replace("UP", UP).into_bytes();
    p.extend_from_slice(content);
    p.extend_from_slice(after.replace("UP", UP).as_bytes());
    p
}

fn frame(payload: &[u8]) -> Vec<u8> {
    [&b"data: "[..], payload, b"\n\n"].concat()
}

/// The pattern of a payload, as the stream records it.
fn pattern_of(payload: &[u8]) -> Option<ContentFrame> {
    let view = AnswerView::parse(payload)?;
    let mut edits = Edits::new(payload);
    if let Some(model) = view.model.0.filter(|m| m.get().contains(UP)) {
        edits.replace_value(model, &b"\"llama-3.1-8b-instruct\""[..])?;
    }
    ContentFrame::record(&view, &edits)
}

#[test]
fn only_a_plain_string_in_the_same_text_takes_the_pattern() {
    let first = payload(0, br#""tok0 ""#);
    let p = pattern_of(&first).expect("a plain content frame has a pattern");
    let takes = |data: &[u8]| {
        let mut cx = ctx();
        cx.response.answered = vec![false];
        p.forward(&frame(data), data, &mut cx, &mut BytesMut::new())
    };
    assert!(takes(&payload(0, br#""tok1 ""#)));
    assert!(takes(&payload(0, "\"é ✓\"".as_bytes())));
    assert!(takes(&payload(0, br#""""#)));
    // Something to unescape, a bare quote or control character, bytes that are not UTF-8,
    // another value, other text around it: the full path.
    for content in [&br#""a\"b""#[..], br#""a\nb""#, b"\"a\"b\"", b"\"a\tb\"", b"\"a\xffb\"", b"1", b"null"] {
        assert!(!takes(&payload(0, content)), "{}", String::from_utf8_lossy(content));
    }
    assert!(!takes(&payload(1, br#""tok1 ""#)));
    // Frames a pattern is not made from.
    for text in [
        payload(0, br#""a\"b""#),
        br#"{"choices":[{"delta":{"content":"a"},"finish_reason":"stop"}]}"#.to_vec(),
        br#"{"choices":[{"delta":{"content":"a","reasoning_content":"r"}}]}"#.to_vec(),
        br#"{"choices":[{"delta":{"content":"a"}},{"delta":{"content":"b"}}]}"#.to_vec(),
        br#"{"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":1}}"#.to_vec(),
    ] {
        assert!(pattern_of(&text).is_none(), "{}", String::from_utf8_lossy(&text));
    }
}

/// `text` with the ids a translator draws at random (`msg_` and 32 hex digits, when a chunk
/// has no `id`) written `_ID`.
fn without_ids(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('_') {
        out.push_str(&rest[..=i]);
        rest = &rest[i + 1..];
        let hex = rest.bytes().take_while(u8::is_ascii_hexdigit).count();
        if hex >= 24 {
            out.push_str("ID");
            rest = &rest[hex..];
        }
    }
    out.push_str(rest);
    out
}

/// A content string's bytes: plain text, escapes, and what makes a frame invalid JSON (a
/// bare quote, a control character, bytes that are not UTF-8).
fn piece() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => Just(b"tok ".to_vec()),
        2 => Just("é✓".as_bytes().to_vec()),
        1 => Just(br#"\""#.to_vec()),
        1 => Just(br#"\u00e9"#.to_vec()),
        1 => Just(br#"\"#.to_vec()),
        1 => Just(b"\"".to_vec()),
        1 => Just(b"\t".to_vec()),
        1 => Just(vec![0xc3]),
    ]
}

proptest! {
    /// Streams of content frames in a few shapes, with any content strings, valid or not:
    /// each frame's output and the request's end state are the reference's.
    #[test]
    fn content_frames_read_with_the_pattern_match_the_reference(
        frames in proptest::collection::vec((0usize..4, proptest::collection::vec(piece(), 0..4)), 1..12),
    ) {
        let (mut cx, mut reference_cx) = (ctx(), ctx());
        for (shape, pieces) in &frames {
            let content = [&b"\""[..], &pieces.concat(), b"\""].concat();
            let frame = frame(&payload(*shape, &content));
            let (mut out, mut expected) = (BytesMut::new(), BytesMut::new());
            on_frame(&frame, &mut cx, &mut out);
            let data = data_payload(&frame).map(|d| d.into_owned()).unwrap_or_default();
            reference::frame(&frame, &data, &mut reference_cx, &mut expected);
            let value = |b: &BytesMut| {
                (!b.is_empty()).then(|| {
                    let mut v = without_nulls(json(&b[6..b.len() - 2]));
                    if let Some(e) = v.get_mut("error").and_then(serde_json::Value::as_object_mut) {
                        e.remove("request_id"); // differs between two contexts
                    }
                    v
                })
            };
            prop_assert_eq!(value(&out), value(&expected), "{}", String::from_utf8_lossy(&frame));
            if cx.response.saw_done {
                break; // an error frame ended the stream (the reference does not stop by itself)
            }
        }
        prop_assert_eq!(state(&cx), state(&reference_cx));
    }

    /// The same streams on the chat route and through both translators: with the pattern,
    /// byte for byte what reading every frame in full gives.
    #[test]
    fn the_pattern_changes_no_byte_of_any_dialect(
        frames in proptest::collection::vec((0usize..4, proptest::collection::vec(piece(), 0..4)), 1..12),
        which in 0u8..3,
    ) {
        let (mut cx, mut full_cx) = (translated(which), translated(which));
        let (mut out, mut expected) = (Vec::new(), Vec::new());
        for (shape, pieces) in &frames {
            let content = [&b"\""[..], &pieces.concat(), b"\""].concat();
            let frame = frame(&payload(*shape, &content));
            let (mut a, mut b) = (BytesMut::new(), BytesMut::new());
            on_frame(&frame, &mut cx, &mut a);
            on_frame_in_full(&frame, &mut full_cx, &mut b);
            out.extend_from_slice(&a);
            expected.extend_from_slice(&b);
        }
        let text = without_ids(&String::from_utf8_lossy(&out).replace(&cx.request_id, "REQ"));
        let full = without_ids(&String::from_utf8_lossy(&expected).replace(&full_cx.request_id, "REQ"));
        prop_assert_eq!(text, full);
        prop_assert_eq!(state(&cx), state(&full_cx));
    }
}
