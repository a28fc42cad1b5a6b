//! Switchyard's data-plane node: applies config streamed from the control plane and
//! serves the HTTP API. A request goes `http` → `request` → `chain` → `executor` →
//! `providers::<kind>` and back; no module names one above it on that path. `app` holds
//! what every request shares (below `http` and `stream`, the streaming response), and
//! `failure` decides what an upstream failure means (below `executor`, `stream` and the
//! providers' dispatch); `retry` whether the executor calls the same model again; `chaos`
//! which injected fault touches an upstream call (below the providers' dispatch, which
//! applies it); `structured` checks answers against a request's `response_format` (below
//! `failure` and `chain`); `spool` keeps on disk the failover events `telemetry` cannot hold,
//! and `custody` moves there those a kill of the process would lose; `probe`
//! is the node's prober, beside the request path, using the node's breakers and the
//! providers.
//! `deployment` orders a model's deployments for an attempt and counts their requests in
//! flight (below `chain` and `executor`).
//! `otel` makes the OpenTelemetry spans and log records (below `executor` and `http`).
//! `services` is what the node owns once (telemetry, limits, metrics, breakers, loads), below
//! `executor`, `stream`, `probe` and `http`, which all use it.
//! `python3 .ci/module-cycles.py --layers data-plane` prints the layers.
#![forbid(unsafe_code)]

pub mod app;
pub mod breaker;
pub mod chain;
pub mod chaos;
pub mod config;
pub mod continuation;
pub mod custody;
pub mod degraded;
pub mod deployment;
pub mod dir_lock;
pub mod embeddings;
pub mod error;
pub mod executor;
pub mod failure;
pub mod http;
pub mod keys;
pub mod limits;
pub mod loss;
pub mod messages;
pub mod metrics;
pub mod models;
pub mod node;
pub mod otel;
pub mod persist;
pub mod probe;
pub mod providers;
pub mod report;
pub mod request;
pub mod request_id;
pub mod responses;
pub mod retry;
pub mod serve;
pub mod services;
pub mod shards;
pub mod spool;
pub mod state;
pub mod stream;
pub mod structured;
pub mod sync;
pub mod telemetry;
pub mod wake;
