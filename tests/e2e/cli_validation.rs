//! What the `switchyard` binary refuses before it starts (bad flags, short tokens), and what
//! `switchyard dev` does with the tokens and the data directory it is given.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use switchyard_e2e::*;

const GOOD_TOKEN: &str = "validation-admin-token-0123";
const JOIN_TOKEN: &str = "validation-join-token-4567";

/// Runs `switchyard ARGS` to completion with none of the token or control variables set
/// but `envs`.
async fn run(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(switchyard_bin());
    cmd.args(args)
        .env_remove("SWITCHYARD_ADMIN_TOKEN")
        .env_remove("SWITCHYARD_JOIN_TOKEN")
        .env_remove("SWITCHYARD_CONTROL")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("switchyard {args:?} did not exit: it should have refused"))
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts a usage error (exit 2) whose message names `flag` and contains `words`.
fn assert_usage_error(out: &Output, flag: &str, words: &str) {
    let text = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains(flag), "the error should name {flag}: {text}");
    assert!(text.contains(words), "the error should say {words:?}: {text}");
}

// === flags ===

#[tokio::test]
async fn node_refuses_a_control_url_that_is_not_an_http_url_with_a_host() {
    let bad = [
        ("notaurl", "has no scheme"),
        ("127.0.0.1:7400", "has no scheme"),
        ("ftp://cp.example.com", "must be http or https"),
        ("http://127.0.0.1:7400,notaurl", "\"notaurl\""),
    ];
    for (control, why) in bad {
        let out = run(&["node", "--control", control, "--listen", "127.0.0.1:0"], &[]).await;
        assert_usage_error(&out, "--control", why);
    }
    // The environment variable goes through the same check.
    let out = run(&["node", "--listen", "127.0.0.1:0"], &[("SWITCHYARD_CONTROL", "notaurl")]).await;
    assert_usage_error(&out, "--control", "has no scheme");
}

#[tokio::test]
async fn node_refuses_max_body_bytes_zero() {
    let args = ["node", "--max-body-bytes", "0", "--listen", "127.0.0.1:0"];
    assert_usage_error(&run(&args, &[]).await, "--max-body-bytes", "at least 1");
}

/// `--limit 0` used to reach the control plane as "the default" and print 100 events; 0 is
/// now refused before any request.
#[tokio::test]
async fn events_and_deliveries_refuse_limit_zero() {
    let env =
        [("SWITCHYARD_ADMIN_TOKEN", GOOD_TOKEN), ("SWITCHYARD_CONTROL", "http://127.0.0.1:9")];
    assert_usage_error(&run(&["events", "--limit", "0"], &env).await, "--limit", "0");
    let out = run(&["webhooks", "deliveries", "hook", "--limit", "0"], &env).await;
    assert_usage_error(&out, "--limit", "0");
}

/// clap's usage line under a missing `--name` listed the flags given as well, `--control`
/// included (from SWITCHYARD_CONTROL), which read as if they were required.
#[tokio::test]
async fn keys_create_without_its_name_prints_a_usage_line_that_makes_nothing_else_look_required() {
    let env =
        [("SWITCHYARD_ADMIN_TOKEN", GOOD_TOKEN), ("SWITCHYARD_CONTROL", "http://127.0.0.1:9")];
    let out = run(&["keys", "create", "--json"], &env).await;
    assert_usage_error(&out, "--name <NAME>", "required");
    let text = stderr(&out);
    let usage = text.lines().find(|l| l.starts_with("Usage: ")).unwrap_or_default();
    assert_eq!(usage, "Usage: switchyard keys create [OPTIONS] --name <NAME>", "{text}");
}

/// The text under `flag` in a `--help` output (the lines up to the next flag).
fn help_of(help: &str, flag: &str) -> String {
    let mut lines = help.lines().skip_while(|l| !l.trim_start().starts_with(flag));
    lines.next().unwrap_or_else(|| panic!("no {flag} in:\n{help}"));
    lines.take_while(|l| !l.trim_start().starts_with('-')).collect::<Vec<_>>().join(" ")
}

