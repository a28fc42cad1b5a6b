//! TLS between Switchyard's parts (docs/operating.md, "TLS"): the control plane's gRPC
//! listener, the node's channel to it, the node's HTTP listener and the CLI's admin calls.
//!
//! - [`files`]: PEM files named by the flag that gave them, and what a bad one is called;
//! - [`expiry`]: when the certificates read from them expire, for `/metrics`;
//! - [`reload`]: a value built from files and rebuilt when they change (rotation);
//! - [`config`]: the rustls server and client configs, whose certificates, keys and CAs
//!   come from reloading files;
//! - [`words`]: rustls's handshake errors as an operator reads them;
//! - [`connect`]: a connector that dials a control plane over TLS (for tonic's channel);
//! - [`accept`]: handshakes of accepted connections, off the accept loop, refusals logged
//!   at a bounded rate.
//!
//! One crypto provider, `ring`, the one the upstream client already uses.

pub mod accept;
pub mod config;
pub mod connect;
pub mod expiry;
pub mod files;
pub mod reload;
pub mod words;
