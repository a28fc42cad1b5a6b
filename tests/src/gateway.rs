//! A whole gateway for data-plane tests: a control plane on the embedded store, a node,
//! and a simulated provider, all real processes on loopback, with a catalog whose models
//! are served by the simulator and a key to call them with.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::*;

/// Gateway names → the simulator's upstream model names. `sim-us` is in region `us`,
/// `sim-eu` in `eu`; both are the same simulator.
pub const PRIMARY: &str = "sim/primary";
pub const SECONDARY: &str = "sim/secondary";
pub const TERTIARY: &str = "sim/tertiary";
pub const EU_MODEL: &str = "sim-eu/model";
/// A model whose catalog entry sets `stall_timeout_ms: 1000`.
pub const STALLY: &str = "sim/stally";
/// A model of an Anthropic-kind provider (`sim-anthropic`, the simulator's root URL): the
/// node speaks Anthropic's Messages API to the simulator's `/v1/messages` for it.
pub const ANTHROPIC: &str = "anthropic/claude";
/// Its upstream model name at the simulator.
pub const ANTHROPIC_UPSTREAM: &str = "claude-sim";
/// A model of a Gemini-kind provider (`sim-gemini`, the simulator's root URL): the node
/// speaks the Gemini API to the simulator's `/v1beta/models/…:generateContent` for it.
pub const GEMINI: &str = "google/gemini";
/// Its upstream model name at the simulator.
pub const GEMINI_UPSTREAM: &str = "gemini-sim";
/// A model of an Azure OpenAI provider (`sim-azure`): the node calls the simulator at
/// `/openai/deployments/azure-deployment/chat/completions?api-version=2024-10-21`.
pub const AZURE: &str = "azure/gpt";
/// A model of an OpenAI-kind provider (`sim-openai`): the node speaks Chat Completions to
/// the simulator for it, and sends `/v1/responses` requests to its `/v1/responses` as they
/// came (docs/responses.md).
pub const OPENAI: &str = "openai/gpt";
/// Its upstream model name at the simulator.
pub const OPENAI_UPSTREAM: &str = "gpt-sim";
pub const AZURE_DEPLOYMENT: &str = "azure-deployment";
pub const ALL_MODELS: [&str; 3] = [PRIMARY, SECONDARY, TERTIARY];
/// Models with a catalog `context_window` (docs/catalog.md): 8, 4 and 100 tokens (the
/// simulator counts words). `ANTHROPIC` and `GEMINI` have 8 too.
pub const CTX_SMALL: &str = "sim/ctx-small";
pub const CTX_SMALLER: &str = "sim/ctx-smaller";
pub const CTX_LARGE: &str = "sim/ctx-large";
/// Models whose catalog entry says `continuation: prefill` (docs/catalog.md): the node may
/// ask them to continue a stream that broke. Upstream `continues` and `continues-too`; no
/// other model of this catalog continues, so other tests' broken streams end as before.
pub const CONTINUES: &str = "sim/continues";
pub const CONTINUES_TOO: &str = "sim/continues-too";

