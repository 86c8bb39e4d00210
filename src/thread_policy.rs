//! How the gateway's own background threads are scheduled beside Pingora's request threads.

/// Mark the calling thread `SCHED_BATCH` (Linux): the same share of the CPU as any other
/// thread, but waking it does not preempt the thread running on that core (decision 140).
///
/// The ledger writer is woken by request threads: by every hold, and by the first op of a
/// batch (since decision 193 a settlement queued during its linger wakes nothing; before it,
/// every settlement did). With the default policy each wake-up preempted the request thread
/// on a busy core, so the writer committed a batch of a few ops at a time and the core paid
/// two context switches per batch; as a batch thread it runs when the request thread waits
/// for the network or its time slice ends, and takes everything queued by then in one
/// transaction. On an idle core it still runs at once, so a lone request waits no longer for
/// its hold.
///
/// Changing to `SCHED_BATCH` needs no privilege; if the kernel refuses (a seccomp filter, a
/// non-Linux system) the thread keeps the default policy and a warning says so.
pub fn run_as_batch(thread: &str) {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `sched_setscheduler` on the calling thread (pid 0) with a valid, initialised
        // parameter; it reads `param` and changes nothing else.
        let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
        if rc != 0 {
            log::warn!("{thread}: SCHED_BATCH refused ({}); the default policy stays", std::io::Error::last_os_error());
        }
    }
    #[cfg(not(target_os = "linux"))]
    log::debug!("{thread}: no SCHED_BATCH on this system; the default policy stays");
}

/// The calling thread's scheduling policy (`libc::SCHED_*`), for tests.
#[cfg(all(test, target_os = "linux"))]
fn policy() -> i32 {
    // SAFETY: `sched_getscheduler` on the calling thread reads no memory of ours.
    unsafe { libc::sched_getscheduler(0) }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_batch_thread_is_scheduled_as_batch_and_others_are_not() {
        let (before, after) = std::thread::spawn(|| {
            let before = policy();
            run_as_batch("test");
            (before, policy())
        })
        .join()
        .unwrap_or((-1, -1));
        assert_eq!(before, libc::SCHED_OTHER);
        assert_eq!(after, libc::SCHED_BATCH);
        assert_eq!(policy(), libc::SCHED_OTHER, "only the calling thread changes");
    }
}
