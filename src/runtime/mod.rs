//! The process around the proxy: how background threads run (how they are scheduled is the
//! `tollgate-threads` crate), the clock the stores keep, what a graceful stop waits for, and
//! test fault injection.

pub mod background;
pub mod clock;
pub mod drain;
pub mod fast_map;
pub mod faults;
