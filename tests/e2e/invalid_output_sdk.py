"""The official `openai` Python SDK's structured outputs through a Switchyard chain with
`invalid_output`: `parse()` with a Pydantic model gets a valid object although the chain's
first model answers broken JSON.

Usage: invalid_output_sdk.py BASE_URL API_KEY PRIMARY FALLBACK
Prints one JSON line; exits non-zero on a failure.
"""
import json
import sys

import openai
import pydantic

base_url, api_key, primary, fallback = sys.argv[1:5]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)


class Person(pydantic.BaseModel):
    name: str
    age: int


# `chat.completions.parse` in current SDKs; `beta.chat.completions.parse` in older ones.
completions = client.chat.completions
if not hasattr(completions, "parse"):
    completions = client.beta.chat.completions

completion = completions.parse(
    model=primary,
    messages=[{"role": "user", "content": "Who wrote the first program?"}],
    response_format=Person,
    extra_body={"fallback_models": [fallback], "redundancy": {"on": ["invalid_output"]}},
)
message = completion.choices[0].message
assert isinstance(message.parsed, Person), message
report = completion.model_extra["secureai"]
print(json.dumps({
    "parsed": message.parsed.model_dump(),
    "model": completion.model,
    "reasons": [a.get("reason") for a in report["failover"]["attempts"]],
}))
