//! The catalog the bench applies: model names the subcommands request, and the simulator
//! behind them.

use std::net::SocketAddr;

/// Gateway model names → simulator upstream models. `failing` is scripted to answer 503
/// before the node sees any traffic; `secondary` is the fallback that serves instead.
pub const PRIMARY: &str = "sim/primary";
pub const FAILING: &str = "sim/failing";
pub const SECONDARY: &str = "sim/secondary";
/// The primary's simulator model as one that can continue an answer (`continuation:
/// prefill`): its streams keep what they delivered, for `streams --prefill`.
pub const PREFILL: &str = "sim/prefill";
/// The primary and secondary again, behind an Anthropic-kind provider (the simulator's
/// `/v1/messages`): the models `--surfaces` serves Messages requests with unchanged.
pub const ANTHROPIC_PRIMARY: &str = "sim-anthropic/primary";
pub const ANTHROPIC_SECONDARY: &str = "sim-anthropic/secondary";
/// Two embedding models of the same dimensions (a chain may fail over between them only
/// then), for the `--surfaces` embeddings targets.
pub const EMBED: &str = "sim/embed";
pub const EMBED_SECONDARY: &str = "sim/embed-secondary";

/// A short cool-down so half-open probes do happen inside every measured window: the
/// attempts-per-request figure is then the steady state of an open breaker that keeps
/// probing, not an artefact of a 30 s default cool-down outlasting the window.
const BREAKER_POLICY: &str = "breaker_policy:
  window_size: 20
  min_requests: 10
  failure_rate_threshold: 0.5
  consecutive_timeouts: 5
  cooldown_ms: 1000
  max_cooldown_ms: 1000
  half_open_probes: 1
";

/// The simulator at `sim` as an openai-compatible provider serving the models above and as
/// an Anthropic-kind one serving the primary and secondary again, with the bench's breaker
/// policy.
pub fn catalog_yaml(sim: SocketAddr) -> String {
    format!(
        r#"providers:
  - name: sim
    kind: openai-compatible
    base_url: http://{sim}/v1
    region: us
  - name: sim-anthropic
    kind: anthropic
    base_url: http://{sim}
    region: us
models:
  - name: {PRIMARY}
    provider: sim
    upstream_model: primary
  - name: {FAILING}
    provider: sim
    upstream_model: failing
  - name: {SECONDARY}
    provider: sim
    upstream_model: secondary
  - name: {PREFILL}
    provider: sim
    upstream_model: primary
    continuation: prefill
  - name: {ANTHROPIC_PRIMARY}
    provider: sim-anthropic
    upstream_model: primary
  - name: {ANTHROPIC_SECONDARY}
    provider: sim-anthropic
    upstream_model: secondary
{BREAKER_POLICY}"#
    )
}

/// [`catalog_yaml`] with the two embedding models `--surfaces` measures. Kept apart: a build
/// from before embedding models (a `--baseline-switchyard`) refuses a catalog naming them.
pub fn catalog_with_embeddings_yaml(sim: SocketAddr) -> String {
    let mut yaml = catalog_yaml(sim);
    let at = yaml.find("breaker_policy:").unwrap_or(yaml.len());
    yaml.insert_str(
        at,
        &format!(
            "  - name: {EMBED}
    provider: sim
    upstream_model: embed
    type: embedding
    dimensions: 256
  - name: {EMBED_SECONDARY}
    provider: sim
    upstream_model: embed-secondary
    type: embedding
    dimensions: 256
"
        ),
    );
    yaml
}

/// A model served by three deployments of the simulator (equal weights), and the same three
/// balanced by `least_latency`: what `deployment-cost` measures against [`PRIMARY`], a
/// model of one deployment.
pub const DEPLOYED: &str = "sim/deployed";
pub const DEPLOYED_LEAST_LATENCY: &str = "sim/deployed-least-latency";

/// [`catalog_yaml`] with the two models of three deployments. Kept apart, like the
/// embedding models: a build from before deployments refuses a catalog naming them.
pub fn catalog_with_deployments_yaml(sim: SocketAddr) -> String {
    let mut yaml = catalog_yaml(sim);
    let at = yaml.find("breaker_policy:").unwrap_or(yaml.len());
    let deployments = "    deployments:
      - {provider: sim, upstream_model: deployed-1}
      - {provider: sim, upstream_model: deployed-2}
      - {provider: sim, upstream_model: deployed-3}
";
    yaml.insert_str(
        at,
        &format!(
            "  - name: {DEPLOYED}
{deployments}  - name: {DEPLOYED_LEAST_LATENCY}
{deployments}    balance: least_latency
"
        ),
    );
    yaml
}
