//! Server-Sent Events framing for streams passing through: split a byte stream that arrives
//! in arbitrary chunks into whole frames, carrying a partial frame to the next chunk.

use bytes::{Bytes, BytesMut};

/// Accumulates chunks and yields complete frames (terminator included).
#[derive(Debug, Default)]
pub struct SseFramer {
    buf: BytesMut,
}

impl SseFramer {
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete frame, ending in a blank line (`\n\n` or `\r\n\r\n`).
    pub fn next_frame(&mut self) -> Option<Bytes> {
        let end = frame_end(&self.buf)?;
        Some(self.buf.split_to(end).freeze())
    }

    /// Bytes of an unfinished frame (at end of stream).
    pub fn take_rest(&mut self) -> Bytes {
        self.buf.split().freeze()
    }

    pub fn has_partial(&self) -> bool {
        !self.buf.is_empty()
    }
}

/// Index just past the first blank line, if any.
fn frame_end(buf: &[u8]) -> Option<usize> {
    for i in memchr::memchr_iter(b'\n', buf) {
        match buf.get(i + 1) {
            Some(b'\n') => return Some(i + 2),
            Some(b'\r') if buf.get(i + 2) == Some(&b'\n') => return Some(i + 3),
            _ => {}
        }
    }
    None
}

/// The `data:` payload of a frame (several `data:` lines are joined by `\n`); `None` for a
/// frame without data (comments, bare `event:` lines).
pub fn data_payload(frame: &[u8]) -> Option<std::borrow::Cow<'_, [u8]>> {
    let mut found: Option<std::borrow::Cow<'_, [u8]>> = None;
    for line in lines(frame) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(rest) = line.strip_prefix(b"data:") else {
            continue;
        };
        let rest = rest.strip_prefix(b" ").unwrap_or(rest);
        found = Some(match found {
            None => std::borrow::Cow::Borrowed(rest),
            Some(prev) => {
                let mut v = prev.into_owned();
                v.push(b'\n');
                v.extend_from_slice(rest);
                std::borrow::Cow::Owned(v)
            }
        });
    }
    found
}

/// The `\n`-separated lines of `frame`, as `split` gives them (the text after the last `\n`
/// included), found with `memchr` rather than a test of every byte: every stream frame is
/// split this way.
fn lines(frame: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(frame);
    std::iter::from_fn(move || {
        let text = rest?;
        match memchr::memchr(b'\n', text) {
            Some(i) => {
                rest = Some(&text[i + 1..]);
                Some(&text[..i])
            }
            None => rest.take(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frames_of(chunks: &[&[u8]]) -> Vec<Bytes> {
        let mut f = SseFramer::default();
        let mut out = Vec::new();
        for c in chunks {
            f.push(c);
            while let Some(fr) = f.next_frame() {
                out.push(fr);
            }
        }
        out
    }

    #[test]
    fn frames_split_across_chunks_come_out_whole() {
        let out = frames_of(&[b"data: {\"a\"", b":1}\n", b"\ndata: [DONE]\n\n"]);
        assert_eq!(out, vec![Bytes::from("data: {\"a\":1}\n\n"), Bytes::from("data: [DONE]\n\n")]);
    }

    #[test]
    fn crlf_terminators_are_frames_too() {
        let out = frames_of(&[b"data: x\r\n\r\ndata: y\n\n"]);
        assert_eq!(out.len(), 2);
        assert_eq!(data_payload(&out[0]).as_deref(), Some(&b"x"[..]));
    }

    #[test]
    fn multi_line_data_is_joined_and_comments_have_none() {
        assert_eq!(data_payload(b"data: a\ndata: b\n\n").as_deref(), Some(&b"a\nb"[..]));
        assert_eq!(data_payload(b": keepalive\n\n"), None);
        assert_eq!(data_payload(b"event: ping\ndata:{}\n\n").as_deref(), Some(&b"{}"[..]));
    }

    proptest! {
        #[test]
        fn lines_are_the_lines_split_gives(text in proptest::collection::vec(
            prop_oneof![Just(b'\n'), Just(b'\r'), Just(b'd'), Just(b':'), Just(b' '), any::<u8>()], 0..64)) {
            let by_split: Vec<&[u8]> = text.split(|&b| b == b'\n').collect();
            prop_assert_eq!(lines(&text).collect::<Vec<_>>(), by_split);
        }

        #[test]
        fn any_chunking_gives_the_same_frames(cuts in proptest::collection::vec(0usize..200, 0..12)) {
            let stream: &[u8] = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"usage\":{}}\r\n\r\ndata: [DONE]\n\n";
            let mut points: Vec<usize> = cuts.into_iter().map(|c| c % stream.len()).collect();
            points.sort_unstable();
            let mut chunks = Vec::new();
            let mut last = 0;
            for p in points { chunks.push(&stream[last..p]); last = p; }
            chunks.push(&stream[last..]);
            let whole = frames_of(&[stream]);
            prop_assert_eq!(frames_of(&chunks), whole);
        }
    }
}
