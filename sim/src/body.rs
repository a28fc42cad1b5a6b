//! The response body type: a whole buffer, or frames fed by a task over a channel.
//!
//! One concrete enum instead of a boxed body keeps a plain response to a single `Bytes` with
//! no extra allocation, which matters when the simulator is the load benchmark's target.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::sync::mpsc;

/// What a streaming task sends: data, or "abort the connection here".
#[derive(Debug)]
pub enum Chunk {
    Data(Bytes),
    Abort,
}

/// The error a body yields to make hyper drop the connection mid-response.
#[derive(Debug, thiserror::Error)]
#[error("simulated connection drop")]
pub struct Aborted;

#[derive(Debug)]
pub enum SimBody {
    Full(Option<Bytes>),
    Channel(mpsc::Receiver<Chunk>),
}

impl SimBody {
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        SimBody::Full(Some(bytes.into()))
    }

    pub fn empty() -> Self {
        SimBody::Full(None)
    }
}

impl http_body::Body for SimBody {
    type Data = Bytes;
    type Error = Aborted;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Aborted>>> {
        match self.get_mut() {
            SimBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            SimBody::Channel(rx) => match rx.poll_recv(cx) {
                Poll::Ready(Some(Chunk::Data(b))) => Poll::Ready(Some(Ok(Frame::data(b)))),
                Poll::Ready(Some(Chunk::Abort)) => Poll::Ready(Some(Err(Aborted))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, SimBody::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            SimBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            SimBody::Full(None) => SizeHint::with_exact(0),
            SimBody::Channel(_) => SizeHint::default(),
        }
    }
}
