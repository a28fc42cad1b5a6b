//! No secret in any output: a control plane, a node and a simulated provider run with known
//! secrets (admin and join tokens, provider keys through `env:` references, a webhook
//! signing secret, credentials in a provider's and a webhook's URL, API keys) while admin
//! commands, good and bad requests, failovers, refused credentials and webhook deliveries go
//! through them; then every process's log and stdout, every admin command's output, every
//! answer a client got, every webhook request and both `/metrics` pages are searched for
//! each secret. Real processes on loopback; the switchyard crates log at debug.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use switchyard_e2e::{
    CliOutput, HttpResponse, PATIENCE, Proc, cli_with_env, eventually, http_get, http_request,
    node_version, start_sim,
};

// Each secret is a value no process would print by chance; `core` (its middle) is searched
// for too, so a secret cut short or wrapped in other text is still found.
const ADMIN_TOKEN: &str = "adm-Zq8TfW3kLm2Rv9Xc-admin";
const WRONG_ADMIN_TOKEN: &str = "adm-Hy6PbN4sGd7Jw1Ke-wrong";
const JOIN_TOKEN: &str = "join-Vb5MxQ2cTr8Ln4Pz-join";
const WRONG_JOIN_TOKEN: &str = "join-Ka3WeY9uDf6Hs2Qm-wrong";
/// Refused by the provider (401), so the node falls back to the reserve.
const PROVIDER_KEY: &str = "sk-expired-Rt7GhJ2vBn5Kc8Wx";
const PROVIDER_RESERVE: &str = "sk-reserve-Mf4QsZ9pLd3Ty6Ue";
const WEBHOOK_SECRET: &str = "whsec_c2VjcmV0cy1lMmUtd2ViaG9vay1zaWduaW5nLWtleQ==";
const URL_PASSWORD: &str = "urlpass-Nc8VkE5rXw2Jb7Fa";
const HOOK_PASSWORD: &str = "hookpass-Dp3YtL6mQs9Gh4Zn";
const WRONG_API_KEY: &str = "sy-wrongQx7Nv2Bk5Wm8Rc3Lf6Ht9";

// Everything, libraries included: an HTTP client's connection pool logs the URLs it is handed.
const RUST_LOG: &str = "trace";

fn core(secret: &str) -> &str {
    let mid = secret.len() / 2;
    &secret[mid - 6..mid + 6]
}

/// A webhook receiver that records every request; it answers the first with 500, so the
/// control plane's retry path runs too, and the rest with 200.
struct Receiver {
    port: u16,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    async fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&requests);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let seen = Arc::clone(&seen);
                tokio::spawn(async move {
                    let mut raw = Vec::new();
                    let mut buf = [0u8; 8192];
                    // A request is read until its body is in (Content-Length) or 2 s pass.
                    let read = async {
                        loop {
                            let n = socket.read(&mut buf).await.unwrap_or(0);
                            if n == 0 {
                                break;
                            }
                            raw.extend_from_slice(&buf[..n]);
                            if request_complete(&raw) {
                                break;
                            }
                        }
                    };
                    let _ = tokio::time::timeout(Duration::from_secs(2), read).await;
                    let first = {
                        let mut seen = seen.lock().unwrap();
                        seen.push(String::from_utf8_lossy(&raw).into_owned());
                        seen.len() == 1
                    };
                    let status = if first { "500 Internal Server Error" } else { "200 OK" };
                    let answer = format!(
                        "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    );
                    let _ = socket.write_all(answer.as_bytes()).await;
                });
            }
        });
        Receiver { port, requests }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

fn request_complete(raw: &[u8]) -> bool {
    let text = String::from_utf8_lossy(raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else { return false };
    let length = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case("content-length").then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0usize);
    body.len() >= length
}

fn catalog(sim: &str, hook_port: u16) -> String {
    format!(
        r#"providers:
  - name: sim
    kind: openai-compatible
    base_url: {sim}/v1
    api_keys: ["env:SECRETS_PROVIDER_KEY", "env:SECRETS_PROVIDER_RESERVE"]
  - name: behind-auth
    kind: openai-compatible
    base_url: http://urluser:{URL_PASSWORD}@127.0.0.1:9/v1
models:
  - name: sim/primary
    provider: sim
    upstream_model: primary
  - name: sim/secondary
    provider: sim
    upstream_model: secondary
  - name: locked/model
    provider: behind-auth
    upstream_model: unreachable
webhooks:
  - name: hook
    url: http://hookuser:{HOOK_PASSWORD}@127.0.0.1:{hook_port}/hook
    secret: env:SECRETS_WEBHOOK_SECRET
    internal: true
    events: ["*"]
"#
    )
}

