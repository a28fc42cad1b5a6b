//! Switchyard's control plane: keeps keys and the catalog in the store, serves the admin
//! API, and streams config to data-plane nodes.
#![forbid(unsafe_code)]

pub mod admin;
pub mod audit;
pub mod auth;
pub mod events;
pub mod fanout;
pub mod faults;
pub mod fleet;
pub mod layout;
pub mod limits;
pub mod metrics;
pub mod nodes;
pub mod paging;
pub mod peer;
pub mod reports;
pub mod server;
pub mod store;
pub mod webhooks;
