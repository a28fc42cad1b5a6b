//! What an upstream failure means — the one place that decides it. For each way an attempt
//! can fail (an HTTP status, a transport error, a timeout, an in-band stream error, a
//! malformed body, a request refused before the call, an answer that breaks the request's
//! `response_format`), it says whether the chain fails over and under which failover reason,
//! whether the circuit breaker counts it against the upstream, and the code a client sees
//! (docs/http-api.md, "Errors").

use std::time::Duration;

use http::StatusCode;

use switchyard_catalog::FailoverReason;

use crate::breaker::Outcome;
use crate::providers::error::{CallError, StreamError, UpstreamError};
use crate::structured::Invalid;

/// How one attempt failed.
#[derive(Debug)]
pub enum Failure {
    /// The call itself: no answer, an error status, an unusable body, a refusal.
    Call(CallError),
    /// Reading the stream broke.
    Stream(StreamError),
    /// An error event inside a 2xx stream (Anthropic's `overloaded_error`, an OpenAI
    /// `error` frame).
    InBand(UpstreamError),
    /// A committed stream sent nothing for the model's `stall_timeout_ms`.
    Stalled(Duration),
    /// The model's provider is not configured on this node.
    Unconfigured(String),
    /// A completion whose content is not what the request's `response_format` asked for,
    /// checked because the chain's `on` holds `invalid_output`.
    InvalidOutput(Invalid),
}

impl Failure {
    /// The wait the upstream asked for with `Retry-After`, if it answered with one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Failure::Call(CallError::Http { retry_after, .. }) => *retry_after,
            _ => None,
        }
    }
}

/// The code a client sees for a failure: in a stream's error frame, and in the message of
/// a chain that failed for a reason the client cannot guess from the failover reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Timeout,
    Stalled,
    /// The upstream connection broke while a stream was being read.
    Disconnected,
    /// The call got no whole answer: the connection was refused or failed (DNS, TLS), or
    /// broke before the answer was read. Only ever the code of a failure before a stream
    /// commits, where no code reaches the client (a committed stream's codes are
    /// [`after_commit`]'s): it decides whether the call is retried.
    ConnectionFailed,
    Malformed,
    /// An error event from the upstream.
    UpstreamError,
    RateLimited,
    ServerError,
    /// The provider refused every credential the gateway holds for it (HTTP 401/403).
    CredentialRefused,
    /// The gateway has no usable credential for the provider on this node.
    CredentialMissing,
    /// The gateway could not encode or build the upstream request: a bug of ours.
    GatewayError,
    ProviderNotConfigured,
    /// The answer is not JSON valid against the request's `response_format`.
    InvalidOutput,
    /// The prompt is longer than the model's context.
    ContextLength,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Stalled => "stream_stalled",
            Self::Disconnected => "upstream_disconnected",
            Self::ConnectionFailed => "upstream_connection_failed",
            Self::Malformed => "upstream_malformed",
            Self::UpstreamError => "upstream_error",
            Self::RateLimited => "upstream_rate_limited",
            Self::ServerError => "upstream_server_error",
            Self::CredentialRefused => "provider_credential_refused",
            Self::CredentialMissing => "provider_credential_missing",
            Self::GatewayError => "gateway_error",
            Self::ProviderNotConfigured => "provider_not_configured",
            Self::InvalidOutput => "invalid_output",
            Self::ContextLength => "context_length_exceeded",
        }
    }

    /// Whether another call to the same model could go differently. A refused or missing
    /// credential, a missing provider and a request the gateway cannot build fail the same
    /// way every time: retrying them only adds load and delay.
    pub fn retryable(self) -> bool {
        match self {
            Self::Timeout
            | Self::Disconnected
            | Self::ConnectionFailed
            | Self::Malformed
            | Self::UpstreamError
            | Self::RateLimited
            | Self::ServerError => true,
            Self::Stalled
            | Self::CredentialRefused
            | Self::CredentialMissing
            | Self::GatewayError
            | Self::ProviderNotConfigured
            // Not retried: the next model is a better bet than sampling the same one again
            // (docs/catalog.md, "Retries").
            | Self::InvalidOutput
            // The same prompt is as long the second time.
            | Self::ContextLength => false,
        }
    }

    /// A sentence for the client when the failover reason alone would mislead: these are
    /// the operator's to fix, not the client's and not the provider's outage.
    pub fn explanation(self) -> Option<&'static str> {
        match self {
            Self::CredentialRefused => Some(
                "the provider refused the gateway's credential for it (HTTP 401/403) and no reserve credential is left; the operator must fix the provider's api_keys",
            ),
            Self::CredentialMissing => {
                Some("the gateway has no usable credential for its provider on this node")
            }
            Self::ProviderNotConfigured => Some("its provider is not configured on this node"),
            Self::InvalidOutput => {
                Some("its answer was not JSON valid against the request's response_format")
            }
            _ => None,
        }
    }
}

