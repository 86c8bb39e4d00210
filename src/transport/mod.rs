//! The client side of the connection, where the gateway helps Pingora's proxy loop.

pub mod connection_cap;
