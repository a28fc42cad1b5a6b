//! The official `openai` Python SDK against a real node: a plain and a failover request,
//! and a typed error. `.ci/run` installs the SDK into `.venv`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use serde_json::json;
use switchyard_e2e::gateway::*;

#[tokio::test]
async fn the_official_openai_python_sdk_reads_plain_and_failover_responses() {
    let gw = Gateway::start().await;
    gw.script("primary", json!({"kind": "status", "status": 503})).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/e2e/openai_sdk.py");
    let out = tokio::process::Command::new(switchyard_e2e::python())
        .arg(&script)
        .arg(format!("{}/v1", gw.node.url()))
        .arg(&gw.key)
        .arg(PRIMARY)
        .arg(SECONDARY)
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "SDK check failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let checks: Vec<serde_json::Value> =
        stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(checks.len(), 3, "{stdout}");
    assert_eq!(checks[1]["served"], SECONDARY);
}
