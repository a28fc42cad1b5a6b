//! A streamed upstream response whose head was 2xx, read as unified events.

use std::collections::VecDeque;

use bytes::Bytes;
use http_body_util::BodyExt;
use switchyard_tls::words;

use super::adapter::StreamDecoder;
use super::error::StreamError;
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
                Err(e) => Some(Err(StreamError::Connection(words::chain(&e)))),
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
    /// The last chunk handed out said every choice had finished: a clean close of the body
    /// from here on ends the stream, end marker or not.
    complete: bool,
    /// Frames that did not parse, skipped (docs/http-api.md, "Streaming").
    skipped: u32,
    /// Why the first skipped frame did not parse: the failure's message if nothing else
    /// makes the stream whole.
    first_skip: Option<String>,
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
            complete: false,
            skipped: 0,
            first_skip: None,
            cut: None,
        }
    }

    /// How many frames did not parse and were skipped so far.
    pub fn skipped_frames(&self) -> u32 {
        self.skipped
    }

    /// A frame that does not parse is skipped and counted, never an error by itself: the
    /// rest of the answer is intact, and a client SDK that met the frame would raise and
    /// lose all of it.
    fn skip(&mut self, why: String) {
        self.skipped = self.skipped.saturating_add(1);
        if self.first_skip.is_none() {
            self.first_skip = Some(why);
        }
    }

    /// Ends the stream as `cut` says once its content chunks are through.
    pub(super) fn cut(&mut self, cut: Cut) {
        self.cut = Some(cut);
    }

    /// The next event; `None` once the body ended cleanly after its end marker.
    ///
    /// Whether a stream that ends is whole is decided here, the same way for every provider:
    /// a body that closes cleanly after every choice's finish reason ended the answer (the
    /// decoder adds what its end marker would have brought, then [`StreamEvent::Done`]);
    /// one that closes before is broken.
    pub async fn next(&mut self) -> Option<Result<StreamEvent, StreamError>> {
        loop {
            if let Some(cut) = &self.cut
                && cut.due()
            {
                return self.cut_off().await;
            }
            if let Some(event) = self.ready.pop_front() {
                match &event {
                    StreamEvent::Chunk { commits, finished, .. } => {
                        self.complete = *finished;
                        if let Some(cut) = &mut self.cut
                            && *commits
                        {
                            cut.seen += 1;
                        }
                    }
                    // Nothing after the end is read.
                    StreamEvent::Done => {
                        self.ended = true;
                        self.ready.clear();
                        self.parser = sse::Parser::default();
                    }
                    StreamEvent::Error(_) => {}
                }
                return Some(Ok(event));
            }
            match self.parser.next_frame() {
                // The line is consumed: the parser reads on from the next one.
                Err(e @ sse::SseError::NotUtf8) => {
                    self.skip(e.to_string());
                    continue;
                }
                Err(e) => return Some(Err(StreamError::Malformed(e.to_string()))),
                Ok(Some(frame)) => match self.decoder.decode(&frame) {
                    Ok(events) => {
                        self.ready.extend(events);
                        continue;
                    }
                    Err(e) => {
                        self.skip(e);
                        continue;
                    }
                },
                Ok(None) => {}
            }
            if self.ended {
                return None;
            }
            match self.source.data().await {
                None => {
                    self.ended = true;
                    if self.complete {
                        // Bytes after the finish reason that never became an event are one
                        // more frame that did not parse, not a reason to fail a whole answer.
                        if self.parser.has_partial() {
                            self.skip("the stream ended mid-event after its finish reason".into());
                        }
                        self.ready.extend(self.decoder.close());
                        continue;
                    }
                    if let Some(why) = self.first_skip.take() {
                        return Some(Err(StreamError::Malformed(format!(
                            "the stream ended before its finish reason, and {} of its frames did not parse (first: {why})",
                            self.skipped
                        ))));
                    }
                    if self.parser.has_partial() {
                        return Some(Err(StreamError::Connection(
                            "the stream ended mid-event".into(),
                        )));
                    }
                    return Some(Err(StreamError::Connection(
                        "the upstream closed the stream before its finish reason".into(),
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

#[cfg(test)]
mod tests {
    //! How a stream ends, decided here for every provider: whole after its finish reason,
    //! with or without the end marker; broken before it; frames that do not parse skipped.

    use super::*;
    use crate::providers::{Adapter, anthropic::Anthropic, gemini::Gemini, openai::OpenAi};

    fn stream(adapter: &dyn Adapter, body: &str) -> UpstreamStream {
        let source = Source::Injected(Some(Bytes::from(body.to_owned())));
        UpstreamStream::new(source, adapter.stream_decoder("up"))
    }

    /// What the stream yields, one word each: `text:…`, `finish`, `usage:N`, `done`, or
    /// the error's kind; until `None`.
    async fn read(mut s: UpstreamStream) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(next) = s.next().await {
            out.push(match next {
                Ok(StreamEvent::Chunk { fields, usage, usage_only: true, .. }) => {
                    assert!(fields.contains_key("usage"));
                    format!("usage:{}", usage.map_or(0, |u| u.completion_tokens))
                }
                Ok(StreamEvent::Chunk { fields, .. }) => {
                    let choices: serde_json::Value =
                        serde_json::from_str(fields["choices"].get()).unwrap();
                    match choices[0]["delta"]["content"].as_str() {
                        Some(text) if !text.is_empty() => format!("text:{text}"),
                        _ if !choices[0]["finish_reason"].is_null() => "finish".into(),
                        _ => "role".into(),
                    }
                }
                Ok(StreamEvent::Done) => "done".into(),
                Ok(StreamEvent::Error(e)) => format!("in-band:{}", e.message),
                Err(StreamError::Connection(_)) => "connection".into(),
                Err(StreamError::Malformed(_)) => "malformed".into(),
            });
        }
        out
    }

    fn openai(data: &[&str]) -> String {
        data.iter().map(|d| format!("data: {d}\n\n")).collect()
    }

    const ROLE: &str = r#"{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#;
    const HI: &str =
        r#"{"id":"c","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}"#;
    const STOP: &str = r#"{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#;
    const USAGE: &str =
        r#"{"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#;
    const NOT_JSON: &str = r#"{"id":"c","choices":[{"delta": "#;

    #[tokio::test]
    async fn an_openai_stream_closed_after_its_finish_reason_and_usage_ends_with_done() {
        let got = read(stream(&OpenAi, &openai(&[ROLE, HI, STOP, USAGE]))).await;
        assert_eq!(got, ["role", "text:hi", "finish", "usage:1", "done"]);
        // With the marker, the same events: the node's own `done` stands for it.
        let got = read(stream(&OpenAi, &openai(&[ROLE, HI, STOP, USAGE, "[DONE]"]))).await;
        assert_eq!(got, ["role", "text:hi", "finish", "usage:1", "done"]);
    }

    #[tokio::test]
    async fn a_stream_closed_before_its_finish_reason_is_broken() {
        let got = read(stream(&OpenAi, &openai(&[ROLE, HI]))).await;
        assert_eq!(got, ["role", "text:hi", "connection"]);
    }

    #[tokio::test]
    async fn every_choice_must_finish_before_a_close_is_an_end() {
        let second =
            r#"{"id":"c","choices":[{"index":1,"delta":{"content":"yo"},"finish_reason":null}]}"#;
        let got = read(stream(&OpenAi, &openai(&[ROLE, second, STOP]))).await;
        assert_eq!(got, ["role", "text:yo", "finish", "connection"], "choice 1 never finished");
    }

    #[tokio::test]
    async fn a_frame_that_does_not_parse_is_skipped_and_counted() {
        let mut s = stream(&OpenAi, &openai(&[ROLE, HI, NOT_JSON, HI, STOP, "[DONE]"]));
        let mut got = Vec::new();
        while let Some(Ok(event)) = s.next().await {
            got.push(matches!(event, StreamEvent::Done));
        }
        assert_eq!(got.len(), 5, "role, hi, hi, finish, done: {got:?}");
        assert_eq!(s.skipped_frames(), 1);
    }

    #[tokio::test]
    async fn a_stream_of_frames_that_do_not_parse_is_still_a_failure() {
        let got = read(stream(&OpenAi, &openai(&[NOT_JSON, NOT_JSON]))).await;
        assert_eq!(got, ["malformed"]);
        // Past its finish reason, though, a bad frame is only counted.
        let mut s = stream(&OpenAi, &openai(&[ROLE, HI, STOP, NOT_JSON]));
        let mut got = Vec::new();
        while let Some(Ok(event)) = s.next().await {
            got.push(event);
        }
        assert!(matches!(got.last(), Some(StreamEvent::Done)), "{got:?}");
        assert_eq!(s.skipped_frames(), 1);
    }

    #[tokio::test]
    async fn an_anthropic_stream_closed_after_its_stop_reason_gets_what_message_stop_brings() {
        let events = [
            (
                "message_start",
                r#"{"type":"message_start","message":{"id":"m","model":"up","usage":{"input_tokens":3,"output_tokens":1}}}"#,
            ),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}"#,
            ),
            ("content_block_stop", r#"{"type":"content_block_stop","index":0}"#),
            (
                "message_delta",
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":4}}"#,
            ),
        ];
        let body: String =
            events.iter().map(|(e, d)| format!("event: {e}\ndata: {d}\n\n")).collect();
        let got = read(stream(&Anthropic, &body)).await;
        assert_eq!(got, ["role", "text:hi", "finish", "usage:4", "done"]);
        // Without the stop reason it is a broken stream.
        let cut: String =
            events[..3].iter().map(|(e, d)| format!("event: {e}\ndata: {d}\n\n")).collect();
        let got = read(stream(&Anthropic, &cut)).await;
        assert_eq!(got, ["role", "text:hi", "connection"]);
    }

    #[tokio::test]
    async fn a_gemini_stream_ends_with_its_body_after_the_finish_reason() {
        let frames = [
            r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"hi"}]},"index":0}]}"#,
            r#"{"candidates":[{"content":{"role":"model","parts":[{"text":""}]},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":3,"candidatesTokenCount":1,"totalTokenCount":4}}"#,
        ];
        let body: String = frames.iter().map(|d| format!("data: {d}\r\n\r\n")).collect();
        let got = read(stream(&Gemini, &body)).await;
        assert_eq!(got, ["text:hi", "finish", "usage:1", "done"]);
        let got = read(stream(&Gemini, &format!("data: {}\r\n\r\n", frames[0]))).await;
        assert_eq!(got, ["text:hi", "connection"]);
    }
}
