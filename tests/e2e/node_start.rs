//! End to end: what a node refuses at start and what it answers outside its API — real
//! control plane, node and simulator processes on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;

use switchyard_e2e::gateway::*;
use switchyard_e2e::*;
use tokio::process::Command;

#[tokio::test]
async fn a_second_node_on_one_data_dir_exits_1_naming_the_directory_and_the_holders_pid() {
    let gw = Gateway::start().await;
    let node_dir = gw.dir.path().join("node");
    let holder = gw.node.child.id().unwrap();
    // As a supervisor restarting a node while the old one still drains would start it.
    let second = Command::new(switchyard_bin())
        .args(["node", "--control", &gw.control, "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&node_dir)
        .env_remove("SWITCHYARD_JOIN_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(PATIENCE, second).await.expect("it exits").unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&node_dir.display().to_string()), "{stderr}");
    assert!(stderr.contains(&format!("pid {holder}")), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("listening on"), "it never served");
    // The first node is untouched and still serves.
    let r = gw.chat(serde_json::json!({"model": SECONDARY, "messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(r.status, 200, "{}", r.body);

    // Once the holder is gone (killed: the OS lock ends with the process), the directory
    // is free again and a node starts on it.
    let Gateway { node, dir, control, .. } = gw;
    node.kill().await;
    let again = Proc::start(
        &[
            "node",
            "--control",
            &control,
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &node_dir.display().to_string(),
        ],
        &[],
        dir.path().join("node-again.log"),
    )
    .await;
    assert!(again.child.id().is_some());
}

#[tokio::test]
async fn an_unknown_endpoint_answers_in_the_openai_error_shape_naming_method_and_path_and_is_counted()
 {
    let gw = Gateway::start().await;
    let r = gw.post("/v1/chat/completion", Some(&gw.key), b"{}").await;
    assert_eq!(r.status, 404, "{}", r.body);
    let error = &r.json()["error"];
    assert_eq!(error["type"], "not_found_error");
    assert_eq!(error["code"], "unknown_url");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("POST /v1/chat/completion"), "{message}");
    // A known path with another method: 405, in the same shape.
    let r = http_request(gw.node.addr, "GET", "/v1/chat/completions", Some(&gw.key), None)
        .await
        .unwrap();
    assert_eq!(r.status, 405, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "method_not_allowed");
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("GET"), "{}", r.body);

    let metrics = http_get(gw.node.addr, "/metrics", None).await.unwrap().body;
    let count = |status: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("switchyard_http_requests_total{")
                    && l.contains(r#"endpoint="unknown""#)
                    && l.contains(&format!(r#"status="{status}""#))
            })
            .and_then(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
    };
    assert_eq!(count("404"), Some(1.0), "{metrics}");
    assert_eq!(count("405"), Some(1.0), "{metrics}");
}
