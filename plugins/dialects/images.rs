//! The inline image checks live in `plugins/shared/images.rs` (the chat path uses them too).

pub use crate::shared::images::{ImageCount, MEDIA_TYPES, is_base64, parse_data_url};
