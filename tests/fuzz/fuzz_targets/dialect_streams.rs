//! Replica stream bytes through the chat path's one response pipeline, on the chat route and
//! with the messages and Responses translators registered: never a panic, and a stream that
//! ends always ends once (`[DONE]`/`message_stop`/`response.completed`, or one error).
#![no_main]

mod common;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use tollgate::proxy::ctx::{Placement, RequestCtx};
use tollgate_plugins::dialects::{MessagesStream, ResponsesStream};
use tollgate_plugins::shared::answer::{AnswerTranslator, Translation};

fn ctx(translator: Option<Box<dyn AnswerTranslator>>) -> RequestCtx {
    let config = common::config();
    let mut cx = RequestCtx::new(config.clone());
    cx.route = Some(tollgate::http::routes::Route::ChatCompletions);
    if let (Some(model), Some(pool)) = (config.catalog.get("fuzz-model"), config.pools.get("fuzz-model")) {
        cx.placement = Some(Placement::new(model.clone(), pool.clone()));
    }
    if let Some(t) = translator {
        cx.ext.insert(Translation(t));
    }
    cx.logged = true;
    cx
}

fuzz_target!(|data: &[u8]| {
    // The first byte cuts the input into two chunks (any chunking must work).
    let Some((&cut, data)) = data.split_first() else { return };
    let cut = usize::from(cut).min(data.len());
    let translators: [Option<Box<dyn AnswerTranslator>>; 3] = [
        None,
        Some(Box::new(MessagesStream::new("fuzz-model", b"fuzz signing key 0123456789abcdef"))),
        Some(Box::new(ResponsesStream::new("fuzz-model"))),
    ];
    for t in translators {
        let mut cx = ctx(t);
        let mut first = Some(Bytes::copy_from_slice(&data[..cut]));
        tollgate_plugins::chat::on_stream_chunk(&mut first, false, &mut cx);
        let mut rest = Some(Bytes::copy_from_slice(&data[cut..]));
        tollgate_plugins::chat::on_stream_chunk(&mut rest, true, &mut cx);
        assert!(cx.response.saw_done, "a stream that ended was not closed");
    }
});
