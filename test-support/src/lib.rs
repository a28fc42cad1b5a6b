//! What the control plane's store tests, the end-to-end harness and the bench share: a real,
//! throw-away etcd ([`etcd`]), test certificates ([`pki`]), loopback ports held for a process
//! that may restart on them ([`port`]), a fleet of lean node clients on the real node stream
//! ([`node_fleet`]) and the simulator's command line ([`sim`]).
//!
//! It depends on neither plane nor the CLI: it drives them from outside, as users do.
// Test support: a harness that cannot go on fails the test that called it, with a message.
#![allow(clippy::expect_used, clippy::panic)]

pub mod etcd;
pub mod node_fleet;
pub mod pki;
pub mod port;
pub mod sim;
