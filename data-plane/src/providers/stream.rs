//! A streamed upstream response whose head was 2xx, read as unified events.

use std::collections::VecDeque;

use bytes::Bytes;
use http_body_util::BodyExt;

use super::adapter::StreamDecoder;
use super::error::{StreamError, error_chain};
use super::sse;
use super::unified::StreamEvent;
use crate::chaos::{Cut, CutKind};

/// Where a stream's bytes come from.
pub(super) enum Source {
    /// The upstream's response body.
    Upstream(hyper::body::Incoming),
    /// A body an injected fault made on the node (a malformed 200): these bytes, then the end.
    Injected(Option<Bytes>),
}

impl Source {
    /// The next piece of the body: `None` at its end, `Err` when the connection broke.
    async fn data(&mut self) -> Option<Result<Bytes, StreamError>> {
        match self {
            Self::Upstream(body) => match body.frame().await? {
                // Trailers carry no events.
                Ok(frame) => Some(Ok(frame.into_data().unwrap_or_default())),
                Err(e) => Some(Err(StreamError::Connection(error_chain(&e)))),
            },
            Self::Injected(bytes) => bytes.take().map(Ok),
        }
    }
}

/// A streamed upstream response whose head was 200: events as they arrive.
pub struct UpstreamStream {
    source: Source,
    parser: sse::Parser,
    decoder: Box<dyn StreamDecoder>,
    /// Events decoded from a frame but not handed out yet.
    ready: VecDeque<StreamEvent>,
    ended: bool,
    /// Where an injected stream fault ends the stream; `None` for every other stream.
    cut: Option<Cut>,
}

impl UpstreamStream {
    pub(super) fn new(source: Source, decoder: Box<dyn StreamDecoder>) -> Self {
        Self {
            source,
            parser: sse::Parser::default(),
            decoder,
            ready: VecDeque::new(),
            ended: false,
            cut: None,
        }
    }

    /// Ends the stream as `cut` says once its content chunks are through.
    pub(super) fn cut(&mut self, cut: Cut) {
        self.cut = Some(cut);
    }

    /// The next event; `None` once the body ended cleanly after its end marker.
    pub async fn next(&mut self) -> Option<Result<StreamEvent, StreamError>> {
        loop {
            if let Some(cut) = &self.cut
                && cut.due()
            {
                return self.cut_off().await;
            }
            if let Some(event) = self.ready.pop_front() {
                if let Some(cut) = &mut self.cut
                    && matches!(event, StreamEvent::Chunk { commits: true, .. })
                {
                    cut.seen += 1;
                }
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
            match self.source.data().await {
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
                    return Some(Err(e));
                }
                Some(Ok(data)) => {
                    if let Err(e) = self.parser.push(&data) {
                        return Some(Err(StreamError::Malformed(e.to_string())));
                    }
                }
            }
        }
    }

    /// An injected stream fault's end: the upstream connection is released either way; a
    /// stall then sends nothing, ever (the reader's stall timeout ends it), a drop is a
    /// broken connection.
    async fn cut_off(&mut self) -> Option<Result<StreamEvent, StreamError>> {
        self.source = Source::Injected(None);
        self.parser = sse::Parser::default();
        self.ready.clear();
        self.ended = true;
        let cut = self.cut.as_ref()?;
        match cut.kind {
            CutKind::Stall => std::future::pending().await,
            CutKind::Drop => {
                let message = format!(
                    "connection reset by peer after {} content chunks (injected fault `{}`)",
                    cut.seen, cut.fault
                );
                self.cut = None;
                Some(Err(StreamError::Connection(message)))
            }
        }
    }
}
