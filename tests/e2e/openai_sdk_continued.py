"""Reads a stream the node continues after a break with the official OpenAI Python SDK.

Usage: openai_sdk_continued.py BASE_URL KEY MODEL FALLBACK. Prints one JSON line: the text
the SDK assembled and the node's `secureai.continued` report. Any exception fails the run.
"""
import json
import sys

from openai import OpenAI

base, key, model, fallback = sys.argv[1:5]
client = OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Say it."}],
    stream=True,
    extra_body={"fallback_models": [fallback]},
)
text, continued = [], None
for chunk in stream:
    for choice in chunk.choices:
        if choice.delta.content:
            text.append(choice.delta.content)
    report = (chunk.model_extra or {}).get("secureai")
    if report and "continued" in report:
        continued = report["continued"]
print(json.dumps({"text": "".join(text), "continued": continued}))
