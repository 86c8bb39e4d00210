//! Stream heartbeats: a dialect that asks for one (the messages dialect's `ping` event every
//! 15 seconds while the replica is silent) gets its payload written to the client whenever
//! nothing was delivered for that long. Pingora's body filters run only when upstream bytes
//! arrive, so a timer task writes the payload itself on a `dup` of the plain-TCP client
//! socket, framed as one HTTP/1.1 chunk.
//!
//! The write must never land inside one of Pingora's own writes. Both sides use sequentially
//! consistent atomics (Dekker's handshake): before a chunk goes out, the body filter records
//! the delivery time and then waits while a ping is being written; the timer marks "writing"
//! and then re-reads the delivery time, giving up if anything was delivered within the
//! interval. Either the timer sees the fresh delivery and skips, or the filter sees the ping
//! in flight and waits the few microseconds it takes. Pings start only after the first
//! delivered bytes, so a client never sees one before the stream's opening event.

use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::task::JoinHandle;

const ARMED: u8 = 0;
const STOPPED: u8 = 1;
/// Not started until the first delivery.
const NEVER: u64 = u64::MAX;

/// Shared by the proxy task (deliveries) and the timer (pings).
#[derive(Debug)]
pub struct Pulse {
    origin: Instant,
    /// Milliseconds since `origin` of the last delivery (or ping); `NEVER` before the first.
    last_ms: AtomicU64,
    writing: AtomicBool,
}

impl Pulse {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// Call before each chunk goes to the client.
    pub fn delivering(&self) {
        self.last_ms.store(self.now_ms(), SeqCst);
        while self.writing.load(SeqCst) {
            std::thread::yield_now();
        }
    }
}

#[derive(Debug)]
pub struct Heartbeat {
    pub pulse: Arc<Pulse>,
    state: Arc<AtomicU8>,
    fd: RawFd,
    task: JoinHandle<()>,
}

/// `payload` as one chunk of a chunked HTTP/1.1 body, or as it is for a close-delimited one.
pub fn frame(payload: &[u8], chunked: bool) -> Bytes {
    if !chunked {
        return Bytes::copy_from_slice(payload);
    }
    let mut out = format!("{:x}\r\n", payload.len()).into_bytes();
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
    Bytes::from(out)
}

/// Write all of `bytes` to the non-owned socket `fd`, waiting for room at most `limit`.
fn write_all(fd: RawFd, mut bytes: &[u8], limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while !bytes.is_empty() {
        // SAFETY: `fd` is our own dup, open until `stop` closes it after this task ended.
        let n = unsafe { libc::send(fd, bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
        if n > 0 {
            bytes = &bytes[usize::try_from(n).unwrap_or(0)..];
            continue;
        }
        let err = std::io::Error::last_os_error().raw_os_error();
        if n < 0 && (err == Some(libc::EAGAIN) || err == Some(libc::EINTR)) && Instant::now() < deadline {
            let mut p = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut p, 1, 50) };
            continue;
        }
        return false;
    }
    true
}

impl Heartbeat {
    /// Ping the client socket `fd` with `payload` (already framed) after every `every` of
    /// silence following the first delivery.
    pub fn arm(fd: RawFd, payload: Bytes, every: Duration) -> Option<Heartbeat> {
        // SAFETY: dup of a descriptor pingora holds open for the duration of this call.
        let dup = unsafe { libc::dup(fd) };
        if dup < 0 {
            log::warn!("heartbeat: dup failed; no pings on this stream");
            return None;
        }
        let pulse = Arc::new(Pulse { origin: Instant::now(), last_ms: AtomicU64::new(NEVER), writing: false.into() });
        let state = Arc::new(AtomicU8::new(ARMED));
        let (p, st) = (pulse.clone(), state.clone());
        let every_ms = u64::try_from(every.as_millis()).unwrap_or(u64::MAX).max(1);
        let task = tokio::spawn(async move {
            loop {
                let last = p.last_ms.load(SeqCst);
                let wait = if last == NEVER { every_ms } else { (last + every_ms).saturating_sub(p.now_ms()).max(1) };
                tokio::time::sleep(Duration::from_millis(wait)).await;
                // "Writing" first, then the checks (the other half of each handshake is in
                // `Pulse::delivering` and `Heartbeat::stop`).
                p.writing.store(true, SeqCst);
                if st.load(SeqCst) != ARMED {
                    p.writing.store(false, SeqCst);
                    return;
                }
                let last = p.last_ms.load(SeqCst);
                let due = last != NEVER && p.now_ms().saturating_sub(last) >= every_ms;
                let ok = !due || write_all(dup, &payload, Duration::from_secs(1));
                if due && ok {
                    p.last_ms.store(p.now_ms(), SeqCst);
                }
                p.writing.store(false, SeqCst);
                if !ok {
                    return; // the client is gone or stuck; the proxy notices on its own write
                }
            }
        });
        Some(Heartbeat { pulse, state, fd: dup, task })
    }

    /// Stop pinging (the stream ended). Safe to call more than once.
    pub fn stop(&self) {
        if self.state.compare_exchange(ARMED, STOPPED, SeqCst, SeqCst).is_ok() {
            self.task.abort();
            // A ping in flight finishes its (bounded) write before the descriptor closes.
            while self.pulse.writing.load(SeqCst) {
                std::thread::yield_now();
            }
            // SAFETY: our own dup. A task that marks "writing" after this point sees STOPPED
            // and does not write; one that marked it before has finished (the loop above).
            unsafe {
                libc::close(self.fd);
            }
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Arm the dialect's heartbeat (if it asked for one) on a plain HTTP/1 client connection:
/// chunked when the client speaks HTTP/1.1, since the rewritten body has no length.
pub fn arm_for(
    s: &pingora::proxy::Session,
    resp: &pingora::http::ResponseHeader,
    cx: &mut crate::ctx::RequestCtx,
    every: Duration,
) {
    let Some(payload) = cx.heartbeat_payload.as_ref() else { return };
    let Some(h1) = s.as_downstream().as_http1() else { return };
    if s.digest().is_some_and(|d| d.ssl_digest.is_some()) {
        return; // the ping is written on the raw socket: not under TLS (decision 124)
    }
    if resp.headers.contains_key("content-length") {
        return; // a sized body cannot take extra bytes
    }
    let chunked = s.req_header().version == http::Version::HTTP_11;
    let framed = frame(payload, chunked);
    cx.heartbeat = Heartbeat::arm(h1.stream().id(), framed, every);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_framing() {
        assert_eq!(&frame(b"hello", true)[..], b"5\r\nhello\r\n");
        assert_eq!(&frame(b"hello", false)[..], b"hello");
    }
}
