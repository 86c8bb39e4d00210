//! The body replay (`src/transport/body_replay.rs`) on any request head: header sets, `Connection`
//! options, HTTP/1.0 and 1.1, `Expect`, chunked and `Content-Length` framing, pipelined bytes.
//! Whatever the client sent, a head Pingora accepts is rebuilt without a panic, and after the
//! rebuild the session reads: the same request line, the client's keepalive choice, and the
//! new body. A failed rebuild leaves a session whose header can still be read.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use pingora::protocols::http::ServerSession;
use tollgate::transport::body_replay::replace_request_body;
use tollgate::transport::held_output::OutputHold;

/// Body bytes read from `s`, at most 64 KiB.
async fn read_body(s: &mut ServerSession) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    while let Ok(Some(chunk)) = s.read_request_body().await {
        out.extend_from_slice(&chunk);
        if out.len() > 65_536 {
            return None;
        }
    }
    Some(out)
}

async fn run(data: &[u8]) {
    let mut s = Box::new(ServerSession::new_http1(Box::new(std::io::Cursor::new(data.to_vec()))));
    if !matches!(s.read_request().await, Ok(true)) {
        return; // Pingora refuses the head itself (a 400 before any phase runs)
    }
    let Some(_) = read_body(&mut s).await else { return };
    let before = s.req_header().clone();
    let keepalive = s.get_keepalive();
    let new_body = Bytes::from_static(b"{\"model\":\"m\",\"replayed\":true}");
    let hold = OutputHold::default();
    let stall = std::time::Duration::from_secs(60);
    match replace_request_body(&mut s, new_body.clone(), keepalive, &hold, stall).await {
        Ok(()) => {
            let after = s.req_header();
            assert_eq!(after.method, before.method);
            assert_eq!(after.raw_path(), before.raw_path(), "the request target as the client sent it");
            assert_eq!(after.version, before.version);
            assert_eq!(s.get_keepalive().is_some(), keepalive.is_some(), "the client's keepalive choice is kept");
            assert_eq!(read_body(&mut s).await.as_deref(), Some(&new_body[..]), "the new body is what is read");
        }
        Err(_) => {
            let _ = s.req_header(); // the stand-in has a header
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
    if let Ok(rt) = rt {
        rt.block_on(run(data));
    }
});
