//! TLS between Switchyard's parts (docs/operating.md, "TLS"): node ↔ control plane, CLI ↔
//! control plane, clients ↔ node; mutual TLS; rotation without a restart; and the errors an
//! operator sees when a certificate is expired, from another CA, for another host, or a
//! file cannot be read. Real processes on loopback; certificates from the harness's PKI.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Stdio;

use switchyard_e2e::gateway::*;
use switchyard_e2e::pki::{Ca, Leaf};
use switchyard_e2e::tls::{connect, https_request};
use switchyard_e2e::*;

const HOSTS: &[&str] = &["localhost", "127.0.0.1"];

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// A gateway whose control plane serves TLS with a certificate of `ca`; with `mutual`, it
/// also requires client certificates signed by `ca`, and the node and the CLI present one
/// (which the node's listener serves HTTPS with, as `--tls-cert` means both).
async fn tls_gateway(ca: &Ca, mutual: bool, node_https: bool) -> Gateway {
    let node = (mutual || node_https).then(|| (ca.leaf("node", HOSTS), ca.cert_path().to_owned()));
    Gateway::start_with(GatewayOptions {
        tls: Some(GatewayTls {
            ca: ca.cert_path().to_owned(),
            server: ca.leaf("control", HOSTS),
            client_ca: mutual.then(|| ca.cert_path().to_owned()),
            node,
        }),
        ..GatewayOptions::default()
    })
    .await
}

/// A control plane on its own store with the given TLS flags.
async fn tls_control(dir: &Path, name: &str, server: &Leaf, extra: &[&str]) -> (Proc, String) {
    let store = format!("file://{}", dir.join(format!("{name}-store")).display());
    let (cert, key) = (path(&server.cert), path(&server.key));
    let mut flags = vec!["--tls-cert", &cert, "--tls-key", &key];
    flags.extend_from_slice(extra);
    let cp = start_control_with(&store, "127.0.0.1:0", dir, name, &[], &flags).await;
    let url = format!("https://localhost:{}", cp.addr.port());
    (cp, url)
}

/// `switchyard nodes --json` against `url`, with `flags` (e.g. `--control-ca F`).
async fn nodes_call(url: &str, flags: &[&str]) -> CliOutput {
    let mut args = vec!["nodes", "--json"];
    args.extend_from_slice(flags);
    cli(url, &args).await
}

