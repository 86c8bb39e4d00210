//! Rate limit layers through the gateway (spec "Limits", "Rate limit layers", 429/503 codes,
//! "Retry rules"), on the embedded in-process limiter. The Redis-backed runs (two instances,
//! outage, killed instance) are in `tests/limits_redis.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Gateway, Mock, Opts, Reply, chat_body};
use serde_json::json;

fn with_limits(lines: &str) -> Opts {
    Opts { limits: Some(lines.to_string()), ..Opts::default() }
}

fn slow_chat(model: &str) -> serde_json::Value {
    chat_body(model, false)
}

const SLOW: [(&str, &str); 1] = [("x-mock-ttft-ms", "1500")];

fn retry_after(r: &Reply) -> (u64, u64) {
    let s: u64 = r.header("retry-after").expect("Retry-After").parse().unwrap();
    let ms: u64 = r.header("retry-after-ms").expect("Retry-After-Ms").parse().unwrap();
    assert!(s >= 1 && s == ms.div_ceil(1000), "Retry-After {s} is Retry-After-Ms {ms} rounded up");
    (s, ms)
}

#[path = "limits/concurrency.rs"]
mod concurrency;
#[path = "limits/request_windows.rs"]
mod request_windows;
#[path = "limits/surface.rs"]
mod surface;
