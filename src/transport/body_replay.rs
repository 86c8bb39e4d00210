//! Forwarding a body the gateway has already read.
//!
//! An HTTP/1 connection's first request: after reading and rewriting its body, the downstream
//! session is rebuilt over a stream that first yields the serialized header plus the new body
//! and then the real socket. Pingora then proxies the new body as if the client had sent it,
//! with a correct `Content-Length`, and keepalive intact. What the rebuild is for since bodies
//! can be handed to Pingora whole (`proxy/forward.rs`): the socket wrapper it installs, which
//! the connection's later requests go through too, holds non-streamed answers and times
//! writes by progress.
//!
//! HTTP/1 only (an HTTP/2 session cannot be taken apart). Bytes a client pipelines after its
//! body are kept: the old session is finished as a reusable one, which hands them back, and
//! they follow the replayed body. The
//! client's `Connection` choice is kept too: the old session is finished as reusable whatever
//! the client asked (Pingora would close a `Connection: close` socket there), and the fresh
//! session reads the original header, so it closes after the response exactly when the client
//! asked for that.
//!
//! The wrapper also carries the connection's [`OutputHold`], which keeps a non-streamed
//! response in memory until its body is known to be good (see `held_output.rs`).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use pingora::protocols::http::ServerSession;
use pingora::protocols::http::v1::client::http_req_header_to_wire;
use pingora::protocols::{Peek, Shutdown, Stream};
use pingora::{Error, ErrorType, Result};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::transport::held_output::{Mode, OutputHold};

/// A socket that yields `prefix` before reading from `inner`, and writes through `hold`.
#[derive(Debug)]
pub struct PrefixedStream {
    prefix: Bytes,
    inner: Stream,
    hold: OutputHold,
    progress: WriteProgress,
}

/// Writes to a client measured by their progress, not their length (issue 49): a client that
/// keeps reading, however slowly, is never cut; one that reads nothing for `stall` is, with
/// `TimedOut` (Pingora then ends the request as the client's: its replica request is dropped
/// and it is billed for what was written).
///
/// A write waits while the kernel holds more than [`UNSENT_MAX`] unsent bytes for the client,
/// and one write may leave far more than that (a chunk read whole from the replica): at 2 KB a
/// second the wait for such a write alone can pass `stall`. So when the timer runs out, the
/// socket's send queue (`SIOCOUTQ`: bytes not yet acknowledged) is read: if it shrank since the
/// timer was armed, the client read in the meantime and the timer starts again.
#[derive(Debug)]
struct WriteProgress {
    stall: Duration,
    /// The client's socket, whose send queue tells whether the client reads (none in tests).
    fd: Option<std::os::fd::RawFd>,
    /// Armed when a write could not go on; cleared by any progress.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The send queue when the timer was armed.
    queued: Option<i32>,
}

impl WriteProgress {
    fn new(stall: Duration, fd: Option<std::os::fd::RawFd>) -> Self {
        WriteProgress { stall, fd, timer: None, queued: None }
    }

    /// Fold a write's poll in: progress disarms the timer; no progress arms it, and past
    /// `stall` without any (of the write, or of the client's reading) the write fails.
    fn check<T>(&mut self, polled: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.timer = None;
            return polled;
        }
        let stall = self.stall;
        if self.timer.is_none() {
            self.queued = self.fd.and_then(send_queue);
        }
        loop {
            let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let now = self.fd.and_then(send_queue);
            match (self.queued, now) {
                (Some(before), Some(after)) if after < before => {
                    self.queued = Some(after);
                    self.timer = None; // the client read: a new period
                }
                _ => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client read nothing for {stall:?}"),
                    )));
                }
            }
        }
    }
}

/// Bytes in `fd`'s send queue not yet acknowledged by the client (Linux `SIOCOUTQ`).
fn send_queue(fd: std::os::fd::RawFd) -> Option<i32> {
    let mut queued: libc::c_int = 0;
    // SAFETY: `fd` is the connection's socket, open while its stream lives; the ioctl writes
    // one `c_int` into `queued` and nothing else.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut queued) };
    (rc == 0).then_some(queued)
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

impl PrefixedStream {
    /// The client's socket under the replay.
    pub fn inner(&self) -> &Stream {
        &self.inner
    }

    fn write_through(&mut self, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        let this = self;
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

    fn flush_through(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self;
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
}

impl AsyncWrite for PrefixedStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = this.write_through(cx, b);
        this.progress.check(polled, cx)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let polled = this.flush_through(cx);
        this.progress.check(polled, cx)
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

crate::transport::inner_stream_digests!(PrefixedStream);

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
/// through `hold`, and fail when the client reads nothing for `stall`. `keepalive` is the keepalive setting read before any `100 Continue` was
/// written (writing it turns keepalive off on the old session). On an error the session left in
/// place is a stand-in with the request line (so later phases can still read the header); the
/// client connection is then lost.
pub async fn replace_request_body(
    downstream: &mut Box<ServerSession>,
    body: Bytes,
    keepalive: Option<u64>,
    hold: &OutputHold,
    stall: Duration,
) -> Result<()> {
    // Only the request line is kept for a failed rebuild (the header is cloned once, below);
    // both clones share their bytes.
    let (method, uri) = (downstream.req_header().method.clone(), downstream.req_header().uri.clone());
    match rebuild(downstream, body, keepalive, hold, stall).await {
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
    stall: Duration,
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
    hold_little_unsent(&raw);
    let fd = Some(raw.id()).filter(|fd| *fd > 2); // a socket, never a standard stream
    let stream = PrefixedStream {
        prefix: wire.freeze(),
        inner: raw,
        hold: hold.clone(),
        progress: WriteProgress::new(stall, fd),
    };
    let mut fresh = ServerSession::new_http1(Box::new(stream));
    fresh.read_request().await?;
    fresh.set_keepalive(keepalive);
    fresh.set_keepalive_reuses_remaining(reuses);
    // Pipelined bytes now sit behind the replayed body: let the session hand them on.
    fresh.set_pipelining_enabled(true);
    // The fresh session starts with default settings: re-apply ours. Its writes are timed by
    // the wrapper's progress, not each as a whole (a slow reader's long write is no stall).
    fresh.set_write_timeout(None);
    // Keep Pingora's copy of a body up to 64 KiB as it reads it, so a request the replica
    // never answered can be sent again to another (`proxy/retry.rs`, decision 204).
    fresh.enable_retry_buffering();
    **downstream = fresh;
    Ok(())
}

/// Most bytes the kernel keeps unsent for a client (`TCP_NOTSENT_LOWAT`).
const UNSENT_MAX: libc::c_int = 16 * 1024;

/// Let the kernel hold at most [`UNSENT_MAX`] bytes not yet sent to this client (issue 49).
/// Without it a slow reader's socket buffer grows to megabytes: a write then waits until half
/// of it drained (minutes for a client reading kilobytes a second, which no write deadline
/// should have to cover), and output queued there counts as delivered though the client may
/// never read it. With it, a write is woken as the client reads. Set once per connection (a
/// socket option on the descriptor the connection holds; no write on it).
fn hold_little_unsent(stream: &Stream) {
    let fd = stream.id();
    // SAFETY: `fd` is the connection's socket, open while `stream` lives; setsockopt reads
    // the `c_int` it is given and nothing else.
    let set = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NOTSENT_LOWAT,
            (&UNSENT_MAX as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if set != 0 {
        log::debug!("TCP_NOTSENT_LOWAT not set on fd {fd}: {}", io::Error::last_os_error());
    }
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

#[cfg(test)]
#[path = "body_replay_tests.rs"]
mod tests;