/// Runs `switchyard ARGS` expecting it to refuse to start; its output once it has exited.
async fn refused_start(args: &[&str]) -> CliOutput {
    let mut cmd = tokio::process::Command::new(switchyard_bin());
    cmd.args(args)
        .env("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(PATIENCE, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("switchyard {args:?} started instead of refusing"))
        .unwrap();
    CliOutput {
        success: out.status.success(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Waits until `proc`'s log has a line containing every one of `words`; returns that line.
async fn log_line(proc: &Proc, what: &str, words: &[&str]) -> String {
    eventually(PATIENCE, what, || async {
        proc.log_text().lines().find(|l| words.iter().all(|w| l.contains(w))).map(str::to_owned)
    })
    .await
}

#[tokio::test]
async fn a_node_takes_its_config_from_a_tls_control_plane_and_serves_a_chat() {
    let ca = Ca::new("switchyard test CA");
    let gw = tls_gateway(&ca, false, false).await;
    // The gateway's start already applied the catalog and created the key over https, and
    // the node applied them: its config came over the TLS stream.
    assert!(gw.control.starts_with("https://"), "{}", gw.control);
    let r = gw.chat(body(PRIMARY)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let opened =
        log_line(&gw.node, "the node's config stream to open", &["config stream open"]).await;
    assert!(opened.contains(&gw.control), "the stream is to the https URL: {opened}");
    let nodes = gw.admin(&["nodes", "--json"]).await.json();
    assert_eq!(nodes["nodes"].as_array().map(Vec::len), Some(1), "{nodes}");

    // The listener speaks only TLS: a plaintext client gets nowhere.
    let plain = cli(&gw.cp.url(), &["nodes", "--json"]).await;
    assert!(!plain.success, "a plaintext call to the TLS listener failed");
}

#[tokio::test]
async fn the_cli_calls_an_https_control_plane_with_control_ca() {
    let ca = Ca::new("switchyard test CA");
    let dir = tempfile::tempdir().unwrap();
    let (_cp, url) = tls_control(dir.path(), "cp", &ca.leaf("control", HOSTS), &[]).await;
    let ca_file = path(ca.cert_path());
    let out = nodes_call(&url, &["--control-ca", &ca_file]).await;
    assert!(out.success, "{}", out.stderr);
    assert!(out.json()["nodes"].is_array(), "{}", out.stdout);
    // The same through the environment.
    let out = cli_with_env(
        &url,
        &["nodes", "--json"],
        &[("SWITCHYARD_ADMIN_TOKEN", ADMIN_TOKEN), ("SWITCHYARD_CONTROL_CA", &ca_file)],
    )
    .await;
    assert!(out.success, "{}", out.stderr);
}

#[tokio::test]
async fn mutual_tls_refuses_nodes_without_a_certificate_of_the_client_ca() {
    let ca = Ca::new("switchyard test CA");
    // The gateway's node presents a certificate of the client CA: accepted, config applied.
    let gw = tls_gateway(&ca, true, false).await;
    let nodes = gw.admin(&["nodes", "--json"]).await.json();
    assert_eq!(nodes["nodes"].as_array().map(Vec::len), Some(1), "{nodes}");
    let ca_file = path(ca.cert_path());

    // A node without a client certificate: refused at the handshake, and it says why.
    let bare_dir = gw.path().join("bare");
    let bare = Proc::start(
        &[
            "node",
            "--control",
            &gw.control,
            "--control-ca",
            &ca_file,
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &path(&bare_dir),
        ],
        &[],
        gw.path().join("bare.log"),
    )
    .await;
    let said =
        log_line(&bare, "the node without a certificate to say why", &["config stream ended"])
            .await;
    assert!(said.contains(&gw.control), "names the control plane: {said}");
    assert!(said.contains("requires a client certificate"), "{said}");
    let logged = log_line(
        &gw.cp,
        "the control plane to log the refusal",
        &["refused a TLS handshake", "no client certificate"],
    )
    .await;
    assert!(logged.contains("peer=127.0.0.1:"), "names the peer's address: {logged}");
    assert_eq!(node_version(bare.addr).await, None, "the refused node has no config");

    // A node with a certificate from another CA: refused too.
    let other = Ca::new("another CA");
    let stranger_cert = other.leaf("stranger", HOSTS);
    let stranger = Proc::start(
        &[
            "node",
            "--control",
            &gw.control,
            "--control-ca",
            &ca_file,
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &path(&gw.path().join("stranger")),
            "--tls-cert",
            &path(&stranger_cert.cert),
            "--tls-key",
            &path(&stranger_cert.key),
        ],
        &[],
        gw.path().join("stranger.log"),
    )
    .await;
    let said = log_line(
        &stranger,
        "the node with a stranger's certificate to say why",
        &["config stream ended"],
    )
    .await;
    assert!(said.contains("refused our certificate"), "{said}");
    log_line(
        &gw.cp,
        "the control plane to log the unknown issuer",
        &["refused a TLS handshake", "unknown issuer", "--client-ca"],
    )
    .await;
    assert_eq!(
        gw.admin(&["nodes", "--json"]).await.json()["nodes"].as_array().map(Vec::len),
        Some(1),
        "only the node with the right certificate joined"
    );

    // The admin calls are under mutual TLS too: without a certificate, refused in words.
    let out = nodes_call(&gw.control, &["--control-ca", &ca_file]).await;
    assert!(!out.success, "{}", out.stdout);
    assert!(out.stderr.contains("requires a client certificate"), "{}", out.stderr);
}

#[tokio::test]
async fn the_nodes_https_listener_serves_http1_and_http2() {
    let ca = Ca::new("switchyard test CA");
    let gw = tls_gateway(&ca, false, true).await;
    let node_ca = gw.node_ca.clone().unwrap();
    let payload = body(PRIMARY).to_string();

    // ALPN: the node offers both; a client asking for either gets it.
    let (_, h1) = connect(gw.node.addr, "localhost", &node_ca, &[b"http/1.1"]).await.unwrap();
    assert_eq!(h1.as_deref(), Some(&b"http/1.1"[..]));
    let (_, h2) =
        connect(gw.node.addr, "localhost", &node_ca, &[b"h2", b"http/1.1"]).await.unwrap();
    assert_eq!(h2.as_deref(), Some(&b"h2"[..]));

    let r = https_request(
        gw.node.addr,
        &node_ca,
        "POST",
        "/v1/chat/completions",
        Some(&gw.key),
        Some(payload.as_bytes()),
    )
    .await
    .expect("the node answers over HTTPS");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.headers.starts_with("HTTP/1.1 200"), "{}", r.headers);

    // A whole chat over each protocol, by curl, which reports the version it used.
    let url = format!("https://localhost:{}/v1/chat/completions", gw.node.addr.port());
    for (flag, version) in [("--http1.1", "1.1"), ("--http2", "2")] {
        let out = tokio::process::Command::new("curl")
            .args([
                "-sS",
                flag,
                "--cacert",
                &path(&node_ca),
                "-o",
                "/dev/null",
                "-w",
                "%{http_version} %{http_code}",
            ])
            .args([
                "-H",
                &format!("Authorization: Bearer {}", gw.key),
                "-H",
                "Content-Type: application/json",
            ])
            .args(["--data", &payload, &url])
            .output()
            .await
            .expect("curl (with HTTP/2) is needed for this test");
        let said = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            said,
            format!("{version} 200"),
            "{flag}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test]
async fn a_rotated_certificate_is_served_to_new_connections_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let old_ca = Ca::new("old CA");
    let live = old_ca.leaf("control", HOSTS);
    let (cp, url) = tls_control(dir.path(), "cp", &live, &[]).await;
    let (old, new) = (path(old_ca.cert_path()), Ca::new("new CA"));
    let new_file = path(new.cert_path());
    assert!(nodes_call(&url, &["--control-ca", &old]).await.success);
    let before = cp.child.id();

    // The operator's tooling drops a certificate of a new CA over the files.
    new.leaf("control-rotated", HOSTS).install_as(&live);
    eventually(PATIENCE, "the CLI trusting only the new CA to get through", || async {
        nodes_call(&url, &["--control-ca", &new_file]).await.success.then_some(())
    })
    .await;
    let out = nodes_call(&url, &["--control-ca", &old]).await;
    assert!(!out.success, "the old CA no longer fits");
    assert!(out.stderr.contains("unknown issuer"), "{}", out.stderr);
    assert_eq!(cp.child.id(), before, "the same process");
    log_line(&cp, "the control plane to log the reload", &["reloaded"]).await;
}

#[tokio::test]
async fn tls_failures_name_the_peer_or_the_file_and_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("switchyard test CA");
    let ca_file = path(ca.cert_path());

    // Expired: the CLI says which control plane and that its certificate expired; the node
    // says the same in its log; the control plane logs the refused handshake.
    let (expired_cp, url) =
        tls_control(dir.path(), "expired", &ca.expired_leaf("control", HOSTS), &[]).await;
    let out = nodes_call(&url, &["--control-ca", &ca_file]).await;
    assert!(!out.success);
    assert!(
        out.stderr.contains(&url) && out.stderr.contains("certificate expired (valid until "),
        "{}",
        out.stderr
    );
    let node = Proc::start(
        &["node", "--control", &url, "--control-ca", &ca_file, "--listen", "127.0.0.1:0"],
        &[],
        dir.path().join("node-expired.log"),
    )
    .await;
    let said =
        log_line(&node, "the node to say the certificate expired", &["config stream ended"]).await;
    assert!(said.contains(&url) && said.contains("certificate expired"), "{said}");
    let logged = log_line(
        &expired_cp,
        "the control plane to log the refused handshake",
        &["refused a TLS handshake"],
    )
    .await;
    assert!(
        logged.contains("peer=127.0.0.1:") && logged.contains("refused our certificate"),
        "{logged}"
    );

    // Another CA.
    let (_cp, url) = tls_control(dir.path(), "good", &ca.leaf("control", HOSTS), &[]).await;
    let other = Ca::new("another CA");
    let other_file = path(other.cert_path());
    let out = nodes_call(&url, &["--control-ca", &other_file]).await;
    assert!(!out.success);
    assert!(out.stderr.contains(&url) && out.stderr.contains("unknown issuer"), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!("--control-ca {other_file}")),
        "names the CA file: {}",
        out.stderr
    );

    // Another host name.
    let (_cp, url) =
        tls_control(dir.path(), "elsewhere", &ca.leaf("elsewhere", &["cp.example.com"]), &[]).await;
    let out = nodes_call(&url, &["--control-ca", &ca_file]).await;
    assert!(!out.success);
    assert!(
        out.stderr.contains(&url)
            && out
                .stderr
                .contains("name mismatch: certificate is for cp.example.com, not localhost"),
        "{}",
        out.stderr
    );

    // Files that cannot be used stop the start, naming the flag and the file.
    let leaf = ca.leaf("files", HOSTS);
    let missing = path(&dir.path().join("missing-key.pem"));
    let store = format!("file://{}", dir.path().join("store").display());
    let cert = path(&leaf.cert);
    let out = refused_start(&[
        "control",
        "--store",
        &store,
        "--listen",
        "127.0.0.1:0",
        "--tls-cert",
        &cert,
        "--tls-key",
        &missing,
    ])
    .await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains(&format!("--tls-key {missing}: cannot read")), "{}", out.stderr);
    let out = refused_start(&[
        "node",
        "--control",
        "https://localhost:1",
        "--listen",
        "127.0.0.1:0",
        "--tls-cert",
        &cert,
        "--tls-key",
        &missing,
    ])
    .await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains(&format!("--tls-key {missing}: cannot read")), "{}", out.stderr);
    // A key where the certificate belongs.
    let key = path(&leaf.key);
    let out = refused_start(&[
        "control",
        "--store",
        &store,
        "--listen",
        "127.0.0.1:0",
        "--tls-cert",
        &key,
        "--tls-key",
        &key,
    ])
    .await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains(&format!("--tls-cert {key}: no certificate")), "{}", out.stderr);
    assert!(!out.stderr.contains("PRIVATE KEY-----"), "no key material in errors: {}", out.stderr);
    // An unreadable CA file for the CLI.
    let out = nodes_call("https://localhost:1", &["--control-ca", &missing]).await;
    assert!(!out.success);
    assert!(out.stderr.contains(&format!("--control-ca {missing}: cannot read")), "{}", out.stderr);
}

