//! The Responses adapter's request translation on any JSON body.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use tollgate_plugins::dialects::responses_to_chat;

fuzz_target!(|data: &[u8]| {
    let Some((model, body)) = common::split(data) else { return };
    let Some(entry) = common::config().catalog.get(model) else { return };
    if let Err(e) = responses_to_chat(&body, entry) {
        common::assert_client_error(&e);
    }
});
