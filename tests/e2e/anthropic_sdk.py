"""Drives a Switchyard node's `/v1/messages` with the official `anthropic` Python SDK, as an
app or an agent would.

Usage: anthropic_sdk.py BASE_URL API_KEY CHECK PRIMARY FALLBACK
CHECK is one of plain, stream, tools, stream_tools, count_tokens, missing_max_tokens,
chain_failed; the chain is PRIMARY then FALLBACK (sent as the gateway's `fallback_models`
body field). Prints
one JSON line with what the SDK returned (the Rust test checks it, and what the provider
got, against the simulator); exits non-zero on the first failed assertion.
"""
import json
import sys

import anthropic

base_url, api_key, check, primary, fallback = sys.argv[1:6]

SYSTEM = "You are the e2e check of the Switchyard gateway."
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
# The gateway field that names the chain rides in the body next to Anthropic's.
CHAIN = {"fallback_models": [fallback]}


def client(retries=0):
    return anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=retries)


def report_of(headers, message):
    return {
        "served_header": headers.get("x-served-model"),
        "requested_header": headers.get("x-requested-model"),
        "request_id": headers.get("x-request-id"),
        "dropped_hints": headers.get("x-dropped-hints"),
        "model": message.model,
        "secureai": (message.model_extra or {}).get("secureai"),
    }


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def plain():
    raw = client().messages.with_raw_response.create(
        model=primary,
        max_tokens=64,
        system=SYSTEM,
        messages=[{"role": "user", "content": "Say hello"}],
        extra_body=CHAIN,
    )
    message = raw.parse()
    assert message.type == "message" and message.role == "assistant", message
    assert message.stop_reason == "end_turn", message.stop_reason
    assert text_of(message), message
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0, message.usage
    return {**report_of(raw.headers, message), "text": text_of(message)}


def stream():
    with client().messages.stream(
        model=primary,
        max_tokens=64,
        system=SYSTEM,
        messages=[{"role": "user", "content": "Say hello"}],
        extra_body=CHAIN,
    ) as s:
        headers = s.response.headers
        text = "".join(s.text_stream)
        final = s.get_final_message()
    # The SDK builds the final message from the events: it must be the text it streamed.
    assert text_of(final) == text, (text, final)
    assert final.stop_reason == "end_turn", final.stop_reason
    return {**report_of(headers, final), "text": text, "stop_reason": final.stop_reason}


def tools():
    c = client()
    question = {"role": "user", "content": "What is the weather in Paris?"}
    first = c.messages.create(
        model=primary,
        max_tokens=64,
        system=SYSTEM,
        tools=[WEATHER],
        messages=[question],
        extra_body=CHAIN,
    )
    calls = [b for b in first.content if b.type == "tool_use"]
    if calls:
        call = {"type": "tool_use", "id": calls[0].id, "name": calls[0].name, "input": calls[0].input}
        assert first.stop_reason == "tool_use", first.stop_reason
    else:
        # A model that answered in text: the app continues a conversation in which the tool
        # was called all the same (the translation of both blocks is what is checked).
        call = {"type": "tool_use", "id": "toolu_sdk_1", "name": "get_weather", "input": {"city": "Paris"}}
    raw = c.messages.with_raw_response.create(
        model=primary,
        max_tokens=64,
        system=SYSTEM,
        tools=[WEATHER],
        messages=[
            question,
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": call["id"], "content": "sunny, 21 degrees"}
            ]},
        ],
        extra_body=CHAIN,
    )
    second = raw.parse()
    assert second.stop_reason == "end_turn", second.stop_reason
    assert text_of(second), second
    return {
        **report_of(raw.headers, second),
        "first_stop_reason": first.stop_reason,
        "first_tool": calls[0].name if calls else None,
        "first_input": calls[0].input if calls else None,
        "tool_use_id": call["id"],
        "text": text_of(second),
    }


def stream_tools():
    with client().messages.stream(
        model=primary,
        max_tokens=64,
        system=SYSTEM,
        tools=[WEATHER],
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        extra_body=CHAIN,
    ) as s:
        headers = s.response.headers
        partial_json = "".join(
            e.delta.partial_json
            for e in s
            if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
        )
        final = s.get_final_message()
    calls = [b for b in final.content if b.type == "tool_use"]
    assert len(calls) == 1, final
    # The SDK builds the call's input from the streamed JSON pieces: they must agree.
    assert json.loads(partial_json) == calls[0].input, (partial_json, final)
    return {
        **report_of(headers, final),
        "stop_reason": final.stop_reason,
        "tool": calls[0].name,
        "tool_use_id": calls[0].id,
        "input": calls[0].input,
    }


def count_tokens():
    raw = client().messages.with_raw_response.count_tokens(
        model=primary,
        system=SYSTEM,
        messages=[{"role": "user", "content": "Count these five words"}],
        extra_body=CHAIN,
    )
    counted = raw.parse()
    assert counted.input_tokens > 0, counted
    return {
        "input_tokens": counted.input_tokens,
        "estimated": (counted.model_extra or {}).get("estimated"),
        "request_id": raw.headers.get("x-request-id"),
    }


def missing_max_tokens():
    try:
        # NOT_GIVEN leaves the field out of the body, as a hand-built request would; a
        # timeout of our own, as the SDK otherwise derives one from max_tokens.
        client().messages.create(
            model=primary,
            max_tokens=anthropic.NOT_GIVEN,
            timeout=30,
            messages=[{"role": "user", "content": "Say hello"}],
            extra_body=CHAIN,
        )
    except anthropic.BadRequestError as e:
        assert e.status_code == 400, e.status_code
        assert e.body["type"] == "error", e.body
        assert e.body["error"]["type"] == "invalid_request_error", e.body
        assert "max_tokens" in e.body["error"]["message"], e.body
        return {"status": e.status_code, "error": e.body["error"]}
    raise SystemExit("expected a BadRequestError")


def chain_failed():
    # The SDK's default retries (2): the node's `x-should-retry: false` must stop them.
    try:
        client(retries=2).messages.create(
            model=primary,
            max_tokens=64,
            messages=[{"role": "user", "content": "Say hello"}],
            extra_body=CHAIN,
        )
    except anthropic.APIStatusError as e:
        assert e.body["type"] == "error", e.body
        return {
            "class": type(e).__name__,
            "status": e.status_code,
            "should_retry": e.response.headers.get("x-should-retry"),
            "request_id": e.response.headers.get("x-request-id"),
            "error": e.body["error"],
        }
    raise SystemExit("expected an APIStatusError")


CHECKS = {
    "plain": plain,
    "stream": stream,
    "tools": tools,
    "stream_tools": stream_tools,
    "count_tokens": count_tokens,
    "missing_max_tokens": missing_max_tokens,
    "chain_failed": chain_failed,
}

print(json.dumps({"check": check, **CHECKS[check]()}))
