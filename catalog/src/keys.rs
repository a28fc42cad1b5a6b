//! API keys and their `failoverDefaults` (see docs/http-api.md and docs/cli.md).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{FieldError, ValidationErrors};

/// The most distinct models a chain may hold.
pub const MAX_CHAIN_MODELS: usize = 3;
pub const TIMEOUT_MS_RANGE: (u32, u32) = (1_000, 300_000);
pub const FIRST_TOKEN_TIMEOUT_MS_RANGE: (u32, u32) = (500, 60_000);
/// The prefix of every key secret, so a leaked key is recognisable (and greppable).
pub const SECRET_PREFIX: &str = "sy-";

/// Why an attempt failed, in the HTTP API's words (docs/http-api.md, "Failover"); the values
/// of `redundancy.on`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailoverReason {
    ConnectionError,
    ServerError,
    RateLimit,
    Timeout,
    /// The provider refused the prompt as longer than the model's context: fails over only
    /// to a later model whose catalog `context_window` is larger (docs/http-api.md,
    /// "Failover").
    ContextLength,
    /// The provider answered, but not with JSON matching the request's `response_format`
    /// (docs/http-api.md, "Structured outputs"). Opt-in: never in the default `on`.
    InvalidOutput,
}

impl FailoverReason {
    /// The default `on`: the four reasons that say a provider is failing, and a prompt too
    /// long for one model. `invalid_output` is left out so that turning it on is a choice
    /// each key or request makes.
    pub const ALL: [FailoverReason; 5] = [
        Self::ConnectionError,
        Self::ServerError,
        Self::RateLimit,
        Self::Timeout,
        Self::ContextLength,
    ];

    /// Every value `on` accepts, in the order messages list them.
    pub const ACCEPTED: [FailoverReason; 6] = [
        Self::ConnectionError,
        Self::ServerError,
        Self::RateLimit,
        Self::Timeout,
        Self::ContextLength,
        Self::InvalidOutput,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::ConnectionError => "connection_error",
            Self::ServerError => "server_error",
            Self::RateLimit => "rate_limit",
            Self::Timeout => "timeout",
            Self::ContextLength => "context_length",
            Self::InvalidOutput => "invalid_output",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ACCEPTED.into_iter().find(|r| r.as_str() == text)
    }

    /// `connection_error, server_error, rate_limit, timeout, context_length or
    /// invalid_output`, for messages
    /// that list what `on` accepts.
    pub fn accepted_list() -> String {
        let names: Vec<&str> = Self::ACCEPTED.iter().map(|r| r.as_str()).collect();
        match names.split_last() {
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyStatus {
    Active,
    Revoked,
}

impl KeyStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Revoked => "revoked",
        }
    }
}

/// A key's default chain and options, applied when a request names only `model`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailoverDefaults {
    pub models: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_token_timeout_ms: Option<u32>,
    /// `None`: the default triggers (`FailoverReason::ALL`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on: Option<Vec<FailoverReason>>,
    /// The designed answer when no model of a chain can serve (docs/http-api.md,
    /// "Degraded answers"); a request's `redundancy.degraded` replaces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded: Option<Degraded>,
    /// Continue a stream that breaks after its first token (docs/http-api.md,
    /// "Streaming"); `None`: on. A request's `redundancy.continue_streams` replaces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continue_streams: Option<bool>,
    /// Send a request that names a session to the session's deployment (docs/catalog.md,
    /// "Session affinity"); `None`: on. A request's `redundancy.session_affinity` replaces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity: Option<bool>,
}

/// The most bytes a degraded answer's message may hold.
pub const DEGRADED_MESSAGE_MAX_BYTES: usize = 4096;

/// A designed, labelled answer for the moment no model can serve.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Degraded {
    /// The assistant message the client gets, 1 to 4,096 bytes.
    pub message: String,
    /// Answer at once, without trying a model, when every model's breaker is open and none is
    /// due for a probe.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub when_all_open: bool,
}

impl Degraded {
    /// Why `message` cannot be sent, if it cannot.
    pub fn check_message(message: &str) -> Option<String> {
        if message.is_empty() {
            Some("must not be empty".to_owned())
        } else if message.len() > DEGRADED_MESSAGE_MAX_BYTES {
            Some(format!("at most {DEGRADED_MESSAGE_MAX_BYTES} bytes, got {}", message.len()))
        } else {
            None
        }
    }
}