pub struct Gateway {
    pub dir: tempfile::TempDir,
    pub sim: Proc,
    pub cp: Proc,
    pub node: Proc,
    /// A key with no defaults and no limits.
    pub key: String,
    pub key_id: String,
    /// The node's port, when the test asked for one held for it.
    pub node_port: Option<ReservedPort>,
    /// The control plane's URL as the node and the CLI use it (`https://localhost:…` with
    /// TLS).
    pub control: String,
    /// What every admin call runs with: the admin token, and with TLS the CA and client
    /// certificate.
    pub admin_env: Vec<(&'static str, String)>,
    /// With TLS on the node's listener: the CA its certificate is signed by.
    pub node_ca: Option<PathBuf>,
}

/// TLS on a gateway's control plane (docs/operating.md, "TLS"), and what the node and the
/// admin calls reach it with.
pub struct GatewayTls {
    /// The CA that signed `server`: the node's `--control-ca`, the CLI's `SWITCHYARD_CONTROL_CA`.
    pub ca: PathBuf,
    /// The control plane's certificate (for `localhost`).
    pub server: crate::pki::Leaf,
    /// Mutual TLS: the control plane's `--client-ca`.
    pub client_ca: Option<PathBuf>,
    /// The node's `--tls-cert`/`--tls-key` (its HTTPS listener's certificate and its client
    /// certificate), also the admin calls' client certificate; and the CA that signed it.
    pub node: Option<(crate::pki::Leaf, PathBuf)>,
}

/// A breaker policy that opens after four calls, half of them failed, and tries again after
/// 1.5 s: a short outage opens a breaker and its recovery closes it within a test.
pub const BREAKER_OF_FOUR: &str = "breaker_policy:
  window_size: 4
  min_requests: 4
  failure_rate_threshold: 0.5
  consecutive_timeouts: 5
  cooldown_ms: 1500
  max_cooldown_ms: 6000
  half_open_probes: 1
";

pub struct GatewayOptions {
    /// Extra YAML appended to the catalog's top level (e.g. a `breaker_policy:` block).
    pub breaker_policy: &'static str,
    /// Extra entries of the catalog's `models:` list (items indented by two spaces), after
    /// the models every test has.
    pub models: &'static str,
    /// Provider `api_keys` for the simulator providers.
    pub api_keys: &'static str,
    /// Environment for the node (credentials).
    pub node_env: Vec<(&'static str, &'static str)>,
    /// Extra `switchyard node` flags.
    pub node_args: Vec<&'static str>,
    /// Run the node on a port held for the whole test (else on a port of its own): for a
    /// test that checks nothing answers there once the node is gone.
    pub hold_node_port: bool,
    /// Environment for both the control plane and the node (e.g. `OTEL_*`).
    pub env: Vec<(&'static str, String)>,
    /// TLS between the parts (none: plaintext).
    pub tls: Option<GatewayTls>,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        Self {
            breaker_policy: "",
            models: "",
            api_keys: "[]",
            node_env: Vec::new(),
            node_args: Vec::new(),
            hold_node_port: false,
            env: Vec::new(),
            tls: None,
        }
    }
}

pub fn catalog_yaml(sim_url: &str, options: &GatewayOptions) -> String {
    format!(
        r#"providers:
  - name: sim-us
    kind: openai-compatible
    base_url: {sim_url}/v1
    api_keys: {keys}
    region: us
  - name: sim-eu
    kind: openai-compatible
    base_url: {sim_url}/v1
    region: eu
  - name: sim-anthropic
    kind: anthropic
    base_url: {sim_url}
    api_keys: {keys}
    region: us
  - name: sim-openai
    kind: openai
    base_url: {sim_url}/v1
    api_keys: {keys}
    region: us
  - name: sim-azure
    kind: azure-openai
    base_url: {sim_url}
    api_version: 2024-10-21
  - name: sim-gemini
    kind: gemini
    base_url: {sim_url}
    api_keys: {keys}
    region: us
  - name: nowhere
    kind: openai-compatible
    base_url: http://127.0.0.1:9/v1
    region: us
models:
  - name: {PRIMARY}
    provider: sim-us
    upstream_model: primary
    price: {{input_per_mtok: 1.0, output_per_mtok: 2.0}}
  - name: {SECONDARY}
    provider: sim-us
    upstream_model: secondary
    price: {{input_per_mtok: 3.0, output_per_mtok: 4.0}}
  - name: {TERTIARY}
    provider: sim-us
    upstream_model: tertiary
  - name: {EU_MODEL}
    provider: sim-eu
    upstream_model: eu-model
  - name: {STALLY}
    provider: sim-us
    upstream_model: stally
    stall_timeout_ms: 1000
  - name: {ANTHROPIC}
    provider: sim-anthropic
    upstream_model: {ANTHROPIC_UPSTREAM}
    max_tokens: 512
    context_window: 8
  - name: {GEMINI}
    provider: sim-gemini
    upstream_model: {GEMINI_UPSTREAM}
    context_window: 8
  - name: {CTX_SMALL}
    provider: sim-us
    upstream_model: ctx-small
    context_window: 8
  - name: {CTX_SMALLER}
    provider: sim-us
    upstream_model: ctx-smaller
    context_window: 4
  - name: {CTX_LARGE}
    provider: sim-us
    upstream_model: ctx-large
    context_window: 100
  - name: {OPENAI}
    provider: sim-openai
    upstream_model: {OPENAI_UPSTREAM}
  - name: {AZURE}
    provider: sim-azure
    upstream_model: {AZURE_DEPLOYMENT}
  - name: nowhere/model
    provider: nowhere
    upstream_model: unreachable
  - name: {CONTINUES}
    provider: sim-us
    upstream_model: continues
    continuation: prefill
  - name: {CONTINUES_TOO}
    provider: sim-us
    upstream_model: continues-too
    continuation: prefill
{models}{policy}"#,
        keys = options.api_keys,
        models = options.models,
        policy = options.breaker_policy,
    )
}

impl Gateway {
    pub async fn start() -> Gateway {
        Self::start_with(GatewayOptions::default()).await
    }

