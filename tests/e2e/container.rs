//! End to end: the container image. `deploy/build-image` builds it with buildah from the
//! binary under test, and podman runs `switchyard dev` in it the way a cluster runs a node:
//! as the container's PID 1, as a non-root user, on a read-only root file system with every
//! capability dropped, reached through a published port; then stops it with SIGTERM while a
//! stream is in flight.
//!
//! buildah, podman and runc must be installed (`.ci/run` installs them): a test of the image
//! that skipped where they are absent would pass without having run.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::Command;

use switchyard_e2e::*;

/// The uid the image runs as (its Dockerfile's `USER`, the manifests' `runAsUser`).
const NONROOT_UID: u64 = 65532;
/// The ports `switchyard dev` listens on inside the container, published on loopback.
const NODE_PORT: u16 = 8080;
const SIM_PORT: u16 = 9000;
/// The drained stream: this many content chunks, this far apart (2 s in all), so that it is
/// still in flight when SIGTERM arrives after its first chunk.
const CHUNKS: u32 = 8;
const CHUNK_DELAY_MS: u64 = 250;

/// Fails, saying how to install it, when `tool` is not on PATH.
fn require(tool: &str) {
    let found = std::process::Command::new(tool).arg("--version").output();
    assert!(
        found.is_ok_and(|out| out.status.success()),
        "{tool} not found: run .ci/run (it installs buildah, podman and runc), or \
         `apt-get install buildah podman runc`"
    );
}

/// An image in podman's store, removed on drop.
struct Image(String);

impl Drop for Image {
    fn drop(&mut self) {
        let _ = std::process::Command::new("podman").args(["rmi", "--force", &self.0]).output();
    }
}

/// A container by name, removed (stopped at once if still running) on drop.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let args = ["rm", "--force", "--time", "0", &self.0];
        let _ = std::process::Command::new("podman").args(args).output();
    }
}

/// `podman ARGS`, which must succeed; its stdout.
async fn podman(args: &[&str]) -> String {
    let out = Command::new("podman").args(args).output().await.unwrap();
    assert!(
        out.status.success(),
        "podman {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

async fn build_image(tag: &str) -> Image {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/build-image");
    let out =
        Command::new(script).arg("--binary").arg(switchyard_bin()).arg(tag).output().await.unwrap();
    let image = Image(tag.to_owned());
    assert!(
        out.status.success(),
        "deploy/build-image failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    image
}

/// The host address podman published a container port on.
async fn published(name: &str, port: u16) -> SocketAddr {
    let text = podman(&["port", name, &format!("{port}/tcp")]).await;
    text.lines()
        .next()
        .unwrap_or_default()
        .parse()
        .unwrap_or_else(|_| panic!("podman port: {text}"))
}

/// `podman run` arguments for the image as a cluster runs it. Two settings make it run on
/// hosts where podman's defaults do not: `runc` (Debian 12's default runtime, crun 1.8,
/// refuses a host with a hybrid cgroup hierarchy), and the open-files and processes limits
/// (podman's defaults for root, 1048576, exceed the hard limits of a host or a CI container
/// without CAP_SYS_RESOURCE, which may not raise them).
fn run_args(name: &str, tag: &str) -> Vec<String> {
    use rustix::process::{Resource, getrlimit};
    let open_files = getrlimit(Resource::Nofile).maximum.unwrap_or(65536).min(65536);
    let mut args: Vec<String> =
        ["--runtime", "runc", "run", "--name", name].into_iter().map(str::to_owned).collect();
    args.extend([
        format!("--ulimit=nofile={open_files}:{open_files}"),
        "--ulimit=nproc=4096:4096".to_owned(),
        // The Kubernetes manifests' securityContext. A read-only root has a tmpfs on /tmp,
        // where `dev` keeps its data by default.
        "--read-only".to_owned(),
        "--cap-drop=all".to_owned(),
        "--security-opt=no-new-privileges".to_owned(),
        format!("--publish=127.0.0.1::{NODE_PORT}"),
        format!("--publish=127.0.0.1::{SIM_PORT}"),
        tag.to_owned(),
        "dev".to_owned(),
        format!("--listen=0.0.0.0:{NODE_PORT}"),
        format!("--sim-listen=0.0.0.0:{SIM_PORT}"),
    ]);
    args
}

/// The process's real, effective, saved and file-system uids as its container sees them:
/// /proc/PID/status gives them as this (the host's) user namespace sees them, and the
/// process's uid_map turns them back (the identity for a rootful container, a subordinate
/// range for a rootless one).
fn uids_inside(pid: &str) -> Vec<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    let map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).unwrap();
    let ranges: Vec<[u64; 3]> = map
        .lines()
        .map(|l| {
            let n: Vec<u64> = l.split_whitespace().map(|n| n.parse().unwrap()).collect();
            [n[0], n[1], n[2]]
        })
        .collect();
    let inside = |host: u64| -> u64 {
        let range =
            ranges.iter().find(|[_, outside, len]| (*outside..outside + len).contains(&host));
        let [inside, outside, _] = range.unwrap_or_else(|| panic!("uid {host} not in {map}"));
        host - outside + inside
    };
    line.split_whitespace().skip(1).map(|uid| inside(uid.parse().unwrap())).collect()
}

/// The process's PID inside its own (innermost) PID namespace.
fn pid_in_namespace(pid: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("NSpid:")).unwrap();
    line.split_whitespace().last().unwrap().to_owned()
}

