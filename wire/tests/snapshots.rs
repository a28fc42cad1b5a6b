//! Snapshot tests of every translation, per format pair and both directions (Gemini, a
//! provider format only, from the core and into it): each snapshot holds the core form in
//! the middle and what the other format gets, so a changed translation shows up as a
//! reviewed diff (tests/snapshots/*.snap).
//!
//! To accept changed snapshots, review the diff the failing test prints, then run
//! `INSTA_UPDATE=always cargo nextest run -p switchyard-wire --test snapshots` and review
//! `git diff wire/tests/snapshots` before committing. With `CI=true` insta writes nothing and
//! a changed or missing snapshot fails.

#![allow(clippy::unwrap_used)]

use insta::assert_json_snapshot;
use serde_json::{Value, json};

use switchyard_wire::core::{Event, Request};
use switchyard_wire::{Refusal, chat, gemini, messages, responses};

fn value(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

fn bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap()
}

// === Messages request → core → Chat body ===

fn messages_to_chat(body: &Value, reasoning_allowed: bool) -> Value {
    let core = messages::parse_request(&bytes(body)).unwrap();
    let (chat, hints) = chat::request_body(&core, reasoning_allowed);
    json!({"core": core, "chat": value(&chat), "dropped": hints})
}

#[test]
fn messages_request_to_chat_plain() {
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 1024,
        "system": "You are terse.", "messages": [{"role": "user", "content": "Hello"}],
        "stop_sequences": ["\n\nHuman:"], "temperature": 0.7, "top_k": 40});
    assert_json_snapshot!(messages_to_chat(&body, false));
}

#[test]
fn messages_request_to_chat_streaming() {
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 256, "stream": true,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Count to 3"}]}]});
    assert_json_snapshot!(messages_to_chat(&body, false));
}

#[test]
fn messages_request_to_chat_tools_round_trip() {
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 1024,
    "tools": [{"name": "get_weather", "description": "Get the current weather in a given location",
        "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
    "messages": [
        {"role": "user", "content": "What's the weather like in San Francisco?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "I'll check."},
            {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "get_weather", "input": {"location": "San Francisco, CA"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01A09q90qw90lq917835lq9", "content": "15 degrees"},
            {"type": "text", "text": "And tomorrow?"}]}
    ]});
    assert_json_snapshot!(messages_to_chat(&body, false));
}

#[test]
fn messages_request_to_chat_images() {
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 1024, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQSkZJRg=="}},
        {"type": "image", "source": {"type": "url", "url": "https://upload.wikimedia.org/wikipedia/commons/a/a7/Camponotus_flavomarginatus_ant.jpg"}},
        {"type": "text", "text": "Compare these images."}]}]});
    assert_json_snapshot!(messages_to_chat(&body, false));
}

#[test]
fn messages_request_to_chat_claude_code() {
    let body: Value =
        serde_json::from_str(include_str!("fixtures/claude_code_request.json")).unwrap();
    assert_json_snapshot!(
        "messages_request_to_chat_claude_code_reasoning_model",
        messages_to_chat(&body, true)
    );
    // For a model without reasoning, the thinking budget is a dropped hint too.
    let other = messages_to_chat(&body, false);
    assert_json_snapshot!("messages_request_to_chat_claude_code_dropped", other["dropped"]);
}

// === Chat request → core → Messages body ===

fn chat_to_messages(body: &Value) -> Value {
    let core = chat::parse_request(&bytes(body)).unwrap();
    let messages = messages::request_body(&core, "claude-sonnet-4-5-20250929", 4096).unwrap();
    json!({"core": core, "messages": value(&messages)})
}

#[test]
fn chat_request_to_messages_plain() {
    let body = json!({"model": "gpt-4o", "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello!"}],
        "temperature": 1.2, "stop": "END", "user": "user-1234"});
    assert_json_snapshot!(chat_to_messages(&body));
}

#[test]
fn chat_request_to_messages_streaming() {
    let body = json!({"model": "gpt-4o", "stream": true, "stream_options": {"include_usage": true},
        "max_completion_tokens": 300, "reasoning_effort": "medium",
        "messages": [{"role": "developer", "content": "Think first."}, {"role": "user", "content": "Why is the sky blue?"}]});
    assert_json_snapshot!(chat_to_messages(&body));
}

