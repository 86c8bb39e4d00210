//! The SSE framer on any bytes split anywhere: frames plus the rest give back the input
//! exactly, every frame ends in a blank line, and reading `data:` never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate::http::sse::{SseFramer, data_payload};

fuzz_target!(|data: &[u8]| {
    let Some((&cut, bytes)) = data.split_first() else { return };
    let step = usize::from(cut).max(1);
    let mut framer = SseFramer::default();
    let mut out = Vec::with_capacity(bytes.len());
    for chunk in bytes.chunks(step) {
        framer.push(chunk);
        while let Some(frame) = framer.next_frame() {
            assert!(frame.ends_with(b"\n\n") || frame.ends_with(b"\r\n\r\n") || frame.ends_with(b"\n\r\n"));
            let _ = data_payload(&frame);
            out.extend_from_slice(&frame);
        }
    }
    out.extend_from_slice(&framer.take_rest());
    assert_eq!(out, bytes, "framing loses or invents no byte");
});
