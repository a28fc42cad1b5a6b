"""Streams that end without `[DONE]` or carry a frame that does not parse, read through a
Switchyard node with the official `openai` Python SDK.

Usage: openai_sdk_stream_ends.py BASE_URL API_KEY NO_DONE_MODEL BAD_FRAME_MODEL

Prints one JSON line per check.
"""
import json
import sys

import openai

base_url, api_key, no_done, bad_frame = sys.argv[1:5]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
messages = [{"role": "user", "content": "count to six for me please"}]

# The upstream sent its finish reason and usage, then closed without `data: [DONE]`: the
# SDK reads a whole answer and its usage, and raises nothing.
stream = client.chat.completions.create(
    model=no_done,
    messages=messages,
    stream=True,
    stream_options={"include_usage": True},
)
text, finish, usage = "", None, None
for chunk in stream:
    if chunk.choices:
        text += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    if chunk.usage:
        usage = chunk.usage
assert finish == "stop", finish
assert usage is not None, "the usage chunk reached the SDK"
print(json.dumps({
    "check": "no_done",
    "text": text,
    "usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens},
}))

# A data line that is not JSON in the middle: the SDK would raise on it and lose the answer;
# through the node it reads the whole answer, and the node's last chunk says one frame was
# skipped.
stream = client.chat.completions.create(model=bad_frame, messages=messages, stream=True)
text, skipped = "", None
for chunk in stream:
    if chunk.choices:
        text += chunk.choices[0].delta.content or ""
    report = (chunk.model_extra or {}).get("secureai") or {}
    if "skipped_frames" in report:
        skipped = report["skipped_frames"]
print(json.dumps({"check": "bad_frame", "text": text, "skipped_frames": skipped}))
