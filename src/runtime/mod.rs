//! The process around the proxy: how background threads are scheduled and run, the clock the
//! stores keep, what a graceful stop waits for, and test fault injection.

pub mod background;
pub mod clock;
pub mod drain;
pub mod fast_map;
pub mod faults;
#[allow(unsafe_code)] // sched_setscheduler and sched_getscheduler
pub mod thread_policy;
