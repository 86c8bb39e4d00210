//! A TCP forwarder a test can switch off and on: "the database stopped" without stopping the
//! machine's shared PostgreSQL. Off: every forwarded connection is cut and new ones are
//! closed at once, as a stopped server's clients see it. It runs on its own thread, so a test
//! blocked in a synchronous call does not stall it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

pub struct TcpSwitch {
    pub port: u16,
    up: Arc<AtomicBool>,
    live: Arc<Mutex<Vec<AbortHandle>>>,
}

impl TcpSwitch {
    /// Forward a free local port to `target` (`host:port`).
    pub fn start(target: &str) -> TcpSwitch {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let port = std_listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(true));
        let live: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let (up2, live2, target) = (up.clone(), live.clone(), target.to_string());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = TcpListener::from_std(std_listener).unwrap();
                loop {
                    let Ok((mut client, _)) = listener.accept().await else { continue };
                    if !up2.load(Ordering::SeqCst) {
                        drop(client);
                        continue;
                    }
                    let target = target.clone();
                    let task = tokio::spawn(async move {
                        if let Ok(mut server) = TcpStream::connect(&target).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    });
                    live2.lock().unwrap().push(task.abort_handle());
                }
            });
        });
        TcpSwitch { port, up, live }
    }

    /// Cut every connection and refuse new ones.
    pub fn off(&self) {
        self.up.store(false, Ordering::SeqCst);
        for task in self.live.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    pub fn on(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

/// `url` (`scheme://user@host:port/db...`) with its port replaced.
pub fn with_port(url: &str, port: u16) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (auth, path) = rest.split_once('/').unwrap();
    let (user, hostport) = match auth.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), auth),
    };
    let host = hostport.rsplit_once(':').map(|(h, _)| h).unwrap_or(hostport);
    format!("{scheme}://{user}{host}:{port}/{path}")
}

/// `host:port` of `url`.
pub fn authority(url: &str) -> String {
    let rest = url.split_once("://").unwrap().1;
    let auth = rest.split_once('/').map(|(a, _)| a).unwrap_or(rest);
    let hostport = auth.rsplit_once('@').map(|(_, h)| h).unwrap_or(auth);
    if hostport.contains(':') { hostport.to_string() } else { format!("{hostport}:5432") }
}
