//! Authentication through the running gateway, on every route class, and the admin API's
//! own rules (token, validation, key operations), on SQLite and on PostgreSQL.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::{Value, json};

const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/messages"),
    ("GET", "/v1/models"),
    ("GET", "/v1/credits"),
    ("GET", "/v1/usage"),
];

async fn call(gw: &Gateway, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    if method == "GET" {
        gw.get_as(path, headers).await
    } else {
        gw.post_as(path, &chat_body("chat-model", false), headers).await
    }
}

/// (status, code or messages type) of an error reply, whichever envelope it is in.
fn outcome(r: &Reply) -> (u16, String, String) {
    let v = r.json();
    let code = v["error"]["code"].as_str().unwrap_or("").to_string();
    let message = v["error"]["message"].as_str().unwrap_or("").to_string();
    (r.status, code, message)
}

#[path = "auth/admin_api.rs"]
mod admin_api;
#[path = "auth/keys.rs"]
mod keys;
