//! Model types, the models list and wildcard models (docs/catalog.md, "`models`" and
//! "Wildcard models"; docs/http-api.md, "`GET /v1/models` and `GET /v1/models/{id}`"), on a
//! real control plane, node and simulator. The simulator answers any model name it is sent,
//! so what a wildcard sends upstream is read from its per-model request counts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};

use switchyard_e2e::gateway::*;
use switchyard_e2e::*;

/// Added to the gateway's catalog: two wildcards of different providers and prefix lengths,
/// an explicit entry under the shorter one with an upstream name of its own, and an
/// embedding model.
const EXTRA_MODELS: &str = "  - name: wild/*
    provider: sim-us
  - name: wild/deep/*
    provider: sim-eu
  - name: wild/pinned
    provider: sim-us
    upstream_model: pinned-upstream
  - name: sim/embed
    provider: sim-us
    upstream_model: embed
    type: embedding
    dimensions: 8
";

/// A gateway whose catalog also holds [`EXTRA_MODELS`], applied and in force on the node.
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

async fn get(gw: &Gateway, path: &str, key: &str) -> HttpResponse {
    http_get(gw.node.addr, path, Some(key)).await.expect("the node answers")
}

async fn chat_as(gw: &Gateway, key: &str, model: &str) -> HttpResponse {
    gw.post("/v1/chat/completions", Some(key), body(model).to_string().as_bytes()).await
}

fn by_id<'a>(list: &'a Value, id: &str) -> Option<&'a Value> {
    list["data"].as_array().unwrap().iter().find(|m| m["id"] == id)
}

fn ids(list: &Value) -> Vec<&str> {
    list["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn the_list_shows_each_models_type_an_embeddings_dimensions_and_wildcards_as_written() {
    let gw = gateway().await;
    let r = get(&gw, "/v1/models", &gw.key).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let list = r.json();
    assert_eq!(list["object"], "list");
    assert_eq!(
        by_id(&list, PRIMARY).unwrap(),
        &json!({"id": PRIMARY, "object": "model", "created": 0, "owned_by": "sim-us", "type": "chat"})
    );
    assert_eq!(
        by_id(&list, "sim/embed").unwrap(),
        &json!({"id": "sim/embed", "object": "model", "created": 0, "owned_by": "sim-us",
                "type": "embedding", "dimensions": 8})
    );
    assert_eq!(by_id(&list, "wild/*").unwrap()["owned_by"], "sim-us");
    assert_eq!(by_id(&list, "wild/deep/*").unwrap()["owned_by"], "sim-eu");
    // `switchyard catalog` shows them as written, type and dimensions included.
    let shown = gw.admin(&["catalog"]).await;
    assert!(shown.success, "{}", shown.stderr);
    assert!(shown.stdout.contains("name: wild/*\n"), "{}", shown.stdout);
    assert!(shown.stdout.contains("type: embedding\n"), "{}", shown.stdout);
    let stored = gw.admin(&["catalog", "--json"]).await.json();
    assert_eq!(stored["models"][0], json!({"name": "wild/*", "provider": "sim-us"}));
    assert_eq!(stored["models"][3]["type"], "embedding");
    assert_eq!(stored["models"][3]["dimensions"], 8);
    assert!(stored["models"][4].get("type").is_none(), "chat, the default, is not written");
}

#[tokio::test]
async fn one_model_by_an_id_with_slashes_a_name_under_a_wildcard_and_a_404_naming_the_id() {
    let gw = gateway().await;
    let r = get(&gw, "/v1/models/sim/primary", &gw.key).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["id"], PRIMARY);
    let embed = get(&gw, "/v1/models/sim/embed", &gw.key).await.json();
    assert_eq!((&embed["type"], &embed["dimensions"]), (&json!("embedding"), &json!(8)));
    // A concrete name under a wildcard is that model; under the longest wildcard.
    let under = get(&gw, "/v1/models/wild/deep/some/model", &gw.key).await;
    assert_eq!(under.status, 200, "{}", under.body);
    assert_eq!(
        under.json(),
        json!({"id": "wild/deep/some/model", "object": "model", "created": 0,
               "owned_by": "sim-eu", "type": "chat"})
    );
    assert_eq!(get(&gw, "/v1/models/wild/*", &gw.key).await.json()["id"], "wild/*");
    for unknown in ["/v1/models/nope/model", "/v1/models/wild", "/v1/models/sim"] {
        let r = get(&gw, unknown, &gw.key).await;
        assert_eq!(r.status, 404, "{unknown}: {}", r.body);
        let error = &r.json()["error"];
        assert_eq!(error["code"], "model_not_found", "{unknown}");
        assert_eq!(error["type"], "invalid_request_error");
        let id = unknown.trim_start_matches("/v1/models/");
        assert!(error["message"].as_str().unwrap().contains(&format!("`{id}`")), "{error}");
    }
    let r = get(&gw, "/v1/models/sim/primary", "sy-not-a-key").await;
    assert_eq!(r.status, 401, "auth as every endpoint: {}", r.body);
}

#[tokio::test]
async fn a_wildcard_model_is_served_end_to_end_with_the_rest_of_its_name_upstream() {
    let gw = gateway().await;
    let r = gw.chat(body("wild/any-model")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["model"], "wild/any-model", "the gateway name the client sent");
    assert_eq!(gw.upstream_requests("any-model").await, 1);
    assert_eq!(gw.last_upstream_request("any-model").await["body"]["model"], "any-model");
    // The longest prefix wins: `wild/deep/*` sends `x`, not `deep/x`.
    let r = gw.chat(body("wild/deep/x")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!((gw.upstream_requests("x").await, gw.upstream_requests("deep/x").await), (1, 0));
    // The explicit entry wins over the wildcard it falls under.
    let r = gw.chat(body("wild/pinned")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (gw.upstream_requests("pinned-upstream").await, gw.upstream_requests("pinned").await),
        (1, 0)
    );
    // A name under a wildcard fails over like any model, each attempt by its own name.
    gw.script("broken", json!({"kind": "status", "status": 503})).await;
    let r = gw
        .chat(json!({"model": "wild/broken", "fallback_models": ["wild/fine"],
                           "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        attempts(&r.json()),
        [triple("wild/broken", "failed", "server_error"), triple("wild/fine", "served", "")]
    );
    let metrics = http_get(gw.node.addr, "/metrics", None).await.unwrap().body;
    for name in ["wild/broken", "wild/fine", "wild/any-model"] {
        assert!(metrics.contains(&format!("model=\"{name}\"")), "a series of its own: {name}");
    }
    // The wildcard itself is no model to call.
    let before = gw.upstream_total().await;
    let r = gw.chat(body("wild/*")).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "model");
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("`wild/*` is a wildcard"));
    assert_eq!(gw.upstream_total().await, before, "nothing went upstream");
}

#[tokio::test]
async fn an_allow_list_naming_a_wildcard_admits_every_name_under_it_and_nothing_else() {
    let gw = gateway().await;
    let key = gw.create_key(&["--allowed-models", "wild/*"]).await;
    assert_eq!(chat_as(&gw, &key, "wild/anything").await.status, 200);
    let r = chat_as(&gw, &key, PRIMARY).await;
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "model_not_allowed");
    let list = get(&gw, "/v1/models", &key).await.json();
    assert_eq!(ids(&list), ["wild/*", "wild/deep/*", "wild/pinned"]);
    assert_eq!(get(&gw, "/v1/models/wild/x", &key).await.status, 200);
    assert_eq!(get(&gw, "/v1/models/sim/primary", &key).await.status, 404, "not for this key");

    // A concrete name under a wildcard: that name alone, listed as the model it is.
    let key = gw.create_key(&["--allowed-models", "wild/only-this"]).await;
    let list = get(&gw, "/v1/models", &key).await.json();
    assert_eq!(ids(&list), ["wild/only-this"]);
    assert_eq!(by_id(&list, "wild/only-this").unwrap()["owned_by"], "sim-us");
    let r = chat_as(&gw, &key, "wild/only-this").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = chat_as(&gw, &key, "wild/other").await;
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(get(&gw, "/v1/models/wild/other", &key).await.status, 404);

    // The control plane takes names it serves, wildcards and names under them; no others.
    let out = gw.admin(&["keys", "create", "--name", "x", "--allowed-models", "nope/*"]).await;
    assert!(!out.success && out.stderr.contains("allowed_models[0]"), "{}", out.stderr);
}

#[tokio::test]
async fn a_default_chain_names_models_under_a_wildcard_but_never_the_wildcard() {
    let gw = gateway().await;
    let id = gw.key_id.clone();
    let out = gw.admin(&["keys", "set-defaults", &id, "--models", "wild/*"]).await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("failoverDefaults.models[0]") && out.stderr.contains("wildcard"),
        "{}",
        out.stderr
    );
    gw.script("first", json!({"kind": "status", "status": 503})).await;
    gw.set_defaults(&["--models", "wild/first,wild/second"]).await;
    let r = gw.chat(body("wild/first")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-served-model").as_deref(), Some("wild/second"));
}

#[tokio::test]
async fn an_embedding_model_in_a_chat_or_messages_chain_is_refused_naming_its_field_before_any_call()
 {
    let gw = gateway().await;
    let before = gw.upstream_total().await;
    let r = gw
        .chat(json!({"model": PRIMARY, "fallback_models": [SECONDARY, "sim/embed"],
                     "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    let error = &r.json()["error"];
    assert_eq!(error["param"], "fallback_models[1]");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("`sim/embed`") && message.contains("embedding"), "{message}");
    let r = gw.chat(body("sim/embed")).await;
    assert_eq!((r.status, &r.json()["error"]["param"]), (400, &json!("model")), "{}", r.body);
    // /v1/messages forms the same chain: the same refusal, in Anthropic's envelope.
    let messages = json!({"model": "sim/embed", "max_tokens": 16,
                          "messages": [{"role": "user", "content": "hi"}]});
    let r = gw.post("/v1/messages", Some(&gw.key), messages.to_string().as_bytes()).await;
    assert_eq!(r.status, 400, "{}", r.body);
    let error = &r.json()["error"];
    assert_eq!(
        (&error["type"], &error["param"]),
        (&json!("invalid_request_error"), &json!("model"))
    );
    assert!(error["message"].as_str().unwrap().contains("`sim/embed`"), "{}", r.body);
    assert_eq!(gw.upstream_total().await, before, "nothing went upstream");
}

#[tokio::test]
async fn apply_refuses_a_bad_type_dimensions_or_wildcard_naming_field_and_model_with_exit_1() {
    let gw = gateway().await;
    let file = gw.path().join("catalog.yaml");
    let good = std::fs::read_to_string(&file).unwrap();
    let embed = "    type: embedding\n    dimensions: 8\n";
    let wildcard = "  - name: wild/*\n    provider: sim-us\n";
    let cases = [
        // (what is changed, into what, the field refused, the model it names)
        (embed, "    type: embedding\n", "models[3].dimensions", "sim/embed"),
        (embed, "    dimensions: 8\n", "models[3].dimensions", "sim/embed"),
        (embed, "    type: embedding\n    dimensions: 0\n", "models[3].dimensions", "sim/embed"),
        (
            wildcard,
            "  - name: wild/*\n    provider: sim-us\n    upstream_model: x\n",
            "models[0].upstream_model",
            "wild/*",
        ),
    ];
    for (i, (from, to, field, model)) in cases.into_iter().enumerate() {
        let bad = good.replacen(from, to, 1);
        assert_ne!(bad, good, "case {i}: the fixture changed");
        let path = gw.path().join(format!("bad{i}.yaml"));
        std::fs::write(&path, bad).unwrap();
        let out = gw.admin(&["apply", "-f", &path.display().to_string()]).await;
        assert_eq!(out.code, Some(1), "case {i}: {}", out.stderr);
        assert!(
            out.stderr.contains(field) && out.stderr.contains(&format!("\"{model}\"")),
            "case {i}: {}",
            out.stderr
        );
    }
    for bad_name in ["wild/gpt-*", "*"] {
        let bad = good.replacen("  - name: wild/*\n", &format!("  - name: \"{bad_name}\"\n"), 1);
        let path = gw.path().join("bad-name.yaml");
        std::fs::write(&path, bad).unwrap();
        let out = gw.admin(&["apply", "-f", &path.display().to_string()]).await;
        assert_eq!(out.code, Some(1), "{bad_name}: {}", out.stderr);
        assert!(out.stderr.contains("models[0].name"), "{bad_name}: {}", out.stderr);
    }
}
