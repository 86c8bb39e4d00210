//! Shared by the request targets: the fuzz catalog, loaded once, and the rule every request
//! parser must keep: bad input is a catalogued 4xx, never a panic and never a 5xx.
#![allow(dead_code)]

use std::path::Path;
use std::sync::{Arc, OnceLock};

use tollgate::config::Config;
use tollgate::http::error::GatewayError;

pub fn config() -> &'static Arc<Config> {
    static CONFIG: OnceLock<Arc<Config>> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/tollgate.yaml");
        match tollgate::config::load(&path) {
            Ok(c) => Arc::new(c),
            Err(e) => panic!("fuzz config: {e}"),
        }
    })
}

/// The first byte picks the model (image-capable or text-only); the rest is the body.
pub fn split(data: &[u8]) -> Option<(&'static str, serde_json::Value)> {
    let (&pick, body) = data.split_first()?;
    let model = if pick % 2 == 0 { "fuzz-model" } else { "text-model" };
    serde_json::from_slice(body).ok().map(|v| (model, v))
}

pub fn assert_client_error(e: &GatewayError) {
    assert!((400..500).contains(&e.status()), "bad input gave {} {}: {}", e.status(), e.kind.code(), e.message);
}
