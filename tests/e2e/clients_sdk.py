"""The official `openai` Python SDK at its default retries against a failed chain.

Usage: clients_sdk.py BASE_URL API_KEY PRIMARY FALLBACK
Prints one JSON line with what the SDK raised; exits non-zero if it did not raise.
"""
import json
import sys

import openai

base_url, api_key, primary, fallback = sys.argv[1:5]
# No max_retries: the SDK's default (2), as an application gets it.
client = openai.OpenAI(base_url=base_url, api_key=api_key)

try:
    client.chat.completions.create(
        model=primary,
        messages=[{"role": "user", "content": "Say hello"}],
        extra_body={"fallback_models": [fallback]},
    )
    raise SystemExit("expected an InternalServerError")
except openai.InternalServerError as e:
    # The SDK keeps only the body's `error` object: the attempts are there.
    attempts = [[a["model"], a["status"]] for a in e.body["attempts"]]
    print(json.dumps({
        "status": e.status_code,
        "code": e.code,
        "max_retries": client.max_retries,
        "attempts": attempts,
        "request_id": e.request_id,
    }))
