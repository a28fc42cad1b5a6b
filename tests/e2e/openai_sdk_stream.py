"""Streams through a Switchyard node with the official `openai` Python SDK.

Usage: openai_sdk_stream.py BASE_URL API_KEY FAILING FALLBACK DROPPING
"""
import json
import sys

import openai

base_url, api_key, failing, fallback, dropping = sys.argv[1:6]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)

# Failover before the first token: the SDK sees one clean stream from the fallback.
stream = client.chat.completions.create(
    model=failing,
    messages=[{"role": "user", "content": "hi"}],
    stream=True,
    extra_body={"fallback_models": [fallback]},
)
text = ""
for chunk in stream:
    assert chunk.model == fallback, chunk.model
    if chunk.choices and chunk.choices[0].delta.content:
        text += chunk.choices[0].delta.content
assert text == "streamed fallback text", text
print(json.dumps({"check": "stream_failover", "text": text}))

# A drop after the first tokens: the SDK raises while iterating, with only that model's text.
stream = client.chat.completions.create(
    model=dropping,
    messages=[{"role": "user", "content": "hi"}],
    stream=True,
    extra_body={"fallback_models": [fallback]},
)
text = ""
try:
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    raise SystemExit("expected an APIError while iterating")
except openai.APIError as e:
    assert "streamed fallback" not in text, text
    assert text and "alpha".startswith(text[:5].strip()) or text.startswith("alpha"), text
    print(json.dumps({"check": "stream_drop_raises", "error": str(e), "text": text}))