/// What a failed attempt means.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Fail over if `reason` is in the chain's `on`. `breaker` is what the circuit breaker
    /// records (`None`: the upstream is not to blame, the permit is released unjudged).
    Failover { reason: FailoverReason, breaker: Option<Outcome>, code: Code },
    /// Stop the chain and hand `error` to the client with `status`: the request is at fault.
    ///
    /// `context_length`: the provider refused the prompt as longer than the model's context
    /// (OpenAI's `context_length_exceeded`, Anthropic's "prompt is too long", Gemini's input
    /// token count past the maximum). The prompt is the client's, but a later model with a
    /// larger `context_window` may take it: the chain fails over (reason `context_length`)
    /// only to such a model, skipping the others; with none it stops here.
    Stop {
        status: StatusCode,
        error: UpstreamError,
        breaker: Option<Outcome>,
        context_length: bool,
    },
}

/// The verdict on a failure before the stream committed (or a plain call).
pub fn classify(failure: Failure) -> Verdict {
    use FailoverReason as R;
    let failover = |reason, breaker, code| Verdict::Failover { reason, breaker, code };
    match failure {
        Failure::Call(e) => match e {
            CallError::Unsupported { message, param } => Verdict::Stop {
                status: StatusCode::BAD_REQUEST,
                error: UpstreamError {
                    message,
                    kind: "invalid_request_error".into(),
                    code: Some("unsupported_by_provider".into()),
                    param,
                },
                breaker: None,
                context_length: false,
            },
            // Another provider's adapter may well encode the request: fail over, but the
            // upstream was never called, so its breaker is not charged.
            CallError::Encode(_) | CallError::Build(_) => {
                failover(R::ServerError, None, Code::GatewayError)
            }
            CallError::Transport(_) => {
                failover(R::ConnectionError, Some(Outcome::Failure), Code::ConnectionFailed)
            }
            CallError::Timeout(_) => failover(R::Timeout, Some(Outcome::Timeout), Code::Timeout),
            CallError::Malformed(_) => {
                failover(R::ServerError, Some(Outcome::Failure), Code::Malformed)
            }
            CallError::NoCredential(_) => {
                failover(R::ServerError, Some(Outcome::Failure), Code::CredentialMissing)
            }
            CallError::Http { status, error, .. } => http_status(status, error),
        },
        Failure::Stream(e) => match e {
            StreamError::Connection(_) => {
                failover(R::ConnectionError, Some(Outcome::Failure), Code::Disconnected)
            }
            StreamError::Malformed(_) => {
                failover(R::ServerError, Some(Outcome::Failure), Code::Malformed)
            }
        },
        Failure::InBand(error) => in_band(error),
        Failure::Stalled(_) => failover(R::Timeout, Some(Outcome::Timeout), Code::Stalled),
        Failure::Unconfigured(_) => {
            failover(R::ServerError, Some(Outcome::Failure), Code::ProviderNotConfigured)
        }
        // The provider answered, so its breaker counts a success: the output is wrong, the
        // provider is up, and the chain moves on without opening anything.
        Failure::InvalidOutput(_) => {
            failover(R::InvalidOutput, Some(Outcome::Success), Code::InvalidOutput)
        }
    }
}

/// How a committed stream ends on a failure: the model is locked, so every failure is the
/// served model's (an in-band error included), and the client gets an error frame with
/// this code. Returns the breaker outcome and the code.
pub fn after_commit(failure: &Failure) -> (Outcome, Code) {
    match failure {
        Failure::Call(CallError::Timeout(_)) => (Outcome::Timeout, Code::Timeout),
        Failure::Stalled(_) => (Outcome::Timeout, Code::Stalled),
        Failure::Stream(StreamError::Connection(_)) => (Outcome::Failure, Code::Disconnected),
        Failure::Stream(StreamError::Malformed(_)) => (Outcome::Failure, Code::Malformed),
        Failure::InBand(_) => (Outcome::Failure, Code::UpstreamError),
        Failure::Call(_) | Failure::Unconfigured(_) => (Outcome::Failure, Code::ServerError),
        // Streams are not checked against a response_format; were one, the provider answered.
        Failure::InvalidOutput(_) => (Outcome::Success, Code::InvalidOutput),
    }
}

