//! The accept loop: one hyper HTTP/1 connection task per TCP connection.

use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::routes;
use crate::state::State;

/// Serves until the process is killed.
pub async fn serve(listener: TcpListener, state: Arc<State>) {
    let builder = Arc::new(http1::Builder::new());
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Typically out of file descriptors under a load test: back
                // off briefly instead of spinning on the error.
                log::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // Frames are flushed one by one; Nagle would batch them (and add
        // latency the benches would blame on the gateway).
        if let Err(e) = stream.set_nodelay(true) {
            log::debug!("set_nodelay for {peer}: {e}");
        }
        let state = Arc::clone(&state);
        let builder = Arc::clone(&builder);
        tokio::spawn(async move {
            let service = service_fn(move |req| routes::handle(Arc::clone(&state), req));
            if let Err(e) = builder.serve_connection(TokioIo::new(stream), service).await {
                // Aborts and clients leaving mid-stream land here; both are
                // expected in tests.
                log::debug!("connection from {peer}: {e}");
            }
        });
    }
}
