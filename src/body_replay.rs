//! Forwarding a body the gateway has already read.
//!
//! Routing on `model` needs the body before `upstream_peer`, and Pingora 0.9 has no
//! supported way to forward a body read in `request_filter` (its retry buffer stops at
//! 64 KiB and a pipelined prefix at 1 MiB; our limit is 3.5 MB). So after reading and
//! rewriting, the HTTP/1 downstream session is rebuilt over a stream that first yields the
//! serialized header plus the new body and then the real socket. Pingora then proxies the new
//! body as if the client had sent it, with a correct `Content-Length`, and keepalive intact.
//!
//! Consequences: HTTP/1 only (an HTTP/2 session cannot be taken apart; h2c stays off on the
//! public listener). Bytes a client pipelines after its body are kept: the old session is
//! finished as a reusable one, which hands them back, and they follow the replayed body. The
//! client's `Connection` choice is kept too: the old session is finished as reusable whatever
//! the client asked (Pingora would close a `Connection: close` socket there), and the fresh
//! session reads the original header, so it closes after the response exactly when the client
//! asked for that.
//!
//! The wrapper also carries the connection's [`OutputHold`], which keeps a non-streamed
//! response in memory until its body is known to be good (see `held_output.rs`).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use pingora::protocols::http::ServerSession;
use pingora::protocols::http::v1::client::http_req_header_to_wire;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::tls::{SslDigest, TlsRef};
use pingora::protocols::{
    ALPN, GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream, TimingDigest,
    UniqueID, UniqueIDType,
};
use pingora::{Error, ErrorType, Result};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::held_output::{Mode, OutputHold};

/// A client that stops reading cannot hold a stream (and its replica slot) forever.
pub const DOWNSTREAM_WRITE_TIMEOUT: Duration = Duration::from_secs(60);

/// A socket that yields `prefix` before reading from `inner`, and writes through `hold`.
#[derive(Debug)]
pub struct PrefixedStream {
    prefix: Bytes,
    inner: Stream,
    hold: OutputHold,
}

/// Write `queued` to `inner` until it is empty.
fn drain(inner: &mut Stream, queued: &mut Vec<u8>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    while !queued.is_empty() {
        match Pin::new(&mut *inner).poll_write(cx, queued) {
            Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
            Poll::Ready(Ok(n)) => {
                queued.drain(..n);
            }
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        }
    }
    Poll::Ready(Ok(()))
}

impl AsyncRead for PrefixedStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.prefix.is_empty() {
            return Pin::new(&mut self.inner).poll_read(cx, buf);
        }
        let n = self.prefix.len().min(buf.remaining());
        let head = self.prefix.split_to(n);
        buf.put_slice(&head);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for PrefixedStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let mut st = this.hold.lock();
        match st.mode {
            Mode::Hold | Mode::Gather => {
                st.queued.extend_from_slice(b);
                Poll::Ready(Ok(b.len()))
            }
            Mode::Replaced => drain(&mut this.inner, &mut st.queued, cx).map_ok(|()| b.len()),
            Mode::Pass => match drain(&mut this.inner, &mut st.queued, cx) {
                Poll::Ready(Ok(())) => {
                    drop(st);
                    Pin::new(&mut this.inner).poll_write(cx, b)
                }
                other => other.map_ok(|()| 0),
            },
        }
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let mut st = this.hold.lock();
        match st.mode {
            Mode::Hold => return Poll::Ready(Ok(())),
            Mode::Gather if !OutputHold::end_gathered(&st) => return Poll::Ready(Ok(())),
            Mode::Gather => st.mode = Mode::Pass, // everything goes out in this one write
            Mode::Pass | Mode::Replaced => {}
        }
        match drain(&mut this.inner, &mut st.queued, cx) {
            Poll::Ready(Ok(())) => {
                drop(st);
                Pin::new(&mut this.inner).poll_flush(cx)
            }
            other => other,
        }
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let mut st = this.hold.lock();
        if st.mode == Mode::Hold {
            st.queued.clear(); // a held response that never completed is not sent half
        }
        match drain(&mut this.inner, &mut st.queued, cx) {
            Poll::Ready(Ok(())) => {
                drop(st);
                Pin::new(&mut this.inner).poll_shutdown(cx)
            }
            other => other,
        }
    }
}

#[async_trait]
impl Shutdown for PrefixedStream {
    async fn shutdown(&mut self) {
        // Queued bytes (a replacement response) go out before the socket closes.
        if let Err(e) = tokio::io::AsyncWriteExt::flush(self).await {
            log::debug!("flush before shutdown: {e}");
        }
        self.inner.shutdown().await
    }
}

impl UniqueID for PrefixedStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for PrefixedStream {
    fn get_ssl(&self) -> Option<&TlsRef> {
        self.inner.get_ssl()
    }
    fn get_ssl_digest(&self) -> Option<Arc<SslDigest>> {
        self.inner.get_ssl_digest()
    }
    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for PrefixedStream {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }
    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }
    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for PrefixedStream {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
}

impl GetSocketDigest for PrefixedStream {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }
}