/// Whether a status means the provider refused the gateway's credential: the next reserve
/// credential is tried before the attempt counts as failed.
pub fn refuses_credential(status: StatusCode) -> bool {
    status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN
}

fn http_status(status: StatusCode, error: UpstreamError) -> Verdict {
    use FailoverReason as R;
    let failover = |reason, breaker, code| Verdict::Failover { reason, breaker, code };
    match status {
        StatusCode::TOO_MANY_REQUESTS => {
            failover(R::RateLimit, Some(Outcome::Failure), Code::RateLimited)
        }
        // The upstream gave up waiting for a request the gateway sent whole: its slowness,
        // not the client's mistake, so another model may serve.
        StatusCode::REQUEST_TIMEOUT => failover(R::Timeout, Some(Outcome::Timeout), Code::Timeout),
        // Anthropic's 529 `overloaded_error` is a 5xx like any other.
        s if s.is_server_error() => {
            failover(R::ServerError, Some(Outcome::Failure), Code::ServerError)
        }
        // After every reserve credential: the gateway's credential failing is not the
        // client's fault, and the next provider may serve. `server_error` is the failover
        // reason (the contract has none of its own for it); the code and message say what
        // happened.
        s if refuses_credential(s) => {
            failover(R::ServerError, Some(Outcome::Failure), Code::CredentialRefused)
        }
        // The upstream answered: it is healthy, the request is at fault.
        status => {
            let context_length = status.is_client_error() && error.is_context_length();
            Verdict::Stop { status, error, breaker: Some(Outcome::Success), context_length }
        }
    }
}