#[tokio::test]
async fn dev_help_describes_its_listen_flags_and_control_help_says_an_admin_token_is_required() {
    let out = run(&["dev", "--help"], &[]).await;
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(help_of(&help, "--listen <").contains("node's HTTP listener"), "{help}");
    assert!(help_of(&help, "--control-listen <").contains("control plane's gRPC"), "{help}");

    let out = run(&["control", "--help"], &[]).await;
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    let about = help.lines().take_while(|l| !l.starts_with("Usage:")).collect::<String>();
    assert!(about.starts_with("Run a control plane (needs an admin token)"), "{help}");
    assert!(about.contains("comes from SWITCHYARD_ADMIN_TOKEN or --admin-token-file"), "{help}");
    let list = String::from_utf8_lossy(&run(&["--help"], &[]).await.stdout).into_owned();
    assert!(list.contains("Run a control plane (needs an admin token)\n"), "{list}");
    assert!(help_of(&help, "--admin-token-file").contains("one of the two is required"), "{help}");
}

// === tokens ===

#[tokio::test]
async fn one_character_tokens_are_refused_everywhere_they_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let control = ["control", "--store", &store, "--listen", "127.0.0.1:0"];

    let out = run(&control, &[("SWITCHYARD_ADMIN_TOKEN", "x")]).await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("SWITCHYARD_ADMIN_TOKEN is too short"), "{}", stderr(&out));
    assert!(stderr(&out).contains("at least 16"), "{}", stderr(&out));

    let envs = [("SWITCHYARD_ADMIN_TOKEN", GOOD_TOKEN), ("SWITCHYARD_JOIN_TOKEN", "y")];
    let out = run(&control, &envs).await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("SWITCHYARD_JOIN_TOKEN is too short"), "{}", stderr(&out));

    let file = dir.path().join("join-token");
    std::fs::write(&file, "z\n").unwrap();
    let file_arg = file.display().to_string();
    let node = ["node", "--control", "http://127.0.0.1:9", "--listen", "127.0.0.1:0"];
    let mut with_file = node.to_vec();
    with_file.extend(["--join-token-file", &file_arg]);
    let out = run(&with_file, &[]).await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains(&format!("{file_arg} is too short")), "{}", stderr(&out));
    let out = run(&node, &[("SWITCHYARD_JOIN_TOKEN", "y")]).await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("SWITCHYARD_JOIN_TOKEN is too short"), "{}", stderr(&out));

    // The admin CLI refuses it before any round trip (nothing listens at port 9).
    let envs = [("SWITCHYARD_ADMIN_TOKEN", "x"), ("SWITCHYARD_CONTROL", "http://127.0.0.1:9")];
    let out = run(&["keys", "list"], &envs).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("SWITCHYARD_ADMIN_TOKEN is too short"), "{}", stderr(&out));

    let data = dir.path().join("dev").display().to_string();
    let out = run(&["dev", "--data-dir", &data], &[("SWITCHYARD_ADMIN_TOKEN", "x")]).await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("SWITCHYARD_ADMIN_TOKEN is too short"), "{}", stderr(&out));
}

// === dev ===

/// A running `switchyard dev`, killed on drop, with what it printed.
struct Dev {
    child: Child,
    text: String,
    node: SocketAddr,
    control: String,
    demo_key: String,
}

impl Dev {
    async fn start(data_dir: &Path, envs: &[(&str, &str)]) -> Dev {
        let log = std::fs::File::create(data_dir.with_extension("log")).unwrap();
        let mut cmd = Command::new(switchyard_bin());
        cmd.args(["dev", "--data-dir", &data_dir.display().to_string()])
            .args(["--control-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0"])
            .env_remove("SWITCHYARD_ADMIN_TOKEN")
            .env_remove("SWITCHYARD_JOIN_TOKEN")
            .env_remove("SWITCHYARD_CONTROL")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let text = tokio::time::timeout(Duration::from_secs(30), async {
            let mut text = String::new();
            while let Some(line) = lines.next_line().await.unwrap() {
                text.push_str(&line);
                text.push('\n');
                // The last line dev prints.
                if line.starts_with("Other nodes") {
                    return text;
                }
            }
            panic!("switchyard dev exited; it printed:\n{text}");
        })
        .await
        .expect("switchyard dev did not finish starting");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let value = |label: &str| -> String {
            let line = text.lines().find(|l| l.trim_start().starts_with(label));
            let line = line.unwrap_or_else(|| panic!("no {label:?} line in:\n{text}"));
            line.rsplit(' ').next().unwrap().to_owned()
        };
        let node = value("node (OpenAI-compatible HTTP):");
        let node = node.trim_start_matches("http://").parse().unwrap();
        let control = value("control plane (gRPC):");
        let demo_key = value("demo API key (shown once):");
        Dev { child, text, node, control, demo_key }
    }

