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

/// `path` fit for a log line: a segment holding an API key's shape (`rp_` and at least eight
/// letters or digits, wherever in the segment) is replaced by `rp_[redacted]`, so a key a client
/// put in a URL (`GET /v1/models/rp_...`) is never written to a log (issue 49).
pub fn redacted_path(path: &str) -> std::borrow::Cow<'_, str> {
    if !path.contains("rp_") {
        return std::borrow::Cow::Borrowed(path);
    }
    let keyish = |seg: &str| {
        seg.match_indices("rp_").any(|(i, _)| seg[i + 3..].bytes().take_while(u8::is_ascii_alphanumeric).count() >= 8)
    };
    let parts: Vec<&str> = path.split('/').map(|seg| if keyish(seg) { "rp_[redacted]" } else { seg }).collect();
    std::borrow::Cow::Owned(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_shaped_path_segments_are_redacted() {
        let key = format!("rp_{}", "a1".repeat(20));
        assert_eq!(redacted_path(&format!("/v1/models/{key}")), "/v1/models/rp_[redacted]");
        assert_eq!(redacted_path(&format!("/v1/{key}/x/Bearer%20{key}")), "/v1/rp_[redacted]/x/rp_[redacted]");
        assert_eq!(redacted_path("/v1/models/llama-3.1-8b"), "/v1/models/llama-3.1-8b");
        assert_eq!(redacted_path("/v1/models/rp_short"), "/v1/models/rp_short", "not key-shaped");
    }

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
