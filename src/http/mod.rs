//! The HTTP surface the core answers itself: routes, the request's checks, the error
//! catalogue and its two envelopes, SSE framing, and the small text and JSON helpers the
//! dialects share.

pub mod answer;
pub mod envelope;
pub mod error;
pub mod json_raw;
pub mod request;
pub mod responder;
pub mod routes;
pub mod session;
pub mod sse;
pub mod text;
