//! Token checks for the admin API and for node streams.

use sha2::{Digest, Sha256};
use tonic::{Request, Status};

use crate::peer::is_loopback;

/// A bearer token compared in constant time (over SHA-256 digests, so that neither the
/// content nor the length of the expected token leaks through timing).
#[derive(Clone)]
pub struct Token([u8; 32]);

impl Token {
    pub fn new(secret: &str) -> Self {
        Self(Sha256::digest(secret.as_bytes()).into())
    }

    pub fn matches(&self, presented: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        digest.iter().zip(self.0.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

fn bearer<T>(request: &Request<T>) -> Option<&str> {
    request.metadata().get("authorization")?.to_str().ok()?.strip_prefix("Bearer ")
}

/// Authenticates every admin call (reads too).
#[derive(Clone, Debug)]
pub struct AdminAuth(pub Token);

impl tonic::service::Interceptor for AdminAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        match bearer(&request) {
            Some(token) if self.0.matches(token) => Ok(request),
            Some(_) => Err(Status::unauthenticated("admin token rejected")),
            None => Err(Status::unauthenticated(
                "missing admin token: send `authorization: Bearer <SWITCHYARD_ADMIN_TOKEN>`",
            )),
        }
    }
}

/// Authenticates nodes: by join token when one is configured, else by loopback address.
#[derive(Clone, Debug)]
pub struct TokenCheck {
    pub join_token: Option<Token>,
}

impl TokenCheck {
    pub fn check_node<T>(&self, request: &Request<T>) -> Result<(), Status> {
        match &self.join_token {
            Some(expected) => match bearer(request) {
                Some(token) if expected.matches(token) => Ok(()),
                _ => Err(Status::unauthenticated("join token missing or rejected")),
            },
            None if is_loopback(request.remote_addr()) => Ok(()),
            None => Err(Status::permission_denied(
                "this control plane has no SWITCHYARD_JOIN_TOKEN and accepts nodes from loopback only",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_only_themselves() {
        let t = Token::new("s3cret");
        assert!(t.matches("s3cret"));
        assert!(!t.matches("s3cre"));
        assert!(!t.matches(""));
    }
}
