//! Text helpers every layer uses: the rule for header values the spec bounds (non-blank
//! printable ASCII), and cutting what a client sent before quoting it in an error message.

/// Non-blank printable ASCII of at most `max` characters.
pub fn printable_ascii(value: &[u8], max: usize) -> bool {
    !value.is_empty()
        && value.len() <= max
        && value.iter().all(|&b| (0x20..0x7f).contains(&b))
        && value.iter().any(|&b| b != b' ')
}

/// At most `max` bytes of `s`, cut at a character boundary.
pub fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_header_rule() {
        assert!(printable_ascii(b"abc-123", 512));
        assert!(!printable_ascii(b"", 512));
        assert!(!printable_ascii(b"   ", 512));
        assert!(!printable_ascii(b"a\tb", 512));
        assert!(!printable_ascii("é".as_bytes(), 512));
        assert!(printable_ascii(&[b'a'; 512], 512));
        assert!(!printable_ascii(&[b'a'; 513], 512));
    }

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate("héllo", 2), "h", "the cut falls inside é: back to its start");
        assert_eq!(truncate("abc", 10), "abc");
    }
}
