//! tollgate: an LLM inference gateway on Pingora.
//!
//! `src/` is the core: configuration, the error catalogue and its two envelopes, routing,
//! the per-request context, the plugin contract, placement on replica pools, SSE framing,
//! usage pricing and the one `ProxyHttp` implementation. The phase plugins are another crate
//! (`tollgate-plugins`, `plugins/`) that depends on this one, so the core cannot name a plugin;
//! the binary (`app/`) assembles the chain from config.

pub mod access_log;
pub mod admin;
pub mod allocator;
pub mod background;
pub mod body_replay;
pub mod client_address;
pub mod clock;
pub mod config;
pub mod ctx;
pub mod drain;
pub mod envelope;
pub mod error;
pub mod fast_map;
pub mod faults;
pub mod health;
pub mod held_output;
pub mod idempotency;
pub mod identity;
pub mod identity_service;
pub mod json_raw;
pub mod limits;
pub mod metrics;
pub mod money;
pub mod placement;
pub mod placement_sim;
pub mod placements;
pub mod plans;
pub mod plugin;
pub mod proxy;
pub mod redis_conn;
pub mod request;
pub mod responder;
pub mod routes;
pub mod session;
pub mod sse;
pub mod store;
pub mod text;
pub mod thread_policy;
pub mod traces;
pub mod transport;
pub mod usage;
