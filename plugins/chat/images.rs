//! Rule 8: content parts. On image models `image_url` and `input_image` parts must be inline
//! data URLs of a whole png, jpeg, webp or gif image, at most 8 a request; anything else that
//! is not text (audio, video, files, images on a text-only model) is refused, never stripped.

use base64::Engine;
use serde_json::Value;

use crate::shared::images::{ImageCount, MEDIA_TYPES, is_complete_image};
use tollgate::http::error::{ErrorKind, GatewayError};

const TEXT_PARTS: &[&str] = &["text", "refusal"];

fn not_supported(param: &str, message: String) -> GatewayError {
    GatewayError::new(ErrorKind::HostedParameterNotSupported, message).with_param(param)
}

/// Check every content part of `messages` (already shape-checked by `messages::check`).
pub fn check(messages: &[Value], image_input: bool) -> Result<(), GatewayError> {
    let mut count = ImageCount::default();
    for (i, m) in messages.iter().enumerate() {
        let Some(parts) = m.get("content").and_then(Value::as_array) else { continue };
        for (j, part) in parts.iter().enumerate() {
            let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
            if TEXT_PARTS.contains(&kind) {
                continue;
            }
            let param = format!("messages[{i}].content[{j}]");
            let is_image = kind == "image_url" || kind == "input_image";
            if !is_image || !image_input {
                let what = if is_image { "image input" } else { "this kind of content" };
                let kind = tollgate::http::text::truncate(kind, 64);
                return Err(not_supported(
                    "messages",
                    format!(
                        "This model does not accept {what}: `{kind}` part at {param}; such parts are not stripped."
                    ),
                ));
            }
            count.take(&param)?;
            check_image(image_url(part), &param)?;
        }
    }
    Ok(())
}

/// The URL of an `image_url` part (`{url}` object or string) or `input_image` part (string).
fn image_url(part: &Value) -> Option<&str> {
    let v = part.get("image_url")?;
    v.as_str().or_else(|| v.get("url")?.as_str())
}

fn check_image(url: Option<&str>, param: &str) -> Result<(), GatewayError> {
    let Some(url) = url else {
        return Err(not_supported(param, format!("`{param}` carries no inline image; send a data URL.")));
    };
    let Some(rest) = url.strip_prefix("data:") else {
        // Clarification 15: remote URLs (and file ids) are never fetched.
        return Err(not_supported(
            param,
            format!("Remote images are not fetched; send `{param}` inline as a data URL (png, jpeg, webp, gif)."),
        ));
    };
    let invalid = |why: &str| GatewayError::invalid_request(param, format!("The image at `{param}` {why}."));
    let Some((media, data)) = rest.split_once(";base64,") else {
        return Err(invalid("is not a base64 data URL"));
    };
    if !MEDIA_TYPES.contains(&media) {
        return Err(invalid("must be image/png, image/jpeg, image/webp or image/gif"));
    }
    let bytes =
        base64::engine::general_purpose::STANDARD.decode(data).map_err(|_| invalid("is not complete base64"))?;
    if !is_complete_image(media, &bytes) {
        return Err(invalid(&format!("is not a complete {media} image")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A 1x1 PNG.
    pub const PNG: &str =
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

    fn with_part(part: Value) -> Vec<Value> {
        vec![
            json!({"role": "user", "content": "a"}),
            json!({"role": "user", "content": [{"type": "text", "text": "t"}, part]}),
        ]
    }

    fn refusal(r: Result<(), GatewayError>) -> Option<(&'static str, String)> {
        r.err().map(|e| (e.kind.code(), e.param.unwrap_or_default()))
    }

    #[test]
    fn inline_images_pass_on_image_models() {
        let url = format!("data:image/png;base64,{PNG}");
        assert!(check(&with_part(json!({"type": "image_url", "image_url": {"url": url}})), true).is_ok());
        assert!(check(&with_part(json!({"type": "input_image", "image_url": url})), true).is_ok());
    }

    #[test]
    fn bad_images_name_the_part() {
        let at = "messages[1].content[1]".to_string();
        let remote = json!({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}});
        assert_eq!(refusal(check(&with_part(remote), true)), Some(("hosted_parameter_not_supported", at.clone())));
        let truncated = format!("data:image/png;base64,{}", &PNG[..PNG.len() - 8]);
        let part = json!({"type": "image_url", "image_url": {"url": truncated}});
        assert_eq!(refusal(check(&with_part(part), true)), Some(("invalid_request", at.clone())));
        let wrong_type = format!("data:image/gif;base64,{PNG}");
        let part = json!({"type": "image_url", "image_url": {"url": wrong_type}});
        assert_eq!(refusal(check(&with_part(part), true)), Some(("invalid_request", at.clone())));
        let bmp = json!({"type": "image_url", "image_url": {"url": "data:image/bmp;base64,Qk0="}});
        assert_eq!(refusal(check(&with_part(bmp), true)), Some(("invalid_request", at)));
    }

    #[test]
    fn a_ninth_image_is_refused() {
        let url = format!("data:image/png;base64,{PNG}");
        let parts: Vec<Value> = (0..9).map(|_| json!({"type": "image_url", "image_url": {"url": url}})).collect();
        let msgs = vec![json!({"role": "user", "content": parts})];
        assert_eq!(refusal(check(&msgs, true)), Some(("invalid_request", "messages[0].content[8]".into())));
        assert!(check(&msgs[..], true).is_err());
    }

    #[test]
    fn non_text_parts_are_refused_with_param_messages() {
        let url = format!("data:image/png;base64,{PNG}");
        let image = json!({"type": "image_url", "image_url": {"url": url}});
        let expected = Some(("hosted_parameter_not_supported", "messages".to_string()));
        assert_eq!(refusal(check(&with_part(image), false)), expected);
        for part in
            [json!({"type": "input_audio", "input_audio": {}}), json!({"type": "video_url"}), json!({"type": "file"})]
        {
            assert_eq!(refusal(check(&with_part(part.clone()), true)), expected, "{part}");
        }
    }
}