/// The content of an SSE chat stream's chunks, joined, and whether it ended with `[DONE]`.
fn streamed_content(body: &str) -> (String, bool) {
    let mut content = String::new();
    let mut done = false;
    for data in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let chunk: Value = serde_json::from_str(data).unwrap_or(Value::Null);
        content.push_str(chunk["choices"][0]["delta"]["content"].as_str().unwrap_or_default());
    }
    (content, done)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_dev_as_a_non_root_pid_1_and_drains_a_stream_on_sigterm() {
    require("buildah");
    require("podman");
    require("runc");
    let unique = format!("{}-{}", std::process::id(), now_ms());
    let tag = format!("localhost/switchyard-e2e:{unique}");
    let _image = build_image(&tag).await;

    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("container.log");
    let name = format!("switchyard-e2e-{unique}");
    let _container = Container(name.clone());
    let mut run = Command::new("podman")
        .args(run_args(&name, &tag))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(&log_path).unwrap()))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
    let printed = tokio::time::timeout(PATIENCE, async {
        let mut text = String::new();
        while let Ok(Some(line)) = lines.next_line().await {
            text.push_str(&line);
            text.push('\n');
            // The last line dev prints.
            if line.starts_with("Other nodes") {
                return text;
            }
        }
        panic!("the container exited; it printed:\n{text}\nits log:\n{}", log());
    })
    .await
    .unwrap_or_else(|_| {
        panic!("switchyard dev did not start in the container; its log:\n{}", log())
    });
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let key_line = printed.lines().find(|l| l.contains("demo API key (shown once):"));
    let key = key_line.unwrap().rsplit(' ').next().unwrap().to_owned();
    let node = published(&name, NODE_PORT).await;
    let sim = published(&name, SIM_PORT).await;

    // Liveness and readiness through the published port.
    eventually(PATIENCE, "/healthz through the published port", || async move {
        http_get(node, "/healthz", None).await.filter(|r| r.status == 200)
    })
    .await;
    eventually(PATIENCE, "/readyz to answer 200", || async move {
        http_get(node, "/readyz", None).await.filter(|r| r.status == 200)
    })
    .await;

    // The demo request fails over inside the container as it does outside.
    let body =
        json!({"model": "demo/flaky-primary", "messages": [{"role": "user", "content": "Hello"}]});
    let body = body.to_string();
    let r = http_request(node, "POST", "/v1/chat/completions", Some(&key), Some(body.as_bytes()))
        .await
        .expect("the node answers");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["secureai"]["served_model"], "demo/steady-fallback", "{}", r.body);
    assert_eq!(r.json()["secureai"]["failover"]["occurred"], true, "{}", r.body);

    // The process is the container's PID 1 and runs as the non-root user (what `id -u` would
    // print inside, had the image a shell): its uids as the kernel holds them.
    let pid = podman(&["inspect", "--format", "{{.State.Pid}}", &name]).await;
    assert_eq!(pid_in_namespace(&pid), "1", "switchyard is the container's init");
    assert_eq!(uids_inside(&pid), vec![NONROOT_UID; 4], "real, effective, saved and fs uid");

    // A slow stream, in flight when SIGTERM comes, is finished before the process exits 0.
    let text = "one two three four five six seven eight";
    let script =
        json!({"kind": "ok", "text": text, "chunks": CHUNKS, "chunk_delay_ms": CHUNK_DELAY_MS});
    let script = script.to_string();
    let scripted =
        http_request(sim, "PUT", "/_sim/models/steady-fallback", None, Some(script.as_bytes()))
            .await
            .expect("the simulator answers");
    assert!(
        scripted.status < 300,
        "scripting the simulator: {} {}",
        scripted.status,
        scripted.body
    );
    let stream_body = json!({"model": "demo/steady-fallback", "stream": true,
        "messages": [{"role": "user", "content": "Hello"}]})
    .to_string();
    let socket = TcpStream::connect(node).await.unwrap();
    let stream = http_send(
        socket,
        node,
        "POST",
        "/v1/chat/completions",
        Some(&key),
        &[],
        Some(stream_body.as_bytes()),
    );
    let (head, mut body) = stream.await.expect("the node answers");
    assert_eq!(head.status, 200, "{}", response_head(&head));
    // The event stream as it arrives, read a frame at a time so that SIGTERM can come between.
    let mut received = Vec::new();
    let content = |r: &[u8]| !streamed_content(&String::from_utf8_lossy(r)).0.is_empty();
    let first = tokio::time::timeout(PATIENCE, read_body_until(&mut body, &mut received, content));
    let first = first.await.expect("the stream's first content chunk");
    assert!(first, "the stream ended early: {}", String::from_utf8_lossy(&received));

    podman(&["kill", "--signal", "TERM", &name]).await;
    eventually(Duration::from_secs(10), "/readyz to answer 503 draining", || async move {
        let r = http_get(node, "/readyz", None).await?;
        (r.status == 503 && r.json()["reason"] == "draining").then_some(())
    })
    .await;
    tokio::time::timeout(PATIENCE, read_body_until(&mut body, &mut received, |_| false))
        .await
        .expect("the stream finishes during the drain");
    let raw = &*String::from_utf8_lossy(&received);
    let (content, done) = streamed_content(raw);
    assert_eq!(content, text, "every chunk arrived: {raw}");
    assert!(done, "the stream ended with [DONE]: {raw}");

    let status = tokio::time::timeout(PATIENCE, run.wait())
        .await
        .unwrap_or_else(|_| panic!("the container did not exit after SIGTERM; its log:\n{}", log()))
        .unwrap();
    assert!(status.success(), "podman run exits 0, not {status}; its log:\n{}", log());
    let code = podman(&["inspect", "--format", "{{.State.ExitCode}}", &name]).await;
    assert_eq!(code, "0", "the container's exit code; its log:\n{}", log());
    assert!(log().contains("node stopped"), "the node drained and stopped:\n{}", log());
}