    /// The admin token dev generated and printed.
    fn printed_admin_token(&self) -> String {
        let line = self.text.lines().find(|l| l.contains("export SWITCHYARD_ADMIN_TOKEN="));
        line.unwrap().rsplit('=').next().unwrap().to_owned()
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
        let _ = self.child.wait().await;
    }
}

async fn demo_request(node: SocketAddr, key: &str) -> Option<HttpResponse> {
    let body =
        br#"{"model": "demo/flaky-primary", "messages": [{"role": "user", "content": "Hello"}]}"#;
    http_request(node, "POST", "/v1/chat/completions", Some(key), Some(body)).await
}

/// Waits for the node to serve `key` (the demo chain answers from the fallback).
async fn served(node: SocketAddr, key: &str) -> Value {
    eventually(Duration::from_secs(20), "the demo request is served", || async {
        demo_request(node, key).await.filter(|r| r.status == 200).map(|r| r.json())
    })
    .await
}

async fn keys(dev: &Dev, token: &str) -> Vec<Value> {
    let out = cli_with_env(
        &dev.control,
        &["keys", "list", "--json"],
        &[("SWITCHYARD_ADMIN_TOKEN", token)],
    )
    .await;
    out.json().as_array().unwrap().clone()
}

/// The demo's provider points at the simulator's `/v1` once (the simulator answers 404 on
/// `/v1/v1/…`, as OpenAI does, so the demo request itself proves the URL), and a restart over
/// the same data directory reuses the demo key instead of adding another active one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_serves_the_demo_and_keeps_one_demo_key_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("dev");

    let first = Dev::start(&data, &[]).await;
    let token = first.printed_admin_token();
    let answer = served(first.node, &first.demo_key).await;
    let content = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(content.contains("fallback"), "{answer}");
    let catalog =
        cli_with_env(&first.control, &["catalog", "--json"], &[("SWITCHYARD_ADMIN_TOKEN", &token)])
            .await
            .json();
    let base_url = catalog["providers"][0]["base_url"].as_str().unwrap().to_owned();
    assert!(base_url.ends_with("/v1") && !base_url.ends_with("/v1/v1"), "{base_url}");
    let before = keys(&first, &token).await;
    assert_eq!(before.len(), 1, "{before:?}");
    // What earlier releases left over a data directory: one more active demo key per start.
    let env = [("SWITCHYARD_ADMIN_TOKEN", token.as_str())];
    let extra =
        cli_with_env(&first.control, &["keys", "create", "--name", "dev-demo", "--json"], &env)
            .await
            .json();
    let old_key = first.demo_key.clone();
    first.stop().await;

    let second = Dev::start(&data, &[]).await;
    let token = second.printed_admin_token();
    served(second.node, &second.demo_key).await;
    let after = keys(&second, &token).await;
    let active: Vec<&Value> = after.iter().filter(|k| k["status"] == "active").collect();
    assert_eq!(active.len(), 1, "one active demo key after a restart: {after:?}");
    assert_eq!(active[0]["id"], before[0]["id"], "the first demo key is reused");
    let revoked = after.iter().find(|k| k["id"] == extra["id"]).unwrap();
    assert_eq!(revoked["status"], "revoked", "{after:?}");
    assert_ne!(second.demo_key, old_key, "its secret is rotated (only its hash is kept)");
    let old = demo_request(second.node, &old_key).await.unwrap();
    assert_eq!(old.status, 401, "{}", old.body);
    second.stop().await;
}

