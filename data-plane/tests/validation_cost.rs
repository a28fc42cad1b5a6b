//! What structured-output validation adds to a node's CPU per request (docs/BENCHMARKS.md,
//! "Structured output validation"): a 2 KiB answer checked against a 20-property schema,
//! and the schema compiled, with the node's allocator. A benchmark, ignored by default:
//!
//! `cargo test --release -p switchyard-data-plane --test validation_cost -- --ignored --nocapture`
#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::hint::black_box;
use std::time::Instant;

use serde_json::value::RawValue;
use serde_json::{Value, json};

use switchyard_data_plane::providers::{Completion, Fields, Usage};
use switchyard_data_plane::structured::{Compiled, OutputCheck};

// The node's allocator (cli/src/main.rs): the check allocates a tree of the answer.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A strict 20-property schema (every property required, no others), and a 2 KiB answer
/// that satisfies it.
fn schema_and_answer() -> (Value, String) {
    let mut properties = serde_json::Map::new();
    let mut answer = serde_json::Map::new();
    for i in 0..20 {
        let (schema, value) = match i % 5 {
            0 => (json!({"type": "string"}), json!("x".repeat(312))),
            1 => (json!({"type": "integer", "minimum": 0}), json!(i * 1000)),
            2 => (json!({"type": "number"}), json!(f64::from(i) * 1.5)),
            3 => (json!({"type": "string", "enum": ["low", "medium", "high"]}), json!("medium")),
            _ => (
                json!({"type": "array", "items": {"type": "string"}}),
                json!(["alpha".repeat(8), "beta".repeat(8), "gamma".repeat(8)]),
            ),
        };
        properties.insert(format!("field_{i:02}"), schema);
        answer.insert(format!("field_{i:02}"), value);
    }
    let required: Vec<&String> = properties.keys().collect();
    let schema = json!({"type": "object", "properties": properties, "required": required,
                        "additionalProperties": false});
    (schema, Value::Object(answer).to_string())
}

/// Median µs per call of `f` over 7 rounds of `iterations`.
fn per_call(iterations: u32, f: &dyn Fn()) -> f64 {
    for _ in 0..iterations / 10 {
        f();
    }
    let mut rounds: Vec<f64> = (0..7)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..iterations {
                f();
            }
            started.elapsed().as_secs_f64() * 1e6 / f64::from(iterations)
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[rounds.len() / 2]
}

#[test]
#[ignore = "a benchmark: run in release, see docs/BENCHMARKS.md"]
fn validation_cost_per_request() {
    let (schema, content) = schema_and_answer();
    let format = RawValue::from_string(
        json!({"type": "json_schema",
               "json_schema": {"name": "report", "strict": true, "schema": schema}})
        .to_string(),
    )
    .unwrap();
    // The upstream's answer as an OpenAI-compatible provider sends it: forwarded verbatim.
    let body = json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1,
        "model": "m", "choices": [{"index": 0, "finish_reason": "stop",
        "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 600, "total_tokens": 610}})
    .to_string();
    let completion = Completion::new(
        Fields::Verbatim { bytes: body.clone().into(), model: None },
        Usage::default(),
    );
    let cache = Compiled::default();
    let check = cache.get(Some(&format)).unwrap().unwrap();
    assert!(check.check(completion.choices()).is_ok());

    let compile = per_call(2_000, &|| {
        black_box(OutputCheck::compile(Some(black_box(&format))).unwrap());
    });
    let kept = per_call(20_000, &|| {
        black_box(cache.get(Some(black_box(&format))).unwrap());
    });
    let validate = per_call(20_000, &|| {
        black_box(check.check(black_box(&completion).choices())).unwrap();
    });
    println!(
        "answer {} bytes (content {} bytes), schema {} bytes, 20 properties, medians of 7 rounds:\n\
         check the answer       {validate:6.2} µs\n\
         find the kept schema   {kept:6.2} µs   -> added per request, schema seen before: {:6.2} µs\n\
         compile the schema     {compile:6.2} µs   -> added per request, schema new:         {:6.2} µs",
        body.len(),
        content.len(),
        format.get().len(),
        kept + validate,
        compile + validate,
    );
}
