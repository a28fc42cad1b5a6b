//! What a drill is and what it reports: the scenarios, and the report printed as text or
//! given to scripts as JSON.

use std::collections::BTreeMap;

use clap::ValueEnum;
use serde::Serialize;

use crate::drill::verdict::Expectation;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// The chain's first model answers 503 to every call.
    PrimaryDown,
    /// Half of the first model's calls answer 503.
    PrimaryFlaky,
    /// The first model's streams stop after 3 content chunks.
    StreamStall,
    /// Every model of the chain answers 503.
    AllDown,
    /// The first model's streams are cut off (the connection drops) after a few content
    /// chunks; the node continues each one.
    StreamCut,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::PrimaryDown => "primary-down",
            Scenario::PrimaryFlaky => "primary-flaky",
            Scenario::StreamStall => "stream-stall",
            Scenario::AllDown => "all-down",
            Scenario::StreamCut => "stream-cut",
        }
    }

    pub fn default_requests(self) -> u32 {
        match self {
            // Enough for the default breaker window (20) to fill and many requests after.
            Scenario::PrimaryDown | Scenario::PrimaryFlaky => 40,
            // Each stalled stream waits out the model's stall timeout.
            Scenario::StreamStall | Scenario::StreamCut => 8,
            Scenario::AllDown => 20,
        }
    }
}

/// The API the drill's requests come through, as an app's would.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Surface {
    /// OpenAI's Chat Completions: `POST /v1/chat/completions`.
    #[default]
    Chat,
    /// Anthropic's Messages: `POST /v1/messages`.
    Messages,
    /// OpenAI's Responses: `POST /v1/responses`.
    Responses,
}

impl Surface {
    pub fn name(self) -> &'static str {
        match self {
            Surface::Chat => "chat",
            Surface::Messages => "messages",
            Surface::Responses => "responses",
        }
    }

    pub fn path(self) -> &'static str {
        match self {
            Surface::Chat => "/v1/chat/completions",
            Surface::Messages => "/v1/messages",
            Surface::Responses => "/v1/responses",
        }
    }
}

/// Everything a drill prints, and `--json` gives scripts.
#[derive(Debug, Serialize)]
pub struct DrillReport {
    pub scenario: Scenario,
    pub surface: Surface,
    pub node: String,
    pub key_id: String,
    pub chain: Vec<String>,
    pub faults: Vec<String>,
    /// stream-cut: the content chunks after which the primary's streams are cut.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cut_after: Option<u32>,
    pub requests: usize,
    pub concurrency: u32,
    pub took_ms: f64,
    pub latency_ms: Latency,
    /// Upstream calls to the chain's first model per request, retries included.
    pub primary_calls_per_request: f64,
    pub upstream_calls_per_request: f64,
    /// Breaker state changes on the node during the drill, by gateway model.
    pub breaker_transitions: BTreeMap<String, u64>,
    pub expectations: Vec<Expectation>,
    /// The drill's faults were cleared and the node applied the clearing.
    pub faults_cleared: bool,
    pub passed: bool,
}

#[derive(Debug, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
}
