//! The process allocator: mimalloc, asked the way its fast paths expect, and the memory
//! policy around it ([`keep_small_pages`], [`spawn_heap_collectors`]). The binaries choose it
//! (`#[global_allocator]` in `app/src/main.rs` and the bench's floor); the core does not know it.
//!
//! `mimalloc::MiMalloc` passes every Rust allocation to `mi_malloc_aligned`, even those that
//! need no more than the word alignment every mimalloc block has. mimalloc 3 serves those
//! from its free list only up to 1 KiB; a larger one (a request's future, Pingora's header
//! and body buffers) takes the aligned path's over-allocation: about 180 instructions
//! instead of a dozen, and a block bigger than asked (decision 201). So an allocation
//! aligned to a word or less goes to `mi_malloc`, and only stricter ones to the aligned
//! entry points; every block is freed by `mi_free` either way.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys::{
    mi_free, mi_malloc, mi_malloc_aligned, mi_realloc, mi_realloc_aligned, mi_zalloc, mi_zalloc_aligned,
};

/// The alignment every mimalloc block has: its sizes are whole words and its pages start
/// aligned to at least 16 bytes.
const WORD_ALIGN: usize = std::mem::size_of::<usize>();

/// The global allocator of the `tollgate` binary and of the bench's floor binary (decisions 137
/// and 201).
pub struct Allocator;

// SAFETY: each method forwards to the mimalloc call with the same contract; `mi_free` frees a
// block from any of them, a block is resized by the call matching its layout's alignment (the
// same one that made it), and `mi_malloc`'s blocks are aligned to `WORD_ALIGN`, which is all the
// unaligned calls are used for.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe {
            if layout.align() <= WORD_ALIGN {
                mi_malloc(layout.size()).cast()
            } else {
                mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe {
            if layout.align() <= WORD_ALIGN {
                mi_zalloc(layout.size()).cast()
            } else {
                mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: see the impl.
        unsafe { mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe {
            if layout.align() <= WORD_ALIGN {
                mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

/// Keep the process on small pages (Linux `PR_SET_THP_DISABLE`), as the first thing `main`
/// does. mimalloc asks for transparent huge pages on its arenas; a burst of streams then
/// leaves hundreds of megabytes resident after its memory is freed, because returning a
/// freed range inside a huge page does not shrink it, and khugepaged collapses partly
/// returned ranges back into huge pages while the node is idle (measured: RSS 37 MB before a
/// burst of 2,048 streams, ~400 MB and rising a minute after it; ~150 MB and flat without
/// huge pages; issue 49). The gateway's heap is tens of megabytes, where huge pages save
/// little. A kernel that refuses leaves the setting as it was, with a warning.
pub fn keep_small_pages() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: prctl with an integer option and integer arguments; it touches no memory
        // of ours.
        let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        if rc != 0 {
            log::warn!("transparent huge pages stay on: {}", std::io::Error::last_os_error());
        }
    }
}

/// How often the request threads' allocator heaps are collected (see [`spawn_heap_collectors`]).
pub const COLLECT_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Memory a thread's allocator heap holds free goes back to the system only when that thread
/// collects it, and blocks freed by other threads (a request moves between request threads)
/// wait in its heap until then: a request thread idle after a burst kept ~100 MB of freed
/// pages resident (issue 49). `tasks` loops on the calling runtime collect the heap of the
/// worker they run on every `every` (`mi_collect`, forced: empty pages are freed and returned
/// at once; tens of microseconds for a heap in use).
///
/// The loops wake together. A task a timer wakes runs on the worker that turned the timer,
/// and an idle worker sleeps until work is handed to it, so loops woken one at a time all ran
/// on one worker while the other kept what a burst left in its heap (22-52 MB of anonymous
/// memory 30 s after 2,048 streams in half the runs, against ~7 MB before). Woken together,
/// all but one wait in that worker's queue, and the runtime wakes the sleeping worker to take
/// some.
pub fn spawn_heap_collectors(tasks: usize, every: std::time::Duration) {
    // SAFETY: `mi_collect` walks the calling thread's own heap; it takes no pointer.
    spawn_together(tasks, every, || unsafe { libmimalloc_sys::mi_collect(true) });
}

/// `tasks` loops on the calling runtime, each running `action` every `every`, all at once.
fn spawn_together(tasks: usize, every: std::time::Duration, action: fn()) {
    let first = tokio::time::Instant::now() + every;
    for _ in 0..tasks {
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(first, every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                action();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static RAN_ON: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

    /// What a collection does, as far as scheduling goes: it runs on some worker for a while.
    fn note_worker() {
        let name = std::thread::current().name().unwrap_or("").to_string();
        RAN_ON.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(name);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }

    /// The request threads' collectors reach both workers of an otherwise idle runtime: loops
    /// woken one at a time all ran on the worker that turns the timers, and the other worker's
    /// heap was never collected.
    #[test]
    fn collectors_that_wake_together_run_on_every_worker() {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name_fn(|| format!("worker-{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)))
            .enable_all()
            .build()
            .expect("a runtime");
        rt.spawn(async { spawn_together(8, std::time::Duration::from_millis(200), note_worker) });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let workers = loop {
            std::thread::sleep(std::time::Duration::from_millis(50));
            let mut seen = RAN_ON.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
            seen.sort();
            seen.dedup();
            if seen.len() >= 2 || std::time::Instant::now() > deadline {
                break seen;
            }
        };
        rt.shutdown_background();
        assert_eq!(workers.len(), 2, "the collectors ran on {workers:?} only");
    }

    /// Sizes from 1 byte to 4 MiB at alignments from 1 to 4096: the block is aligned as asked,
    /// holds what is written to it, keeps it through growth and shrinking, and a zeroed block is
    /// zero. An alignment above a word sent to the unaligned calls fails here.
    #[test]
    fn blocks_are_aligned_and_hold_their_bytes() {
        let sizes = (1..=64).chain((65..=20_000).step_by(37)).chain([65_536, 1 << 20, (4 << 20) + 3]);
        for size in sizes {
            for align in [1, 2, 4, 8, 16, 32, 64, 128, 4096] {
                let layout = Layout::from_size_align(size, align).expect("a valid layout");
                // SAFETY: non-zero sizes; each block is freed with its own layout.
                unsafe {
                    let p = Allocator.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "size {size} align {align}");
                    std::ptr::write_bytes(p, 0xA5, size);
                    let grown = Allocator.realloc(p, layout, size * 3);
                    assert_eq!(grown as usize % align, 0, "grown: size {size} align {align}");
                    assert!(std::slice::from_raw_parts(grown, size).iter().all(|&b| b == 0xA5));
                    let grown_layout = Layout::from_size_align(size * 3, align).expect("a valid layout");
                    let shrunk = Allocator.realloc(grown, grown_layout, size.div_ceil(2));
                    assert_eq!(shrunk as usize % align, 0, "shrunk: size {size} align {align}");
                    assert!(std::slice::from_raw_parts(shrunk, size.div_ceil(2)).iter().all(|&b| b == 0xA5));
                    Allocator
                        .dealloc(shrunk, Layout::from_size_align(size.div_ceil(2), align).expect("a valid layout"));
                    let z = Allocator.alloc_zeroed(layout);
                    assert_eq!(z as usize % align, 0, "zeroed: size {size} align {align}");
                    assert!(std::slice::from_raw_parts(z, size).iter().all(|&b| b == 0));
                    Allocator.dealloc(z, layout);
                }
            }
        }
    }
}
