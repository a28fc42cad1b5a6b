//! The web console (docs/operating.md, "The console") in headless Chromium, on real
//! processes: a control plane, two nodes and the simulator. `.ci/run` installs Debian's
//! `chromium` and `chromium-driver`, and `selenium` into `.venv`.
//!
//! `SWITCHYARD_CONSOLE_SCREENSHOTS=DIR` saves the pages as PNG (docs/img/ holds them).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use switchyard_e2e::gateway::*;
use switchyard_e2e::*;

#[tokio::test]
async fn the_console_shows_the_fleet_a_breaker_opening_failovers_live_and_a_drills_verdict() {
    let gw = Gateway::start_with(GatewayOptions {
        breaker_policy: BREAKER_OF_FOUR,
        ..Default::default()
    })
    .await;
    gw.set_defaults(&["--models", &format!("{PRIMARY},{SECONDARY}")]).await;
    let node2 = start_node(
        &gw.control,
        &gw.path().join("node2"),
        "127.0.0.1:0",
        gw.path().join("node2.log"),
    )
    .await;
    let addr = node2.addr;
    eventually(PATIENCE, "the second node to apply the config", || async move {
        node_version(addr).await.filter(|v| *v > 0)
    })
    .await;

    // An outage of the primary for every key, until the first node's breaker opens.
    let injected = gw
        .admin(&[
            "chaos",
            "inject",
            "console-outage",
            "--model",
            PRIMARY,
            "--status",
            "503",
            "--ttl",
            "5m",
            "--json",
        ])
        .await
        .json();
    gw.wait_for(injected["version"].as_i64().unwrap()).await;
    let (node, key) = (gw.node.addr, gw.key.clone());
    eventually(PATIENCE, "the first node's breaker of the primary to open", || {
        let key = key.clone();
        let gw = &gw;
        async move {
            fail_over(node, &key, 1).await;
            let breakers = gw.admin(&["breakers", "--json"]).await.stdout;
            breakers.contains("\"open\"").then_some(())
        }
    })
    .await;

    let shots = std::env::var("SWITCHYARD_CONSOLE_SCREENSHOTS").unwrap_or_default();
    let out = sdk_script(
        "console_chromium.py",
        &[
            &gw.cp.url(),
            ADMIN_TOKEN,
            &gw.node.url(),
            &gw.key,
            &gw.key_id,
            PRIMARY,
            SECONDARY,
            &shots,
        ],
    )
    .await;
    let checks: Vec<String> = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| v["check"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        checks,
        [
            "no_token_gets_the_login_page",
            "a_wrong_token_gets_401_and_a_generic_message",
            "signed_in_and_sees_two_nodes",
            "sees_the_breaker_open",
            "a_failover_arrives_live_without_reload",
            "a_drill_form_with_a_missing_field_names_it",
            "faults_cleared",
            "a_drill_runs_and_shows_its_verdict",
            "signed_out",
            "nothing_loaded_from_outside",
            "wrong_tokens_are_rate_limited",
        ],
        "{out}"
    );
    drop(node2);
}

#[tokio::test]
async fn no_ui_turns_the_console_off() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let cp = start_control_with(&store, "127.0.0.1:0", dir.path(), "cp", &[], &["--no-ui"]).await;
    // Only the gRPC services answer: an unknown method, no page.
    for path in ["/ui/login", "/ui/fleet", "/ui/static/console.js"] {
        let page = http_get(cp.addr, path, None).await.unwrap();
        assert!(page.body.is_empty(), "{path}: {}", page.body);
        assert_eq!(page.header("grpc-status").as_deref(), Some("12"), "{path}: {}", page.headers);
        assert_eq!(page.header("content-security-policy"), None, "{path}");
    }
    // The rest of the listener is still there.
    assert_eq!(http_get(cp.addr, "/metrics", None).await.unwrap().status, 200);
}

#[tokio::test]
async fn under_tls_the_console_is_served_on_the_same_port_with_a_secure_cookie() {
    let ca = switchyard_e2e::pki::Ca::new("switchyard test CA");
    let server = ca.leaf("control", &["localhost", "127.0.0.1"]);
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().join("store").display());
    let (cert, key) = (server.cert.display().to_string(), server.key.display().to_string());
    let cp = start_control_with(
        &store,
        "127.0.0.1:0",
        dir.path(),
        "cp",
        &[],
        &["--tls-cert", &cert, "--tls-key", &key],
    )
    .await;
    let https = |method: &'static str, path: &'static str, body: Option<String>| {
        let ca = ca.cert_path().to_owned();
        async move {
            switchyard_e2e::tls::https_request(
                cp.addr,
                &ca,
                method,
                path,
                None,
                body.as_deref().map(str::as_bytes),
            )
            .await
            .unwrap()
        }
    };
    let page = https("GET", "/ui/fleet", None).await;
    assert_eq!(page.status, 303, "{}", page.headers);
    assert_eq!(page.header("location").as_deref(), Some("/ui/login"));
    let signed_in = https("POST", "/ui/login", Some(format!("token={ADMIN_TOKEN}"))).await;
    assert_eq!(signed_in.status, 303, "{}", signed_in.body);
    let cookie = signed_in.header("set-cookie").unwrap();
    for attribute in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/ui"] {
        assert!(cookie.split("; ").any(|a| a == attribute), "{attribute} missing: {cookie}");
    }
}
