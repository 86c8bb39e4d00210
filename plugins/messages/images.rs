//! Inline image checks shared by both request translators (spec rule 8, "Limits").
//!
//! The chat path would check the translated parts too, but it would name chat positions;
//! checking here names the dialect's own block (clarification 15).

use crate::error::GatewayError;

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
