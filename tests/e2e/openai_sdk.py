"""Drives a Switchyard node with the official `openai` Python SDK, as an app would.

Usage: openai_sdk.py BASE_URL API_KEY PRIMARY FALLBACK
Prints one JSON line per check; exits non-zero on the first failure.
"""
import json
import sys

import openai

base_url, api_key, primary, fallback = sys.argv[1:5]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)

# A plain request: the SDK parses the completion unchanged.
plain = client.chat.completions.create(
    model=fallback, messages=[{"role": "user", "content": "Say hello"}]
)
assert plain.model == fallback, plain.model
assert plain.choices[0].message.content, plain
assert plain.usage.total_tokens > 0, plain.usage
print(json.dumps({"check": "plain", "model": plain.model}))

# A failover request: gateway fields go through the SDK's extra_body; the report comes
# back as an extra attribute the SDK keeps.
failover = client.chat.completions.create(
    model=primary,
    messages=[{"role": "user", "content": "Say hello"}],
    extra_body={"fallback_models": [fallback]},
)
assert failover.model == fallback, failover.model
report = failover.model_extra["secureai"]
assert report["failover"]["occurred"] is True, report
assert [a["status"] for a in report["failover"]["attempts"]] == ["failed", "served"], report
print(json.dumps({"check": "failover", "served": failover.model, "attempts": report["failover"]["attempts"]}))

# An error the SDK raises as its typed exception.
try:
    client.chat.completions.create(model="sim/nope", messages=[{"role": "user", "content": "x"}])
    raise SystemExit("expected a BadRequestError")
except openai.BadRequestError as e:
    assert e.code == "model_not_found", e
    print(json.dumps({"check": "error", "code": e.code}))
