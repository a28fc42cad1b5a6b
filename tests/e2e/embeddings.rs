//! `POST /v1/embeddings` (docs/http-api.md, "`POST /v1/embeddings`") on a real control plane,
//! node and simulator: OpenAI-format and Gemini models, batches, base64, failover between
//! models of one dimensions, and the refusals that keep a chain's vectors comparable.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use base64::Engine as _;
use serde_json::{Value, json};

use switchyard_e2e::gateway::*;
use switchyard_e2e::*;

const EMBED_A: &str = "sim/embed-a";
const EMBED_B: &str = "sim-eu/embed-b";
const EMBED_WIDE: &str = "sim/embed-wide";
const GEMINI_EMBED: &str = "google/embed";
const AZURE_EMBED: &str = "azure/embed";

/// Added to the gateway's catalog: embedding models of 8 dimensions on two OpenAI-format
/// providers, Gemini and Azure, and one of 16.
const EXTRA_MODELS: &str = "  - name: sim/embed-a
    provider: sim-us
    upstream_model: embed-a
    type: embedding
    dimensions: 8
  - name: sim-eu/embed-b
    provider: sim-eu
    upstream_model: embed-b
    type: embedding
    dimensions: 8
  - name: sim/embed-wide
    provider: sim-us
    upstream_model: embed-wide
    type: embedding
    dimensions: 16
  - name: google/embed
    provider: sim-gemini
    upstream_model: gemini-embed
    type: embedding
    dimensions: 8
  - name: azure/embed
    provider: sim-azure
    upstream_model: azure-embed
    type: embedding
    dimensions: 8
";

async fn gateway() -> Gateway {
    let gw = Gateway::start().await;
    let file = gw.path().join("catalog.yaml");
    let catalog = std::fs::read_to_string(&file).unwrap();
    assert!(catalog.contains("\nmodels:\n"), "the gateway's catalog changed shape");
    let catalog = catalog.replacen("\nmodels:\n", &format!("\nmodels:\n{EXTRA_MODELS}"), 1);
    std::fs::write(&file, catalog).unwrap();
    let applied = gw.admin(&["apply", "-f", &file.display().to_string(), "--json"]).await.json();
    gw.wait_for(applied["version"].as_i64().unwrap()).await;
    gw
}

async fn embed(gw: &Gateway, body: Value) -> HttpResponse {
    gw.post("/v1/embeddings", Some(&gw.key), body.to_string().as_bytes()).await
}

