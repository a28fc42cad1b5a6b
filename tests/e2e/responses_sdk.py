"""Drives a Switchyard node's `/v1/responses` with the official `openai` Python SDK, as an
app or an agent would.

Usage: responses_sdk.py BASE_URL API_KEY CHECK PRIMARY FALLBACK
CHECK is one of plain, stream, stream_helper, tools, chain_failed, previous_response_id; the
chain is PRIMARY then FALLBACK (sent as the gateway's `fallback_models` body field). Prints
one JSON line with what the SDK returned (the Rust test checks it, and what the provider
got, against the simulator); exits non-zero on the first failed assertion.
"""
import json
import sys

import openai

base_url, api_key, check, primary, fallback = sys.argv[1:6]

INSTRUCTIONS = "You are the e2e check of the Switchyard gateway."
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
# The gateway field that names the chain rides in the body next to OpenAI's.
CHAIN = {"fallback_models": [fallback]}


def client(retries=0):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=retries)


def report_of(headers, response):
    return {
        "served_header": headers.get("x-served-model"),
        "requested_header": headers.get("x-requested-model"),
        "request_id": headers.get("x-request-id"),
        "dropped_hints": headers.get("x-dropped-hints"),
        "model": response.model,
        "secureai": (response.model_extra or {}).get("secureai"),
    }


def plain():
    raw = client().responses.with_raw_response.create(
        model=primary,
        instructions=INSTRUCTIONS,
        input="Say hello",
        max_output_tokens=64,
        store=False,
        extra_body=CHAIN,
    )
    response = raw.parse()
    assert response.object == "response" and response.status == "completed", response
    assert response.id.startswith("resp_"), response.id
    assert response.output[0].type == "message" and response.output[0].role == "assistant", response
    assert response.output_text, response
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0, response.usage
    total = response.usage.input_tokens + response.usage.output_tokens
    assert response.usage.total_tokens == total, response.usage
    return {**report_of(raw.headers, response), "text": response.output_text}


def stream():
    events = client().responses.create(
        model=primary,
        instructions=INSTRUCTIONS,
        input=[{"role": "user", "content": "Say hello"}],
        max_output_tokens=64,
        store=False,
        stream=True,
        extra_body=CHAIN,
    )
    headers = events.response.headers
    seen = list(events)
    types = [e.type for e in seen]
    assert types[:2] == ["response.created", "response.in_progress"], types
    assert types[-1] == "response.completed", types
    numbers = [e.sequence_number for e in seen]
    assert numbers == list(range(len(seen))), numbers
    text = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
    final = seen[-1].response
    # The completed response holds the text that streamed.
    assert final.output_text == text, (text, final)
    assert final.usage.output_tokens > 0, final.usage
    created = seen[0].response
    return {
        **report_of(headers, created),
        "text": text,
        "types": types,
        "created": types.count("response.created"),
        "status": final.status,
    }


def stream_helper():
    # The SDK's own stream helper builds the response from the events and checks their
    # order as it goes (an output item before its deltas, each delta's content part).
    with client().responses.stream(
        model=primary,
        instructions=INSTRUCTIONS,
        input="Say hello",
        extra_body=CHAIN,
    ) as s:
        text = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        final = s.get_final_response()
    assert final.output_text == text, (text, final)
    return {"text": text, "model": final.model, "status": final.status}


def tools():
    c = client()
    question = {"role": "user", "content": "What is the weather in Paris?"}
    first = c.responses.create(
        model=primary,
        instructions=INSTRUCTIONS,
        input=[question],
        tools=[WEATHER],
        extra_body=CHAIN,
    )
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1, first
    call = calls[0]
    # The app sends the conversation back whole (nothing is stored): the answer's items as
    # they came, then the call's output.
    raw = c.responses.with_raw_response.create(
        model=primary,
        instructions=INSTRUCTIONS,
        input=[
            question,
            *[o.model_dump(exclude_none=True) for o in first.output],
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 degrees"},
        ],
        tools=[WEATHER],
        store=False,
        extra_body=CHAIN,
    )
    second = raw.parse()
    assert second.status == "completed", second
    assert second.output_text, second
    return {
        **report_of(raw.headers, second),
        "first_tool": call.name,
        "first_arguments": json.loads(call.arguments),
        "call_id": call.call_id,
        "text": second.output_text,
    }


def chain_failed():
    # The SDK's default retries (2): the node's `x-should-retry: false` must stop them.
    try:
        client(retries=2).responses.create(model=primary, input="Say hello", extra_body=CHAIN)
    except openai.APIStatusError as e:
        return {
            "class": type(e).__name__,
            "status": e.status_code,
            "should_retry": e.response.headers.get("x-should-retry"),
            "code": e.code,
            "error": e.body,
        }
    raise SystemExit("expected an APIStatusError")


def previous_response_id():
    try:
        client().responses.create(
            model=primary, input="And then?", previous_response_id="resp_123", extra_body=CHAIN
        )
    except openai.BadRequestError as e:
        assert e.param == "previous_response_id", e.body
        return {"status": e.status_code, "param": e.param, "message": e.message}
    raise SystemExit("expected a BadRequestError")


CHECKS = {
    "plain": plain,
    "stream": stream,
    "stream_helper": stream_helper,
    "tools": tools,
    "chain_failed": chain_failed,
    "previous_response_id": previous_response_id,
}

print(json.dumps({"check": check, **CHECKS[check]()}))
