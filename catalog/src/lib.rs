//! Switchyard's domain types, shared by the control plane, the nodes and the CLI: the model
//! catalog (providers, models, breaker policy, webhooks), API keys and their
//! `failoverDefaults`, and the validation every one of them passes before it is stored.
//!
//! Validation errors carry the path of the offending field (`models[2].provider`), so that
//! `switchyard apply` can name the file, the YAML path and the field.
#![forbid(unsafe_code)]

pub mod catalog;
pub mod credential;
pub mod keys;
pub mod time;

pub use catalog::{
    BreakerOverride, BreakerPolicy, Catalog, Model, Price, Provider, ProviderKind, RetryOverride,
    RetryPolicy, Webhook,
};
pub use credential::CredentialRef;
pub use keys::{ApiKeyRecord, FailoverDefaults, FailoverReason, KeyStatus};

/// One invalid field: `path` is where it is (`models[2].provider`), `message` what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

impl FieldError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self { path: path.into(), message: message.into() }
    }
}

/// Every invalid field of a document, in document order; never empty.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct ValidationErrors(pub Vec<FieldError>);
