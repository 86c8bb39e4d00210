//! tollgate: an LLM inference gateway on Pingora.
//!
//! `src/` is the core; its folders are its parts. The phase plugins are another crate
//! (`tollgate-plugins`, `plugins/`) that depends on this one, so the core cannot name a plugin;
//! the binary (`app/`) assembles the chain from config.
//!
//! - `transport`: the client connection (client address, connection cap, and the pieces that
//!   help Pingora's proxy loop: body replay, held output).
//! - `http`: routes, the request's checks, the error catalogue and its envelopes, SSE framing.
//! - `proxy`: the one `ProxyHttp` implementation, the per-request context, the plugin
//!   contract, placement on replica pools and replica health.
//! - `money`: microcents, usage and its pricing, coding plans.
//! - `store`: the ledger and the identity records behind traits (SQLite, PostgreSQL).
//! - `identity`: API keys and their lifecycle, and the cached lookup the proxy uses.
//! - `state`: state instances share (limiter, idempotency, session placements; in process or
//!   on Redis).
//! - `config`: the YAML configuration (the operator API is the binary's, `app/src/admin/`).
//! - `observe`: metrics, access log, traces.
//! - `runtime`: background threads and their scheduling, clock, graceful stop (the allocator is
//!   the binaries' choice: `tollgate-allocator`).

// Unsafe code is allowed only in the modules that call the OS (marked where they are declared).
#![deny(unsafe_code)]

pub mod config;
pub mod http;
pub mod identity;
pub mod money;
pub mod observe;
pub mod proxy;
pub mod runtime;
pub mod state;
pub mod store;
pub mod transport;
