//! Chat completions through the gateway against the mock replica: the request rewrite, the
//! response normalisation and Usage object, streaming, and every upstream failure path.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::{Value, json};

fn parse_frames(r: &Reply) -> (Vec<Value>, bool) {
    let data = r.sse_data();
    let done = data.last().is_some_and(|d| d == "[DONE]");
    let frames = data.iter().filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect();
    (frames, done)
}

#[path = "chat_proxy/requests.rs"]
mod requests;
#[path = "chat_proxy/responses.rs"]
mod responses;
#[path = "chat_proxy/streaming.rs"]
mod streaming;
#[path = "chat_proxy/upstream_failures.rs"]
mod upstream_failures;
