//! The access log: one line per finished request, as text (the default, through `log`) or as
//! one JSON object (`access_log.format: json`). JSON lines are handed to a writer thread
//! through a bounded queue and written in batches to stderr, so a request never waits on the
//! log: when the queue is full the line is dropped and counted
//! (`tollgate_access_log_dropped_total`). Key ids and workspace ids are logged, never a key,
//! a session identity or a prompt.

use std::io::Write;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{LazyLock, OnceLock};

use serde::Serialize;

use crate::proxy::ctx::RequestCtx;

/// Lines waiting for the writer at most.
const QUEUE: usize = 65_536;

static SENDER: OnceLock<Option<SyncSender<String>>> = OnceLock::new();

static DROPPED: LazyLock<Option<prometheus::IntCounter>> = LazyLock::new(|| {
    prometheus::register_int_counter!("tollgate_access_log_dropped_total", "Access log lines dropped (queue full)").ok()
});

/// How long the writer lets lines gather after a burst: one write (and one wake-up of this
/// thread) per burst instead of per request (stderr itself is unbuffered).
const GATHER: std::time::Duration = std::time::Duration::from_millis(5);

fn writer(rx: Receiver<String>) {
    let mut out = std::io::BufWriter::with_capacity(256 * 1024, std::io::stderr());
    while let Ok(first) = rx.recv() {
        let _ = writeln!(out, "{first}");
        // Whatever queued meanwhile goes out in the same write burst.
        while let Ok(line) = rx.try_recv() {
            let _ = writeln!(out, "{line}");
        }
        let _ = out.flush();
        std::thread::sleep(GATHER);
    }
}

fn sender() -> Option<&'static SyncSender<String>> {
    SENDER
        .get_or_init(|| {
            let (tx, rx) = sync_channel(QUEUE);
            match std::thread::Builder::new().name("access-log".into()).spawn(move || writer(rx)) {
                Ok(_) => Some(tx),
                Err(e) => {
                    log::error!("access log writer could not start ({e}); JSON access lines are dropped");
                    None
                }
            }
        })
        .as_ref()
}

/// Queue a JSON access line (never blocks).
pub fn write_json(line: String) {
    let sent = sender().map(|tx| tx.try_send(line));
    if !matches!(sent, Some(Ok(()))) {
        if let (Some(Err(TrySendError::Full(_))) | None, Some(d)) = (sent, DROPPED.as_ref()) {
            d.inc();
        }
    }
}

/// One access line's fields, borrowed from the request (serialized straight to text).
#[derive(Serialize)]
pub struct Line<'a> {
    time: String,
    request_id: &'a str,
    client_request_id: Option<&'a str>,
    client_ip: Option<std::net::IpAddr>,
    route: &'a str,
    model: Option<&'a str>,
    replica: Option<&'a str>,
    status: u16,
    error_code: Option<&'static str>,
    key_id: Option<&'a str>,
    workspace_id: Option<&'a str>,
    placement: Option<&'static str>,
    spilled: bool,
    funding: &'static str,
    prompt_tokens: Option<u64>,
    cached_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    cost_microcents: Option<u64>,
    ttft_ms: Option<u64>,
    duration_ms: u64,
    bytes_in: Option<u64>,
    bytes_out: usize,
    client_gone: bool,
}

/// The JSON access line of a finished request.
pub fn json_line(cx: &RequestCtx, status: u16, path: &str, bytes_in: Option<u64>, bytes_out: usize) -> String {
    let p = cx.placement.as_ref();
    let usage = cx.usage.figures();
    let millis = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let line = Line {
        time: jiff::Timestamp::now().to_string(),
        request_id: &cx.request_id,
        client_request_id: cx.client_request_id.as_deref(),
        client_ip: cx.client_ip,
        route: path,
        model: cx.model().map(|m| m.id.as_str()),
        replica: p.and_then(|p| p.ran_on.map(|i| p.pool.replicas[i].authority.as_str())),
        status,
        error_code: cx.failure.as_ref().map(|f| f.kind.code()),
        key_id: cx.principal.as_ref().map(|p| p.key_id.as_str()),
        workspace_id: cx.principal.as_ref().map(|p| p.workspace_id.as_str()),
        placement: p.filter(|p| p.placed).map(|p| p.affinity.map_or("load", |a| a.by.as_str())),
        spilled: p.is_some_and(|p| p.spilled),
        funding: cx.funding_label(),
        prompt_tokens: usage.map(|u| u.prompt_tokens),
        cached_tokens: usage.map(|u| u.cached_tokens),
        completion_tokens: usage.map(|u| u.completion_tokens),
        cost_microcents: usage.map(|u| u.cost.0),
        ttft_ms: cx.response.first_token_after.map(millis),
        duration_ms: millis(cx.started.elapsed()),
        bytes_in,
        bytes_out,
        client_gone: cx.client_gone,
    };
    serde_json::to_string(&line).unwrap_or_default()
}
