//! Switchyard's data-plane node: applies config streamed from the control plane and
//! serves the HTTP API. A request goes `http` → `request` → `chain` → `executor` →
//! `providers::<kind>` and back.
#![forbid(unsafe_code)]

pub mod breaker;
pub mod chain;
pub mod config;
pub mod error;
pub mod executor;
pub mod http;
pub mod metrics;
pub mod node;
pub mod persist;
pub mod providers;
pub mod report;
pub mod request;
pub mod serve;
pub mod shards;
pub mod state;
pub mod stream;
pub mod sync;
pub mod telemetry;