/// An error event before the first content, classified like its HTTP equivalent. Providers
/// name the class in the error's type or code: OpenAI's `rate_limit_exceeded`/`requests`/
/// `tokens`, Anthropic's `rate_limit_error` and `overloaded_error`.
fn in_band(error: UpstreamError) -> Verdict {
    use FailoverReason as R;
    if error.kind == "invalid_request_error" || error.is_context_length() {
        let context_length = error.is_context_length();
        return Verdict::Stop {
            status: StatusCode::BAD_REQUEST,
            error,
            breaker: Some(Outcome::Success),
            context_length,
        };
    }
    let rate_limited = error.kind.contains("rate_limit")
        || error.code.as_deref().is_some_and(|c| c.contains("rate_limit"))
        || error.kind == "requests"
        || error.kind == "tokens";
    if rate_limited {
        Verdict::Failover {
            reason: R::RateLimit,
            breaker: Some(Outcome::Failure),
            code: Code::RateLimited,
        }
    } else {
        Verdict::Failover {
            reason: R::ServerError,
            breaker: Some(Outcome::Failure),
            code: Code::UpstreamError,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(kind: &str, code: Option<&str>) -> UpstreamError {
        UpstreamError {
            message: "m".into(),
            kind: kind.into(),
            code: code.map(Into::into),
            param: None,
        }
    }

    fn status(code: u16) -> Failure {
        Failure::Call(CallError::Http {
            status: StatusCode::from_u16(code).unwrap(),
            error: upstream("x", None),
            retry_after: None,
        })
    }

    fn encode_error() -> serde_json::Error {
        serde_json::from_str::<u8>("x").unwrap_err()
    }

    fn build_error() -> http::Error {
        http::Request::post("not a uri\n").body(()).unwrap_err()
    }

    /// Every way an attempt fails before its stream commits, and what it means.
    #[test]
    fn every_failure_has_one_verdict() {
        use Code as C;
        use FailoverReason as R;
        use Outcome as O;
        type Want = Option<(R, Option<O>, C)>;
        let table: Vec<(&str, Failure, Want)> = vec![
            ("429", status(429), Some((R::RateLimit, Some(O::Failure), C::RateLimited))),
            ("500", status(500), Some((R::ServerError, Some(O::Failure), C::ServerError))),
            ("502", status(502), Some((R::ServerError, Some(O::Failure), C::ServerError))),
            ("503", status(503), Some((R::ServerError, Some(O::Failure), C::ServerError))),
            (
                "anthropic 529",
                status(529),
                Some((R::ServerError, Some(O::Failure), C::ServerError)),
            ),
            ("408", status(408), Some((R::Timeout, Some(O::Timeout), C::Timeout))),
            ("401", status(401), Some((R::ServerError, Some(O::Failure), C::CredentialRefused))),
            ("403", status(403), Some((R::ServerError, Some(O::Failure), C::CredentialRefused))),
            ("400", status(400), None),
            ("404", status(404), None),
            ("413", status(413), None),
            ("422", status(422), None),
            (
                "transport",
                Failure::Call(CallError::Transport("connection refused".into())),
                Some((R::ConnectionError, Some(O::Failure), C::ConnectionFailed)),
            ),
            (
                "timeout",
                Failure::Call(CallError::Timeout(Duration::from_secs(1))),
                Some((R::Timeout, Some(O::Timeout), C::Timeout)),
            ),
            (
                "malformed body",
                Failure::Call(CallError::Malformed("not json".into())),
                Some((R::ServerError, Some(O::Failure), C::Malformed)),
            ),
            (
                "no credential",
                Failure::Call(CallError::NoCredential("env var unset".into())),
                Some((R::ServerError, Some(O::Failure), C::CredentialMissing)),
            ),
            (
                "encoding bug",
                Failure::Call(CallError::Encode(encode_error())),
                Some((R::ServerError, None, C::GatewayError)),
            ),
            (
                "request cannot be built",
                Failure::Call(CallError::Build(build_error())),
                Some((R::ServerError, None, C::GatewayError)),
            ),
            (
                "stream broke",
                Failure::Stream(StreamError::Connection("reset".into())),
                Some((R::ConnectionError, Some(O::Failure), C::Disconnected)),
            ),
            (
                "malformed frame",
                Failure::Stream(StreamError::Malformed("bad".into())),
                Some((R::ServerError, Some(O::Failure), C::Malformed)),
            ),
            (
                "anthropic overloaded_error in a 200 stream",
                Failure::InBand(upstream("server_error", Some("overloaded_error"))),
                Some((R::ServerError, Some(O::Failure), C::UpstreamError)),
            ),
            (
                "anthropic rate_limit_error in a stream",
                Failure::InBand(upstream("rate_limit_error", Some("rate_limit_error"))),
                Some((R::RateLimit, Some(O::Failure), C::RateLimited)),
            ),
            (
                "openai error frame: rate_limit_exceeded",
                Failure::InBand(upstream("server_error", Some("rate_limit_exceeded"))),
                Some((R::RateLimit, Some(O::Failure), C::RateLimited)),
            ),
            (
                "openai error frame: tokens",
                Failure::InBand(upstream("tokens", None)),
                Some((R::RateLimit, Some(O::Failure), C::RateLimited)),
            ),
            (
                "openai error frame: requests",
                Failure::InBand(upstream("requests", None)),
                Some((R::RateLimit, Some(O::Failure), C::RateLimited)),
            ),
            (
                "error frame, other",
                Failure::InBand(upstream("server_error", None)),
                Some((R::ServerError, Some(O::Failure), C::UpstreamError)),
            ),
            (
                "in-band invalid request",
                Failure::InBand(upstream("invalid_request_error", None)),
                None,
            ),
            (
                "provider not configured",
                Failure::Unconfigured("p".into()),
                Some((R::ServerError, Some(O::Failure), C::ProviderNotConfigured)),
            ),
            (
                "answer not JSON for its response_format",
                Failure::InvalidOutput(Invalid::NotJson { choice: 0, error: "x".into() }),
                Some((R::InvalidOutput, Some(O::Success), C::InvalidOutput)),
            ),
            (
                "answer cut at max_tokens, its JSON broken",
                Failure::InvalidOutput(Invalid::Truncated { choice: 0, error: "x".into() }),
                Some((R::InvalidOutput, Some(O::Success), C::InvalidOutput)),
            ),
            (
                "answer against the schema",
                Failure::InvalidOutput(Invalid::Schema {
                    choice: 0,
                    at: "/age".into(),
                    message: "x".into(),
                }),
                Some((R::InvalidOutput, Some(O::Success), C::InvalidOutput)),
            ),
        ];
        for (case, failure, want) in table {
            let got = classify(failure);
            match (got, want) {
                (Verdict::Failover { reason, breaker, code }, Some(want)) => {
                    assert_eq!((reason, breaker, code), want, "{case}")
                }
                (Verdict::Stop { .. }, None) => {}
                (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_context_length_refusal_is_its_own_verdict_with_the_upstreams_answer() {
        let error = upstream("invalid_request_error", Some("context_length_exceeded"));
        let verdict =
            classify(Failure::Call(CallError::http(StatusCode::BAD_REQUEST, error.clone())));
        let want = Verdict::Stop {
            status: StatusCode::BAD_REQUEST,
            error: error.clone(),
            breaker: Some(Outcome::Success),
            context_length: true,
        };
        assert_eq!(verdict, want);
        assert_eq!(classify(Failure::InBand(error)), want, "in a stream, before any content");
        assert!(!Code::ContextLength.retryable());
    }

    #[test]
    fn a_client_error_stops_the_chain_with_the_upstreams_answer_and_a_healthy_upstream() {
        let error = upstream("invalid_request_error", Some("invalid_value"));
        let verdict =
            classify(Failure::Call(CallError::http(StatusCode::BAD_REQUEST, error.clone())));
        assert_eq!(
            verdict,
            Verdict::Stop {
                status: StatusCode::BAD_REQUEST,
                error,
                breaker: Some(Outcome::Success),
                context_length: false,
            }
        );
    }

    #[test]
    fn a_refusal_before_the_call_is_the_clients_400_and_leaves_the_breaker_alone() {
        let verdict = classify(Failure::Call(CallError::Unsupported {
            message: "no audio".into(),
            param: Some("messages[0].content[1]".into()),
        }));
        let Verdict::Stop { status, error, breaker, .. } = verdict else { panic!("{verdict:?}") };
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(error.code.as_deref(), Some("unsupported_by_provider"));
        assert_eq!(error.kind, "invalid_request_error");
        assert_eq!(error.param.as_deref(), Some("messages[0].content[1]"));
        assert_eq!(breaker, None);
    }

    #[test]
    fn a_committed_stream_blames_the_served_model_for_every_failure() {
        let table = [
            (Failure::Call(CallError::Timeout(Duration::ZERO)), Outcome::Timeout, "timeout"),
            (Failure::Stalled(Duration::ZERO), Outcome::Timeout, "stream_stalled"),
            (
                Failure::Stream(StreamError::Connection("x".into())),
                Outcome::Failure,
                "upstream_disconnected",
            ),
            (
                Failure::Stream(StreamError::Malformed("x".into())),
                Outcome::Failure,
                "upstream_malformed",
            ),
            (
                Failure::InBand(upstream("invalid_request_error", None)),
                Outcome::Failure,
                "upstream_error",
            ),
        ];
        for (failure, outcome, code) in table {
            assert_eq!(after_commit(&failure), (outcome, code_of(code)), "{failure:?}");
        }
    }

    fn code_of(text: &str) -> Code {
        [Code::Timeout, Code::Stalled, Code::Disconnected, Code::Malformed, Code::UpstreamError]
            .into_iter()
            .find(|c| c.as_str() == text)
            .unwrap()
    }

    #[test]
    fn only_failures_another_call_could_change_are_retryable() {
        let code = |failure| match classify(failure) {
            Verdict::Failover { code, .. } => code,
            other => panic!("{other:?}"),
        };
        for retryable in [status(429), status(503), status(529), status(408)] {
            assert!(code(retryable).retryable());
        }
        assert!(code(Failure::Call(CallError::Transport("reset".into()))).retryable());
        assert!(code(Failure::InBand(upstream("server_error", None))).retryable());
        for futile in [
            status(401),
            Failure::Call(CallError::NoCredential("unset".into())),
            Failure::Call(CallError::Encode(encode_error())),
            Failure::Unconfigured("p".into()),
            Failure::InvalidOutput(Invalid::Unreadable("x".into())),
        ] {
            assert!(!code(futile).retryable());
        }
    }

    #[test]
    fn only_401_and_403_try_a_reserve_credential() {
        assert!(refuses_credential(StatusCode::UNAUTHORIZED));
        assert!(refuses_credential(StatusCode::FORBIDDEN));
        assert!(!refuses_credential(StatusCode::BAD_REQUEST));
        assert!(!refuses_credential(StatusCode::TOO_MANY_REQUESTS));
    }
}
