//! Inline image checks shared by the dialect translators and the chat path (spec rule 8,
//! "Limits").
//!
//! The chat path would check the translated parts too, but it would name chat positions;
//! checking here names the dialect's own block (clarification 15).

use tollgate::http::error::GatewayError;

/// Images per request (spec "Limits": 8, chat dialect), applied to both dialects.
pub const MAX_IMAGES: usize = 8;
pub const MEDIA_TYPES: &[&str] = &["image/png", "image/jpeg", "image/gif", "image/webp"];

/// Images seen so far in one request.
#[derive(Debug, Default)]
pub struct ImageCount(usize);

impl ImageCount {
    /// Count one more image, refusing the one past the limit by its `param`.
    pub fn take(&mut self, param: &str) -> Result<(), GatewayError> {
        self.0 += 1;
        if self.0 > MAX_IMAGES {
            return Err(GatewayError::invalid_request(
                param,
                format!("At most {MAX_IMAGES} images are accepted per request; `{param}` is one too many."),
            ));
        }
        Ok(())
    }
}

/// Standard base64 with padding, as inline images carry it (no whitespace, no URL-safe
/// alphabet): a truncated upload fails here, before generation.
pub fn is_base64(s: &str) -> bool {
    let body = s.trim_end_matches('=');
    !s.is_empty()
        && s.len() % 4 == 0
        && s.len() - body.len() <= 2
        && body.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
}

/// The media type and data of `data:<media>;base64,<data>`, when the media type is one of
/// [`MEDIA_TYPES`] and the data is complete base64.
pub fn parse_data_url(url: &str) -> Option<(&str, &str)> {
    let (media, data) = url.strip_prefix("data:")?.split_once(";base64,")?;
    (MEDIA_TYPES.contains(&media) && is_base64(data)).then_some((media, data))
}

/// Whether decoded image bytes are a whole image of `media` (one of [`MEDIA_TYPES`]): the
/// format's signature opens it and its end marker closes it, so a truncated upload that
/// still decodes as base64 is refused before generation (decisions.md 61).
pub fn is_complete_image(media: &str, bytes: &[u8]) -> bool {
    match media {
        "image/png" => {
            bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() >= 20 && bytes.ends_with(b"IEND\xaeB`\x82")
        }
        "image/jpeg" => {
            // Encoders may pad after the end-of-image marker; zero bytes are skipped.
            let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
            bytes.starts_with(b"\xff\xd8\xff") && end >= 4 && bytes[..end].ends_with(b"\xff\xd9")
        }
        "image/gif" => (bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a")) && bytes.ends_with(b";"),
        "image/webp" => {
            let declared = bytes.get(4..8).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize);
            bytes.starts_with(b"RIFF")
                && bytes.get(8..12) == Some(b"WEBP")
                && declared.is_some_and(|d| d.saturating_add(8) <= bytes.len())
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_checked_by_signature_and_end_marker() {
        let png = [b"\x89PNG\r\n\x1a\n".as_slice(), &[0u8; 16], b"\0\0\0\0IEND\xaeB`\x82"].concat();
        assert!(is_complete_image("image/png", &png));
        assert!(!is_complete_image("image/png", &png[..png.len() - 3]), "truncated");
        assert!(!is_complete_image("image/jpeg", &png), "declared type must match");
        assert!(is_complete_image("image/jpeg", b"\xff\xd8\xff\xe0abc\xff\xd9\0\0"));
        assert!(!is_complete_image("image/jpeg", b"\xff\xd8\xff\xe0abc"));
        assert!(is_complete_image("image/gif", b"GIF89a...;"));
        assert!(!is_complete_image("image/gif", b"GIF89a..."));
        let webp = [b"RIFF".as_slice(), &8u32.to_le_bytes(), b"WEBPVP8 "].concat();
        assert!(is_complete_image("image/webp", &webp));
        assert!(!is_complete_image("image/webp", &webp[..14]));
        assert!(!is_complete_image("image/bmp", b"BM"));
    }
}