#[test]
fn chat_request_to_messages_tools_round_trip() {
    let body = json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": "What's the weather in Paris and Rome?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
            {"id": "call_def", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "15 C"},
        {"role": "tool", "tool_call_id": "call_def", "content": [{"type": "text", "text": "21 C"}]},
        {"role": "user", "content": "Which is warmer?"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}, "strict": true}}],
        "tool_choice": "required", "parallel_tool_calls": true});
    assert_json_snapshot!(chat_to_messages(&body));
}

#[test]
fn chat_request_to_messages_images() {
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is in these images?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "https://upload.wikimedia.org/a.jpg", "detail": "high"}}]}]});
    assert_json_snapshot!(chat_to_messages(&body));
}

// === Chat completion → core → Messages response, and back ===

fn completion_to_message(body: &Value) -> Value {
    let core = chat::parse_completion(&bytes(body)).unwrap();
    let message = messages::response_body(&core, "gpt-4o");
    json!({"core": core, "messages": value(&message)})
}

fn message_to_completion(body: &Value) -> Value {
    let core = messages::parse_response(&bytes(body)).unwrap();
    let completion = chat::completion_body_at(&core, "claude-sonnet-4-5", 1_700_000_000);
    json!({"core": core, "chat": value(&completion)})
}

#[test]
fn chat_completion_to_messages_response_plain() {
    let body = json!({"id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT", "object": "chat.completion",
        "created": 1741569952, "model": "gpt-4o-2024-08-06",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello! How can I help?", "refusal": null, "annotations": []},
            "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0}},
        "service_tier": "default", "system_fingerprint": "fp_50cad350e4"});
    assert_json_snapshot!(completion_to_message(&body));
}

#[test]
fn chat_completion_to_messages_response_tools() {
    let body = json!({"id": "chatcmpl-abc123", "object": "chat.completion", "created": 1699896916, "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_abc123", "type": "function", "function": {"name": "get_current_weather", "arguments": "{\n\"location\": \"Boston, MA\"\n}"}}]},
            "logprobs": null, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 82, "completion_tokens": 17, "total_tokens": 99,
            "prompt_tokens_details": {"cached_tokens": 64}}});
    assert_json_snapshot!(completion_to_message(&body));
}

#[test]
fn messages_response_to_chat_completion_plain() {
    let body = json!({"id": "msg_013Zva2CMHLNnXjNJJKqJ2EF", "type": "message", "role": "assistant",
        "model": "claude-sonnet-4-5-20250929", "content": [{"type": "text", "text": "Hi! My name is Claude."}],
        "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": 2095, "output_tokens": 503, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}});
    assert_json_snapshot!(message_to_completion(&body));
}

#[test]
fn messages_response_to_chat_completion_tools_and_thinking() {
    let body = json!({"id": "msg_01Aq9w938a90dw8q", "type": "message", "role": "assistant",
        "model": "claude-sonnet-4-5-20250929", "content": [
            {"type": "thinking", "thinking": "The user wants the weather.", "signature": "EqQBCkYIBxgC"},
            {"type": "text", "text": "I'll check the weather."},
            {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "get_weather", "input": {"location": "San Francisco, CA"}}],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 100, "output_tokens": 80, "cache_creation_input_tokens": 1200, "cache_read_input_tokens": 3000}});
    assert_json_snapshot!(message_to_completion(&body));
}

// === Chat chunk stream → core → Messages frames ===

fn frames(frames: &[messages::Frame]) -> Vec<Value> {
    frames.iter().map(|f| json!({"event": f.event, "data": value(&f.data)})).collect()
}

fn chunks_to_frames(chunks: &[Value]) -> Value {
    let mut decoder = chat::ChunkDecoder::new();
    let mut encoder = messages::Encoder::new("gpt-4o");
    let mut events: Vec<Event> = Vec::new();
    let mut out = Vec::new();
    for chunk in chunks {
        for event in decoder.decode(&bytes(chunk)).unwrap() {
            events.push(event.clone());
            encoder.push(event, &mut out);
        }
    }
    encoder.finish(&mut out);
    json!({"core": events, "messages": frames(&out)})
}

