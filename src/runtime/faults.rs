//! Fault injection for the tests of the gateway's own failure paths. In debug builds the
//! environment variable `TOLLGATE_FAULT_PANIC` names a phase (`request`; `response_end`, the last body chunk;
//! `response_after_output`, a stream chunk after output was delivered; `log:<plugin>`, that
//! plugin's log hook; `TOLLGATE_FAULT_LOST_REPLY=hold` takes a recorded hold's answer as lost)
//! in which every request panics on purpose, so a test can see that a panic is answered with
//! `500 internal_error` and never drops the connection silently. Release builds compile the
//! check out.

/// Panic here when this debug build was started with `TOLLGATE_FAULT_PANIC=<phase>`.
#[inline]
pub fn panic_point(phase: &str) {
    #[cfg(debug_assertions)]
    {
        if wanted() == Some(phase) {
            #[allow(clippy::panic)]
            {
                panic!("fault injected in the {phase} phase (TOLLGATE_FAULT_PANIC)");
            }
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = phase;
}

/// Panic here when this debug build was started with `TOLLGATE_FAULT_PANIC=<phase>:<plugin>`.
#[inline]
pub fn panic_point_in(phase: &str, plugin: &str) {
    #[cfg(debug_assertions)]
    {
        if wanted().and_then(|w| w.split_once(':')) == Some((phase, plugin)) {
            #[allow(clippy::panic)]
            {
                panic!("fault injected in the {plugin} plugin's {phase} phase (TOLLGATE_FAULT_PANIC)");
            }
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = (phase, plugin);
}

/// Whether this debug build was started with `TOLLGATE_FAULT_LOST_REPLY=<op>`: the store
/// did `op` but its answer is taken as lost (a commit whose reply never came back).
#[inline]
pub fn reply_lost(op: &str) -> bool {
    #[cfg(debug_assertions)]
    {
        static LOST: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        LOST.get_or_init(|| std::env::var("TOLLGATE_FAULT_LOST_REPLY").ok()).as_deref() == Some(op)
    }
    #[cfg(not(debug_assertions))]
    {
        let _ = op;
        false
    }
}

/// The message of a caught panic.
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// `TOLLGATE_FAULT_PANIC`, read once.
#[cfg(debug_assertions)]
fn wanted() -> Option<&'static str> {
    static WANTED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    WANTED.get_or_init(|| std::env::var("TOLLGATE_FAULT_PANIC").ok()).as_deref()
}
