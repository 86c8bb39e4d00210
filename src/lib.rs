//! tollgate: an LLM inference gateway on Pingora.
//!
//! `src/` is the core: configuration, the error catalogue and its two envelopes, routing,
//! the per-request context, the plugin contract, placement on replica pools, SSE framing,
//! usage pricing and the one `ProxyHttp` implementation. `plugins/` holds the phase plugins;
//! the core never names one (the chain is assembled in `plugins/mod.rs`).

pub mod admin;
pub mod body_replay;
pub mod cli;
pub mod config;
pub mod ctx;
pub mod envelope;
pub mod error;
pub mod faults;
pub mod heartbeat;
pub mod held_output;
pub mod identity;
pub mod json_raw;
pub mod limits;
pub mod placement;
pub mod plugin;
pub mod proxy;
pub mod request;
pub mod responder;
pub mod routes;
pub mod server;
pub mod sse;
pub mod store;
pub mod usage;
pub mod watchdog;

#[path = "../plugins/mod.rs"]
pub mod plugins;
