//! What one drill request came to, read off the node's answer: the HTTP status, the model
//! that served, the failover report's attempts, and for a stream when its chunks and its
//! error frame arrived. Parsing only; nothing here talks to the network.

use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

/// One entry of the failover report (`secureai.failover.attempts[]`, docs/http-api.md).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Attempt {
    pub model: String,
    /// `served`, `failed` or `skipped`.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "is_zero")]
    pub retries: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub injected: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Attempt {
    /// Upstream calls this attempt made: none for a skip, one plus its retries otherwise.
    pub fn calls(&self) -> u32 {
        if self.status == "skipped" { 0 } else { 1 + self.retries }
    }
}

/// How a streamed answer unfolded, timed from the request's start.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StreamTiming {
    pub content_chunks: u32,
    /// When the last chunk carrying content arrived.
    pub last_content: Option<Duration>,
    /// The `error.code` of an in-band error frame, and when it arrived.
    pub error_code: Option<String>,
    pub error_at: Option<Duration>,
    /// `data: [DONE]` arrived.
    pub done: bool,
    /// The drill gave up waiting: neither an error frame nor the end came in time.
    pub hung: bool,
    /// The answer's text: every chunk's content, in order.
    pub text: String,
    /// How many continuations the node reported (`secureai.continued` in the final chunk);
    /// 0 when none did.
    pub continuations: usize,
}

/// One request of a drill.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    /// When it was sent and when its answer ended, since the drill's load began.
    pub started: Duration,
    pub finished: Duration,
    /// The HTTP status; `None` when no answer came (the connection failed).
    pub status: Option<u16>,
    /// The transport error, or the `error.code` of an error answer.
    pub error: Option<String>,
    /// The model named in the answer (`switchyard/degraded` for a designed answer).
    pub served_model: Option<String>,
    /// The node answered with its designed degraded answer (`x-switchyard-degraded: true`).
    pub degraded: bool,
    pub attempts: Vec<Attempt>,
    pub stream: Option<StreamTiming>,
}

impl Observation {
    pub fn latency(&self) -> Duration {
        self.finished.saturating_sub(self.started)
    }

    /// Upstream calls made to `model` for this request, retries included.
    pub fn calls_to(&self, model: &str) -> u32 {
        self.attempts.iter().filter(|a| a.model == model).map(Attempt::calls).sum()
    }

    /// Every upstream call made for this request.
    pub fn calls(&self) -> u32 {
        self.attempts.iter().map(Attempt::calls).sum()
    }

    /// The request reached `model` and found its breaker open.
    pub fn skipped(&self, model: &str) -> bool {
        self.attempts.iter().any(|a| a.model == model && a.status == "skipped")
    }

    /// Served by a model (not the degraded answer).
    pub fn served(&self) -> bool {
        self.status == Some(200) && !self.degraded && self.stream.as_ref().is_none_or(|s| s.done)
    }
}

/// The attempts of a report, wherever the answer carries it: `secureai` on `/v1` (success
/// and error answers alike), and `attempts` beside an error.
pub fn attempts(answer: &Value) -> Vec<Attempt> {
    let list = answer
        .pointer("/secureai/failover/attempts")
        .or_else(|| answer.pointer("/secureai/attempts"))
        .or_else(|| answer.pointer("/error/attempts"))
        .and_then(Value::as_array);
    list.map(|items| items.iter().filter_map(attempt).collect()).unwrap_or_default()
}

fn attempt(item: &Value) -> Option<Attempt> {
    Some(Attempt {
        model: item.get("model")?.as_str()?.to_owned(),
        status: item.get("status")?.as_str()?.to_owned(),
        reason: item.get("reason").and_then(Value::as_str).map(str::to_owned),
        retries: item
            .get("retries")
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0),
        injected: item.get("injected").and_then(Value::as_str).map(str::to_owned),
    })
}

/// How many continuations a chunk reports (`secureai.continued`), if it reports any: the
/// models asked to continue. An entry `skipped` (its breaker open, or no time left) asked
/// nobody, and is not counted.
pub fn continued(chunk: &Value) -> Option<usize> {
    let entries = chunk.pointer("/secureai/continued").and_then(Value::as_array)?;
    Some(entries.iter().filter(|e| e["outcome"] != "skipped").count())
}

/// The `error.code` of an OpenAI error envelope, if the value is one.
pub fn error_code(answer: &Value) -> Option<String> {
    let error = answer.get("error")?;
    error
        .get("code")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| error.get("type").and_then(Value::as_str).map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn attempts_are_read_from_a_success_and_counted_with_their_retries() {
        let answer = json!({"model": "b", "secureai": {"failover": {"occurred": true, "attempts": [
            {"model": "a", "status": "failed", "reason": "server_error", "latency_ms": 3,
             "retries": 2, "injected": "drill-x"},
            {"model": "b", "status": "served", "latency_ms": 1}]}}});
        let a = attempts(&answer);
        assert_eq!(a.len(), 2);
        assert_eq!((a[0].calls(), a[0].injected.as_deref()), (3, Some("drill-x")));
        assert_eq!(a[1].calls(), 1);
        let skipped = json!({"secureai": {"failover": {"attempts": [
            {"model": "a", "status": "skipped", "reason": "circuit_open", "latency_ms": 0}]}}});
        assert_eq!(attempts(&skipped)[0].calls(), 0);
    }

    #[test]
    fn attempts_are_read_from_an_error_answer() {
        let answer = json!({"error": {"code": "all_models_failed", "type": "server_error"},
            "secureai": {"attempts": [{"model": "a", "status": "failed", "reason": "server_error"}]}});
        assert_eq!(attempts(&answer).len(), 1);
        assert_eq!(error_code(&answer).as_deref(), Some("all_models_failed"));
        assert_eq!(attempts(&json!({"id": "x"})), []);
    }

    #[test]
    fn continuations_are_counted_from_the_final_chunk() {
        let last = json!({"choices": [], "secureai": {"served_model": "a", "requested_model": "a",
            "continued": [{"model": "a", "reason": "upstream_disconnected", "at_char": 6,
                           "outcome": "served"}]}});
        assert_eq!(continued(&last), Some(1));
        let skipped_then_served = json!({"choices": [], "secureai": {"continued": [
            {"model": "a", "reason": "upstream_disconnected", "at_char": 6, "outcome": "skipped"},
            {"model": "b", "reason": "upstream_disconnected", "at_char": 6, "outcome": "served"}]}});
        assert_eq!(continued(&skipped_then_served), Some(1));
        assert_eq!(continued(&json!({"choices": [{"delta": {"content": "x"}}]})), None);
    }
}
