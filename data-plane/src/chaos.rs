//! Injected faults (`switchyard chaos inject`, docs/cli.md): which fault, if any, touches an
//! upstream call, and what the provider would have sent instead. The providers' dispatch
//! applies them at the call itself, so everything after it — the adapters' parsers,
//! classification, breakers, failover, error frames, events — is the code that handles real
//! failures. A node with no fault pays one emptiness check per chain entry.

use std::sync::Arc;

use serde_json::json;

use switchyard_catalog::ProviderKind;
use switchyard_catalog::fault::{Fault, FaultKind};

/// The faults that match a chain entry's calls: its model or its provider, and the
/// request's key. Empty, with nothing allocated, when no fault is active on this node.
pub fn matching(
    faults: &[Arc<Fault>],
    model: &str,
    provider: &str,
    key_id: &str,
) -> Vec<Arc<Fault>> {
    if faults.is_empty() {
        return Vec::new();
    }
    let now = switchyard_time::now_ms();
    faults
        .iter()
        .filter(|f| f.matches(model, provider, key_id) && !expired(f, now))
        .cloned()
        .collect()
}

/// The faults that match the node's probes of a model: those naming the model or its
/// provider, whichever key they are scoped to. A probe belongs to no key, but the breaker it
/// tests is the node's: a fault that opened it for one key's calls keeps its probes failing
/// too, so a drill's model stays down for the drill's length instead of a probe closing its
/// breaker behind it.
pub fn matching_probe(faults: &[Arc<Fault>], model: &str, provider: &str) -> Vec<Arc<Fault>> {
    if faults.is_empty() {
        return Vec::new();
    }
    let now = switchyard_time::now_ms();
    faults.iter().filter(|f| f.targets(model, provider) && !expired(f, now)).cloned().collect()
}

/// A fault past its expiry is over even when the store's deletion never reached this node:
/// a node cut off from its control plane keeps its last config, and a drill must not outlive
/// its TTL there. Zero means no expiry.
fn expired(fault: &Fault, now_ms: i64) -> bool {
    fault.expires_at_unix_ms > 0 && now_ms >= fault.expires_at_unix_ms
}

/// The faults that may touch one attempt's upstream calls, and those that did.
#[derive(Debug, Default)]
pub struct Injector<'a> {
    faults: &'a [Arc<Fault>],
    injected: Vec<&'a Fault>,
}

impl<'a> Injector<'a> {
    pub fn new(faults: &'a [Arc<Fault>]) -> Self {
        Self { faults, injected: Vec::new() }
    }

    /// The fault for one upstream call, if one fires: each matching fault in turn, each with
    /// its `rate`; the first that fires is the call's only one. Stream faults touch streamed
    /// calls only.
    pub fn draw(&mut self, stream: bool) -> Option<&'a Fault> {
        if self.faults.is_empty() {
            return None;
        }
        let fault: &'a Fault =
            self.faults.iter().find(|f| (stream || !streams_only(&f.kind)) && fires(f.rate))?;
        self.injected.push(fault);
        Some(fault)
    }

    /// The first fault that touched a call: the attempt's `injected`.
    pub fn first(&self) -> Option<&'a Fault> {
        self.injected.first().copied()
    }

    /// Every fault that touched a call, once per call.
    pub fn injected(&self) -> &[&'a Fault] {
        &self.injected
    }
}

fn streams_only(kind: &FaultKind) -> bool {
    matches!(kind, FaultKind::StallAfter { .. } | FaultKind::DropAfter { .. })
}

/// Whether a fault of this `rate` (0–1) touches one call.
fn fires(rate: f64) -> bool {
    rate >= 1.0 || (rate > 0.0 && rand::random::<f64>() < rate)
}

/// What an injected `reset` reports: the words of the OS error it stands for.
pub fn reset_message(fault: &Fault) -> String {
    format!("connection reset by peer (injected fault `{}`)", fault.name)
}

// === What the provider would have sent ===

/// The body a provider of `kind` sends with HTTP `status` (as its API reference and
/// recorded responses show it), for the adapter to parse like a real one.
pub fn error_body(kind: ProviderKind, status: u16, upstream_model: &str) -> Vec<u8> {
    let body = match kind {
        ProviderKind::Openai | ProviderKind::OpenaiCompatible => {
            openai_error(status, upstream_model)
        }
        ProviderKind::AzureOpenai => azure_error(status),
        ProviderKind::Anthropic => anthropic_error(status, upstream_model),
        ProviderKind::Gemini => gemini_error(status, upstream_model),
    };
    body.to_string().into_bytes()
}

