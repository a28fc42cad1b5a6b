"""The official openai SDK's embeddings.create against a node: one input through a failover,
a batch, floats against the SDK's default base64, and the refusal of a mixed-dimension chain.

Usage: openai_sdk_embeddings.py BASE_URL KEY PRIMARY FALLBACK WIDE  -> prints four JSON lines
"""

import json
import sys

import openai

base_url, key, primary, fallback, wide = sys.argv[1:6]
client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)

# The SDK sends encoding_format=base64 unless told otherwise, and decodes it.
one = client.embeddings.create(
    model=primary, input="hello", extra_body={"fallback_models": [fallback]}
)
print(json.dumps({"served": one.model, "lengths": [len(d.embedding) for d in one.data]}))

batch = client.embeddings.create(
    model=fallback, input=["a", "b", "hello"], extra_body={"fallback_models": [primary]}
)
print(json.dumps({
    "lengths": [len(d.embedding) for d in batch.data],
    "indices": [d.index for d in batch.data],
}))

floats = client.embeddings.create(model=fallback, input="hello", encoding_format="float")
same = all(abs(a - b) < 1e-6 for a, b in zip(floats.data[0].embedding, one.data[0].embedding))
print(json.dumps({"same_as_base64": same and len(floats.data[0].embedding) == 8}))

try:
    client.embeddings.create(model=fallback, input="x", extra_body={"fallback_models": [wide]})
    print(json.dumps({"status": 200}))
except openai.BadRequestError as e:
    print(json.dumps({"status": e.status_code, "param": e.param, "message": e.message}))
