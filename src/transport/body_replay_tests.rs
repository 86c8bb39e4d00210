use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A writer timed as the replay's socket is: by [`WriteProgress`].
struct Timed<W> {
    inner: W,
    progress: WriteProgress,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Timed<W> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_write(cx, b);
        this.progress.check(polled, cx)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Issue 49: one write to a client reading 64 bytes every 100 ms takes 6.4 s for 4 KB, far
/// past the 300 ms stall limit, and succeeds (each step makes progress); once the client
/// stops reading, the next write fails after the stall limit.
#[tokio::test(start_paused = true)]
async fn writes_are_timed_by_progress_not_by_length() {
    let (ours, mut client) = tokio::io::duplex(64);
    let stall = Duration::from_millis(300);
    let mut w = Timed { inner: ours, progress: WriteProgress::new(stall, None) };
    let reader = tokio::spawn(async move {
        let mut buf = [0u8; 64];
        let mut total = 0;
        while total < 4096 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            total += client.read(&mut buf).await.unwrap_or(0);
        }
        client // kept open, never read again
    });
    let started = tokio::time::Instant::now();
    w.write_all(&[7u8; 4096]).await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(6), "paced by the reader: {:?}", started.elapsed());
    let _client = reader.await.unwrap();
    let stopped = tokio::time::Instant::now();
    let err = w.write_all(&[7u8; 4096]).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    assert!(stopped.elapsed() >= stall && stopped.elapsed() < stall * 2, "{:?}", stopped.elapsed());
}
