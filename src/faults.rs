//! Fault injection for the tests of the gateway's own failure paths. In debug builds the
//! environment variable `TOLLGATE_FAULT_PANIC` names a phase (`request`; `response_end`, the last body chunk;
//! `response_after_output`, a stream chunk after output was delivered)
//! in which every request panics on purpose, so a test can see that a panic is answered with
//! `500 internal_error` and never drops the connection silently. Release builds compile the
//! check out.

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