impl FailoverDefaults {
    /// Normalises defaults as an admin saves them: duplicates dropped (first kept), more than
    /// three distinct or unknown models refused, timeouts clamped into range. Returns the
    /// saved value and a warning for each clamp, so the admin learns what was stored.
    pub fn normalize(
        self,
        model_exists: impl Fn(&str) -> bool,
    ) -> Result<(Self, Vec<String>), ValidationErrors> {
        let mut errors = Vec::new();
        let mut warnings = Vec::new();
        let models = dedup(self.models);
        if let Some(why) = self.degraded.as_ref().and_then(|d| Degraded::check_message(&d.message))
        {
            errors.push(FieldError::new("failoverDefaults.degraded.message", why));
        }
        // A key may carry only a degraded answer, for requests that bring their own chains.
        if models.is_empty() && self.degraded.is_none() {
            errors.push(FieldError::new("failoverDefaults.models", "must name 1 to 3 models"));
        } else if models.len() > MAX_CHAIN_MODELS {
            errors.push(FieldError::new(
                "failoverDefaults.models",
                format!("at most {MAX_CHAIN_MODELS} distinct models, got {}", models.len()),
            ));
        }
        for (i, model) in models.iter().enumerate() {
            if crate::wildcard::wildcard_prefix(model).is_some() {
                // A chain's attempts each call one upstream model; a wildcard names many.
                errors.push(FieldError::new(
                    format!("failoverDefaults.models[{i}]"),
                    format!(
                        "{model:?} is a wildcard: a chain names models, e.g. {}<model>",
                        model.trim_end_matches('*')
                    ),
                ));
            } else if !model_exists(model) {
                errors.push(FieldError::new(
                    format!("failoverDefaults.models[{i}]"),
                    format!("unknown model {model:?}: not in the catalog"),
                ));
            }
        }
        let timeout_ms = self
            .timeout_ms
            .map(|v| clamp("failoverDefaults.timeout_ms", v, TIMEOUT_MS_RANGE, &mut warnings));
        let first_token_timeout_ms = self.first_token_timeout_ms.map(|v| {
            clamp(
                "failoverDefaults.first_token_timeout_ms",
                v,
                FIRST_TOKEN_TIMEOUT_MS_RANGE,
                &mut warnings,
            )
        });
        let on = self.on.map(|mut on| {
            on.sort();
            on.dedup();
            on
        });
        // Stored as "the default" only when it is exactly the default five: with
        // `invalid_output` a list of five can be another set.
        let on = match on {
            Some(on) if on.is_empty() || on == FailoverReason::ALL => None,
            other => other,
        };
        if errors.is_empty() {
            Ok((
                Self {
                    models,
                    timeout_ms,
                    first_token_timeout_ms,
                    on,
                    degraded: self.degraded,
                    continue_streams: self.continue_streams,
                    session_affinity: self.session_affinity,
                },
                warnings,
            ))
        } else {
            Err(ValidationErrors(errors))
        }
    }
}

