//! What each fuzz target checks (docs/fuzzing.md), in one place: the cargo-fuzz targets in
//! `fuzz/` call these on the inputs libFuzzer makes, and `tests/replay.rs` calls them on
//! every checked-in corpus file and regression on the stable toolchain, so a target and its
//! replay cannot check different things.
//!
//! Each function takes the raw input and panics (an `assert!`) when the parser under test
//! breaks an invariant; returning is a pass. Inputs the parser refuses are fine as long as
//! the refusal is the kind of error the caller expects.

#![allow(clippy::panic)]

pub mod catalog;
pub mod provider;
pub mod request;
pub mod sse;
pub mod webhook_url;

/// A target's check: returns on a pass, panics on a broken invariant.
pub type Check = fn(&[u8]);

/// The targets, by the name of their directory under `fuzz/corpus/` and of their binary
/// under `fuzz/fuzz_targets/`, with the check each one runs.
/// Azure OpenAI speaks OpenAI's format: the `openai` target runs both adapters on each input.
pub const TARGETS: [(&str, Check); 7] = [
    ("request", request::check),
    ("sse", sse::check),
    ("openai", provider::openai),
    ("anthropic", provider::anthropic),
    ("gemini", provider::gemini),
    ("catalog_yaml", catalog::check),
    ("webhook_url", webhook_url::check),
];