/// Every curl dev prints (one per surface) runs as printed: its path, its credential header
/// and its body, answered 200 by the demo chain's fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_prints_a_curl_for_each_surface_that_answers_as_printed() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Dev::start(&dir.path().join("dev"), &[]).await;
    served(dev.node, &dev.demo_key).await;
    let lines: Vec<&str> = dev.text.lines().map(str::trim).collect();
    let mut paths = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(url) = line.strip_prefix("curl -s ").and_then(|l| l.strip_suffix(" \\")) else {
            continue;
        };
        let path = url.trim_start_matches(&format!("http://{}", dev.node)).to_owned();
        let headers = lines[i + 1];
        let body = lines[i + 2]
            .strip_prefix("-d '")
            .and_then(|b| b.strip_suffix('\''))
            .unwrap_or_else(|| panic!("no body after {line}"));
        let r = if headers.contains("x-api-key") {
            let key = dev.demo_key.as_bytes();
            http_request_with(
                dev.node,
                "POST",
                &path,
                None,
                &[("x-api-key", key)],
                Some(body.as_bytes()),
            )
            .await
        } else {
            http_request(dev.node, "POST", &path, Some(&dev.demo_key), Some(body.as_bytes())).await
        }
        .unwrap();
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        let served = r.header("x-served-model").unwrap_or_default();
        let requested = r.header("x-requested-model").unwrap_or_default();
        assert_ne!(served, requested, "{path}: the demo primary fails over");
        paths.push(path);
    }
    assert_eq!(
        paths,
        ["/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/embeddings"],
        "{}",
        dev.text
    );
    dev.stop().await;
}

/// Tokens from the environment are used and never printed; the join token is required of
/// every node, dev's own included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_uses_the_environments_tokens_without_printing_them() {
    let dir = tempfile::tempdir().unwrap();
    let envs = [("SWITCHYARD_ADMIN_TOKEN", GOOD_TOKEN), ("SWITCHYARD_JOIN_TOKEN", JOIN_TOKEN)];
    let dev = Dev::start(&dir.path().join("dev"), &envs).await;
    assert!(!dev.text.contains(GOOD_TOKEN), "dev printed the admin token:\n{}", dev.text);
    assert!(!dev.text.contains(JOIN_TOKEN), "dev printed the join token:\n{}", dev.text);
    assert!(dev.text.contains("SWITCHYARD_ADMIN_TOKEN: the one set in this environment"));
    assert_eq!(keys(&dev, GOOD_TOKEN).await.len(), 1);
    // dev's own node presents the join token, or it would never get the demo catalog.
    served(dev.node, &dev.demo_key).await;

    let stranger = Proc::start(
        &["node", "--control", &dev.control, "--listen", "127.0.0.1:0", "--node-id", "stranger"],
        &[],
        dir.path().join("stranger.log"),
    )
    .await;
    eventually(Duration::from_secs(20), "a node without the join token is refused", || async {
        stranger.log_text().contains("join token missing or rejected").then_some(())
    })
    .await;
    let member = Proc::start(
        &["node", "--control", &dev.control, "--listen", "127.0.0.1:0", "--node-id", "member"],
        &[("SWITCHYARD_JOIN_TOKEN", JOIN_TOKEN)],
        dir.path().join("member.log"),
    )
    .await;
    eventually(Duration::from_secs(20), "a node with the join token gets the config", || async {
        node_version(member.addr).await
    })
    .await;
    dev.stop().await;
}

/// `dev` printed bare `switchyard …` commands, which a shell started where the README runs
/// it (`cargo run … -- dev`) does not find: what it prints now runs as printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_prints_admin_commands_that_run_as_printed() {
    let dir = tempfile::tempdir().unwrap();
    // No `switchyard` on the PATH of dev or of the shell below.
    let path = [("PATH", "/usr/bin:/bin")];
    let dev = Dev::start(&dir.path().join("dev"), &path).await;
    let token = dev.printed_admin_token();
    let line = dev.text.lines().find(|l| l.contains(" keys list; ")).unwrap();
    let (bin, _) = line.trim().split_once(" catalog; ").unwrap();
    let drill = dev.text.lines().find(|l| l.contains(" drill primary-down ")).unwrap();
    assert!(drill.trim().starts_with(&format!("{bin} drill ")), "{}", dev.text);
    // Through a shell, as a user pastes it.
    let out = Command::new("sh")
        .args(["-c", &format!("{bin} nodes --json")])
        .env("PATH", "/usr/bin:/bin")
        .env("SWITCHYARD_CONTROL", &dev.control)
        .env("SWITCHYARD_ADMIN_TOKEN", &token)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{bin}: {}{stdout}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("\"dev-node\""), "{stdout}");
    dev.stop().await;
}
