//! The e2e harness's fleet of lean node clients (tests/src/node_fleet.rs), for `fleet`.

// The e2e tests use all of it; the bench not every accessor.
#[allow(dead_code)]
#[path = "../../tests/src/node_fleet.rs"]
mod harness;

pub use harness::{FleetNode, connect_fleet, time_to_all, wait_all};