/// OpenAI's envelope (API reference, "Error codes"; messages as api.openai.com sends them).
fn openai_error(status: u16, model: &str) -> serde_json::Value {
    let (message, kind, code): (String, &str, Option<&str>) = match status {
        401 => (
            "Incorrect API key provided: sk-proj-****. You can find your API key at https://platform.openai.com/account/api-keys.".into(),
            "invalid_request_error",
            Some("invalid_api_key"),
        ),
        403 => (
            "Country, region, or territory not supported".into(),
            "request_forbidden",
            Some("unsupported_country_region_territory"),
        ),
        404 => (
            format!("The model `{model}` does not exist or you do not have access to it."),
            "invalid_request_error",
            Some("model_not_found"),
        ),
        429 => (
            format!(
                "Rate limit reached for {model} in organization org-switchyard on requests per min (RPM): Limit 500, Used 500, Requested 1. Please try again in 120ms. Visit https://platform.openai.com/account/rate-limits to learn more."
            ),
            "requests",
            Some("rate_limit_exceeded"),
        ),
        503 => (
            "That model is currently overloaded with other requests. You can retry your request, or contact us through our help center at help.openai.com if the error persists.".into(),
            "server_error",
            None,
        ),
        s if s >= 500 => (
            "The server had an error while processing your request. Sorry about that!".into(),
            "server_error",
            None,
        ),
        _ => ("Invalid request.".into(), "invalid_request_error", None),
    };
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

/// Azure OpenAI's envelope: a code and a message, no type (Azure OpenAI REST reference,
/// "ErrorResponse"; the 429 and 401 messages as Azure sends them).
fn azure_error(status: u16) -> serde_json::Value {
    let (code, message) = match status {
        401 => (
            "401",
            "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource.",
        ),
        404 => (
            "DeploymentNotFound",
            "The API deployment for this resource does not exist. If you created the deployment within the last 5 minutes, please wait a moment and try again.",
        ),
        429 => (
            "429",
            "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 1 second. Please go here: https://aka.ms/oai/quotaincrease if you would like to further increase the default rate limit.",
        ),
        503 => (
            "ServiceUnavailable",
            "The service is temporarily unable to process your request. Please try again later.",
        ),
        s if s >= 500 => (
            "InternalServerError",
            "The server had an error while processing your request. Sorry about that!",
        ),
        _ => ("BadRequest", "Invalid request."),
    };
    json!({"error": {"code": code, "message": message}})
}

/// Anthropic's envelope and error types (API reference, "Errors"): 529 is
/// `overloaded_error`, other 5xx `api_error`, other 4xx `invalid_request_error`.
fn anthropic_error(status: u16, model: &str) -> serde_json::Value {
    let (kind, message): (&str, String) = match status {
        401 => ("authentication_error", "invalid x-api-key".into()),
        403 => (
            "permission_error",
            "Your API key does not have permission to use the specified resource.".into(),
        ),
        404 => ("not_found_error", format!("model: {model}")),
        413 => ("request_too_large", "Request exceeds the maximum allowed number of bytes.".into()),
        429 => (
            "rate_limit_error",
            "This request would exceed the rate limit for your organization of 50 requests per minute. For details, refer to: https://docs.claude.com/en/api/rate-limits.".into(),
        ),
        529 => ("overloaded_error", "Overloaded".into()),
        s if s >= 500 => ("api_error", "Internal server error".into()),
        _ => (
            "invalid_request_error",
            "There was an issue with the format or content of your request.".into(),
        ),
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

/// Google's envelope: the HTTP code, a message and the canonical status name (Gemini API
/// "Troubleshooting").
fn gemini_error(status: u16, model: &str) -> serde_json::Value {
    let (name, message): (&str, String) = match status {
        400 => ("INVALID_ARGUMENT", "Request contains an invalid argument.".into()),
        401 => (
            "UNAUTHENTICATED",
            "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential.".into(),
        ),
        403 => ("PERMISSION_DENIED", "The caller does not have permission".into()),
        404 => (
            "NOT_FOUND",
            format!(
                "models/{model} is not found for API version v1beta, or is not supported for generateContent. Call ListModels to see the list of available models and their supported methods."
            ),
        ),
        429 => (
            "RESOURCE_EXHAUSTED",
            "You exceeded your current quota, please check your plan and billing details. For more information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.".into(),
        ),
        503 => ("UNAVAILABLE", "The model is overloaded. Please try again later.".into()),
        504 => ("DEADLINE_EXCEEDED", "The request timed out. Please try again.".into()),
        s if s >= 500 => (
            "INTERNAL",
            "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting".into(),
        ),
        _ => ("FAILED_PRECONDITION", "Precondition check failed.".into()),
    };
    json!({"error": {"code": status, "message": message, "status": name}})
}

/// A 200 body cut off mid-JSON, in the shape of `kind`'s responses (a truncating proxy's
/// answer): for a stream, one SSE frame whose data is not JSON.
pub fn malformed_body(kind: ProviderKind, stream: bool) -> &'static [u8] {
    match (kind, stream) {
        (ProviderKind::Anthropic, false) => {
            br#"{"id": "msg_injected", "type": "message", "role": "assistant", "content": [{"#
        }
        (ProviderKind::Anthropic, true) => {
            b"event: message_start\ndata: {\"type\": \"message_start\", \"message\": {\n\n"
        }
        (ProviderKind::Gemini, false) => br#"{"candidates": [{"content": {"parts": [{"#,
        (ProviderKind::Gemini, true) => b"data: {\"candidates\": [{\"content\": {\"parts\": [{\n\n",
        (_, false) => br#"{"id": "chatcmpl-injected", "object": "chat.completion", "choices": [{"#,
        (_, true) => {
            b"data: {\"id\": \"chatcmpl-injected\", \"object\": \"chat.completion.chunk\", \"choices\": [{\"delta\": \n\n"
        }
    }
}

// === Streams cut short ===

/// How an injected stream fault ends a stream once its content chunks are through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CutKind {
    /// The stream stays open and sends nothing more: the stall timeout fires.
    Stall,
    /// The connection drops.
    Drop,
}

/// A stream an injected fault cuts short after `after` content chunks.
#[derive(Clone, Debug)]
pub struct Cut {
    pub kind: CutKind,
    pub after: u32,
    /// Content chunks handed out so far.
    pub seen: u32,
    pub fault: String,
}

impl Cut {
    /// The cut a fault makes, if it is a stream fault.
    pub fn of(fault: &Fault) -> Option<Cut> {
        let (kind, after) = match fault.kind {
            FaultKind::StallAfter { chunks } => (CutKind::Stall, chunks),
            FaultKind::DropAfter { chunks } => (CutKind::Drop, chunks),
            _ => return None,
        };
        Some(Cut { kind, after, seen: 0, fault: fault.name.clone() })
    }

    /// Whether the stream has handed out all the content it may.
    pub fn due(&self) -> bool {
        self.seen >= self.after
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_catalog::FaultTarget;

    fn fault(name: &str, rate: f64, kind: FaultKind) -> Arc<Fault> {
        Arc::new(Fault {
            name: name.into(),
            target: FaultTarget::Model("m".into()),
            key_id: None,
            rate,
            kind,
            expires_at_unix_ms: 0,
        })
    }

    #[test]
    fn rate_zero_never_fires_and_rate_one_always_does() {
        let never = [fault("never", 0.0, FaultKind::Reset)];
        let always = [fault("always", 1.0, FaultKind::Reset)];
        let mut a = Injector::new(&never);
        let mut b = Injector::new(&always);
        for _ in 0..1_000 {
            assert!(a.draw(false).is_none());
            assert_eq!(b.draw(false).map(|f| f.name.as_str()), Some("always"));
        }
        assert!(a.first().is_none());
        assert_eq!(b.injected().len(), 1_000, "every touched call is counted");
    }

    #[test]
    fn a_partial_rate_touches_about_that_share_of_calls() {
        let half = [fault("half", 0.5, FaultKind::Reset)];
        let mut injector = Injector::new(&half);
        let hits = (0..10_000).filter(|_| injector.draw(false).is_some()).count();
        // Binomial(10000, 0.5): ±5 standard deviations is ±250.
        assert!((4_750..=5_250).contains(&hits), "{hits}");
    }

    #[test]
    fn stream_faults_leave_plain_calls_alone() {
        let faults = [fault("stall", 1.0, FaultKind::StallAfter { chunks: 3 })];
        let mut injector = Injector::new(&faults);
        assert!(injector.draw(false).is_none());
        assert!(injector.first().is_none());
        assert!(injector.draw(true).is_some());
    }

    #[test]
    fn the_first_fault_that_fires_is_the_calls_only_one() {
        let faults = [fault("a", 1.0, FaultKind::Reset), fault("b", 1.0, FaultKind::Hang)];
        let mut injector = Injector::new(&faults);
        assert_eq!(injector.draw(false).map(|f| f.name.as_str()), Some("a"));
        assert_eq!(injector.injected().len(), 1);
    }

    #[test]
    fn matching_filters_by_target_key_and_expiry() {
        let mut by_key = (*fault("k", 1.0, FaultKind::Reset)).clone();
        by_key.key_id = Some("key_a".into());
        let mut by_provider = (*fault("p", 1.0, FaultKind::Reset)).clone();
        by_provider.target = FaultTarget::Provider("prov".into());
        let mut expired = (*fault("old", 1.0, FaultKind::Reset)).clone();
        expired.expires_at_unix_ms = 1;
        let mut live = (*fault("live", 1.0, FaultKind::Reset)).clone();
        live.expires_at_unix_ms = switchyard_time::now_ms() + 60_000;
        let all: Vec<Arc<Fault>> =
            [by_key, by_provider, expired, live].into_iter().map(Arc::new).collect();
        let names = |model, provider, key| {
            matching(&all, model, provider, key).iter().map(|f| f.name.clone()).collect::<Vec<_>>()
        };
        assert_eq!(names("m", "other", "key_a"), ["k", "live"]);
        assert_eq!(names("m", "other", "key_b"), ["live"]);
        assert_eq!(names("x", "prov", "key_b"), ["p"]);
        assert!(names("x", "other", "key_a").is_empty());
        assert!(matching(&[], "m", "p", "k").is_empty());
    }
}