impl FailoverDefaults {
    /// Whether the chain's models can fail over to each other: all chat models, or all
    /// embedding models of one `dimensions` (a fallback's vectors must be comparable with the
    /// first model's). `kind_of` gives a model's type and dimensions (`None`: not in the
    /// catalog, reported elsewhere). The first model that differs from the first is named.
    pub fn check_kinds(
        &self,
        kind_of: impl Fn(&str) -> Option<ChainKind>,
    ) -> Result<(), FieldError> {
        let mut models = self.models.iter().enumerate();
        let Some((first, kind)) = models.find_map(|(_, m)| Some((m, kind_of(m)?))) else {
            return Ok(());
        };
        for (i, model) in models {
            let Some(other) = kind_of(model) else { continue };
            if other != kind {
                return Err(FieldError::new(
                    format!("failoverDefaults.models[{i}]"),
                    format!(
                        "model {model:?} is {other} and {first:?} is {kind}: a chain's models are all chat models, or all embedding models of one dimensions"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// What a chain's models must share to fail over to each other (see
/// [`FailoverDefaults::check_kinds`]); `Model::chain_kind` gives a model's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainKind {
    Chat,
    /// An embedding model, of these dimensions.
    Embedding(Option<u32>),
}

impl std::fmt::Display for ChainKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Chat => f.write_str("a chat model"),
            Self::Embedding(Some(d)) => write!(f, "an embedding model of {d} dimensions"),
            Self::Embedding(None) => f.write_str("an embedding model"),
        }
    }
}

fn clamp(field: &str, value: u32, (lo, hi): (u32, u32), warnings: &mut Vec<String>) -> u32 {
    let clamped = value.clamp(lo, hi);
    if clamped != value {
        warnings.push(format!("{field}: {value} is outside {lo}–{hi}, saved as {clamped}"));
    }
    clamped
}

/// Drops repeated entries, keeping the first occurrence.
pub fn dedup(items: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(items.len());
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

/// The largest count a limit may hold (requests or tokens).
pub const LIMIT_MAX: u64 = 1_000_000_000_000;
/// The largest daily budget, in US dollars.
pub const USD_PER_DAY_MAX: f64 = 1e9;

/// A key's own limits, held for the whole fleet (docs/limits.md): requests and tokens per
/// sliding minute, tokens and US dollars per UTC day. `None`: no such limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpm: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_day: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd_per_day: Option<f64>,
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        self.rpm.is_none()
            && self.tpm.is_none()
            && self.tokens_per_day.is_none()
            && self.usd_per_day.is_none()
    }

    /// The daily budget in micro-dollars, the unit nodes count cost in.
    pub fn micro_usd_per_day(&self) -> Option<u64> {
        self.usd_per_day.map(|usd| (usd * 1e6).round() as u64)
    }

    /// Checks every field; errors name the limit as the CLI flag does (`rpm`, `usd_per_day`).
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut errors = Vec::new();
        for (name, value) in
            [("rpm", self.rpm), ("tpm", self.tpm), ("tokens_per_day", self.tokens_per_day)]
        {
            if let Some(v) = value
                && !(1..=LIMIT_MAX).contains(&v)
            {
                errors.push(FieldError::new(
                    format!("limits.{name}"),
                    format!("must be from 1 to {LIMIT_MAX}, got {v}"),
                ));
            }
        }
        if let Some(usd) = self.usd_per_day {
            let micro = usd * 1e6;
            if !usd.is_finite() || usd <= 0.0 || usd > USD_PER_DAY_MAX {
                errors.push(FieldError::new(
                    "limits.usd_per_day",
                    format!("must be above 0 and at most {USD_PER_DAY_MAX:e}, got {usd}"),
                ));
            } else if (micro - micro.round()).abs() > 1e-6 * micro.max(1.0) {
                errors.push(FieldError::new(
                    "limits.usd_per_day",
                    format!("at most 6 decimals (a millionth of a dollar), got {usd}"),
                ));
            }
        }
        if errors.is_empty() { Ok(()) } else { Err(ValidationErrors(errors)) }
    }
}

/// An API key as stored: the secret itself is never kept, only its SHA-256.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApiKeyRecord {
    pub id: String,
    pub name: String,
    pub created_unix_ms: i64,
    #[serde(default)]
    pub updated_unix_ms: i64,
    pub status: KeyStatus,
    /// Lower-case hex SHA-256 of the whole secret string.
    pub secret_sha256: String,
    /// The secret's last four characters, to tell keys apart in listings.
    pub secret_hint: String,
    #[serde(default, rename = "failoverDefaults", skip_serializing_if = "Option::is_none")]
    pub failover_defaults: Option<FailoverDefaults>,
    /// Empty: every model in the catalog.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_models: Vec<String>,
    /// Empty: every region.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_regions: Vec<String>,
    /// The key's own limits, enforced by every node for the whole fleet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
}

impl ApiKeyRecord {
    pub fn is_active(&self) -> bool {
        self.status == KeyStatus::Active
    }
}

