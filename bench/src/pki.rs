//! The e2e harness's test certificates (std + rcgen + tempfile only), for `tls-cost`: the
//! same generator the end-to-end tests use.

#[path = "../../control-plane/tests/support/pki.rs"]
mod harness;

pub use harness::Ca;
