"""The official openai SDK against a key with limits: its RateLimitError carries the
gateway's code, Retry-After and x-ratelimit-* headers.

Usage: openai_sdk_limits.py BASE_URL KEY MODEL  -> prints one JSON line
"""

import json
import sys

import openai

base_url, key, model = sys.argv[1:4]
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
