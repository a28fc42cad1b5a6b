//! Switchyard's control plane.
#![forbid(unsafe_code)]

pub mod store;
