#!/usr/bin/env python3
"""The official openai Python package against a running llm-server: tests/openai_client.py PORT ALIAS.

Run by tests/test_server.cpp ("server: the openai Python package ..."). Exits non-zero with a message on
the first mismatch; prints "ok N" (N checks) at the end.
"""
import sys

import openai
from sdk_check import Checks, openai_client

port, alias = int(sys.argv[1]), sys.argv[2]
client = openai_client(port)
check = Checks()


# models.list(): one model, the alias as its id.
models = client.models.list()
ids = [m.id for m in models.data]
check(ids == [alias], f"models.list() ids {ids}")

messages = [{"role": "user", "content": "What is the capital of France?"}]
# Any model name is served; the response names the served model.
for name in ["gpt-4o-mini", "gpt-3.5-turbo", alias]:
    r = client.chat.completions.create(model=name, messages=messages, max_tokens=8, temperature=0)
    check(r.model == alias, f"chat model {r.model!r} for {name!r}")
    check(r.choices[0].message.role == "assistant", "role")
    check(len(r.choices[0].message.content) > 0, "content")
    check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "usage sum")
    check(r.usage.completion_tokens <= 8, "max_tokens")
    check(r.choices[0].finish_reason in ("stop", "length"), "finish_reason")
greedy = r.choices[0].message.content

# Streaming: the deltas add up to the non-streamed answer; include_usage gives a last chunk with usage.
text, usage_chunks = "", []
for chunk in client.chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True}):
    if chunk.usage is not None:
        usage_chunks.append(chunk)
    for c in chunk.choices:
        text += c.delta.content or ""
check(text == greedy, f"streamed {text!r} vs {greedy!r}")
check(len(usage_chunks) == 1 and usage_chunks[0].choices == [], "one usage chunk without choices")
check(usage_chunks[0].usage.completion_tokens == r.usage.completion_tokens, "streamed usage")

# Legacy completions.
c = client.completions.create(model="davinci-002", prompt="The capital of France is", max_tokens=4, temperature=0)
check(c.model == alias and "Paris" in c.choices[0].text, f"completion {c.choices[0].text!r}")
check(c.usage.completion_tokens == 4 and c.choices[0].finish_reason == "length", "completion usage")

# Embeddings without an embedding model: llama-server's 501.
try:
    client.embeddings.create(model="text-embedding-3-small", input="hello")
    check(False, "embeddings should fail")
except openai.APIStatusError as e:
    check(e.status_code == 501, f"embeddings status {e.status_code}")
    check("embeddings" in str(e.message), f"embeddings message {e.message}")

check.report()
