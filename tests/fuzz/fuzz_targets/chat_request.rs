//! The chat-completions request rewrite on any JSON body.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use tollgate::proxy::ctx::RequestCtx;
use tollgate::http::routes::Route;

fuzz_target!(|data: &[u8]| {
    let Some((model, body)) = common::split(data) else { return };
    if !body.is_object() {
        return; // the core answers 400 invalid_json before any plugin (src/http/request.rs)
    }
    let config = common::config();
    let mut cx = RequestCtx::new(config.clone());
    cx.logged = true; // dropped by the fuzzer, not by a shutdown
    cx.route = Some(Route::ChatCompletions);
    if let (Some(model), Some(pool)) = (config.catalog.get(model).cloned(), config.pools.get(model).cloned()) {
        cx.placement = Some(tollgate::proxy::ctx::Placement::new(model, pool));
    }
    cx.body = Some(body);
    if let Err(e) = tollgate_plugins::chat::rewrite_request(&mut cx) {
        common::assert_client_error(&e);
    }
});
