//! Injected faults: what `switchyard chaos inject` stores and every node applies at its
//! upstream call, so that failover, retries and breakers can be exercised on purpose
//! (docs/cli.md, "chaos"). A fault is a config resource (`faults/NAME`) kept under a store
//! lease of its TTL: it disappears from the store, and so from every node, when the TTL ends.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{FieldError, ValidationErrors};

/// The longest a fault may live: a forgotten drill must not outlast a day.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3_600);
/// The shortest TTL: below a second a fault could end before it reached every node.
pub const MIN_TTL: Duration = Duration::from_secs(1);
/// The TTL when `--ttl` is not given.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10 * 60);

/// One injected fault, as stored (JSON) and pushed to nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fault {
    /// Unique; `[A-Za-z0-9._-]`, 1–64 bytes. Attempts it touched carry it as `injected`.
    pub name: String,
    /// Which upstream calls it applies to.
    pub target: FaultTarget,
    /// Only calls made for this API key id, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    /// The probability, 0–1, that a matching call is affected.
    pub rate: f64,
    pub kind: FaultKind,
    /// When the fault ends (the store's lease ends it too); informational for listings.
    pub expires_at_unix_ms: i64,
}

/// A gateway model name or a provider name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultTarget {
    Model(String),
    Provider(String),
}

/// What happens to an affected call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum FaultKind {
    /// As if the provider had answered `status` with its real error body (and
    /// `Retry-After: retry_after_secs` when set).
    Status {
        status: u16,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_secs: Option<u64>,
    },
    /// Waits this long before making the real call.
    Delay { ms: u64 },
    /// Never answers: the attempt's timeout fires.
    Hang,
    /// A connection reset: a connection error.
    Reset,
    /// A 200 whose body does not parse.
    Malformed,
    /// A stream that stops sending (but stays open) after this many content chunks.
    StallAfter { chunks: u32 },
    /// A stream cut off after this many content chunks.
    DropAfter { chunks: u32 },
}

impl FaultKind {
    /// The kind's name as the CLI flag spells it (`status`, `delay-ms`, `hang`, …).
    pub fn flag(&self) -> &'static str {
        match self {
            Self::Status { .. } => "status",
            Self::Delay { .. } => "delay-ms",
            Self::Hang => "hang",
            Self::Reset => "reset",
            Self::Malformed => "malformed",
            Self::StallAfter { .. } => "stall-after",
            Self::DropAfter { .. } => "drop-after",
        }
    }
}

/// What [`is_valid_name`] checks, in words for an error message.
pub const NAME_RULE: &str = "a fault name is 1-64 characters of letters, digits, '.', '_' and '-'";

/// Whether `name` can name a fault: it becomes a store key segment and a resource name, so
/// it holds no `/` and nothing that needs escaping.
pub fn is_valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

impl Fault {
    /// Whether the fault applies to a call to `model` (gateway name) of `provider` for `key_id`.
    pub fn matches(&self, model: &str, provider: &str, key_id: &str) -> bool {
        self.targets(model, provider) && self.key_id.as_deref().is_none_or(|k| k == key_id)
    }

    /// Whether the fault names `model` or `provider`, whichever key it is scoped to.
    pub fn targets(&self, model: &str, provider: &str) -> bool {
        match &self.target {
            FaultTarget::Model(m) => m == model,
            FaultTarget::Provider(p) => p == provider,
        }
    }

    /// Checks the fault on its own (names in the catalog and keys are the control plane's to
    /// check). Field paths are the CLI's flags.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut errors = Vec::new();
        if !is_valid_name(&self.name) {
            errors.push(FieldError::new("name", NAME_RULE));
        }
        let target_empty = match &self.target {
            FaultTarget::Model(m) | FaultTarget::Provider(m) => m.trim().is_empty(),
        };
        if target_empty {
            errors.push(FieldError::new(
                "target",
                "name a model (--model) or a provider (--provider)",
            ));
        }
        if !(0.0..=1.0).contains(&self.rate) || self.rate.is_nan() {
            errors.push(FieldError::new("rate", "must be between 0 and 1"));
        }
        match &self.kind {
            FaultKind::Status { status, .. } if !(400..=599).contains(status) => {
                errors.push(FieldError::new("status", "must be an HTTP error status, 400-599"));
            }
            FaultKind::Delay { ms } if *ms == 0 || *ms > 600_000 => {
                errors.push(FieldError::new("delay-ms", "must be 1-600000"));
            }
            _ => {}
        }
        if errors.is_empty() { Ok(()) } else { Err(ValidationErrors(errors)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(kind: FaultKind) -> Fault {
        Fault {
            name: "drill-1".into(),
            target: FaultTarget::Model("openai/gpt-5-nano".into()),
            key_id: None,
            rate: 1.0,
            kind,
            expires_at_unix_ms: 0,
        }
    }

    #[test]
    fn a_fault_round_trips_as_json() {
        let f = fault(FaultKind::Status { status: 503, retry_after_secs: Some(2) });
        let json = serde_json::to_string(&f).unwrap();
        assert!(
            json.contains(r#""kind":{"type":"status","status":503,"retry_after_secs":2}"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<Fault>(&json).unwrap(), f);
    }

    #[test]
    fn matching_is_by_model_or_provider_and_optionally_key() {
        let mut f = fault(FaultKind::Hang);
        assert!(f.matches("openai/gpt-5-nano", "openai", "key_a"));
        assert!(!f.matches("anthropic/claude", "anthropic", "key_a"));
        f.target = FaultTarget::Provider("anthropic".into());
        f.key_id = Some("key_b".into());
        assert!(f.matches("anthropic/claude", "anthropic", "key_b"));
        assert!(!f.matches("anthropic/claude", "anthropic", "key_a"));
    }

    #[test]
    fn validation_names_the_flag() {
        let mut f = fault(FaultKind::Status { status: 200, retry_after_secs: None });
        f.rate = 1.5;
        f.name = "bad name".into();
        let errors = f.validate().unwrap_err().to_string();
        for field in ["name", "rate", "status"] {
            assert!(errors.contains(field), "{errors}");
        }
        assert!(fault(FaultKind::Delay { ms: 0 }).validate().is_err());
        assert!(fault(FaultKind::StallAfter { chunks: 3 }).validate().is_ok());
    }
}
