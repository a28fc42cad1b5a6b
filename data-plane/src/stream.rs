//! Forwarding a committed stream to the client (docs/http-api.md, "Streaming"): chunks go
//! out as they arrive, each naming the model that sent it; the failover report rides in one
//! chunk, the first with content. Once the model is locked, a break (a drop, an in-band error,
//! a stall) is continued when it can be: a model that can take the text so far as the start of
//! its answer ([`crate::continuation`]) is asked for the rest, and only the new text is
//! forwarded, so the client reads one answer; otherwise the stream ends with an error frame —
//! never a hang, never a second start of the answer. A frame that does not parse is skipped
//! and counted, and a stream that closes after its finish reason without `[DONE]` gets the
//! node's own; both, like continuations, are reported in a last chunk before `[DONE]`.
//!
//! The body is pulled by hyper as the client reads, so a slow client slows the upstream
//! read (bounded buffering), and a client that goes away drops the body, which drops the
//! upstream response and closes its connection at once.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use bytes::Bytes;
use serde_json::json;
use serde_json::value::RawValue;

use switchyard_catalog::Model;

use switchyard_proto::node::v1 as pb;

use crate::app::{App, model_headers, raw, record_usage};
use crate::breaker::{Admission, Outcome, Permit};
use crate::chain::Entry;
use crate::chaos::Injector;
use crate::config::NodeConfig;
use crate::continuation::{self, Delivered};
use crate::error::Flavor;
use crate::executor::{self, CommittedStream};
use crate::failure::{self, Failure, Verdict};
use crate::messages::Framing;
use crate::metrics::ContinuationLabels;
use crate::metrics::GenAiSeries;
use crate::providers::{CallError, StreamError, StreamEvent, UpstreamStream, Usage};
use crate::report::AttemptReport;
use crate::report::FailoverReport;
use crate::request::ChatRequest;
use crate::responses;
use crate::retry;

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
    /// What continuing the stream after a break takes; `None` when it is not to be
    /// continued (`continue_streams: false`, or no model of the chain from the serving one
    /// on can continue).
    pub rescue: Option<Rescue>,
}

/// What a continuation needs (docs/http-api.md, "Streaming").
pub struct Rescue {
    /// The client's request as it arrived.
    pub body: Bytes,
    pub config: Arc<NodeConfig>,
    /// The entry that serves, then the chain's later entries.
    pub entries: Vec<Entry>,
    /// When the chain's `deadline_ms` runs out, if it has one.
    pub deadline: Option<Instant>,
}

impl Rescue {
    /// The rescue of a stream served by `served` of `entries`, when one of them from it on
    /// can continue an answer.
    pub fn of(
        body: Bytes,
        config: Arc<NodeConfig>,
        entries: &[Entry],
        served: &Arc<Model>,
        deadline: Option<Instant>,
    ) -> Option<Self> {
        let at = entries.iter().position(|e| Arc::ptr_eq(&e.model, served))?;
        // Most chains have no model that can continue: they copy nothing.
        let able = entries[at..].iter().any(|e| !e.model.continuation.is_none());
        able.then(|| Self { body, config, entries: entries[at..].to_vec(), deadline })
    }
}