fn chunk(delta: Value, finish: Value) -> Value {
    json!({"id": "chatcmpl-123", "object": "chat.completion.chunk", "created": 1694268190,
        "model": "gpt-4o-mini", "system_fingerprint": "fp_44709d6fcb",
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
}

fn usage_chunk() -> Value {
    json!({"id": "chatcmpl-123", "object": "chat.completion.chunk", "created": 1694268190,
        "model": "gpt-4o-mini", "choices": [],
        "usage": {"prompt_tokens": 17, "completion_tokens": 9, "total_tokens": 26,
            "prompt_tokens_details": {"cached_tokens": 0}}})
}

#[test]
fn chat_chunks_to_messages_frames_plain() {
    let chunks = [
        chunk(json!({"role": "assistant", "content": "", "refusal": null}), Value::Null),
        chunk(json!({"content": "Hello"}), Value::Null),
        chunk(json!({"content": " there"}), Value::Null),
        chunk(json!({}), json!("stop")),
        usage_chunk(),
    ];
    assert_json_snapshot!(chunks_to_frames(&chunks));
}

#[test]
fn chat_chunks_to_messages_frames_tools() {
    let chunks = [
        chunk(
            json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0, "id": "call_DdmO9pD3xa9XTPNJ32zg2hcA",
            "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"location\""}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": ": \"Paris\"}"}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 1, "id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}),
            Value::Null,
        ),
        chunk(json!({}), json!("tool_calls")),
        usage_chunk(),
    ];
    assert_json_snapshot!(chunks_to_frames(&chunks));
}

// === Messages event stream → core → Chat chunks ===

fn sse_to_chunks(stream: &[(&str, Value)]) -> Value {
    let mut decoder = messages::Decoder::new();
    let mut encoder = chat::Encoder::at("claude-sonnet-4-5", true, 1_700_000_000);
    let mut events: Vec<Event> = Vec::new();
    let mut out = Vec::new();
    for (event, data) in stream {
        for event in decoder.decode(event, &bytes(data)).unwrap() {
            events.push(event.clone());
            encoder.push(event, &mut out);
        }
    }
    let chunks: Vec<Value> = out.iter().map(|c| value(c)).collect();
    json!({"core": events, "chat": chunks})
}

fn message_start() -> (&'static str, Value) {
    (
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY",
        "type": "message", "role": "assistant", "content": [], "model": "claude-sonnet-4-5-20250929",
        "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": 472, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 2}}}),
    )
}

#[test]
fn messages_events_to_chat_chunks_plain() {
    let stream = [
        message_start(),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        ("ping", json!({"type": "ping"})),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "!"}}),
        ),
        ("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 15}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ];
    assert_json_snapshot!(sse_to_chunks(&stream));
}

#[test]
fn messages_events_to_chat_chunks_thinking_and_tools() {
    let stream = [
        message_start(),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "I need the weather."}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM"}}),
        ),
        ("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Checking."}}),
        ),
        ("content_block_stop", json!({"type": "content_block_stop", "index": 1})),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "name": "get_weather", "input": {}}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"location\": \"San Fra"}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "ncisco, CA\"}"}}),
        ),
        ("content_block_stop", json!({"type": "content_block_stop", "index": 2})),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 89}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ];
    assert_json_snapshot!(sse_to_chunks(&stream));
}

// === Errors ===

fn refusals(parse: fn(&[u8]) -> Result<Request, Refusal>, bodies: &[Value]) -> Value {
    bodies
        .iter()
        .map(|body| {
            let refusal = parse(&bytes(body)).unwrap_err();
            json!({"field": refusal.field, "message": refusal.message})
        })
        .collect()
}

#[test]
fn messages_request_refusals() {
    let user = |content: Value| json!({"role": "user", "content": content});
    let bodies = [
        json!({"model": "m", "messages": [user(json!("hi"))]}),
        json!({"model": "m", "max_tokens": 10, "messages": "hi"}),
        json!({"model": "m", "max_tokens": 10, "messages": [user(json!("a")), {"role": "assistant", "content": "b"},
            user(json!([{"type": "document", "source": {}}]))]}),
        json!({"model": "m", "max_tokens": 10, "messages": [user(json!("a")), {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]}, user(json!("b")),
            user(json!([{"type": "tool_result", "tool_use_id": "toolu_2"}]))]}),
        json!({"model": "m", "max_tokens": 10, "messages": [{"role": "assistant", "content": "hi"}]}),
        json!({"model": "m", "max_tokens": 10, "messages": [user(json!("hi"))], "temperature": 1.5}),
        json!({"model": "m", "max_tokens": 10, "messages": [user(json!("hi"))], "thinking": {"type": "enabled", "budget_tokens": 100}}),
    ];
    assert_json_snapshot!(refusals(messages::parse_request, &bodies));
}

