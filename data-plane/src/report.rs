//! The failover report: what every attempt of a chain did (docs/http-api.md, "The answer").

use serde::Serialize;

use switchyard_catalog::FailoverReason;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptStatus {
    Served,
    Failed,
    Skipped,
}

impl AttemptStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Served => "served",
            Self::Failed => "failed",
            Self::Skipped => "skipped",
        }
    }
}

/// Why an attempt did not serve: one of the failover triggers, a skip, or an error
/// that is never failed over (the client's own 4xx from the upstream).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptReason {
    Failover(FailoverReason),
    CircuitOpen,
    /// Passed over after a context-length refusal: its `context_window` is no larger than
    /// the refusing model's (or not in the catalog).
    ContextWindow,
    /// Not enough of the chain's `deadline_ms` was left to start this attempt.
    DeadlineExceeded,
    ClientError,
}

impl AttemptReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Failover(r) => r.as_str(),
            Self::CircuitOpen => "circuit_open",
            Self::ContextWindow => "context_window",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::ClientError => "client_error",
        }
    }
}

impl Serialize for AttemptReason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl AttemptReport {
    /// The attempt as the node proto carries it in a failover event.
    pub fn to_pb(&self) -> switchyard_proto::node::v1::Attempt {
        switchyard_proto::node::v1::Attempt {
            model: self.model.clone(),
            status: self.status.as_str().to_owned(),
            reason: self.reason.map(|r| r.as_str().to_owned()).unwrap_or_default(),
            latency_ms: self.latency_ms,
            probe: self.probe,
            injected: self.injected.clone().unwrap_or_default(),
            retries: self.retries,
            deployment: self.deployment.as_deref().unwrap_or_default().to_owned(),
            local_limit: self.local_limit,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct AttemptReport {
    pub model: String,
    pub status: AttemptStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<AttemptReason>,
    /// Every call of the attempt, retries and their waits included.
    pub latency_ms: u64,
    /// Extra calls to the same model inside this attempt.
    #[serde(skip_serializing_if = "is_zero")]
    pub retries: u32,
    /// Tried although its breaker was open, because every entry's breaker was open.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub probe: bool,
    /// The injected fault that touched one of the attempt's calls (a drill, not an outage).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub injected: Option<String>,
    /// The deployment tried (`<provider>/<upstream_model>`), for a model with `deployments`:
    /// each deployment an attempt tries is a line of its own.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "shared_str")]
    pub deployment: Option<std::sync::Arc<str>>,
    /// Turned away by the node's own cap on requests in flight (`max_concurrency`) without
    /// an upstream call; its reason is `rate_limit`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub local_limit: bool,
}

fn shared_str<S: serde::Serializer>(
    v: &Option<std::sync::Arc<str>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    v.as_deref().serialize(s)
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// `secureai` on `/v1`, `metadata` on the classic endpoint.
#[derive(Clone, Debug, Serialize)]
pub struct FailoverReport {
    pub requested_model: String,
    pub served_model: String,
    pub failover: Failover,
}

#[derive(Clone, Debug, Serialize)]
pub struct Failover {
    pub occurred: bool,
    pub attempts: Vec<AttemptReport>,
}

/// `All N model attempt(s) failed (last: MODEL — REASON)`, the message docs/http-api.md,
/// "Errors", documents.
pub fn all_failed_message(attempts: &[AttemptReport]) -> String {
    match attempts.last() {
        Some(last) => format!(
            "All {} model attempt(s) failed (last: {} — {})",
            attempts.len(),
            last.model,
            last.reason.map_or("unknown", AttemptReason::as_str)
        ),
        None => "All model attempts failed".to_owned(),
    }
}

/// True when the chain moved past its first model (a failover event is due).
pub fn failover_occurred(attempts: &[AttemptReport]) -> bool {
    attempts.first().is_some_and(|a| a.status != AttemptStatus::Served)
}