fn vectors(answer: &Value) -> Vec<Vec<f64>> {
    answer["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["embedding"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect())
        .collect()
}

/// The 400's `param`, after checking it is a 400.
fn refused(r: &HttpResponse) -> String {
    assert_eq!(r.status, 400, "{}", r.body);
    r.json()["error"]["param"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn one_input_and_a_batch_answer_openais_list_named_by_the_gateway() {
    let gw = gateway().await;
    let r = embed(&gw, json!({"model": EMBED_A, "input": "hello world"})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let one = r.json();
    assert_eq!((&one["object"], &one["model"]), (&json!("list"), &json!(EMBED_A)));
    assert_eq!(one["data"][0]["object"], "embedding");
    assert_eq!(vectors(&one)[0].len(), 8);
    assert_eq!(one["usage"]["prompt_tokens"], 2);
    assert_eq!(r.header("x-served-model").as_deref(), Some(EMBED_A));
    assert_eq!(r.header("x-requested-model").as_deref(), Some(EMBED_A));
    assert!(r.header("x-request-id").is_some());
    let sent = gw.last_upstream_request("embed-a").await;
    assert_eq!(sent["path"], "/v1/embeddings");
    assert_eq!(sent["body"], json!({"model": "embed-a", "input": "hello world"}));

    let r = embed(&gw, json!({"model": EMBED_A, "input": ["b", "hello world", "c d e"]})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let batch = r.json();
    let indices: Vec<_> =
        batch["data"].as_array().unwrap().iter().map(|d| d["index"].clone()).collect();
    assert_eq!(indices, [json!(0), json!(1), json!(2)]);
    assert_eq!(vectors(&batch)[1], vectors(&one)[0], "the same input, the same vector, in order");
    assert_eq!(batch["usage"]["prompt_tokens"], 6);

    // `dimensions` reaches the model; token arrays pass to an OpenAI-format model.
    let r = embed(&gw, json!({"model": EMBED_A, "input": [[1, 2], [3]], "dimensions": 4})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(vectors(&r.json()).iter().map(Vec::len).collect::<Vec<_>>(), [4, 4]);
    // Azure: the deployment's embeddings path.
    let r = embed(&gw, json!({"model": AZURE_EMBED, "input": "x"})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let sent = gw.last_upstream_request("azure-embed").await;
    assert!(
        sent["path"].as_str().unwrap().starts_with("/openai/deployments/azure-embed/embeddings"),
        "{sent}"
    );
}

#[tokio::test]
async fn gemini_embeds_one_with_embed_content_and_several_with_a_batch_and_refuses_token_ids() {
    let gw = gateway().await;
    let r = embed(&gw, json!({"model": GEMINI_EMBED, "input": "alpha"})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let one = r.json();
    assert_eq!(one["model"], GEMINI_EMBED);
    assert!(one["usage"]["prompt_tokens"].as_u64().unwrap() > 0, "{one}");
    let sent = gw.last_upstream_request("gemini-embed").await;
    assert_eq!(sent["path"], "/v1beta/models/gemini-embed:embedContent");

    let r = embed(&gw, json!({"model": GEMINI_EMBED, "input": ["beta", "alpha"], "dimensions": 8}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let batch = r.json();
    assert_eq!(vectors(&batch).len(), 2);
    assert_eq!(vectors(&batch)[1], vectors(&one)[0]);
    let sent = gw.last_upstream_request("gemini-embed").await;
    assert_eq!(sent["path"], "/v1beta/models/gemini-embed:batchEmbedContents");
    assert_eq!(sent["body"]["requests"][0]["outputDimensionality"], 8);

    let before = gw.upstream_total().await;
    let r = embed(&gw, json!({"model": GEMINI_EMBED, "input": [1, 2, 3]})).await;
    assert_eq!(refused(&r), "input");
    let over: Vec<String> = (0..101).map(|i| format!("t{i}")).collect();
    let r = embed(&gw, json!({"model": GEMINI_EMBED, "input": over})).await;
    assert_eq!(refused(&r), "input");
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("at most 100"), "{}", r.body);
    assert_eq!(gw.upstream_total().await, before, "nothing went upstream");
}

#[tokio::test]
async fn base64_is_the_floats_as_little_endian_f32s() {
    let gw = gateway().await;
    for model in [EMBED_A, GEMINI_EMBED] {
        let floats = embed(&gw, json!({"model": model, "input": ["x", "y"]})).await.json();
        let r =
            embed(&gw, json!({"model": model, "input": ["x", "y"], "encoding_format": "base64"}))
                .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let encoded = r.json();
        for (i, expected) in vectors(&floats).iter().enumerate() {
            let text = encoded["data"][i]["embedding"].as_str().expect("a base64 string");
            let bytes = base64::engine::general_purpose::STANDARD.decode(text).unwrap();
            let decoded: Vec<f64> = bytes
                .chunks_exact(4)
                .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect();
            let close = decoded.iter().zip(expected).all(|(a, b)| (a - b).abs() < 1e-6);
            assert!(close && decoded.len() == expected.len(), "{model}: {decoded:?} {expected:?}");
        }
    }
}

#[tokio::test]
async fn a_failing_model_fails_over_to_one_of_the_same_dimensions() {
    let gw = gateway().await;
    gw.script("embed-a", json!({"kind": "status", "status": 503})).await;
    let r = embed(
        &gw,
        json!({"model": EMBED_A, "fallback_models": [EMBED_B, GEMINI_EMBED], "input": ["a", "b"]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let answer = r.json();
    assert_eq!(answer["model"], EMBED_B);
    assert_eq!(vectors(&answer).len(), 2);
    assert_eq!(r.header("x-served-model").as_deref(), Some(EMBED_B));
    assert_eq!(r.header("x-requested-model").as_deref(), Some(EMBED_A));
    assert_eq!(
        attempts(&answer),
        [triple(EMBED_A, "failed", "server_error"), triple(EMBED_B, "served", "")]
    );
    assert_eq!(answer["secureai"]["failover"]["occurred"], true);
    let metrics = http_get(gw.node.addr, "/metrics", None).await.unwrap().body;
    assert!(
        metrics.lines().any(|l| l.starts_with("switchyard_failovers_total")
            && l.contains(r#"served_model="sim-eu/embed-b""#)
            && l.contains(r#"surface="embeddings""#)),
        "{metrics}"
    );

    // The key's chain, from its failoverDefaults, to Gemini this time.
    gw.script("embed-b", json!({"kind": "status", "status": 429})).await;
    gw.set_defaults(&["--models", &format!("{EMBED_A},{EMBED_B},{GEMINI_EMBED}")]).await;
    let r = embed(&gw, json!({"model": EMBED_A, "input": "a"})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["model"], GEMINI_EMBED);
    // All failed: the chat's 502, its attempts named.
    gw.script("gemini-embed", json!({"kind": "status", "status": 500})).await;
    let r = embed(&gw, json!({"model": EMBED_A, "input": "a"})).await;
    assert_eq!(r.status, 502, "{}", r.body);
    assert_eq!(r.json()["secureai"]["attempts"].as_array().unwrap().len(), 3, "{}", r.body);
}

#[tokio::test]
async fn a_reset_connection_or_a_hung_model_fails_over_like_chat() {
    let gw = gateway().await;
    gw.script("embed-a", json!({"kind": "reset"})).await;
    let ask = json!({"model": EMBED_A, "fallback_models": [EMBED_B], "input": "a"});
    let r = embed(&gw, ask).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        attempts(&r.json()),
        [triple(EMBED_A, "failed", "connection_error"), triple(EMBED_B, "served", "")]
    );
    gw.script("embed-a", json!({"kind": "hang"})).await;
    let ask = json!({"model": EMBED_A, "fallback_models": [GEMINI_EMBED], "input": "a",
        "redundancy": {"timeout_ms": 1000}});
    let r = embed(&gw, ask).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        attempts(&r.json()),
        [triple(EMBED_A, "failed", "timeout"), triple(GEMINI_EMBED, "served", "")]
    );
}

#[tokio::test]
async fn a_chain_of_mixed_dimensions_or_a_chat_model_is_refused_before_any_call() {
    let gw = gateway().await;
    let before = gw.upstream_total().await;
    let r =
        embed(&gw, json!({"model": EMBED_A, "fallback_models": [EMBED_WIDE], "input": "a"})).await;
    assert_eq!(refused(&r), "fallback_models[0]");
    let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("16") && message.contains("8"), "{message}");
    let r = embed(&gw, json!({"models": [EMBED_A, EMBED_B, EMBED_WIDE], "input": "a"})).await;
    assert_eq!(refused(&r), "models[2]");

    let r = embed(&gw, json!({"model": PRIMARY, "input": "a"})).await;
    assert_eq!(refused(&r), "model");
    assert!(r.body.contains(PRIMARY) && r.body.contains("chat model"), "{}", r.body);
    let r =
        embed(&gw, json!({"model": EMBED_A, "fallback_models": [SECONDARY], "input": "a"})).await;
    assert_eq!(refused(&r), "fallback_models[0]");

    // An embedding model on the chat surfaces.
    let r = gw.chat(body(EMBED_A)).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "model");
    assert!(r.body.contains(EMBED_A) && r.body.contains("embedding model"), "{}", r.body);
    let messages = json!({"model": EMBED_A, "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}]});
    let r = gw.post("/v1/messages", Some(&gw.key), messages.to_string().as_bytes()).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains(EMBED_A), "{}", r.body);
    assert_eq!(gw.upstream_total().await, before, "nothing went upstream");
}

#[tokio::test]
async fn set_defaults_and_apply_refuse_a_key_chain_that_mixes_dimensions_or_types() {
    let gw = gateway().await;
    let set = |models: String| {
        let gw = &gw;
        async move { gw.admin(&["keys", "set-defaults", &gw.key_id, "--models", &models]).await }
    };
    let out = set(format!("{EMBED_A},{EMBED_WIDE}")).await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("failoverDefaults.models[1]"), "{}", out.stderr);
    assert!(out.stderr.contains("16 dimensions"), "{}", out.stderr);
    let out = set(format!("{EMBED_A},{PRIMARY}")).await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("failoverDefaults.models[1]"), "{}", out.stderr);
    assert!(out.stderr.contains("a chat model"), "{}", out.stderr);

    // A chain that holds, then a catalog change that would break it: refused, naming the key.
    let out = set(format!("{EMBED_A},{EMBED_B}")).await;
    assert!(out.success, "{}", out.stderr);
    let file = gw.path().join("catalog.yaml");
    let good = std::fs::read_to_string(&file).unwrap();
    let from = "    upstream_model: embed-b
    type: embedding
    dimensions: 8
";
    let bad = good.replacen(
        from,
        "    upstream_model: embed-b
    type: embedding
    dimensions: 16
",
        1,
    );
    assert_ne!(bad, good, "the fixture changed");
    let path = gw.path().join("wider.yaml");
    std::fs::write(&path, bad).unwrap();
    let out = gw.admin(&["apply", "-f", &path.display().to_string()]).await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains(&gw.key_id), "{}", out.stderr);
    assert!(out.stderr.contains("set-defaults"), "{}", out.stderr);
    let stored = gw.admin(&["catalog", "--json"]).await.json();
    let b = stored["models"].as_array().unwrap().iter().find(|m| m["name"] == EMBED_B).unwrap();
    assert_eq!(b["dimensions"], 8, "nothing was applied");
    // A change no key's chain minds applies as before.
    let fine = good.replacen(
        "    upstream_model: embed-wide\n    type: embedding\n    dimensions: 16\n",
        "    upstream_model: embed-wide\n    type: embedding\n    dimensions: 32\n",
        1,
    );
    assert_ne!(fine, good);
    std::fs::write(&path, fine).unwrap();
    let out = gw.admin(&["apply", "-f", &path.display().to_string()]).await;
    assert!(out.success, "{}", out.stderr);
}

#[tokio::test]
async fn bad_input_is_a_400_naming_the_field_and_nothing_goes_upstream() {
    let gw = gateway().await;
    let before = gw.upstream_total().await;
    let cases = [
        (json!({"model": EMBED_A}), "input"),
        (json!({"model": EMBED_A, "input": ""}), "input"),
        (json!({"model": EMBED_A, "input": []}), "input"),
        (json!({"model": EMBED_A, "input": ["a", "b", "c", ""]}), "input[3]"),
        (json!({"model": EMBED_A, "input": "a", "dimensions": 0}), "dimensions"),
        (json!({"model": EMBED_A, "input": "a", "dimensions": -1}), "dimensions"),
        (json!({"model": EMBED_A, "input": "a", "dimensions": 9}), "dimensions"),
        (json!({"model": EMBED_A, "input": "a", "encoding_format": "int8"}), "encoding_format"),
        (json!({"model": EMBED_A, "input": "a", "stream": true}), "stream"),
        (json!({"input": "a"}), "model"),
    ];
    for (body, param) in cases {
        let r = embed(&gw, body.clone()).await;
        assert_eq!(refused(&r), param, "{body}");
    }
    let over: Vec<String> = (0..2049).map(|i| format!("t{i}")).collect();
    assert_eq!(refused(&embed(&gw, json!({"model": EMBED_A, "input": over})).await), "input");
    assert_eq!(gw.upstream_total().await, before, "nothing went upstream");
}

#[tokio::test]
async fn the_keys_token_limit_counts_embedding_input_tokens() {
    let gw = gateway().await;
    let set = gw.admin(&["keys", "set-limits", &gw.key_id, "--tpm", "10", "--json"]).await.json();
    gw.wait_for(set["version"].as_i64().unwrap()).await;
    // Six words are six of the simulator's tokens: 10 a minute hold one such request.
    let ask = json!({"model": EMBED_A, "input": "one two three four five six"});
    let first = embed(&gw, ask.clone()).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.json()["usage"]["prompt_tokens"], 6);
    let second = embed(&gw, ask.clone()).await;
    assert_eq!(second.status, 200, "{}", second.body);
    let third = embed(&gw, ask).await;
    assert_eq!(third.status, 429, "{}", third.body);
    assert_eq!(third.json()["error"]["code"], "gateway_rate_limited", "{}", third.body);
}

#[tokio::test]
async fn the_official_openai_python_sdk_embeds_fails_over_and_reads_the_refusal() {
    let gw = gateway().await;
    gw.script("embed-a", json!({"kind": "status", "status": 503})).await;
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/e2e/openai_sdk_embeddings.py");
    let out = tokio::process::Command::new(switchyard_e2e::python())
        .arg(&script)
        .arg(format!("{}/v1", gw.node.url()))
        .arg(&gw.key)
        .args([EMBED_A, EMBED_B, EMBED_WIDE])
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
    let checks: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(checks.len(), 4, "{stdout}");
    // Single, through the failover (the SDK asks for base64 and decodes it).
    assert_eq!(checks[0]["served"], EMBED_B);
    assert_eq!(checks[0]["lengths"], json!([8]));
    // Batched.
    assert_eq!(checks[1]["lengths"], json!([8, 8, 8]));
    assert_eq!(checks[1]["indices"], json!([0, 1, 2]));
    // Floats asked for: the same vector as the base64 one.
    assert_eq!(checks[2]["same_as_base64"], true);
    // The mixed-dimension chain: a BadRequestError naming the field.
    assert_eq!(checks[3]["status"], 400);
    assert_eq!(checks[3]["param"], "fallback_models[0]");
}
