//! The process around the proxy: the allocator, how background threads are scheduled and
//! run, the clock the stores keep, what a graceful stop waits for, and test fault injection.

pub mod allocator;
pub mod background;
pub mod clock;
pub mod drain;
pub mod fast_map;
pub mod faults;
pub mod thread_policy;
