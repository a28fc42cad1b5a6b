//! Checks on the address a gRPC peer connects from.

use std::net::SocketAddr;

/// Whether a peer address is loopback, for control planes that run without a join token.
/// An unknown address (a transport that has none) is not.
pub fn is_loopback(addr: Option<SocketAddr>) -> bool {
    addr.is_some_and(|a| a.ip().is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_known_loopback_peers_are_loopback() {
        for (addr, want) in [
            (Some("127.0.0.1:1"), true),
            (Some("127.9.9.9:1"), true),
            (Some("[::1]:1"), true),
            (Some("10.0.0.1:1"), false),
            (Some("[::ffff:127.0.0.1]:1"), false),
            (None, false),
        ] {
            let parsed = addr.and_then(|a| a.parse().ok());
            assert_eq!(is_loopback(parsed), want, "{addr:?}");
        }
    }
}
