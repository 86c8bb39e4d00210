//! The messages and Responses stream translators on any upstream frames: never a panic.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use tollgate_plugins::dialects::{MessagesStream, ResponsesStream};
use tollgate::sse::SseFramer;

fuzz_target!(|data: &[u8]| {
    let mut framer = SseFramer::default();
    framer.push(data);
    let mut messages = MessagesStream::new("fuzz-model", b"fuzz signing key 0123456789abcdef");
    let mut responses = ResponsesStream::new("fuzz-model");
    let mut out = BytesMut::new();
    while let Some(frame) = framer.next_frame() {
        messages.on_sse_frame(&frame, &mut out);
        responses.on_sse_frame(&frame, &mut out);
    }
});