pub fn respond(app: &Arc<App>, stream: CommittedStream, ctx: Context) -> Response {
    let CommittedStream { mut buffered, upstream, permit, deadline, timeout, stall, slot } = stream;
    let asked = ctx.rescue.as_ref().map_or(0, |r| r.entries.len());
    let delivered = ctx.rescue.as_ref().map(|_| Delivered::default());
    let report = if ctx.multi { raw(&ctx.report) } else { None };
    // A Messages stream carries the report in `message_start`'s message (docs/messages.md).
    let messages =
        (ctx.flavor == Flavor::Anthropic).then(|| Framing::new(&ctx.model.name, report.clone()));
    // A Responses stream carries it in `response.created`'s response (docs/responses.md).
    let responses = (ctx.flavor == Flavor::Responses)
        .then(|| responses::Framing::new(&ctx.model.name, report.clone()));
    if let Some(report) = report.filter(|_| messages.is_none() && responses.is_none()) {
        carry_report(&mut buffered, ctx.flavor.report_field(), report);
    }
    // The head is written while `ctx` is at hand; the body, which takes it, comes after.
    let mut response = Response::new(Body::empty());
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    model_headers(headers, &ctx.model.name, &ctx.report.requested_model);
    let pump = Pump {
        app: Arc::clone(app),
        messages,
        responses,
        ctx,
        buffered: buffered.into(),
        upstream,
        permit: Some(permit),
        _slot: slot,
        deadline,
        timeout,
        stall,
        usage: None,
        content_chunks: 0,
        settled: false,
        part_billed: false,
        delivered,
        continued: Vec::new(),
        asked: vec![false; asked],
        skipped_before: 0,
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
    /// How a `/v1/messages` stream's events are written; `None` for Chat Completions.
    messages: Option<Framing>,
    /// How a `/v1/responses` stream's events are written; `None` for the other surfaces.
    responses: Option<responses::Framing>,
    ctx: Context,
    buffered: VecDeque<StreamEvent>,
    upstream: UpstreamStream,
    permit: Option<Permit>,
    /// The stream counted in flight at its deployment and provider until it ends.
    _slot: Option<crate::deployment::Slot>,
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
    /// The part of the answer a model that broke sent is billed already.
    part_billed: bool,
    /// What the client was sent, kept while the stream may be continued.
    delivered: Option<Delivered>,
    /// Each continuation so far, in order.
    continued: Vec<pb::Continuation>,
    /// Which of the rescue's entries were asked to continue (the first: again).
    asked: Vec<bool>,
    /// Frames skipped by upstream streams before the one read now.
    skipped_before: u32,
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
                    Err((failure, message)) => match self.broke(failure, message).await {
                        Some(frame) => return Some(frame),
                        None => continue,
                    },
                },
            };
            match event {
                None => {
                    self.settle(Outcome::Success);
                    return None;
                }
                Some(Err(e)) => {
                    let message = e.to_string();
                    match self.broke(Failure::Stream(e), message).await {
                        Some(frame) => return Some(frame),
                        None => continue,
                    }
                }
                Some(Ok(StreamEvent::Error(e))) => {
                    let message = format!("The upstream model failed mid-stream: {}", e.message);
                    match self.broke(Failure::InBand(e), message).await {
                        Some(frame) => return Some(frame),
                        None => continue,
                    }
                }
                Some(Ok(StreamEvent::Done)) => {
                    self.settle(Outcome::Success);
                    self.report_continued(true);
                    if let Some(messages) = &mut self.messages {
                        return messages.done();
                    }
                    if let Some(responses) = &mut self.responses {
                        return responses.done();
                    }
                    let done = Bytes::from_static(b"data: [DONE]\n\n");
                    // Skipped frames and continuations are reported in a chunk of the node's
                    // own, the last before `[DONE]`: which upstream chunk was the last is known
                    // only once the stream has ended.
                    return match self.final_report() {
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
                    if commits {
                        self.content_chunks += 1;
                    }
                    if let Some(messages) = &mut self.messages {
                        match messages.chunk(&mut fields) {
                            Some(frame) => return Some(frame),
                            None => continue,
                        }
                    }
                    if let Some(responses) = &mut self.responses {
                        // Kept as it came: a continuation reads the unified chunks.
                        if let Some(delivered) = &mut self.delivered {
                            delivered.keep(&fields);
                        }
                        match responses.chunk(&mut fields) {
                            Some(frame) => return Some(frame),
                            None => continue,
                        }
                    }
                    if usage_only && !self.ctx.include_usage {
                        continue;
                    }
                    if let Some(delivered) = &mut self.delivered {
                        delivered.keep(&fields);
                    }
                    self.keep_identity(&mut fields);
                    if let Some(name) = raw(&self.ctx.model.name) {
                        fields.insert("model".to_owned(), name);
                    }
                    if !self.ctx.include_usage {
                        fields.remove("usage");
                    }
                    let Ok(json) = serde_json::to_vec(&fields) else { continue };
                    return Some(sse_frame(&json));
                }
            }
        }
    }

    /// The stream's `id` and `created` are kept from its first chunk once a frame was
    /// skipped or a continuation may come (so an ordinary stream pays nothing for a report it
    /// does not get); a continuation's chunks carry that first id, so the client reads one
    /// answer.
    fn keep_identity(&mut self, fields: &mut std::collections::BTreeMap<String, Box<RawValue>>) {
        match &self.identity {
            Some((id, _)) if !self.continued.is_empty() => {
                fields.insert("id".to_owned(), id.clone());
            }
            Some(_) => {}
            None if self.upstream.skipped_frames() > 0 || self.delivered.is_some() => {
                if let (Some(id), Some(created)) = (fields.get("id"), fields.get("created")) {
                    self.identity = Some((id.clone(), created.clone()));
                }
            }
            None => {}
        }
    }

    /// The next upstream event within the stall and attempt limits, or the break that ends
    /// this upstream stream.
    async fn read(
        &mut self,
    ) -> Result<Option<Result<StreamEvent, StreamError>>, (Failure, String)> {
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
                Err((Failure::Stalled(self.stall), message))
            }
        }
    }

    fn timed_out(&self) -> (Failure, String) {
        let failure = Failure::Call(CallError::Timeout(self.timeout));
        (failure, "The attempt exceeded timeout_ms while streaming.".to_owned())
    }

    /// The stream broke after content reached the client: continued when it can be
    /// (`None`: reading goes on from the model that continues), else the error frame that
    /// ends it. When every model asked fails, the frame is this break's, never a refusal.
    async fn broke(&mut self, failure: Failure, message: String) -> Option<Bytes> {
        let stalled = matches!(failure, Failure::Stalled(_) | Failure::Call(CallError::Timeout(_)));
        let candidates = self.candidates(stalled);
        let text = match &self.delivered {
            Some(delivered) if !candidates.is_empty() && self.within_deadline() => delivered.text(),
            _ => None,
        };
        let broken = self.ctx.model.name.clone();
        // A continuation that served so far broke too.
        if let Some(last) = self.continued.last_mut()
            && last.outcome == "served"
        {
            last.outcome = "broken".to_owned();
            self.count_continuation(&broken, "broken");
        }
        let Some(text) = text else {
            let frame = self.fail(&failure, &message);
            self.report_continued(false);
            return Some(frame);
        };
        let (outcome, code) = failure::after_commit(&failure);
        let request_id = self.ctx.request_id.to_str().unwrap_or_default().to_owned();
        tracing::info!(model = %broken, request_id, code = code.as_str(), %message, "stream broke after its first token; continuing it");
        // The part the broken model sent is over: its breaker hears of it, and it is billed.
        self.end_part(outcome);
        let at_char = u64::try_from(text.chars().count()).unwrap_or(u64::MAX);
        for i in candidates {
            let outcome = self.open(i, &text).await;
            let model = self.rescue_entry(i).map(|e| e.model.name.clone()).unwrap_or_default();
            self.continued.push(pb::Continuation {
                model: model.clone(),
                reason: code.as_str().to_owned(),
                at_char,
                outcome: outcome.unwrap_or("served").to_owned(),
            });
            match outcome {
                None => return None,
                Some(outcome) => self.count_continuation(&model, outcome),
            }
        }
        // No model could continue: the client gets the break as it was.
        let frame = self.fail(&failure, &message);
        self.report_continued(false);
        Some(frame)
    }

    fn rescue_entry(&self, i: usize) -> Option<&Entry> {
        self.ctx.rescue.as_ref()?.entries.get(i)
    }

    fn within_deadline(&self) -> bool {
        self.ctx.rescue.as_ref().and_then(|r| r.deadline).is_none_or(|d| Instant::now() < d)
    }

    /// Who may continue, in order: the model that broke again (not after a stall or a
    /// timeout: a silent route stays silent), then the chain's later models; each asked at
    /// most once, and only those whose catalog entry says they can.
    fn candidates(&self, stalled: bool) -> Vec<usize> {
        let Some(rescue) = &self.ctx.rescue else { return Vec::new() };
        let current = rescue.entries.iter().position(|e| Arc::ptr_eq(&e.model, &self.ctx.model));
        let Some(current) = current else { return Vec::new() };
        let able = |i: &usize| !self.asked[*i] && !rescue.entries[*i].model.continuation.is_none();
        let same = (!stalled).then_some(current).into_iter().filter(able);
        same.chain((current + 1..rescue.entries.len()).filter(able)).collect()
    }

    /// Asks entry `i` to continue `text`: on success the stream reads on from it (`None`),
    /// otherwise how it went (`refused`, `failed`, `skipped`).
    async fn open(&mut self, i: usize, text: &str) -> Option<&'static str> {
        self.asked[i] = true;
        let rescue = self.ctx.rescue.as_ref()?;
        let entry = rescue.entries.get(i)?.clone();
        let config = Arc::clone(&rescue.config);
        let now = Instant::now();
        let mut timeout = entry.timeout;
        if let Some(deadline) = rescue.deadline {
            timeout = timeout.min(deadline.saturating_duration_since(now));
        }
        // As for an attempt: no call with less time than it could use (a call cut short by
        // the chain's deadline would count as the model's timeout).
        if timeout < executor::FAIR_MINIMUM.min(entry.timeout) {
            return Some("skipped");
        }
        // The same model again is a retry: the node's retry budget pays for it, so that an
        // upstream blip breaking many streams does not send as many calls straight back.
        if Arc::ptr_eq(&entry.model, &self.ctx.model) {
            let policy = retry::Policy::resolve(
                config.catalog.retry_policy.as_ref(),
                entry.model.retry.as_ref(),
                None,
            );
            if !config.retry_budget.try_withdraw(policy.budget, now) {
                return Some("skipped");
            }
        }
        let Some(provider) = config.providers.get(&entry.model.provider) else {
            return Some("failed");
        };
        let Some(kind) = config.catalog.provider(&entry.model.provider).map(|p| p.kind) else {
            return Some("failed");
        };
        let (kept, held) = continuation::prefill(text, kind);
        let Ok(body) = continuation::body(&rescue.body, kept, kind) else { return Some("failed") };
        let held = held.to_owned();
        let upstream_body = match ChatRequest::parse(&body) {
            Ok(request) => match provider.body(&entry.model, &request) {
                Ok(b) => b,
                // A request this provider cannot take: not the upstream's fault.
                Err(_) => return Some("refused"),
            },
            Err(_) => return Some("failed"),
        };
        let breaker = self.app.services.breaker(&config, &entry.model);
        let (admission, transition) = breaker.try_acquire(now);
        self.app.services.report_transition(transition);
        let Admission::Admitted(permit) = admission else { return Some("skipped") };
        let first_token = now + entry.first_token_timeout.min(timeout);
        let request_id = self.ctx.request_id.clone();
        let mut injector = Injector::new(&entry.faults);
        let opened = executor::open_until_first_token(
            provider,
            &entry.model,
            upstream_body,
            first_token,
            &request_id,
            // Continuations are for Chat Completions streams (docs/messages.md).
            None,
            &mut injector,
        )
        .await;
        match opened {
            Ok((buffered, upstream)) => {
                // Its head (a role chunk and the like) is the start of an answer the client
                // has begun already: only its content, and what follows, goes out.
                let first = buffered
                    .iter()
                    .position(|e| {
                        !matches!(e, StreamEvent::Chunk { commits: false, usage_only: false, .. })
                    })
                    .unwrap_or(buffered.len());
                self.buffered = buffered.into_iter().skip(first).collect();
                if !held.is_empty() {
                    self.drop_held(&held);
                }
                // The broken stream's skipped frames are counted before it goes.
                self.count_skipped();
                self.skipped_before += self.upstream.skipped_frames();
                self.upstream = upstream;
                self.permit = Some(permit);
                self.deadline = now + timeout;
                self.timeout = timeout;
                self.stall = Duration::from_millis(u64::from(entry.model.stall_timeout_ms()));
                self.ctx.model = Arc::clone(&entry.model);
                self.part_billed = false;
                None
            }
            Err((failure, _skipped)) => {
                let (breaker, outcome) = match failure::classify(failure) {
                    Verdict::Failover { breaker, .. } => (breaker, "failed"),
                    // Most often the model refused the prefill: skipped, never the final error.
                    Verdict::Stop { breaker, .. } => (breaker, "refused"),
                };
                if let Some(b) = breaker {
                    self.app.services.report_transition(permit.record(b, Instant::now()));
                }
                Some(outcome)
            }
        }
    }

    /// Takes `held` (whitespace the client has and the prefill left out) off the start of
    /// the continuation's first content.
    fn drop_held(&mut self, held: &str) {
        let Some(StreamEvent::Chunk { fields, commits: true, .. }) = self.buffered.front_mut()
        else {
            return;
        };
        let Some(kept) = fields.get("choices") else { return };
        let Ok(mut choices) = serde_json::from_str::<serde_json::Value>(kept.get()) else { return };
        let Some(content) = choices.pointer_mut("/0/delta/content") else { return };
        let Some(text) = content.as_str() else { return };
        *content = serde_json::Value::from(continuation::without_held(text, held));
        if let Some(edited) = raw(&choices) {
            fields.insert("choices".to_owned(), edited);
        }
    }

    fn count_continuation(&self, model: &str, outcome: &'static str) {
        let labels = ContinuationLabels { model: model.to_owned(), outcome };
        self.app.services.metrics.stream_continuations.get_or_create(&labels).inc();
    }

    /// The stream ended after one or more continuations: the last one's outcome is counted
    /// when it served, and the `api:stream_continued` event goes to the control plane.
    fn report_continued(&mut self, served: bool) {
        if self.continued.is_empty() {
            return;
        }
        let served_model = if served { self.ctx.model.name.clone() } else { String::new() };
        if served {
            self.count_continuation(&served_model, "served");
        }
        let report = &self.ctx.report;
        let event = pb::FailoverEvent {
            id: format!("evt_{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>()),
            at_unix_ms: switchyard_time::now_ms(),
            node_id: self.app.services.telemetry.node_id.clone(),
            key_id: self.ctx.key_id.clone(),
            requested_model: report.requested_model.clone(),
            served_model,
            attempts: report.failover.attempts.iter().map(AttemptReport::to_pb).collect(),
            stream: true,
            status: 200,
            degraded: String::new(),
            request_id: self.ctx.request_id.to_str().unwrap_or_default().to_owned(),
            lost: None,
            continued: self.continued.clone(),
            surface: self.ctx.flavor.surface().to_owned(),
        };
        self.app.services.telemetry.push_event(event);
    }

    fn fail(&mut self, failure: &Failure, message: &str) -> Bytes {
        let (outcome, code) = failure::after_commit(failure);
        let code = code.as_str();
        let request_id = self.ctx.request_id.to_str().unwrap_or_default();
        tracing::warn!(model = %self.ctx.model.name, request_id, code, %message, "stream ended with an error frame");
        self.settle(outcome);
        if let Some(messages) = &self.messages {
            return messages.error(http::StatusCode::BAD_GATEWAY, message, code);
        }
        if let Some(responses) = &mut self.responses {
            return responses.error(message, code);
        }
        let body = json!({"error": {"message": message, "type": "server_error", "code": code, "param": null}});
        sse_frame(body.to_string().as_bytes())
    }

    /// The chunk of the node's own that ends a stream whose frames did not all parse
    /// (`skipped_frames`) or that was continued (`continued`, `served_model`): under
    /// `secureai` (`metadata` on the classic endpoint); `None` for an ordinary stream.
    fn final_report(&self) -> Option<Bytes> {
        let skipped = self.skipped_before + self.upstream.skipped_frames();
        if skipped == 0 && self.continued.is_empty() {
            return None;
        }
        let key = self.ctx.flavor.report_field();
        let (id, created) = match &self.identity {
            Some((id, created)) => (json!(id), json!(created)),
            None => (json!("chatcmpl-switchyard"), json!(switchyard_time::now_secs())),
        };
        let mut report = serde_json::Map::new();
        if skipped > 0 {
            report.insert("skipped_frames".into(), json!(skipped));
        }
        if !self.continued.is_empty() {
            let continued: Vec<_> = self
                .continued
                .iter()
                .map(|c| {
                    json!({"model": c.model, "reason": c.reason, "at_char": c.at_char, "outcome": c.outcome})
                })
                .collect();
            report.insert("continued".into(), json!(continued));
            report.insert("served_model".into(), json!(self.ctx.model.name));
            report.insert("requested_model".into(), json!(self.ctx.report.requested_model));
        }
        let chunk = json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": self.ctx.model.name,
            "choices": [],
            key: report,
        });
        Some(sse_frame(chunk.to_string().as_bytes()))
    }

    /// The model that broke is done with: its breaker permit is settled with `outcome`, and
    /// what it sent billed to it.
    fn end_part(&mut self, outcome: Outcome) {
        if let Some(permit) = self.permit.take() {
            self.app.services.report_transition(permit.record(outcome, Instant::now()));
        }
        self.bill_part();
        self.content_chunks = 0;
    }

    /// Counts the frames that did not parse, and warns of them (at most once a minute per
    /// model).
    fn count_skipped(&self) {
        let skipped = self.upstream.skipped_frames();
        if skipped == 0 {
            return;
        }
        let model = &self.ctx.model.name;
        let metrics = &self.app.services.metrics;
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
            self.app.services.report_transition(permit.record(outcome, Instant::now()));
        }
        self.bill();
    }

    /// The stream is over: the part not billed yet is, and its duration observed.
    fn bill(&mut self) {
        // Nothing was sent since a broken part was billed when no model continued it.
        if !self.part_billed {
            self.bill_part();
        }
        self.ctx.gen_ai.duration.observe(self.ctx.started.elapsed().as_secs_f64());
    }

    /// Bills what the model streaming now sent, to it: its usage, or without the upstream's
    /// usage chunk one token per content chunk.
    fn bill_part(&mut self) {
        let usage = self
            .usage
            .take()
            .unwrap_or(Usage { prompt_tokens: 0, completion_tokens: self.content_chunks });
        self.ctx.gen_ai.tokens(usage.prompt_tokens, usage.completion_tokens);
        record_usage(&self.app, &self.ctx.key_id, &self.ctx.model, usage);
        self.part_billed = true;
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
            // A continued stream the client left still called and billed the models.
            self.report_continued(false);
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