#[test]
fn chat_request_refusals() {
    let bodies = [
        json!({"model": "m"}),
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}),
        json!({"model": "m", "messages": [{"role": "tool", "tool_call_id": "c", "content": "x"}]}),
        json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "file", "file": {}}]}]}),
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 3}),
    ];
    assert_json_snapshot!(refusals(chat::parse_request, &bodies));
}

#[test]
fn messages_errors_and_stream_errors() {
    let statuses = [400, 401, 403, 404, 413, 429, 500, 502, 529];
    let bodies: Vec<Value> = statuses
        .iter()
        .map(|s| json!({"status": s, "body": value(&messages::error_body(*s, "message"))}))
        .collect();
    let mut decoder = messages::Decoder::new();
    let in_band = decoder
        .decode(
            "error",
            br#"{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#,
        )
        .unwrap_err();
    assert_json_snapshot!(
        json!({"error_bodies": bodies, "in_band_error": {"field": in_band.field, "message": in_band.message}})
    );
}

// === Gemini (a provider): requests from Messages and Chat, answers and streams back ===

fn to_gemini(core: &Request) -> Value {
    value(&gemini::request_body(core, Some(8192), None).unwrap())
}

#[test]
fn messages_request_to_gemini_claude_code() {
    let body: Value =
        serde_json::from_str(include_str!("fixtures/claude_code_request.json")).unwrap();
    let core = messages::parse_request(&bytes(&body)).unwrap();
    assert_json_snapshot!(to_gemini(&core));
}

