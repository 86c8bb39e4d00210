//! A cap on open client connections, the oldest idle one closed first (issue 49).
//!
//! Pingora accepts every connection its listener gets; each one costs a descriptor and tens
//! of kilobytes, and a client may open thousands and leave them idle. [`ConnectionCap`] wraps
//! the proxy's [`ServerApp`]: each accepted connection is counted and its socket wrapped in a
//! [`TrackedStream`] that knows whether a request is in progress. At the cap, a new connection
//! closes the connection that has been idle the longest (between requests, or accepted and
//! still silent), as nginx reuses its "reusable" connections; when none is idle, the new one
//! is answered `429 hosted_admission_congested` with the envelope and closed.
//!
//! Idle means no request in progress: a connection becomes busy when bytes of a request arrive (or
//! the proxy starts a request) and idle again when the proxy logged its answer ([`mark_idle`]). An
//! idle connection is closed by ending its pending read: Pingora sees the client close, as after a
//! keep-alive timeout. An HTTP/2 connection (known by the client's preface) is busy from its
//! preface while any of its streams is in progress, and idle once the last one was logged; its
//! reads (flow-control and ping frames) do not make it busy. Its sessions have no socket of their
//! own, so they find their connection by the socket digest they share with it.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Once};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::http::ServerSession;
use pingora::protocols::{GetSocketDigest, Peek, Shutdown, Stream};
use pingora::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::http::envelope::{self, Envelope};
use crate::http::error::{ErrorKind, GatewayError};

const BUSY: u8 = 0;
const IDLE: u8 = 1;
const CLOSED: u8 = 2;

/// Refused connections lingering (reading what the client still sends, so that it reads the
/// answer instead of a reset) at once; past this they are closed at once.
const MAX_LINGERING: usize = 256;
const LINGER: Duration = Duration::from_secs(1);

/// What every HTTP/2 client sends first (RFC 9113, section 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const NOT_H2: usize = usize::MAX;

/// An HTTP/2 connection and the registry that counts it.
type H2Connection = (Arc<Conn>, Arc<Connections>);

/// The HTTP/2 connections open, by the address of the socket digest their sessions share.
static H2_CONNECTIONS: LazyLock<Mutex<HashMap<usize, H2Connection>>> = LazyLock::new(Default::default);

/// The node's client connections: how many are open, and the idle ones by idle age.
pub struct Connections {
    max: usize,
    open: AtomicUsize,
    lingering: AtomicUsize,
    next_seq: AtomicU64,
    /// Idle connections by the order they became idle (oldest first).
    idle: Mutex<BTreeMap<u64, Arc<Conn>>>,
}

/// One connection's state, shared by its socket wrapper and the idle index.
#[derive(Debug)]
struct Conn {
    state: AtomicU8,
    /// Its key in the idle index while idle.
    seq: AtomicU64,
    /// The pending read to wake when it is closed (kept only while idle).
    waker: Mutex<Option<Waker>>,
    /// An HTTP/2 connection: busy while `streams` is above zero.
    h2: AtomicBool,
    streams: AtomicU32,
}

