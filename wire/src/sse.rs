//! The server-sent event both event-stream formats write (Messages, Responses): a named
//! event and its JSON data.

use crate::de;

/// One server-sent event: `event: {event}\ndata: {data}\n\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub event: &'static str,
    pub data: Vec<u8>,
}

impl Frame {
    pub(crate) fn new<T: serde::Serialize>(event: &'static str, data: &T) -> Self {
        Frame { event, data: de::to_vec(data) }
    }

    /// The frame as it goes on the wire.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.event.len() + self.data.len() + 16);
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(self.event.as_bytes());
        out.extend_from_slice(b"\ndata: ");
        out.extend_from_slice(&self.data);
        out.extend_from_slice(b"\n\n");
        out
    }
}
