//! Switchyard's data-plane node: applies config streamed from the control plane and
//! serves the HTTP API.
#![forbid(unsafe_code)]

pub mod breaker;
pub mod config;
pub mod http;
pub mod node;
pub mod persist;
pub mod state;
pub mod sync;
