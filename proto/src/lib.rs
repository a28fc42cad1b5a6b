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

    /// The names of the audit log's entries, which are their webhook events' types too.
    pub mod event_types {
        /// A request was served by another model than the first of its chain, or failed
        /// after trying several.
        pub const FAILOVER: &str = "api:model_failover";
        /// A node answered with a key's or request's designed degraded answer: no model
        /// could serve.
        pub const DEGRADED: &str = "api:degraded_response";
        /// A node continued a stream that broke after content reached the client.
        pub const STREAM_CONTINUED: &str = "api:stream_continued";
        /// A node discarded events (a bound of its memory or spool, an unwritable spool, an
        /// unreadable record) and counted them: stored in the audit log like a failover
        /// event.
        pub const EVENTS_LOST: &str = "events.lost";
    }

    /// A circuit breaker's state as the node stream (`BreakerTransition.from`, `to`), the
    /// stored breaker record and the admin API (`Breaker.state`) spell it.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum BreakerState {
        /// Calls flow; outcomes fill the window.
        Closed,
        /// Calls are rejected with no network call until the cool-down has passed.
        Open,
        /// A few probes are let through; the rest are rejected.
        HalfOpen,
    }

    impl BreakerState {
        pub fn as_str(self) -> &'static str {
            match self {
                Self::Closed => "closed",
                Self::Open => "open",
                Self::HalfOpen => "half_open",
            }
        }

        /// `None` for a state this release does not know.
        pub fn parse(state: &str) -> Option<Self> {
            [Self::Closed, Self::Open, Self::HalfOpen].into_iter().find(|s| s.as_str() == state)
        }

        /// Whether `state` keeps ordinary requests off the deployment: open, or half-open
        /// while its probe runs.
        pub fn is_open(state: &str) -> bool {
            matches!(Self::parse(state), Some(Self::Open | Self::HalfOpen))
        }
    }

    #[cfg(test)]
    mod breaker_state_tests {
        use super::BreakerState;

        #[test]
        fn breaker_states_read_as_they_are_written() {
            for state in [BreakerState::Closed, BreakerState::Open, BreakerState::HalfOpen] {
                assert_eq!(BreakerState::parse(state.as_str()), Some(state));
            }
            assert_eq!(BreakerState::parse("ajar"), None);
            assert!(BreakerState::is_open("half_open") && BreakerState::is_open("open"));
            assert!(!BreakerState::is_open("closed") && !BreakerState::is_open(""));
        }
    }

    impl v1::FailoverEvent {
        /// The entry's type: `events.lost` for a count of lost events (`lost`),
        /// `api:degraded_response` for a degraded answer, `api:stream_continued` for a
        /// continued stream, else `api:model_failover`.
        pub fn event_type(&self) -> &'static str {
            use event_types::*;
            if self.lost.is_some() {
                EVENTS_LOST
            } else if !self.degraded.is_empty() {
                DEGRADED
            } else if !self.continued.is_empty() {
                STREAM_CONTINUED
            } else {
                FAILOVER
            }
        }
    }

    /// `NodeControl`'s server with pre-encoded responses (proto/build.rs): the control plane
    /// encodes a config change once for all its nodes. Beside `v1` rather than inside it: it
    /// uses `v1`'s messages, and `v1` knows nothing of it.
    pub mod encoded {
        use bytes::{BufMut, Bytes};
        use prost::Message;
        use tonic::codec::{Codec, EncodeBuf, Encoder};

        use crate::node::v1::{ControlMessage, NodeMessage};

        include!(concat!(env!("OUT_DIR"), "/switchyard.node.v1.NodeControl.rs"));

        /// The protobuf encoding of one [`ControlMessage`]. Cloning it shares the bytes.
        #[derive(Clone, Debug)]
        pub struct EncodedControlMessage(Bytes);

        impl EncodedControlMessage {
            pub fn new(message: &ControlMessage) -> Self {
                Self(Bytes::from(message.encode_to_vec()))
            }

            /// Encoded size in bytes (without gRPC's 5-byte frame header).
            pub fn len(&self) -> usize {
                self.0.len()
            }

            pub fn is_empty(&self) -> bool {
                self.0.is_empty()
            }

            pub fn as_bytes(&self) -> &[u8] {
                &self.0
            }
        }

        /// Writes [`EncodedControlMessage`]s as they are, decodes [`NodeMessage`]s with prost.
        #[derive(Debug, Default, Clone, Copy)]
        pub struct EncodedCodec;

        impl Codec for EncodedCodec {
            type Encode = EncodedControlMessage;
            type Decode = NodeMessage;
            type Encoder = Self;
            type Decoder = tonic_prost::ProstDecoder<NodeMessage>;

            fn encoder(&mut self) -> Self::Encoder {
                *self
            }

            fn decoder(&mut self) -> Self::Decoder {
                tonic_prost::ProstDecoder::default()
            }
        }

        impl Encoder for EncodedCodec {
            type Item = EncodedControlMessage;
            type Error = tonic::Status;

            fn encode(
                &mut self,
                item: Self::Item,
                dst: &mut EncodeBuf<'_>,
            ) -> Result<(), Self::Error> {
                dst.put_slice(&item.0);
                Ok(())
            }
        }

        #[cfg(test)]
        mod tests {
            use super::*;
            use crate::node::v1::{Resource, Update, control_message};

            #[test]
            fn an_encoded_message_decodes_as_the_message() {
                let update = Update {
                    version: 7,
                    upserts: vec![Resource { name: "keys/k".into(), value: b"{}".to_vec() }],
                    deletes: vec!["keys/gone".into()],
                };
                let message = ControlMessage { msg: Some(control_message::Msg::Update(update)) };
                let encoded = EncodedControlMessage::new(&message);
                assert_eq!(ControlMessage::decode(encoded.0.clone()), Ok(message));
            }
        }
    }
}

/// Helpers of the failover event's JSON form (proto/build.rs).
mod json {
    pub fn is_zero(n: &u32) -> bool {
        *n == 0
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
