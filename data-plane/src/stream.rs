//! Forwarding a committed stream to the client (docs/http-api.md, "Streaming"): chunks go
//! out as they arrive, each naming the served model; the failover report rides in one chunk,
//! the first with content; once the model is locked, a drop or a stall ends the stream with
//! an error frame — never a hang, never a second model's text. A frame that does not parse
//! is skipped and counted (`skipped_frames` in a last chunk before `[DONE]`), and a stream
//! that closes after its finish reason without `[DONE]` gets the node's own.
//!
//! The body is pulled by hyper as the client reads, so a slow client slows the upstream
//! read (bounded buffering), and a client that goes away drops the body, which drops the
//! upstream response and closes its connection at once.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use bytes::Bytes;
use serde_json::json;
use serde_json::value::RawValue;

use switchyard_catalog::Model;

use crate::app::{App, model_headers, raw, record_usage};
use crate::breaker::{Outcome, Permit};
use crate::error::Flavor;
use crate::executor::CommittedStream;
use crate::failure::{self, Failure};
use crate::metrics::GenAiSeries;
use crate::providers::{CallError, StreamError, StreamEvent, UpstreamStream, Usage};
use crate::report::FailoverReport;

pub struct Context {
    pub key_id: String,
    /// The request's id: the stream outlives the request's span, so its log lines name it.
    pub request_id: HeaderValue,
    pub model: Arc<Model>,
    pub report: FailoverReport,
    /// A chain of one gets no report.
    pub multi: bool,
    /// The client asked for the final usage chunk (`stream_options.include_usage`).
    pub include_usage: bool,
    pub flavor: Flavor,
    pub gen_ai: Arc<GenAiSeries>,
    /// When the request arrived: the GenAI request duration ends with the stream.
    pub started: Instant,
}

pub fn respond(app: &Arc<App>, stream: CommittedStream, ctx: Context) -> Response {
    let CommittedStream { mut buffered, upstream, permit, deadline, timeout, stall } = stream;
    if ctx.multi
        && let Some(report) = raw(&ctx.report)
    {
        let key = match ctx.flavor {
            Flavor::OpenAi => "secureai",
            Flavor::Classic => "metadata",
        };
        carry_report(&mut buffered, key, report);
    }
    // The head is written while `ctx` is at hand; the body, which takes it, comes after.
    let mut response = Response::new(Body::empty());
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    model_headers(headers, &ctx.model.name, &ctx.report.requested_model);
    let pump = Pump {
        app: Arc::clone(app),
        ctx,
        buffered: buffered.into(),
        upstream,
        permit: Some(permit),
        deadline,
        timeout,
        stall,
        usage: None,
        content_chunks: 0,
        settled: false,
        identity: None,
        after_settle: None,
    };
    let body = futures_util::stream::unfold(pump, |mut pump| async move {
        let frame = pump.next().await?;
        Some((Ok::<Bytes, Infallible>(frame), pump))
    });
    *response.body_mut() = Body::from_stream(body);
    response
}

/// Puts the failover report in one chunk (docs/http-api.md, "Streaming"): the first with
/// content, which the executor read before it committed, so it is among `buffered`. A
/// client that shows text reads that chunk whatever it skips (role-only chunks, say), and
/// the served model is in the headers before any chunk. A stream that committed on its end
/// marker, with no content at all, has the report in its first chunk.
fn carry_report(buffered: &mut [StreamEvent], key: &str, report: Box<RawValue>) {
    let carrier = buffered
        .iter()
        .position(|e| matches!(e, StreamEvent::Chunk { commits: true, .. }))
        .or_else(|| {
            buffered.iter().position(|e| matches!(e, StreamEvent::Chunk { usage_only: false, .. }))
        });
    if let Some(StreamEvent::Chunk { fields, .. }) = carrier.and_then(|i| buffered.get_mut(i)) {
        fields.insert(key.to_owned(), report);
    }
}