/// SHA-256 of a key secret as bytes: what a node looks keys up by.
pub fn secret_digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// The bytes of a stored `secret_sha256` (64 hex digits, either case); `None` if it is not one.
pub fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let nibble = |c: u8| char::from(c).to_digit(16).and_then(|d| u8::try_from(d).ok());
    let mut out = [0u8; 32];
    for (byte, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

/// Hex SHA-256 of a key secret, the form in which keys are stored and looked up.
pub fn hash_secret(secret: &str) -> String {
    digest_hex(&secret_digest(secret))
}

/// Lower-case hex of a digest, as `secret_sha256` stores it.
pub fn digest_hex(digest: &[u8; 32]) -> String {
    let mut hex = String::with_capacity(64);
    for &byte in digest {
        hex.push(char::from(b"0123456789abcdef"[usize::from(byte >> 4)]));
        hex.push(char::from(b"0123456789abcdef"[usize::from(byte & 0xf)]));
    }
    hex
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(m: &str) -> bool {
        ["a", "b", "c", "d"].contains(&m)
    }

    #[test]
    fn defaults_drop_duplicates_before_counting() {
        let d = FailoverDefaults {
            models: vec!["a".into(), "b".into(), "a".into(), "c".into()],
            ..Default::default()
        };
        let (saved, warnings) = d.normalize(known).unwrap();
        assert_eq!(saved.models, ["a", "b", "c"]);
        assert!(warnings.is_empty());
    }

    #[test]
    fn defaults_refuse_more_than_three_distinct_models() {
        let d = FailoverDefaults {
            models: ["a", "b", "c", "d"].map(String::from).to_vec(),
            ..Default::default()
        };
        let err = d.normalize(known).unwrap_err();
        assert_eq!(err.0[0].path, "failoverDefaults.models");
    }

    #[test]
    fn defaults_refuse_unknown_models_naming_them() {
        let d = FailoverDefaults { models: vec!["a".into(), "zz".into()], ..Default::default() };
        let err = d.normalize(known).unwrap_err();
        assert_eq!(err.0[0].path, "failoverDefaults.models[1]");
        assert!(err.0[0].message.contains("\"zz\""));
    }

    #[test]
    fn defaults_clamp_timeouts_into_range_with_a_warning() {
        let d = FailoverDefaults {
            models: vec!["a".into()],
            timeout_ms: Some(999_999),
            first_token_timeout_ms: Some(10),
            on: None,
            degraded: None,
            continue_streams: None,
            session_affinity: None,
        };
        let (saved, warnings) = d.normalize(known).unwrap();
        assert_eq!(saved.timeout_ms, Some(300_000));
        assert_eq!(saved.first_token_timeout_ms, Some(500));
        assert_eq!(warnings.len(), 2);
    }

    #[test]
    fn a_degraded_message_is_checked_and_may_stand_without_models() {
        let degraded = |message: &str| FailoverDefaults {
            degraded: Some(Degraded { message: message.into(), when_all_open: true }),
            ..Default::default()
        };
        let (saved, _) = degraded("Summaries are unavailable right now.").normalize(known).unwrap();
        assert!(saved.models.is_empty());
        assert!(saved.degraded.as_ref().is_some_and(|d| d.when_all_open));
        for bad in [String::new(), "x".repeat(DEGRADED_MESSAGE_MAX_BYTES + 1)] {
            let e = degraded(&bad).normalize(known).unwrap_err();
            assert_eq!(e.0[0].path, "failoverDefaults.degraded.message", "{e:?}");
        }
        assert!(degraded(&"x".repeat(DEGRADED_MESSAGE_MAX_BYTES)).normalize(known).is_ok());
        let e = FailoverDefaults::default().normalize(known).unwrap_err();
        assert_eq!(e.0[0].path, "failoverDefaults.models");
    }

    #[test]
    fn limits_are_checked_naming_the_limit() {
        let ok =
            Limits { rpm: Some(60), tpm: Some(1), tokens_per_day: None, usd_per_day: Some(2.5) };
        assert!(ok.validate().is_ok());
        assert_eq!(ok.micro_usd_per_day(), Some(2_500_000));
        let paths = |l: Limits| -> Vec<String> {
            l.validate().unwrap_err().0.into_iter().map(|e| e.path).collect()
        };
        assert_eq!(paths(Limits { rpm: Some(0), ..Default::default() }), ["limits.rpm"]);
        assert_eq!(
            paths(Limits { tokens_per_day: Some(LIMIT_MAX + 1), ..Default::default() }),
            ["limits.tokens_per_day"]
        );
        for usd in [0.0, -1.0, 2e9, f64::NAN, 0.1234567] {
            assert_eq!(
                paths(Limits { usd_per_day: Some(usd), ..Default::default() }),
                ["limits.usd_per_day"],
                "{usd}"
            );
        }
        assert!(Limits { usd_per_day: Some(0.123456), ..Default::default() }.validate().is_ok());
        assert!(Limits::default().is_empty());
    }

    #[test]
    fn invalid_output_is_accepted_but_never_a_default() {
        assert_eq!(FailoverReason::parse("invalid_output"), Some(FailoverReason::InvalidOutput));
        assert!(!FailoverReason::ALL.contains(&FailoverReason::InvalidOutput));
        assert_eq!(
            FailoverReason::accepted_list(),
            "connection_error, server_error, rate_limit, timeout, context_length or invalid_output"
        );
        let with = |on: Vec<FailoverReason>| FailoverDefaults {
            models: vec!["a".into()],
            on: Some(on),
            ..Default::default()
        };
        let (saved, _) = with(FailoverReason::ALL.to_vec()).normalize(known).unwrap();
        assert_eq!(saved.on, None, "the default five are stored as the default");
        // Five reasons, but not the default five: kept as they are.
        let five = vec![
            FailoverReason::InvalidOutput,
            FailoverReason::Timeout,
            FailoverReason::ContextLength,
            FailoverReason::ServerError,
            FailoverReason::ConnectionError,
        ];
        let (saved, _) = with(five).normalize(known).unwrap();
        assert_eq!(
            saved.on,
            Some(vec![
                FailoverReason::ConnectionError,
                FailoverReason::ServerError,
                FailoverReason::Timeout,
                FailoverReason::ContextLength,
                FailoverReason::InvalidOutput,
            ])
        );
        let (saved, _) = with(FailoverReason::ACCEPTED.to_vec()).normalize(known).unwrap();
        assert_eq!(saved.on.as_deref(), Some(&FailoverReason::ACCEPTED[..]));
    }

    #[test]
    fn hash_is_hex_sha256() {
        assert_eq!(
            hash_secret("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_digest_parses_back_from_its_hex_in_either_case_and_nothing_else_does() {
        let digest = secret_digest("abc");
        assert_eq!(parse_digest(&hash_secret("abc")), Some(digest));
        assert_eq!(parse_digest(&hash_secret("abc").to_uppercase()), Some(digest));
        assert_eq!(digest_hex(&digest), hash_secret("abc"));
        let hex = hash_secret("abc");
        for bad in ["", "h", &hex[..62], &format!("{hex}00"), &format!("{}g", &hex[..63])] {
            assert_eq!(parse_digest(bad), None, "{bad:?}");
        }
        assert_eq!(parse_digest(&format!("+{}", &hex[1..])), None, "a sign is not a digit");
    }

    #[test]
    fn a_wildcard_is_no_default_chain_member_but_a_name_under_one_is() {
        let d = FailoverDefaults {
            models: vec!["openai/gpt-5".into(), "openai/*".into()],
            ..FailoverDefaults::default()
        };
        let errors = d.normalize(|m| m.starts_with("openai/")).unwrap_err().0;
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].path, "failoverDefaults.models[1]");
        assert!(
            errors[0].message.contains("wildcard") && errors[0].message.contains("openai/<model>")
        );
    }

    #[test]
    fn a_chain_mixing_types_or_dimensions_is_refused_naming_the_model() {
        let kind = |m: &str| match m {
            "chat" => Some(ChainKind::Chat),
            "e8" | "e8b" => Some(ChainKind::Embedding(Some(8))),
            "e16" => Some(ChainKind::Embedding(Some(16))),
            _ => None,
        };
        let chain = |models: &[&str]| FailoverDefaults {
            models: models.iter().map(|m| m.to_string()).collect(),
            ..FailoverDefaults::default()
        };
        assert!(chain(&["e8", "e8b"]).check_kinds(kind).is_ok());
        assert!(chain(&["chat"]).check_kinds(kind).is_ok());
        assert!(
            chain(&["unknown", "e8"]).check_kinds(kind).is_ok(),
            "unknown names are not this check's"
        );
        let e = chain(&["e8", "e8b", "e16"]).check_kinds(kind).unwrap_err();
        assert_eq!(e.path, "failoverDefaults.models[2]");
        assert!(e.message.contains("16 dimensions") && e.message.contains("of 8"), "{}", e.message);
        let e = chain(&["chat", "e8"]).check_kinds(kind).unwrap_err();
        assert_eq!(e.path, "failoverDefaults.models[1]");
    }
}