/// Everything one run produced, by where it came from.
#[derive(Default)]
struct Outputs(Vec<(String, String)>);

impl Outputs {
    fn add(&mut self, source: impl Into<String>, text: impl Into<String>) {
        self.0.push((source.into(), text.into()));
    }

    fn cli(&mut self, what: &str, out: &CliOutput) {
        self.add(format!("`switchyard {what}` stdout"), &out.stdout);
        self.add(format!("`switchyard {what}` stderr"), &out.stderr);
    }

    fn response(&mut self, what: &str, r: &HttpResponse) {
        self.add(format!("answer to {what}"), format!("{}\r\n\r\n{}", r.headers, r.body));
    }
}

struct Fleet {
    dir: tempfile::TempDir,
    control: String,
    node: Proc,
    key: String,
}

impl Fleet {
    async fn admin(&self, out: &mut Outputs, args: &[&str]) -> CliOutput {
        let result =
            cli_with_env(&self.control, args, &[("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN)]).await;
        out.cli(&args.join(" "), &result);
        result
    }

    async fn chat(&self, out: &mut Outputs, what: &str, key: &str, body: &[u8]) -> HttpResponse {
        let r = http_request(self.node.addr, "POST", "/v1/chat/completions", Some(key), Some(body))
            .await
            .expect("the node answers");
        out.response(what, &r);
        r
    }
}

fn chat_body(model: &str, fallback: &[&str], stream: bool) -> Vec<u8> {
    json!({
        "model": model,
        "fallback_models": fallback,
        "stream": stream,
        "messages": [{"role": "user", "content": "hello"}],
    })
    .to_string()
    .into_bytes()
}

/// SIGTERM, so the drain and shutdown paths log too; then waits for the exit.
async fn stop(proc: &mut Proc) {
    let pid = proc.child.id().expect("still running").to_string();
    let _ = tokio::process::Command::new("kill").args(["-TERM", &pid]).status().await;
    if tokio::time::timeout(PATIENCE, proc.child.wait()).await.is_err() {
        let _ = proc.child.kill().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_a_log_an_error_an_answer_or_a_metric() {
    let mut out = Outputs::default();
    let receiver = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().to_owned();
    let log = |name: &str| base.join(format!("{name}.log"));

    let mut sim = start_sim(log("sim")).await;
    let accepted = json!([PROVIDER_RESERVE]).to_string();
    let r =
        http_request(sim.addr, "PUT", "/_sim/keys", None, Some(accepted.as_bytes())).await.unwrap();
    assert!(r.status < 300, "{}", r.body);

    let store = format!("file://{}", dir.path().join("store").display());
    let mut cp = Proc::start(
        &[
            "control",
            "--store",
            &store,
            "--listen",
            "127.0.0.1:0",
            "--webhook-min-backoff-ms",
            "50",
            "--webhook-max-backoff-ms",
            "200",
        ],
        &[
            ("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN),
            ("SWITCHYARD_JOIN_TOKEN", JOIN_TOKEN),
            ("SECRETS_WEBHOOK_SECRET", WEBHOOK_SECRET),
            ("RUST_LOG", RUST_LOG),
        ],
        log("control"),
    )
    .await;
    let control = cp.url();

    let catalog_path = dir.path().join("catalog.yaml");
    std::fs::write(&catalog_path, catalog(&sim.url(), receiver.port)).unwrap();
    let catalog_arg = catalog_path.display().to_string();
    let applied = cli_with_env(
        &control,
        &["apply", "-f", &catalog_arg, "--json"],
        &[("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN)],
    )
    .await;
    out.cli("apply", &applied);
    let created = cli_with_env(
        &control,
        &["keys", "create", "--name", "secrets", "--json"],
        &[("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN)],
    )
    .await
    .json();
    // `keys create` prints the key once, on purpose: its output is not searched.
    let key = created["key"].as_str().unwrap().to_owned();
    let key_id = created["id"].as_str().unwrap().to_owned();
    let version =
        created["version"].as_i64().unwrap().max(applied.json()["version"].as_i64().unwrap());

    let node_dir = dir.path().join("node").display().to_string();
    let node_env = [
        ("SWITCHYARD_JOIN_TOKEN", JOIN_TOKEN),
        ("SECRETS_PROVIDER_KEY", PROVIDER_KEY),
        ("SECRETS_PROVIDER_RESERVE", PROVIDER_RESERVE),
        ("RUST_LOG", RUST_LOG),
    ];
    let node = Proc::start(
        &["node", "--control", &control, "--listen", "127.0.0.1:0", "--data-dir", &node_dir],
        &node_env,
        log("node"),
    )
    .await;
    let addr = node.addr;
    eventually(PATIENCE, "the node to apply the catalog and key", || async move {
        node_version(addr).await.filter(|v| *v >= version)
    })
    .await;
    let mut fleet = Fleet { dir, control, node, key };

    // A node presenting the wrong join token is refused, and says so. On SIGTERM it would
    // spend its whole drain timeout offering its hand-off to a control plane that refuses it.
    let intruder_dir = fleet.dir.path().join("intruder").display().to_string();
    let mut intruder = Proc::start(
        &[
            "node",
            "--control",
            &fleet.control,
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &intruder_dir,
            "--drain-timeout",
            "1s",
        ],
        &[("SWITCHYARD_JOIN_TOKEN", WRONG_JOIN_TOKEN), ("RUST_LOG", RUST_LOG)],
        log("intruder"),
    )
    .await;

    // Requests: served with the reserve credential (the first is refused upstream), after a
    // failover, past a provider whose URL carries credentials, streamed, and refused.
    let key = fleet.key.clone();
    let r =
        fleet.chat(&mut out, "a served request", &key, &chat_body("sim/primary", &[], false)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let script = json!({"model": "primary", "behaviour": {"kind": "status", "status": 503}});
    let s =
        http_request(sim.addr, "POST", "/_sim/script", None, Some(script.to_string().as_bytes()))
            .await
            .unwrap();
    assert!(s.status < 300, "{}", s.body);
    let body = chat_body("sim/primary", &["sim/secondary"], false);
    let r = fleet.chat(&mut out, "a failover", &key, &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["model"], "sim/secondary", "{}", r.body);
    let body = chat_body("locked/model", &["sim/secondary"], false);
    let r =
        fleet.chat(&mut out, "a failover from a provider with URL credentials", &key, &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = fleet
        .chat(&mut out, "an unreachable chain", &key, &chat_body("locked/model", &[], false))
        .await;
    assert_eq!(r.status, 502, "{}", r.body);
    let body = chat_body("sim/primary", &["sim/secondary"], true);
    let r = fleet.chat(&mut out, "a streamed failover", &key, &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let body = chat_body("sim/secondary", &[], false);
    let r = fleet.chat(&mut out, "a wrong API key", WRONG_API_KEY, &body).await;
    assert_eq!(r.status, 401, "{}", r.body);
    let r = fleet.chat(&mut out, "malformed JSON", &key, b"{\"model\": ").await;
    assert_eq!(r.status, 400, "{}", r.body);
    let r =
        fleet.chat(&mut out, "an unknown model", &key, &chat_body("nope/model", &[], false)).await;
    assert!(r.status >= 400, "{}", r.body);
    let r = fleet.chat(&mut out, "no messages", &key, br#"{"model": "sim/secondary"}"#).await;
    assert_eq!(r.status, 400, "{}", r.body);

    // Admin commands, including one with a wrong token and a key rotation.
    let commands: [&[&str]; 11] = [
        &["catalog"],
        &["catalog", "--json"],
        &["keys", "list"],
        &["keys", "list", "--json"],
        &["nodes"],
        &["nodes", "--json"],
        &["breakers"],
        &["events"],
        &["events", "--json"],
        &["usage"],
        &["webhooks", "list"],
    ];
    for args in commands {
        let result = fleet.admin(&mut out, args).await;
        assert!(result.success, "switchyard {args:?}: {}", result.stderr);
    }
    let shown = fleet.admin(&mut out, &["keys", "show", &key_id]).await;
    assert!(shown.success, "{}", shown.stderr);
    let refused = cli_with_env(
        &fleet.control,
        &["keys", "list"],
        &[("SWITCHYARD_ADMIN_TOKEN", WRONG_ADMIN_TOKEN)],
    )
    .await;
    out.cli("keys list (wrong admin token)", &refused);
    assert!(!refused.success, "a wrong admin token is refused");
    let rotated = cli_with_env(
        &fleet.control,
        &["keys", "rotate", &key_id, "--json"],
        &[("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN)],
    )
    .await
    .json();
    // Printed once by `rotate`, on purpose: that output is not searched either.
    let new_key = rotated["key"].as_str().unwrap().to_owned();
    let new_version = rotated["version"].as_i64().unwrap();
    let addr = fleet.node.addr;
    eventually(PATIENCE, "the node to apply the rotation", || async move {
        node_version(addr).await.filter(|v| *v >= new_version)
    })
    .await;
    let body = chat_body("sim/secondary", &[], false);
    let r = fleet.chat(&mut out, "the key before its rotation", &key, &body).await;
    assert_eq!(r.status, 401, "{}", r.body);
    let r = fleet.chat(&mut out, "the rotated key", &new_key, &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    fleet.key = new_key.clone();

    // Webhook deliveries: one refused by the receiver, then retried.
    eventually(PATIENCE, "the receiver to get a retried delivery", || {
        let n = receiver.requests().len();
        async move { (n >= 2).then_some(()) }
    })
    .await;
    let deliveries = fleet.admin(&mut out, &["webhooks", "deliveries", "hook"]).await;
    assert!(deliveries.success, "{}", deliveries.stderr);

    let metrics = http_get(fleet.node.addr, "/metrics", None).await.unwrap();
    assert_eq!(metrics.status, 200);
    out.add("the node's /metrics", metrics.body);
    let metrics = http_get(cp.addr, "/metrics", None).await.unwrap();
    assert_eq!(metrics.status, 200);
    out.add("the control plane's /metrics", metrics.body);
    for (i, request) in receiver.requests().into_iter().enumerate() {
        out.add(format!("webhook request {i}"), request);
    }

    // Stopped with SIGTERM, so drains and shutdowns have logged too.
    stop(&mut intruder).await;
    stop(&mut fleet.node).await;
    stop(&mut cp).await;
    stop(&mut sim).await;
    for (name, proc) in [
        ("simulator", &sim),
        ("control plane", &cp),
        ("node", &fleet.node),
        ("intruder node", &intruder),
    ] {
        out.add(format!("the {name}'s log"), proc.log_text());
        out.add(format!("the {name}'s stdout"), proc.stdout_text());
    }

    // The search means something only if the paths ran and their outputs were captured.
    let texts: Vec<&str> = out.0.iter().map(|(_, t)| t.as_str()).collect();
    let everything = texts.concat();
    assert!(cp.log_text().contains("DEBUG"), "the control plane logs at debug: {}", cp.log_text());
    assert!(fleet.node.log_text().contains("DEBUG"), "the node logs at debug");
    assert!(
        intruder.log_text().to_lowercase().contains("join"),
        "the intruder was refused: {}",
        intruder.log_text()
    );
    assert!(cp.stdout_text().contains("listening on"), "stdout is captured");
    assert!(everything.contains("webhook-signature"), "webhook requests were captured");

    let secrets = [
        ("admin token", ADMIN_TOKEN),
        ("wrong admin token", WRONG_ADMIN_TOKEN),
        ("join token", JOIN_TOKEN),
        ("wrong join token", WRONG_JOIN_TOKEN),
        ("provider key", PROVIDER_KEY),
        ("provider reserve key", PROVIDER_RESERVE),
        ("webhook secret", WEBHOOK_SECRET),
        ("provider URL password", URL_PASSWORD),
        ("webhook URL password", HOOK_PASSWORD),
        ("API key (rotated away)", key.as_str()),
        ("API key", new_key.as_str()),
        ("wrong API key", WRONG_API_KEY),
    ];
    let mut leaks = Vec::new();
    for (source, text) in &out.0 {
        for (name, secret) in secrets {
            for needle in [secret, core(secret)] {
                if let Some(line) = text.lines().find(|l| l.contains(needle)) {
                    leaks.push(format!("{name} in {source}: {line}"));
                    break;
                }
            }
        }
    }
    assert!(
        leaks.is_empty(),
        "secrets found in {} place(s) of {} outputs searched:\n{}",
        leaks.len(),
        out.0.len(),
        leaks.join("\n")
    );
    eprintln!(
        "searched {} outputs ({} bytes) for {} secrets: none found",
        out.0.len(),
        everything.len(),
        secrets.len()
    );
}
