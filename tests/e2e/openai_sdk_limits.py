"""The official openai SDK against a key with limits: its RateLimitError carries the
gateway's code, Retry-After and x-ratelimit-* headers.

Usage: openai_sdk_limits.py BASE_URL KEY MODEL [burst N]  -> prints one JSON line

With `burst N`: N calls one after another at the SDK's default retries; prints when each
one succeeded (seconds from the start) and any that failed.
"""

import json
import sys

import openai

import time

base_url, key, model = sys.argv[1:4]
if len(sys.argv) > 5 and sys.argv[4] == "burst":
    client = openai.OpenAI(base_url=base_url, api_key=key)  # default retries
    start = time.monotonic()
    done, failed = [], []
    for _ in range(int(sys.argv[5])):
        try:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
            done.append(round(time.monotonic() - start, 3))
        except openai.APIError as e:
            failed.append(str(e))
    print(json.dumps({"done": done, "failed": failed}))
    sys.exit(0)
client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
served = 0
while served < 100:
    try:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
        served += 1
    except openai.RateLimitError as e:
        headers = e.response.headers
        print(json.dumps({
            "served": served,
            "status": e.status_code,
            "code": e.code,
            "type": e.type,
            "retry_after": headers.get("retry-after"),
            "limit": headers.get("x-ratelimit-limit-requests"),
            "remaining": headers.get("x-ratelimit-remaining-requests"),
            "reset": headers.get("x-ratelimit-reset-requests"),
        }))
        break
