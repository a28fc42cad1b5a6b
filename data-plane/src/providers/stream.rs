//! A streamed upstream response whose head was 2xx, read as unified events.

use std::collections::VecDeque;

use http_body_util::BodyExt;

use super::adapter::StreamDecoder;
use super::error::{StreamError, error_chain};
use super::sse;
use super::unified::StreamEvent;

/// A streamed upstream response whose head was 200: events as they arrive.
pub struct UpstreamStream {
    body: hyper::body::Incoming,
    parser: sse::Parser,
    decoder: Box<dyn StreamDecoder>,
    /// Events decoded from a frame but not handed out yet.
    ready: VecDeque<StreamEvent>,
    ended: bool,
}

impl UpstreamStream {
    pub(super) fn new(body: hyper::body::Incoming, decoder: Box<dyn StreamDecoder>) -> Self {
        Self { body, parser: sse::Parser::default(), decoder, ready: VecDeque::new(), ended: false }
    }

    /// The next event; `None` once the body ended cleanly after its end marker.
    pub async fn next(&mut self) -> Option<Result<StreamEvent, StreamError>> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Some(Ok(event));
            }
            match self.parser.next_frame() {
                Err(e) => return Some(Err(StreamError::Malformed(e.to_string()))),
                Ok(Some(frame)) => match self.decoder.decode(&frame) {
                    Ok(events) => {
                        self.ready.extend(events);
                        continue;
                    }
                    Err(e) => return Some(Err(StreamError::Malformed(e))),
                },
                Ok(None) => {}
            }
            if self.ended {
                return None;
            }
            match self.body.frame().await {
                None => {
                    self.ended = true;
                    if self.parser.has_partial() {
                        return Some(Err(StreamError::Connection(
                            "the stream ended mid-event".into(),
                        )));
                    }
                    if let Some(events) = self.decoder.finish() {
                        self.ready.extend(events);
                        continue;
                    }
                    return Some(Err(StreamError::Connection(
                        "the upstream closed the stream before its end marker".into(),
                    )));
                }
                Some(Err(e)) => {
                    self.ended = true;
                    return Some(Err(StreamError::Connection(error_chain(&e))));
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data()
                        && let Err(e) = self.parser.push(&data)
                    {
                        return Some(Err(StreamError::Malformed(e.to_string())));
                    }
                }
            }
        }
    }
}
