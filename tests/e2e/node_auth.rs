//! Credentials on both sides of the node: the client's `Authorization` scheme, and a
//! provider refusing the gateway's own credential. Real control plane, node and simulated
//! provider processes on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use switchyard_e2e::gateway::*;
use switchyard_e2e::{HttpResponse, dechunk, http_request};

fn msg() -> Value {
    json!([{"role": "user", "content": "hello"}])
}

/// A chat request with `Authorization` exactly as given (the shared client always writes
/// `Bearer`).
async fn chat_with_authorization(gw: &Gateway, authorization: &str) -> HttpResponse {
    let body = json!({"model": PRIMARY, "messages": msg()}).to_string();
    let mut stream = tokio::net::TcpStream::connect(gw.node.addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nAuthorization: {authorization}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        gw.node.addr,
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    let body = if chunked { dechunk(body) } else { body.to_owned() };
    HttpResponse { status, headers: head.to_owned(), body }
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
