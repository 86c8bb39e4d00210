//! The chat-completions request rewrite on any JSON body.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use tollgate::ctx::RequestCtx;
use tollgate::routes::Route;

fuzz_target!(|data: &[u8]| {
    let Some((model, body)) = common::split(data) else { return };
    if !body.is_object() {
        return; // the core answers 400 invalid_json before any plugin (src/request.rs)
    }
    let config = common::config();
    let mut cx = RequestCtx::new(config.clone());
    cx.logged = true; // dropped by the fuzzer, not by a shutdown
    cx.route = Some(Route::ChatCompletions);
    cx.model = config.catalog.get(model).cloned();
    cx.pool = config.pools.get(model).cloned();
    cx.body = Some(body);
    if let Err(e) = tollgate_plugins::chat::rewrite_request(&mut cx) {
        common::assert_client_error(&e);
    }
});