#[tokio::test]
async fn a_drill_runs_through_an_https_node_with_its_admin_calls_under_mutual_tls() {
    let ca = Ca::new("switchyard test CA");
    // Mutual TLS: the node's certificate is also its HTTPS listener's.
    let gw = tls_gateway(&ca, true, true).await;
    let node = format!("https://localhost:{}", gw.node.addr.port());
    let node_ca = path(gw.node_ca.as_deref().unwrap());
    let out = gw
        .admin(&[
            "drill",
            "primary-down",
            "--node",
            &node,
            "--node-ca",
            &node_ca,
            "--key",
            &gw.key,
            "--model",
            PRIMARY,
            "--fallback-models",
            SECONDARY,
            "--json",
        ])
        .await;
    let report = out.json();
    assert_eq!(report["passed"], true, "{report:#}");
    assert_eq!(report["faults_cleared"], true, "{report:#}");
}

/// The value of `name{labels}` in a `/metrics` text, labels written as the process writes
/// them.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn the_node_and_the_control_plane_export_when_their_certificates_expire() {
    let ca = Ca::new("switchyard test CA");
    let now = std::time::SystemTime::now();
    // Whole seconds: a certificate's dates carry no fraction.
    let at = |days: u64| {
        let unix = now.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + days * 86_400;
        (std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix), unix as f64)
    };
    let before = now - std::time::Duration::from_secs(3600);
    let ((control_until, control_unix), (node_until, node_unix)) = (at(30), at(10));
    let control = ca.leaf_valid("control", HOSTS, before, control_until);
    let node = ca.leaf_valid("node", HOSTS, before, node_until);
    let gw = Gateway::start_with(GatewayOptions {
        tls: Some(GatewayTls {
            ca: ca.cert_path().to_owned(),
            server: control.clone(),
            client_ca: None,
            node: Some((node.clone(), ca.cert_path().to_owned())),
        }),
        ..GatewayOptions::default()
    })
    .await;
    let name = "switchyard_tls_certificate_expiry_timestamp_seconds";
    let series =
        |role: &str, file: &Path| format!("{name}{{role=\"{role}\",file=\"{}\"}}", path(file));
    let ca_file = ca.cert_path();
    let scrape = |addr| async move {
        let r = https_request(addr, ca_file, "GET", "/metrics", None, None).await.unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        r.body
    };

    let cp = scrape(gw.cp.addr).await;
    assert_eq!(metric(&cp, &series("tls-cert", &control.cert)), Some(control_unix), "{cp}");
    let n = scrape(gw.node.addr).await;
    assert_eq!(metric(&n, &series("tls-cert", &node.cert)), Some(node_unix), "{n}");
    // The CA file the node checks the control plane against expires too (rcgen's default:
    // 4096-01-01).
    assert_eq!(metric(&n, &series("control-ca", ca.cert_path())), Some(67_090_118_400.0), "{n}");
}

