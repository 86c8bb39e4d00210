//! Fault injection for the tests of the gateway's own failure paths. In debug builds the
//! environment variable `TOLLGATE_FAULT_PANIC` names a phase (`request`; `response_end`, the last body chunk;
//! `response_after_output`, a stream chunk after output was delivered)
//! in which every request panics on purpose, so a test can see that a panic is answered with
//! `500 internal_error` and never drops the connection silently. `TOLLGATE_FAULT_STALL=1`
//! makes a request carrying `x-tollgate-fault-stall-ms: N` block its worker thread for N ms
//! (at most 5 s): a CPU-bound request, for the tests of overload shedding. Release builds
//! compile both checks out.

/// Panic here when this debug build was started with `TOLLGATE_FAULT_PANIC=<phase>`.
#[inline]
pub fn panic_point(phase: &str) {
    #[cfg(debug_assertions)]
    {
        static WANTED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        let wanted = WANTED.get_or_init(|| std::env::var("TOLLGATE_FAULT_PANIC").ok());
        if wanted.as_deref() == Some(phase) {
            #[allow(clippy::panic)]
            {
                panic!("fault injected in the {phase} phase (TOLLGATE_FAULT_PANIC)");
            }
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = phase;
}

/// Block the worker thread as the request's `x-tollgate-fault-stall-ms` header asks, when this
/// debug build was started with `TOLLGATE_FAULT_STALL=1`.
#[inline]
pub fn stall_point(headers: &http::HeaderMap) {
    #[cfg(debug_assertions)]
    {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if *ON.get_or_init(|| std::env::var("TOLLGATE_FAULT_STALL").is_ok_and(|v| v == "1")) {
            let ms = headers.get("x-tollgate-fault-stall-ms").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            if let Some(ms) = ms {
                std::thread::sleep(std::time::Duration::from_millis(ms.min(5_000)));
            }
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = headers;
}