#[async_trait]
impl Peek for PrefixedStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        if self.prefix.is_empty() {
            return self.inner.try_peek(buf).await;
        }
        let n = self.prefix.len().min(buf.len());
        buf[..n].copy_from_slice(&self.prefix[..n]);
        Ok(true)
    }
}

/// Replace the downstream session with one whose request body is `body`; its writes go
/// through `hold`. `keepalive` is the keepalive setting read before any `100 Continue` was
/// written (writing it turns keepalive off on the old session). On an error the session left in
/// place is a stand-in with the request line (so later phases can still read the header); the
/// client connection is then lost.
pub async fn replace_request_body(
    downstream: &mut Box<ServerSession>,
    body: Bytes,
    keepalive: Option<u64>,
    hold: &OutputHold,
) -> Result<()> {
    // Only the request line is kept for a failed rebuild (the header is cloned once, below);
    // both clones share their bytes.
    let (method, uri) = (downstream.req_header().method.clone(), downstream.req_header().uri.clone());
    match rebuild(downstream, body, keepalive, hold).await {
        Ok(()) => Ok(()),
        Err(e) => {
            *downstream = stand_in(&method, &uri).await;
            Err(e)
        }
    }
}

async fn rebuild(
    downstream: &mut Box<ServerSession>,
    body: Bytes,
    keepalive: Option<u64>,
    hold: &OutputHold,
) -> Result<()> {
    let mut replayed = downstream.req_header().clone();
    for h in ["content-length", "transfer-encoding", "expect"] {
        replayed.remove_header(h);
    }
    replayed.insert_header("content-length", body.len().to_string())?;
    let mut wire = http_req_header_to_wire(&replayed)
        .ok_or_else(|| Error::explain(ErrorType::InternalError, "cannot serialize request header"))?;
    wire.extend_from_slice(&body);
    drop(body);
    let reuses = downstream.get_keepalive_reuses_remaining();
    if !matches!(**downstream, ServerSession::H1(_)) {
        return Error::e_explain(ErrorType::InternalError, "body rewrite needs an HTTP/1 client connection");
    }
    let placeholder = Box::new(ServerSession::new_http1(Box::new(std::io::Cursor::new(Vec::<u8>::new()))));
    let mut old = std::mem::replace(downstream, placeholder);
    // Finish the old session as if it were kept alive, so that bytes the client pipelined
    // after its body (read together with the body's end) come back instead of being lost,
    // and the socket is handed back rather than shut. Pingora ignores a keepalive setting
    // while the request says `Connection: close`, so that header goes first; the fresh session
    // reads it again from the replayed header.
    old.req_header_mut().remove_header("connection");
    old.set_keepalive(Some(60));
    old.set_keepalive_reuses_remaining(None);
    old.set_pipelining_enabled(true);
    let reusable = old
        .finish()
        .await?
        .ok_or_else(|| Error::explain(ErrorType::InternalError, "client connection not reusable"))?;
    let (mut raw, pipelined) = reusable.into_parts();
    // On a kept-alive connection the previous request's wrapper is exhausted: unwrap it so
    // wrappers do not nest request after request.
    if raw.as_any().downcast_ref::<PrefixedStream>().is_some_and(|p| p.prefix.is_empty()) {
        match raw.into_any().downcast::<PrefixedStream>() {
            Ok(p) => raw = p.inner,
            Err(_) => return Error::e_explain(ErrorType::InternalError, "stream unwrap failed"),
        }
    }
    if let Some(next) = pipelined {
        wire.extend_from_slice(&next);
    }
    let stream = PrefixedStream { prefix: wire.freeze(), inner: raw, hold: hold.clone() };
    let mut fresh = ServerSession::new_http1(Box::new(stream));
    fresh.read_request().await?;
    fresh.set_keepalive(keepalive);
    fresh.set_keepalive_reuses_remaining(reuses);
    // Pipelined bytes now sit behind the replayed body: let the session hand them on.
    fresh.set_pipelining_enabled(true);
    // The fresh session starts with default settings: re-apply ours.
    fresh.set_write_timeout(Some(DOWNSTREAM_WRITE_TIMEOUT));
    // Keep Pingora's copy of a body up to 64 KiB as it reads it, so a request the replica
    // never answered can be sent again to another (`proxy/retry.rs`, decision 204).
    fresh.enable_retry_buffering();
    **downstream = fresh;
    Ok(())
}

/// A session with no connection that has read the request line of `method` and `uri`, so that
/// the phases after a failed rebuild can read the request header (Pingora panics on a session
/// without one).
async fn stand_in(method: &http::Method, uri: &http::Uri) -> Box<ServerSession> {
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    for line in [format!("{method} {path} HTTP/1.1\r\n\r\n"), "GET / HTTP/1.1\r\n\r\n".to_string()] {
        let mut s = ServerSession::new_http1(Box::new(std::io::Cursor::new(line.into_bytes())));
        if matches!(s.read_request().await, Ok(true)) {
            s.set_keepalive(None);
            return Box::new(s);
        }
    }
    Box::new(ServerSession::new_http1(Box::new(std::io::Cursor::new(Vec::<u8>::new()))))
}