#[tokio::test]
async fn a_rotated_certificate_shows_its_new_expiry_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("switchyard test CA");
    let now = std::time::SystemTime::now();
    let whole = |days: u64| {
        let unix = now.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + days * 86_400;
        (std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix), unix as f64)
    };
    let before = now - std::time::Duration::from_secs(3600);
    let ((soon, soon_unix), (later, later_unix)) = (whole(5), whole(60));
    let live = ca.leaf_valid("control", HOSTS, before, soon);
    let (cp, _url) = tls_control(dir.path(), "cp", &live, &[]).await;
    let series = format!(
        "switchyard_tls_certificate_expiry_timestamp_seconds{{role=\"tls-cert\",file=\"{}\"}}",
        path(&live.cert)
    );
    let expiry = || async {
        let r = https_request(cp.addr, ca.cert_path(), "GET", "/metrics", None, None).await?;
        metric(&r.body, &series)
    };
    assert_eq!(expiry().await, Some(soon_unix));

    // Renewed in place: the scrapes' own handshakes make the control plane read it again.
    ca.leaf_valid("renewed", HOSTS, before, later).install_as(&live);
    eventually(PATIENCE, "the renewed certificate's expiry at /metrics", || async {
        (expiry().await == Some(later_unix)).then_some(())
    })
    .await;
}
