//! The in-process limiter's hot path allocates only what its answer carries (issue 12's hint:
//! no per-request allocation in the limiter's in-process path). An admission check on keys
//! already in use and the release of its lease are counted with a counting global allocator,
//! on this thread only; a copy of the lease id per gate, or a scratch vector, fails it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use tollgate::state::limits::{Check, ConcurrencyGate, InProcessLimiter, LimiterStore, Verdict, WindowLimit};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is passed to the system allocator unchanged; the count is a thread-local
// `Cell` initialised without allocating.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's layout, as received.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: as for `alloc` and `dealloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// The limits plugin's admission shape: the key's window, then per-key, workspace and
/// shared-model gates.
fn admission(now_ms: i64, request: u64) -> Check {
    let gate = |scope, key: &str| ConcurrencyGate { scope, key: key.into(), limit: 1_000 };
    Check {
        now_ms,
        windows: vec![WindowLimit { key: "k:key".into(), limit: 1_000_000 }],
        gates: vec![gate("per_key", "pk:m:key"), gate("workspace", "w:ws"), gate("shared", "m:m")],
        tpm: None,
        lease_id: format!("req_{request:032x}").into(),
        lease_ttl_ms: 30_000,
    }
}

/// Polls a future that never waits (the in-process store answers at once).
fn now<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("the in-process limiter waited"),
    }
}

#[test]
fn an_admission_and_its_release_allocate_only_the_answer() {
    let store = InProcessLimiter::new();
    let t = 1_000_000;
    // The first requests create the keys' windows and gates (once per key, not per request).
    for r in 0..3 {
        let Verdict::Admitted { lease: Some(lease), .. } = now(store.check(&admission(t, r))).unwrap() else {
            panic!("not admitted")
        };
        now(store.release(&lease)).unwrap();
    }
    // A live lease on the gates, so the next one is added beside it (the usual case under load).
    let Verdict::Admitted { lease: Some(other), .. } = now(store.check(&admission(t, 10))).unwrap() else {
        panic!("not admitted")
    };
    for r in 100..110 {
        let check = admission(t + 5, r);
        let before = allocations();
        let verdict = now(store.check(&check)).unwrap();
        let checked = allocations() - before;
        let Verdict::Admitted { ref windows, ref gates_in_use, lease: Some(ref lease) } = verdict else {
            panic!("not admitted: {verdict:?}")
        };
        assert_eq!((windows.len(), gates_in_use.as_slice()), (1, &[2, 2, 2][..]));
        // The boxed future of the async trait, the answer's two vectors, and the lease's list
        // of its three gate keys (the keys copied, the lease id shared with the check).
        assert_eq!(checked, 1 + 2 + 1 + 3, "allocations of admission check {r}");
        let before = allocations();
        now(store.release(lease)).unwrap();
        assert_eq!(allocations() - before, 1, "a release allocates only its boxed future");
    }
    now(store.release(&other)).unwrap();
}
