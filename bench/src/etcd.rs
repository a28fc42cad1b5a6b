//! The e2e harness's throw-away etcd, for `--store etcd`.

#[path = "../../control-plane/tests/support/etcd.rs"]
mod harness;

pub use harness::EtcdProcess;