    pub async fn start_with(options: GatewayOptions) -> Gateway {
        let dir = tempfile::tempdir().unwrap();
        let sim = start_sim(dir.path().join("sim.log")).await;
        let store = format!("file://{}", dir.path().join("store").display());
        let env: Vec<(&str, &str)> = options.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let path = |p: &Path| p.display().to_string();
        let mut cp_flags = Vec::new();
        let mut admin_env = vec![("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN.to_owned())];
        let mut node_tls = Vec::new();
        let mut node_ca = None;
        if let Some(tls) = &options.tls {
            cp_flags.extend(["--tls-cert".into(), path(&tls.server.cert)]);
            cp_flags.extend(["--tls-key".into(), path(&tls.server.key)]);
            if let Some(ca) = &tls.client_ca {
                cp_flags.extend(["--client-ca".into(), path(ca)]);
            }
            admin_env.push(("SWITCHYARD_CONTROL_CA", path(&tls.ca)));
            node_tls.extend(["--control-ca".into(), path(&tls.ca)]);
            if let Some((leaf, ca)) = &tls.node {
                admin_env.push(("SWITCHYARD_TLS_CERT", path(&leaf.cert)));
                admin_env.push(("SWITCHYARD_TLS_KEY", path(&leaf.key)));
                node_tls.extend(["--tls-cert".into(), path(&leaf.cert)]);
                node_tls.extend(["--tls-key".into(), path(&leaf.key)]);
                node_ca = Some(ca.clone());
            }
        }
        let cp_flags: Vec<&str> = cp_flags.iter().map(String::as_str).collect();
        let cp = start_control_with(&store, "127.0.0.1:0", dir.path(), "cp", &env, &cp_flags).await;
        // The certificates are for `localhost`.
        let control = match options.tls {
            Some(_) => format!("https://localhost:{}", cp.addr.port()),
            None => cp.url(),
        };
        let admin_envs: Vec<(&str, &str)> =
            admin_env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let catalog = dir.path().join("catalog.yaml");
        std::fs::write(&catalog, catalog_yaml(&sim.url(), &options)).unwrap();
        let applied =
            cli_with_env(&control, &["apply", "-f", &path(&catalog), "--json"], &admin_envs)
                .await
                .json();
        let created =
            cli_with_env(&control, &["keys", "create", "--name", "e2e", "--json"], &admin_envs)
                .await
                .json();
        let version =
            created["version"].as_i64().unwrap().max(applied["version"].as_i64().unwrap());
        let node_dir = dir.path().join("node").display().to_string();
        let node_port = options.hold_node_port.then(ReservedPort::new);
        let listen = node_port.as_ref().map_or("127.0.0.1:0".to_owned(), |p| p.addr().to_string());
        let mut node_args =
            vec!["node", "--control", &control, "--listen", &listen, "--data-dir", &node_dir];
        node_args.extend(node_tls.iter().map(String::as_str));
        node_args.extend_from_slice(&options.node_args);
        let mut node_env: Vec<(&str, &str)> = options.node_env.clone();
        node_env.extend_from_slice(&env);
        let node = Proc::start(&node_args, &node_env, dir.path().join("node.log")).await;
        let addr = node.addr;
        let https_ca = node_ca.clone();
        eventually(PATIENCE, "the node to apply the catalog and key", || {
            let https_ca = https_ca.clone();
            async move {
                let version_now = match &https_ca {
                    Some(ca) => crate::tls::https_node_version(addr, ca).await,
                    None => node_version(addr).await,
                };
                version_now.filter(|v| *v >= version)
            }
        })
        .await;
        Gateway {
            key: created["key"].as_str().unwrap().to_owned(),
            key_id: created["id"].as_str().unwrap().to_owned(),
            dir,
            sim,
            cp,
            node,
            node_port,
            control,
            admin_env,
            node_ca,
        }
    }

    /// Runs an admin command against the gateway's control plane (over TLS if it has it).
    pub async fn admin(&self, args: &[&str]) -> CliOutput {
        let envs: Vec<(&str, &str)> =
            self.admin_env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        cli_with_env(&self.control, args, &envs).await
    }

    /// Scripts what the simulator does for an upstream model (`primary`, `secondary`, …).
    pub async fn script(&self, upstream_model: &str, behaviour: Value) {
        let body = json!({"model": upstream_model, "behaviour": behaviour}).to_string();
        let r = http_request(self.sim.addr, "POST", "/_sim/script", None, Some(body.as_bytes()))
            .await
            .unwrap();
        assert!(r.status < 300, "scripting the simulator failed: {} {}", r.status, r.body);
    }

    /// Requests the simulator received for an upstream model.
    pub async fn upstream_requests(&self, upstream_model: &str) -> u64 {
        let stats = http_get(self.sim.addr, "/_sim/stats", None).await.unwrap().json();
        stats["models"][upstream_model]["requests"].as_u64().unwrap_or(0)
    }

    /// Every request the simulator received, over all models.
    pub async fn upstream_total(&self) -> u64 {
        let stats = http_get(self.sim.addr, "/_sim/stats", None).await.unwrap().json();
        stats["requests"].as_u64().unwrap_or(0)
    }

    /// The last request body and headers the simulator saw for an upstream model.
    pub async fn last_upstream_request(&self, upstream_model: &str) -> Value {
        http_get(self.sim.addr, &format!("/_sim/last_request?model={upstream_model}"), None)
            .await
            .unwrap()
            .json()
    }

    /// POSTs a chat completion to the node's OpenAI-compatible endpoint with the test key.
    pub async fn chat(&self, body: Value) -> HttpResponse {
        self.post("/v1/chat/completions", Some(&self.key), body.to_string().as_bytes()).await
    }

    /// [`Gateway::chat`] with more request headers (`name`, raw `value`).
    pub async fn chat_with(&self, headers: &[(&str, &[u8])], body: Value) -> HttpResponse {
        let body = body.to_string();
        crate::http_request_with(
            self.node.addr,
            "POST",
            "/v1/chat/completions",
            Some(&self.key),
            headers,
            Some(body.as_bytes()),
        )
        .await
        .expect("the node answers")
    }

    pub async fn classic(&self, body: Value) -> HttpResponse {
        self.post("/chat/completions", Some(&self.key), body.to_string().as_bytes()).await
    }

    pub async fn post(&self, path: &str, key: Option<&str>, body: &[u8]) -> HttpResponse {
        http_request(self.node.addr, "POST", path, key, Some(body)).await.expect("the node answers")
    }

    /// Creates another key (`extra` are more `keys create` flags) and waits until the node has it.
    pub async fn create_key(&self, extra: &[&str]) -> String {
        let mut args = vec!["keys", "create", "--name", "extra", "--json"];
        args.extend_from_slice(extra);
        let created = self.admin(&args).await.json();
        self.wait_for(created["version"].as_i64().unwrap()).await;
        created["key"].as_str().unwrap().to_owned()
    }

    /// Sets the test key's failover defaults and waits until the node has them.
    pub async fn set_defaults(&self, args: &[&str]) {
        let mut all = vec!["keys", "set-defaults", &self.key_id, "--json"];
        all.extend_from_slice(args);
        let out = self.admin(&all).await.json();
        self.wait_for(out["version"].as_i64().unwrap()).await;
    }

    pub async fn wait_for(&self, version: i64) {
        let addr = self.node.addr;
        eventually(PATIENCE, "the node to apply a change", || async move {
            node_version(addr).await.filter(|v| *v >= version)
        })
        .await;
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// A minimal valid request body for `model`.
pub fn body(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hello"}]})
}

/// The attempt objects of a response's report: `secureai.failover.attempts`, else
/// `secureai.attempts`, `metadata.failover.attempts` or a bare `attempts`.
pub fn attempt_objects(response: &Value) -> Vec<Value> {
    response["secureai"]["failover"]["attempts"]
        .as_array()
        .or_else(|| response["secureai"]["attempts"].as_array())
        .or_else(|| response["metadata"]["failover"]["attempts"].as_array())
        .or_else(|| response["attempts"].as_array())
        .cloned()
        .unwrap_or_default()
}

/// A response's attempts (as [`attempt_objects`] finds them) as (model, status, reason)
/// triples.
pub fn attempts(response: &Value) -> Vec<(String, String, String)> {
    attempt_objects(response)
        .iter()
        .map(|a| {
            (
                a["model"].as_str().unwrap_or_default().to_owned(),
                a["status"].as_str().unwrap_or_default().to_owned(),
                a["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

pub fn triple(model: &str, status: &str, reason: &str) -> (String, String, String) {
    (model.to_owned(), status.to_owned(), reason.to_owned())
}

/// A streamed response as the client saw it.
pub struct Streamed {
    pub status: u16,
    pub headers: String,
    /// The `data:` payloads, in order.
    pub frames: Vec<String>,
    /// From sending the request to the end of the response.
    pub took: std::time::Duration,
}

impl Streamed {
    /// The JSON chunks (every frame but `[DONE]`).
    pub fn chunks(&self) -> Vec<Value> {
        self.frames
            .iter()
            .filter(|f| *f != "[DONE]")
            .filter_map(|f| serde_json::from_str(f).ok())
            .collect()
    }

    /// The assistant text the chunks carry.
    pub fn text(&self) -> String {
        self.chunks()
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
            .collect()
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    }

    /// The one chunk that carries the failover report (`secureai`, or `metadata` on the
    /// classic endpoint): the first with content (docs/http-api.md, "Streaming"). Panics
    /// unless exactly one chunk carries it.
    pub fn report_chunk(&self) -> Value {
        let mut carriers = self
            .chunks()
            .into_iter()
            .filter(|c| c.get("secureai").is_some() || c.get("metadata").is_some());
        let first =
            carriers.next().unwrap_or_else(|| panic!("no chunk has the report: {:?}", self.frames));
        assert!(
            carriers.next().is_none(),
            "the report is in more than one chunk: {:?}",
            self.frames
        );
        first
    }

    pub fn error_frame(&self) -> Option<Value> {
        self.chunks().into_iter().find(|c| c.get("error").is_some())
    }
}

impl Gateway {
    /// POSTs a streaming request and reads the whole event stream (bounded by 30 s).
    pub async fn stream(&self, body: Value) -> Streamed {
        stream_chat(self.node.addr, &self.key, body.to_string().as_bytes()).await
    }
}

/// POSTs a streaming chat completion to the node at `addr` with `key` and reads the whole
/// event stream (bounded by 30 s).
pub async fn stream_chat(addr: SocketAddr, key: &str, payload: &[u8]) -> Streamed {
    let started = std::time::Instant::now();
    let socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (head, body) = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        let (response, body) = crate::http_send(
            socket,
            addr,
            "POST",
            "/v1/chat/completions",
            Some(key),
            &[],
            Some(payload),
        )
        .await
        .expect("the node answers");
        // A stream cut off mid-way is an answer too.
        let (mut body, mut bytes) = (body, Vec::new());
        crate::read_body_until(&mut body, &mut bytes, |_| false).await;
        (response, bytes)
    })
    .await
    .expect("the stream ended within 30 s");
    let took = started.elapsed();
    let status = head.status.as_u16();
    let body = String::from_utf8_lossy(&body).into_owned();
    let frames = body
        .split("\n\n")
        .filter_map(|f| {
            f.trim()
                .strip_prefix("data: ")
                .or_else(|| f.trim().strip_prefix("data:"))
                .map(str::to_owned)
        })
        .collect();
    Streamed { status, headers: crate::response_head(&head), frames, took }
}

/// A simulator and two control planes on one etcd, with the test catalog applied: the
/// fleets that check what holds across replicas. Nodes are the test's to start.
pub struct EtcdPair {
    pub dir: tempfile::TempDir,
    pub sim: Proc,
    pub cp1: Proc,
    pub cp2: Proc,
}

impl EtcdPair {
    pub async fn start(etcd: &crate::etcd::EtcdProcess) -> EtcdPair {
        let dir = tempfile::tempdir().unwrap();
        let store = etcd.endpoint().replace("http://", "etcd://");
        let sim = start_sim(dir.path().join("sim.log")).await;
        let cp1 = start_control(&store, "127.0.0.1:0", dir.path(), "cp1").await;
        let cp2 = start_control(&store, "127.0.0.1:0", dir.path(), "cp2").await;
        let catalog = dir.path().join("catalog.yaml");
        std::fs::write(&catalog, catalog_yaml(&sim.url(), &GatewayOptions::default())).unwrap();
        cli(&cp1.url(), &["apply", "-f", &catalog.display().to_string(), "--json"]).await.json();
        EtcdPair { dir, sim, cp1, cp2 }
    }

    /// A node following `first`, then `second`, ready at `version`.
    pub async fn node(&self, name: &str, first: &Proc, second: &Proc, version: i64) -> Proc {
        let node = start_node(
            &format!("{},{}", first.url(), second.url()),
            &self.dir.path().join(name),
            "127.0.0.1:0",
            self.dir.path().join(format!("{name}.log")),
        )
        .await;
        let addr = node.addr;
        eventually(PATIENCE, "a node to apply the config", || async move {
            node_version(addr).await.filter(|v| *v >= version)
        })
        .await;
        node
    }
}

/// Sends `n` chat requests for the primary with the secondary as fallback to the node at
/// `addr`, each answered 200: with the primary scripted to fail, each one fails over.
pub async fn fail_over(addr: std::net::SocketAddr, key: &str, n: u64) {
    let body = serde_json::json!({"model": PRIMARY, "fallback_models": [SECONDARY],
        "messages": [{"role": "user", "content": "hi"}]})
    .to_string();
    for _ in 0..n {
        let r = crate::http_request(
            addr,
            "POST",
            "/v1/chat/completions",
            Some(key),
            Some(body.as_bytes()),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }
}