struct Pump {
    app: Arc<App>,
    ctx: Context,
    buffered: VecDeque<StreamEvent>,
    upstream: UpstreamStream,
    permit: Option<Permit>,
    deadline: Instant,
    timeout: std::time::Duration,
    stall: std::time::Duration,
    usage: Option<Usage>,
    content_chunks: u64,
    settled: bool,
    /// The stream's `id` and `created`, kept from the first chunk forwarded after a skipped
    /// frame, for a chunk of the node's own at the end (the `skipped_frames` report).
    identity: Option<(Box<RawValue>, Box<RawValue>)>,
    /// The frame still to send once the stream is settled (`[DONE]` after the report).
    after_settle: Option<Bytes>,
}

impl Pump {
    /// The next SSE frame for the client; `None` when the stream is over.
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if self.settled {
                return self.after_settle.take();
            }
            let event = match self.buffered.pop_front() {
                Some(event) => Some(Ok(event)),
                None => match self.read().await {
                    Ok(event) => event,
                    Err(frame) => return Some(frame),
                },
            };
            match event {
                None => {
                    self.settle(Outcome::Success);
                    return None;
                }
                Some(Err(e)) => {
                    let message = e.to_string();
                    return Some(self.fail(&Failure::Stream(e), &message));
                }
                Some(Ok(StreamEvent::Error(e))) => {
                    let message = format!("The upstream model failed mid-stream: {}", e.message);
                    return Some(self.fail(&Failure::InBand(e), &message));
                }
                Some(Ok(StreamEvent::Done)) => {
                    self.settle(Outcome::Success);
                    let done = Bytes::from_static(b"data: [DONE]\n\n");
                    // The report of frames that did not parse rides in a chunk of its own,
                    // the last before `[DONE]`: which upstream chunk was the last is known
                    // only once the stream has ended.
                    return match self.skipped_report() {
                        Some(report) => {
                            self.after_settle = Some(done);
                            Some(report)
                        }
                        None => Some(done),
                    };
                }
                Some(Ok(StreamEvent::Chunk { mut fields, commits, usage, usage_only, .. })) => {
                    if usage.is_some() {
                        self.usage = usage;
                    }
                    if usage_only && !self.ctx.include_usage {
                        continue;
                    }
                    if commits {
                        self.content_chunks += 1;
                    }
                    if let Some(name) = raw(&self.ctx.model.name) {
                        fields.insert("model".to_owned(), name);
                    }
                    if !self.ctx.include_usage {
                        fields.remove("usage");
                    }
                    // Kept only once a frame was skipped, so that an ordinary stream pays
                    // nothing for the report it does not get.
                    if self.identity.is_none()
                        && self.upstream.skipped_frames() > 0
                        && let (Some(id), Some(created)) = (fields.get("id"), fields.get("created"))
                    {
                        self.identity = Some((id.clone(), created.clone()));
                    }
                    let Ok(json) = serde_json::to_vec(&fields) else { continue };
                    return Some(sse_frame(&json));
                }
            }
        }
    }

    /// The next upstream event within the stall and attempt limits, or the error frame
    /// that ends the stream.
    async fn read(&mut self) -> Result<Option<Result<StreamEvent, StreamError>>, Bytes> {
        let now = Instant::now();
        let left = self.deadline.saturating_duration_since(now);
        if left.is_zero() {
            return Err(self.timed_out());
        }
        match tokio::time::timeout(self.stall.min(left), self.upstream.next()).await {
            Ok(event) => Ok(event),
            Err(_) if Instant::now() >= self.deadline => Err(self.timed_out()),
            Err(_) => {
                let message = format!(
                    "The upstream model stopped sending: no chunk for {} ms (stall_timeout_ms).",
                    self.stall.as_millis()
                );
                Err(self.fail(&Failure::Stalled(self.stall), &message))
            }
        }
    }

    fn timed_out(&mut self) -> Bytes {
        let failure = Failure::Call(CallError::Timeout(self.timeout));
        self.fail(&failure, "The attempt exceeded timeout_ms while streaming.")
    }

    fn fail(&mut self, failure: &Failure, message: &str) -> Bytes {
        let (outcome, code) = failure::after_commit(failure);
        let code = code.as_str();
        let request_id = self.ctx.request_id.to_str().unwrap_or_default();
        tracing::warn!(model = %self.ctx.model.name, request_id, code, %message, "stream ended with an error frame");
        self.settle(outcome);
        let body = json!({"error": {"message": message, "type": "server_error", "code": code, "param": null}});
        sse_frame(body.to_string().as_bytes())
    }

    /// The chunk that tells the client how many upstream frames did not parse and were
    /// skipped (`secureai.skipped_frames`, `metadata` on the classic endpoint); `None` when
    /// every frame parsed.
    fn skipped_report(&self) -> Option<Bytes> {
        let skipped = self.upstream.skipped_frames();
        if skipped == 0 {
            return None;
        }
        let key = match self.ctx.flavor {
            Flavor::OpenAi => "secureai",
            Flavor::Classic => "metadata",
        };
        let (id, created) = match &self.identity {
            Some((id, created)) => (json!(id), json!(created)),
            None => (json!("chatcmpl-switchyard"), json!(switchyard_time::now_secs())),
        };
        let chunk = json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": self.ctx.model.name,
            "choices": [],
            key: {"skipped_frames": skipped},
        });
        Some(sse_frame(chunk.to_string().as_bytes()))
    }

    /// Counts the frames that did not parse, and warns of them (at most once a minute per
    /// model).
    fn count_skipped(&self) {
        let skipped = self.upstream.skipped_frames();
        if skipped == 0 {
            return;
        }
        let model = &self.ctx.model.name;
        let metrics = &self.app.executor.metrics;
        if metrics.malformed_frames(model, skipped, Instant::now()) {
            let request_id = self.ctx.request_id.to_str().unwrap_or_default();
            tracing::warn!(%model, request_id, skipped, "upstream stream frames did not parse and were skipped (switchyard_upstream_malformed_frames_total counts them; this warning repeats at most once a minute per model)");
        }
    }

    /// Settles the breaker permit and bills usage, once.
    fn settle(&mut self, outcome: Outcome) {
        if self.settled {
            return;
        }
        self.settled = true;
        self.count_skipped();
        if let Some(permit) = self.permit.take() {
            self.app.executor.report_transition(permit.record(outcome, Instant::now()));
        }
        self.bill();
    }

    fn bill(&mut self) {
        // Without the upstream's usage chunk, count one token per content chunk.
        let usage = self
            .usage
            .take()
            .unwrap_or(Usage { prompt_tokens: 0, completion_tokens: self.content_chunks });
        self.ctx.gen_ai.tokens(usage.prompt_tokens, usage.completion_tokens);
        self.ctx.gen_ai.duration.observe(self.ctx.started.elapsed().as_secs_f64());
        record_usage(&self.app, &self.ctx.key_id, &self.ctx.model, usage);
    }
}

