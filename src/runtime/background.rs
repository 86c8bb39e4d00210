//! Background work on a thread of its own with a small current-thread runtime: it never
//! competes with Pingora's request threads, and it outlives whichever runtime started it.

use std::future::Future;

/// Run `task` on a new thread named `name`; a thread or runtime that cannot start is logged.
pub fn spawn(name: &str, task: impl Future<Output = ()> + Send + 'static) {
    let label = name.to_string();
    let run = move || match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt.block_on(task),
        Err(e) => log::error!("{label}: runtime could not start ({e})"),
    };
    if let Err(e) = std::thread::Builder::new().name(name.into()).spawn(run) {
        log::error!("{name}: thread could not start ({e})");
    }
}