#[test]
fn chat_request_to_gemini_tools_round_trip_and_images() {
    let body = json!({"model": "gemini-2.5-flash", "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": [{"type": "text", "text": "What is this, and what's the weather in Paris?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_r1_0__thought__CiQBjz1rX-_a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_r1_0__thought__CiQBjz1rX-_a", "content": "15 C"}],
        "tools": [{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
        "tool_choice": "auto", "max_tokens": 500, "temperature": 0.4, "reasoning_effort": "low"});
    let core = chat::parse_request(&bytes(&body)).unwrap();
    assert_json_snapshot!(json!({"core": core, "gemini": to_gemini(&core)}));
}

fn gemini_response() -> Value {
    json!({"candidates": [{"content": {"role": "model", "parts": [
            {"text": "I'll look that up.", "thoughtSignature": "CiQBjz1rX+/a"},
            {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": "CiQBjz1rX+/a"}]},
        "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 52, "candidatesTokenCount": 14, "totalTokenCount": 120, "thoughtsTokenCount": 54},
        "modelVersion": "gemini-2.5-flash", "responseId": "fVEkaPHtNOmXz7IPzaOd4Ag"})
}

#[test]
fn gemini_response_to_messages_and_chat() {
    let core = gemini::parse_response(&bytes(&gemini_response())).unwrap();
    let message = messages::response_body(&core, "gemini-flash");
    let completion = chat::completion_body_at(&core, "gemini-flash", 1_700_000_000);
    assert_json_snapshot!(
        json!({"core": core, "messages": value(&message), "chat": value(&completion)})
    );
}

#[test]
fn gemini_stream_to_messages_frames_and_chat_chunks() {
    let stream = [
        json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "The weather"}]}, "index": 0}],
            "usageMetadata": {"promptTokenCount": 8, "totalTokenCount": 8}, "modelVersion": "gemini-2.5-flash", "responseId": "r1"}),
        json!({"candidates": [{"content": {"role": "model", "parts": [{"text": " needs a lookup."},
            {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": "Zm9v"}]}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 8, "candidatesTokenCount": 12, "totalTokenCount": 20}, "modelVersion": "gemini-2.5-flash", "responseId": "r1"}),
    ];
    let mut decoder = gemini::Decoder::new();
    let mut frames_out = Vec::new();
    let mut chunks_out = Vec::new();
    let mut anthropic = messages::Encoder::new("gemini-flash");
    let mut openai = chat::Encoder::at("gemini-flash", true, 1_700_000_000);
    let mut events = Vec::new();
    for data in &stream {
        for event in decoder.decode(&bytes(data)).unwrap() {
            events.push(event.clone());
            anthropic.push(event.clone(), &mut frames_out);
            openai.push(event, &mut chunks_out);
        }
    }
    anthropic.finish(&mut frames_out);
    assert!(decoder.finished());
    let chunks: Vec<Value> = chunks_out.iter().map(|c| value(c)).collect();
    assert_json_snapshot!(json!({"core": events, "messages": frames(&frames_out), "chat": chunks}));
}

#[test]
fn gemini_errors() {
    let blocked =
        gemini::parse_response(br#"{"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}}"#)
            .unwrap_err();
    let error = br#"[{"error": {"code": 429, "message": "Resource has been exhausted (e.g. check quota).", "status": "RESOURCE_EXHAUSTED"}}]"#;
    let parsed = gemini::parse_error(error).unwrap();
    let web_image = chat::parse_request(
        br#"{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}]}]}"#,
    )
    .unwrap();
    let unfetchable = gemini::request_body(&web_image, Some(100), None).unwrap_err();
    assert_json_snapshot!(json!({
        "blocked": {"field": blocked.field, "message": blocked.message},
        "error": {"code": parsed.code, "status": parsed.status, "message": parsed.message},
        "web_image": {"field": unfetchable.field, "message": unfetchable.message},
    }));
}

// === Responses request → core → Chat body ===

fn responses_to_chat(body: &Value) -> Value {
    let core = responses::parse_request(&bytes(body)).unwrap();
    let (chat, hints) = chat::request_body(&core, true);
    json!({"core": core, "chat": value(&chat), "dropped": hints})
}

#[test]
fn responses_request_to_chat_plain() {
    let body = json!({"model": "gpt-4.1", "instructions": "Talk like a pirate.",
        "input": "Are semicolons optional in JavaScript?", "max_output_tokens": 200,
        "temperature": 0.5, "top_p": 0.9, "user": "user-1234", "metadata": {"team": "web"}, "store": false});
    assert_json_snapshot!(responses_to_chat(&body));
}

#[test]
fn responses_request_to_chat_tools_round_trip_and_images() {
    let body = json!({"model": "gpt-4.1", "stream": true,
    "tools": [{"type": "function", "name": "get_weather", "description": "Get current temperature for a given location.",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"], "additionalProperties": false},
        "strict": true}],
    "tool_choice": {"type": "function", "name": "get_weather"},
    "input": [
        {"role": "user", "content": [
            {"type": "input_text", "text": "What's the weather where this photo was taken?"},
            {"type": "input_image", "image_url": "https://upload.wikimedia.org/wikipedia/commons/a/a7/Camponotus_flavomarginatus_ant.jpg"},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]},
        {"type": "function_call", "id": "fc_12345xyz", "call_id": "call_12345xyz", "name": "get_weather", "arguments": "{\"location\":\"Paris, France\"}"},
        {"type": "function_call_output", "call_id": "call_12345xyz", "output": "18 degrees"}
    ]});
    assert_json_snapshot!(responses_to_chat(&body));
}

#[test]
fn responses_request_to_chat_structured_output() {
    let body = json!({"model": "gpt-4o-2024-08-06", "input": [
            {"role": "system", "content": "Extract the event information."},
            {"role": "user", "content": "Alice and Bob are going to a science fair on Friday."}],
        "text": {"format": {"type": "json_schema", "name": "calendar_event", "strict": true,
            "schema": {"type": "object", "properties": {"name": {"type": "string"}, "date": {"type": "string"},
                "participants": {"type": "array", "items": {"type": "string"}}},
                "required": ["name", "date", "participants"], "additionalProperties": false}}}});
    assert_json_snapshot!(responses_to_chat(&body));
}

#[test]
fn responses_request_to_chat_codex() {
    let body: Value = serde_json::from_str(include_str!("fixtures/codex_request.json")).unwrap();
    assert_json_snapshot!(responses_to_chat(&body));
}

#[test]
fn responses_request_to_messages_codex() {
    let body: Value = serde_json::from_str(include_str!("fixtures/codex_request.json")).unwrap();
    let core = responses::parse_request(&bytes(&body)).unwrap();
    let out = messages::request_body(&core, "claude-sonnet-4-5", 4096).unwrap();
    assert_json_snapshot!(value(&out));
}

#[test]
fn responses_request_refusals() {
    let bodies = [
        json!({"model": "m", "input": "hi", "previous_response_id": "resp_123"}),
        json!({"model": "m"}),
        json!({"model": "m", "input": [{"role": "user", "content": "a"}, {"type": "item_reference", "id": "msg_1"}]}),
        json!({"model": "m", "input": [{"role": "user", "content": "a"},
            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_2", "output": "x"}]}),
        json!({"model": "m", "input": "hi", "max_output_tokens": 0}),
        json!({"model": "m", "input": "hi", "text": {"format": {"type": "grammar"}}}),
        json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]}),
        json!({"model": "m", "input": "hi", "tool_choice": {"type": "function", "name": "nope"}}),
        json!({"model": "m", "input": "hi", "reasoning": {"effort": "extreme"}}),
        json!({"model": "m", "input": "hi", "temperature": 2.5}),
    ];
    assert_json_snapshot!(refusals(responses::parse_request, &bodies));
}

// === Chat completion → core → Response object ===

#[test]
fn chat_completion_to_response_plain_and_tools() {
    let plain = json!({"id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT", "object": "chat.completion",
        "created": 1741569952, "model": "gpt-4o-2024-08-06",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello! How can I help?", "refusal": null},
            "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29,
            "prompt_tokens_details": {"cached_tokens": 4}}});
    let tools = json!({"id": "chatcmpl-abc123", "object": "chat.completion", "created": 1699896916, "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_abc123", "type": "function", "function": {"name": "get_current_weather", "arguments": "{\"location\": \"Boston, MA\"}"}}]},
            "logprobs": null, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 82, "completion_tokens": 17, "total_tokens": 99}});
    let cut = json!({"id": "chatcmpl-cut", "object": "chat.completion", "created": 1699896916, "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Once upon a"},
            "logprobs": null, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}});
    let out: Vec<Value> = [plain, tools, cut]
        .iter()
        .map(|body| {
            let core = chat::parse_completion(&bytes(body)).unwrap();
            value(&responses::response_body_at(&core, "openai/gpt-4o", 1_700_000_000))
        })
        .collect();
    assert_json_snapshot!(out);
}

// === Chat chunk stream → core → Responses events ===

fn chunks_to_responses(chunks: &[Value]) -> Value {
    let mut decoder = chat::ChunkDecoder::new();
    let mut encoder = responses::Encoder::at("openai/gpt-4o", 1_700_000_000);
    let mut out = Vec::new();
    for chunk in chunks {
        for event in decoder.decode(&bytes(chunk)).unwrap() {
            encoder.push(event, &mut out);
        }
    }
    encoder.finish(&mut out);
    json!(frames(&out))
}

#[test]
fn chat_chunks_to_responses_events_plain() {
    let chunks = [
        chunk(json!({"role": "assistant", "content": "", "refusal": null}), Value::Null),
        chunk(json!({"content": "Hello"}), Value::Null),
        chunk(json!({"content": " there"}), Value::Null),
        chunk(json!({}), json!("stop")),
        usage_chunk(),
    ];
    assert_json_snapshot!(chunks_to_responses(&chunks));
}

#[test]
fn chat_chunks_to_responses_events_tools() {
    let chunks = [
        chunk(json!({"role": "assistant", "content": "Let me look."}), Value::Null),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_DdmO9pD3xa9XTPNJ32zg2hcA",
            "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"location\""}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": ": \"Paris\"}"}}]}),
            Value::Null,
        ),
        chunk(json!({}), json!("tool_calls")),
        usage_chunk(),
    ];
    assert_json_snapshot!(chunks_to_responses(&chunks));
}

#[test]
fn a_responses_stream_that_breaks_ends_with_response_failed() {
    let mut encoder = responses::Encoder::at("openai/gpt-4o", 1_700_000_000);
    let mut out = Vec::new();
    encoder.push(Event::Start { id: "chatcmpl-1".into(), model: "gpt-4o".into() }, &mut out);
    encoder.push(Event::TextDelta("Hel".into()), &mut out);
    // A continuation's start adds no second `response.created`.
    encoder.push(Event::Start { id: "chatcmpl-2".into(), model: "gpt-4o".into() }, &mut out);
    encoder.fail("stream_broken", "The upstream model failed mid-stream.", &mut out);
    encoder.finish(&mut out);
    assert_json_snapshot!(frames(&out));
}