impl Connections {
    pub fn new(max: usize) -> Arc<Connections> {
        Arc::new(Connections {
            max: max.max(1),
            open: AtomicUsize::new(0),
            lingering: AtomicUsize::new(0),
            next_seq: AtomicU64::new(0),
            idle: Mutex::new(BTreeMap::new()),
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Admit a new connection: under the cap, or by closing the oldest idle one. The stream
    /// comes back when the node is at the cap with none idle.
    fn admit(self: &Arc<Self>, inner: Stream) -> Result<TrackedStream, Stream> {
        if self.open.fetch_add(1, Ordering::AcqRel) >= self.max && !self.close_oldest_idle() {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return Err(inner);
        }
        let conn = Arc::new(Conn {
            state: AtomicU8::new(BUSY),
            seq: AtomicU64::new(0),
            waker: Mutex::new(None),
            h2: AtomicBool::new(false),
            streams: AtomicU32::new(0),
        });
        // Accepted and silent is idle: a client that opens connections and sends nothing is
        // the first to make room.
        self.set_idle(&conn);
        crate::observe::metrics::client_connections(1);
        Ok(TrackedStream { inner, conn, registry: self.clone(), preface_seen: 0, h2_key: None })
    }

    /// Close the connection idle the longest; false when none is.
    fn close_oldest_idle(&self) -> bool {
        loop {
            let oldest = lock(&self.idle).pop_first();
            let Some((_, conn)) = oldest else { return false };
            // It may have turned busy since (its request's bytes arrived); then try the next.
            if conn.state.compare_exchange(IDLE, CLOSED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                if let Some(w) = lock(&conn.waker).take() {
                    w.wake();
                }
                crate::observe::metrics::connection_shed("closed_idle");
                return true;
            }
        }
    }

    fn set_idle(&self, conn: &Arc<Conn>) {
        if conn.state.compare_exchange(BUSY, IDLE, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
            conn.seq.store(seq, Ordering::Relaxed);
            lock(&self.idle).insert(seq, conn.clone());
        }
    }

    fn set_busy(&self, conn: &Conn) {
        if conn.state.load(Ordering::Acquire) == IDLE
            && conn.state.compare_exchange(IDLE, BUSY, Ordering::AcqRel, Ordering::Acquire).is_ok()
        {
            lock(&self.idle).remove(&conn.seq.load(Ordering::Relaxed));
            lock(&conn.waker).take();
        }
    }

    fn release(&self, conn: &Conn) {
        if conn.state.swap(CLOSED, Ordering::AcqRel) == IDLE {
            lock(&self.idle).remove(&conn.seq.load(Ordering::Relaxed));
        }
        self.open.fetch_sub(1, Ordering::AcqRel);
        crate::observe::metrics::client_connections(-1);
    }

    /// Answer a connection over the cap with the envelope, then let it go: the client's
    /// remaining bytes are read (briefly) so that it sees the answer rather than a reset.
    async fn refuse(&self, mut stream: Stream) {
        crate::observe::metrics::connection_shed("refused");
        let err = GatewayError::new(
            ErrorKind::HostedAdmissionCongested,
            "The gateway holds as many connections as it takes and none is idle; retry shortly. This is not a quota.",
        )
        .with_retry_after(1);
        let request_id = crate::proxy::ctx::next_request_id();
        let r = envelope::render(&err, Envelope::Chat, &request_id);
        let mut head = format!(
            "HTTP/1.1 {} Too Many Requests\r\ncontent-type: application/json\r\ncontent-length: {}\r\nx-request-id: {request_id}\r\nconnection: close\r\n",
            r.status,
            r.body.len()
        );
        for (name, value) in &r.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        log::info!("{request_id} connection refused: {} open, none idle", self.open());
        let written = tokio::time::timeout(LINGER, async {
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(&r.body).await?;
            stream.flush().await
        })
        .await;
        if !matches!(written, Ok(Ok(()))) {
            return;
        }
        if self.lingering.fetch_add(1, Ordering::AcqRel) < MAX_LINGERING {
            let _ = tokio::time::timeout(LINGER, async {
                let mut sink = [0u8; 4096];
                while let Ok(n) = stream.read(&mut sink).await {
                    if n == 0 {
                        break;
                    }
                }
            })
            .await;
        }
        self.lingering.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A poisoned lock still holds a consistent map (each update is one call).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The proxy's application with its connections counted and capped.
pub struct ConnectionCap<A> {
    inner: Arc<A>,
    connections: Arc<Connections>,
    on_request_runtime: fn(),
    started: Once,
}

impl<A> ConnectionCap<A> {
    pub fn new(inner: A, connections: Arc<Connections>) -> Self {
        ConnectionCap { inner: Arc::new(inner), connections, on_request_runtime: || {}, started: Once::new() }
    }

    /// Run `start` once on the request threads' runtime, at its first connection (where the
    /// binary starts its allocator's heap collectors).
    pub fn on_request_runtime(self, start: fn()) -> Self {
        ConnectionCap { on_request_runtime: start, ..self }
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for ConnectionCap<A> {
    async fn process_new(self: &Arc<Self>, stream: Stream, shutdown: &ShutdownWatch) -> Option<Stream> {
        self.started.call_once(self.on_request_runtime);
        match self.connections.admit(stream) {
            Ok(tracked) => self.inner.process_new(Box::new(tracked), shutdown).await,
            Err(stream) => {
                self.connections.refuse(stream).await;
                None
            }
        }
    }

    async fn cleanup(&self) {
        self.inner.cleanup().await
    }
}

/// The proxy logged its answer on this session's connection: an HTTP/1 connection is idle
/// until its next request, an HTTP/2 one once none of its streams is in progress. (Sessions
/// over a stream this module did not wrap are left alone.)
pub fn mark_idle(session: &ServerSession) {
    if let Some(t) = session.stream().and_then(tracked) {
        t.registry.set_idle(&t.conn);
    } else if let Some((conn, registry)) = h2_connection(session) {
        // Never below zero: a session Pingora logged without running the request filter.
        let was = conn.streams.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        if was == Ok(1) {
            registry.set_idle(&conn);
        }
    }
}

/// A request started on this session's connection (pipelined requests bring no new bytes;
/// an HTTP/2 stream is one more in progress).
pub fn mark_busy(session: &ServerSession) {
    if let Some(t) = session.stream().and_then(tracked) {
        t.registry.set_busy(&t.conn);
    } else if let Some((conn, registry)) = h2_connection(session) {
        conn.streams.fetch_add(1, Ordering::AcqRel);
        registry.set_busy(&conn);
    }
}

/// The HTTP/2 connection an HTTP/2 session runs on.
fn h2_connection(session: &ServerSession) -> Option<H2Connection> {
    let digest = session.digest()?.socket_digest.as_ref()?;
    lock(&H2_CONNECTIONS).get(&(Arc::as_ptr(digest) as usize)).cloned()
}

/// The tracked socket under `stream`, through the wrappers that the gateway puts over it.
fn tracked(stream: &Stream) -> Option<&TrackedStream> {
    let any = stream.as_any();
    if let Some(t) = any.downcast_ref::<TrackedStream>() {
        return Some(t);
    }
    any.downcast_ref::<crate::transport::body_replay::PrefixedStream>()
        .and_then(|p| p.inner().as_any().downcast_ref::<TrackedStream>())
}

/// A client socket counted by [`Connections`] while it lives.
#[derive(Debug)]
pub struct TrackedStream {
    inner: Stream,
    conn: Arc<Conn>,
    registry: Arc<Connections>,
    /// How many of its first bytes matched the HTTP/2 preface so far; `NOT_H2` once one did not.
    preface_seen: usize,
    /// Its key in `H2_CONNECTIONS` while it is an HTTP/2 connection.
    h2_key: Option<usize>,
}

impl TrackedStream {
    /// The client spoke HTTP/2: its sessions mark it busy and idle by their streams.
    fn became_h2(&mut self) {
        let Some(digest) = GetSocketDigest::get_socket_digest(&*self.inner) else { return };
        let key = Arc::as_ptr(&digest) as usize;
        self.conn.h2.store(true, Ordering::Release);
        lock(&H2_CONNECTIONS).insert(key, (self.conn.clone(), self.registry.clone()));
        self.h2_key = Some(key);
    }
}

impl Drop for TrackedStream {
    fn drop(&mut self) {
        if let Some(key) = self.h2_key {
            lock(&H2_CONNECTIONS).remove(&key);
        }
        self.registry.release(&self.conn);
    }
}

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connections").field("max", &self.max).field("open", &self.open()).finish()
    }
}

impl AsyncRead for TrackedStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.conn.state.load(Ordering::Acquire) {
            CLOSED => return Poll::Ready(Ok(())), // closed to make room: the client's end
            IDLE => {
                // Kept before the state is read again, so a close between the two wakes us.
                *lock(&this.conn.waker) = Some(cx.waker().clone());
                if this.conn.state.load(Ordering::Acquire) == CLOSED {
                    return Poll::Ready(Ok(()));
                }
            }
            _ => {}
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            if this.preface_seen < H2_PREFACE.len() {
                // The preface may arrive over several reads (a client trickling bytes).
                let rest = &H2_PREFACE[this.preface_seen..];
                let got = &buf.filled()[before..];
                let n = got.len().min(rest.len());
                this.preface_seen = if got[..n] == rest[..n] { this.preface_seen + n } else { NOT_H2 };
                if this.preface_seen == H2_PREFACE.len() {
                    this.became_h2();
                }
            } else if this.conn.h2.load(Ordering::Acquire) {
                return polled; // an HTTP/2 connection is busy by its streams, not its frames
            }
            this.registry.set_busy(&this.conn);
        }
        polled
    }
}

impl AsyncWrite for TrackedStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, b)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[async_trait]
impl Shutdown for TrackedStream {
    async fn shutdown(&mut self) {
        Shutdown::shutdown(&mut *self.inner).await
    }
}

super::inner_stream_digests!(TrackedStream);

#[async_trait]
impl Peek for TrackedStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

#[cfg(test)]
#[path = "connection_cap_tests.rs"]
mod tests;
