//! Switchyard's domain types, shared by the control plane, the nodes and the CLI: the model
//! catalog (providers, models, breaker policy, webhooks), API keys and their
//! `failoverDefaults`, and the validation every one of them passes before it is stored.
//!
//! Validation errors carry the path of the offending field (`models[2].provider`), so that
//! `switchyard apply` can name the file, the YAML path and the field.
#![forbid(unsafe_code)]

pub mod address;
pub mod catalog;
pub mod credential;
pub mod error;
pub mod fault;
pub mod file;
pub mod keys;
pub mod wildcard;

pub use catalog::{
    Balance, BreakerOverride, BreakerPolicy, Catalog, Deployment, MAX_DEPLOYMENTS, Model,
    ModelType, Price, ProbeOverride, ProbePolicy, Provider, ProviderKind, RetryOverride,
    RetryPolicy, Webhook,
};
pub use credential::CredentialRef;
pub use error::{FieldError, ValidationErrors};
pub use fault::{Fault, FaultKind, FaultTarget};
pub use keys::{ApiKeyRecord, Degraded, FailoverDefaults, FailoverReason, KeyStatus, Limits};
pub use wildcard::{model_allowed, rest_under, wildcard_prefix};