impl Drop for Pump {
    /// The client went away mid-stream: the permit is released unjudged (the upstream did
    /// nothing wrong), and what was streamed so far is still billed.
    fn drop(&mut self) {
        if !self.settled {
            self.settled = true;
            self.count_skipped();
            self.bill();
        }
    }
}

fn sse_frame(json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 8);
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(commits: bool, usage_only: bool) -> StreamEvent {
        StreamEvent::Chunk {
            fields: Default::default(),
            commits,
            usage: None,
            usage_only,
            finished: false,
        }
    }

    fn carriers(events: &[StreamEvent]) -> Vec<usize> {
        (0..events.len())
            .filter(|i| matches!(&events[*i], StreamEvent::Chunk { fields, .. } if fields.contains_key("secureai")))
            .collect()
    }

    fn report() -> Box<RawValue> {
        raw(&json!({"served_model": "b"})).unwrap()
    }

    #[test]
    fn the_report_rides_once_in_the_first_chunk_with_content() {
        let mut events = [chunk(false, false), chunk(true, false)];
        carry_report(&mut events, "secureai", report());
        assert_eq!(carriers(&events), [1]);
    }

    #[test]
    fn a_stream_without_content_has_the_report_in_its_first_chunk_never_a_usage_chunk() {
        let mut events = [chunk(false, true), chunk(false, false), StreamEvent::Done];
        carry_report(&mut events, "secureai", report());
        assert_eq!(carriers(&events), [1]);
        let mut nothing = [StreamEvent::Done];
        carry_report(&mut nothing, "secureai", report());
        assert_eq!(carriers(&nothing), Vec::<usize>::new());
    }
}
