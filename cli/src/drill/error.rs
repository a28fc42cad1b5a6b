//! Why a drill stops before its verdicts, or ends with failing ones.

use std::time::Duration;

use crate::drill::node::NodeError;

/// Why a drill stopped without verdicts, or with failing ones.
#[derive(Debug, thiserror::Error)]
pub enum DrillError {
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error("--model {0:?}: not in the catalog")]
    UnknownModel(String),
    #[error("--key: the control plane knows no active API key with this secret")]
    UnknownKey,
    #[error("{0}")]
    Chain(String),
    #[error("before the drill, {0}; nothing was injected")]
    Unhealthy(String),
    #[error(
        "the node at {url} did not apply the fault within {waited:?} (it is at config version {at}, the fault is {wanted}): is it connected to this control plane?"
    )]
    NotApplied { url: String, waited: Duration, at: i64, wanted: i64 },
    #[error("drill {scenario}: {failed} of {total} expectations do not hold")]
    Failed { scenario: &'static str, failed: usize, total: usize },
    #[error("drill {0} interrupted; its fault was cleared")]
    Interrupted(&'static str),
}

impl DrillError {
    pub fn exit_code(&self) -> u8 {
        match self {
            DrillError::Interrupted(_) => 130,
            _ => 1,
        }
    }
}
