//! State that several gateway instances share, each behind a trait with an in-process
//! backend (one node, nothing installed) and a Redis one (a fleet): the rate limiter and
//! admission, idempotency records, and session placements.

pub mod idempotency;
pub mod limits;
pub mod placements;
pub mod redis_conn;
