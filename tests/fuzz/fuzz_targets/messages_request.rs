//! The messages-dialect request translation (and count_tokens) on any JSON body.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use tollgate_plugins::dialects::{Purpose, to_chat};

fuzz_target!(|data: &[u8]| {
    let Some((model, body)) = common::split(data) else { return };
    let Some(entry) = common::config().catalog.get(model) else { return };
    for purpose in [Purpose::Generate, Purpose::CountTokens] {
        if let Err(e) = to_chat(&body, entry, purpose) {
            common::assert_client_error(&e);
        }
    }
});
