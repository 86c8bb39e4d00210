//! A bare Pingora proxy: what any gateway on Pingora 0.9 pays before doing its own work.
//!
//! `scripts/bench.py` runs it beside nginx and tollgate, with the same settings as the
//! gateway (one thread, a keep-alive pool to one upstream):
//!
//! - `--mode pass`: `upstream_peer` and nothing else; Pingora streams the request through.
//! - `--mode replay`: also reads the whole request body in `request_filter` and forwards it
//!   through tollgate's body replay (`tollgate::transport::body_replay`), unchanged: what a gateway that
//!   routes on the body's `model` pays on Pingora 0.9 (pingora notes, section 2). tollgate
//!   pays it only on a connection's first request and on bodies over 64 KiB (decision 192).
//!
//! Usage: `tollgate-bench-floor --listen 127.0.0.1:19314 --upstream 127.0.0.1:19310 [--mode pass|replay]`

#![forbid(unsafe_code)]
use async_trait::async_trait;
use bytes::BytesMut;
use pingora::prelude::*;
use pingora::server::configuration::ServerConf;
use tollgate::transport::body_replay::replace_request_body;
use tollgate::transport::held_output::OutputHold;

/// The same allocator as the `tollgate` binary (decisions 137 and 201), so the floor differs
/// from the gateway only by the gateway's work.
#[global_allocator]
static ALLOCATOR: tollgate_allocator::Allocator = tollgate_allocator::Allocator;

struct Floor {
    upstream: String,
    replay: bool,
}

#[async_trait]
impl ProxyHttp for Floor {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn request_filter(&self, session: &mut Session, _cx: &mut ()) -> Result<bool> {
        if !self.replay {
            return Ok(false);
        }
        let keepalive = session.get_keepalive();
        let mut body = BytesMut::new();
        while let Some(chunk) = session.read_request_body().await? {
            body.extend_from_slice(&chunk);
        }
        let hold = OutputHold::default();
        replace_request_body(
            &mut session.downstream_session,
            body.freeze(),
            keepalive,
            &hold,
            std::time::Duration::from_secs(60), // the gateway's default stalled_reader_seconds
        )
        .await?;
        Ok(false)
    }

    async fn upstream_peer(&self, _session: &mut Session, _cx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.upstream.as_str(), false, String::new())))
    }
}

fn main() {
    let mut listen = String::from("127.0.0.1:19314");
    let mut upstream = String::from("127.0.0.1:19310");
    let mut replay = false;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_default();
        match flag.as_str() {
            "--listen" => listen = value,
            "--upstream" => upstream = value,
            "--mode" if value == "pass" || value == "replay" => replay = value == "replay",
            _ => {
                eprintln!("usage: tollgate-bench-floor --listen ADDR --upstream ADDR [--mode pass|replay]");
                std::process::exit(2);
            }
        }
    }
    // As the gateway runs with `threads: 1`: one runtime without work stealing (decision 198).
    let conf = ServerConf { threads: 1, work_stealing: false, ..ServerConf::default() };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut proxy = http_proxy_service(&server.configuration, Floor { upstream, replay });
    proxy.add_tcp(&listen);
    server.add_service(proxy);
    server.run_forever()
}
