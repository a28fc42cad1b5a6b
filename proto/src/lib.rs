//! Generated gRPC types. Domain code converts them into validated types at its boundary.
#![allow(clippy::all)]

pub mod admin {
    pub mod v1 {
        tonic::include_proto!("switchyard.admin.v1");
    }
}

pub mod node {
    pub mod v1 {
        tonic::include_proto!("switchyard.node.v1");
    }
}

/// Client stubs for etcd's v3 API (the server half is generated too but unused).
pub mod etcd {
    tonic::include_proto!("etcdserverpb");
}

/// Debug output of the etcd messages that carry a secret: the password and the token are
/// never shown, so a message that ends up in a log or an error does not leak them.
mod etcd_debug {
    use std::fmt;

    use super::etcd::{AuthUserAddRequest, AuthenticateRequest, AuthenticateResponse};

    impl fmt::Debug for AuthenticateRequest {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("AuthenticateRequest")
                .field("name", &self.name)
                .field("password", &"<redacted>")
                .finish()
        }
    }

    impl fmt::Debug for AuthenticateResponse {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("AuthenticateResponse")
                .field("header", &self.header)
                .field("token", &"<redacted>")
                .finish()
        }
    }

    impl fmt::Debug for AuthUserAddRequest {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("AuthUserAddRequest")
                .field("name", &self.name)
                .field("password", &"<redacted>")
                .finish()
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn debug_output_hides_etcd_passwords_and_tokens() {
            let request =
                AuthenticateRequest { name: "switchyard".into(), password: "hunter2".into() };
            let shown = format!("{request:?}");
            assert!(shown.contains("switchyard") && !shown.contains("hunter2"), "{shown}");
            let response = AuthenticateResponse { header: None, token: "tok.en.42".into() };
            assert!(!format!("{response:?}").contains("tok.en.42"));
            let add = AuthUserAddRequest { name: "u".into(), password: "hunter2".into() };
            assert!(!format!("{add:?}").contains("hunter2"));
        }
    }
}
