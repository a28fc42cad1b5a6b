//! Credentials on both sides of the node: the client's `Authorization` scheme, and a
//! provider refusing the gateway's own credential. Real control plane, node and simulated
//! provider processes on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};

use switchyard_e2e::gateway::*;
use switchyard_e2e::{HttpResponse, http_request, http_request_with};

fn msg() -> Value {
    json!([{"role": "user", "content": "hello"}])
}

/// A chat request with `Authorization` exactly as given (not the `Bearer` the `bearer`
/// argument writes).
async fn chat_with_authorization(gw: &Gateway, authorization: &str) -> HttpResponse {
    let body = json!({"model": PRIMARY, "messages": msg()}).to_string();
    http_request_with(
        gw.node.addr,
        "POST",
        "/v1/chat/completions",
        None,
        &[("authorization", authorization.as_bytes())],
        Some(body.as_bytes()),
    )
    .await
    .expect("the node answers")
}

#[tokio::test]
async fn the_bearer_scheme_is_accepted_in_any_case() {
    let gw = Gateway::start().await;
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let r = chat_with_authorization(&gw, &format!("{scheme} {}", gw.key)).await;
        assert_eq!(r.status, 200, "{scheme}: {}", r.body);
    }
    let r = chat_with_authorization(&gw, &format!("Basic {}", gw.key)).await;
    assert_eq!(r.status, 401, "another scheme is still refused: {}", r.body);
}

/// The provider accepts only `sk-valid`; the node holds `sk-expired` and no reserve.
async fn gateway_with_a_refused_credential() -> Gateway {
    let gw = Gateway::start_with(GatewayOptions {
        api_keys: r#"["env:SIM_PRIMARY_KEY"]"#,
        node_env: vec![("SIM_PRIMARY_KEY", "sk-expired")],
        ..GatewayOptions::default()
    })
    .await;
    let r = http_request(gw.sim.addr, "PUT", "/_sim/keys", None, Some(br#"["sk-valid"]"#))
        .await
        .unwrap();
    assert!(r.status < 300, "{}", r.body);
    gw
}

#[tokio::test]
async fn a_provider_refusing_the_gateways_credential_says_so() {
    let gw = gateway_with_a_refused_credential().await;
    let r = gw.chat(json!({"model": PRIMARY, "messages": msg()})).await;
    assert_eq!(r.status, 502, "{}", r.body);
    let v = r.json();
    assert_eq!(v["error"]["code"], "all_models_failed", "{v}");
    assert_eq!(v["error"]["type"], "server_error", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("refused the gateway's credential"), "{message}");
    assert!(message.contains(PRIMARY), "{message}");
    assert!(!r.body.contains("sk-"), "no credential reaches the client: {}", r.body);
}

#[tokio::test]
async fn a_chain_whose_last_provider_refused_the_credential_says_so_and_reports_server_error() {
    let gw = gateway_with_a_refused_credential().await;
    let r =
        gw.chat(json!({"model": PRIMARY, "fallback_models": [SECONDARY], "messages": msg()})).await;
    assert_eq!(r.status, 502, "{}", r.body);
    let v = r.json();
    assert_eq!(v["error"]["code"], "all_models_failed", "{v}");
    // `server_error` stays the failover reason, so `on` keeps working as documented.
    assert_eq!(
        attempts(&v),
        [triple(PRIMARY, "failed", "server_error"), triple(SECONDARY, "failed", "server_error")]
    );
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("All 2 model attempt(s) failed"), "{message}");
    assert!(message.contains("refused the gateway's credential"), "{message}");
}
