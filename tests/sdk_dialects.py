"""The official SDKs against llm-server's other dialects: Anthropic's `anthropic` package on
/v1/messages (whole, streamed, count_tokens) and OpenAI's `openai` package on /v1/responses (whole and
streamed). Run by tests/test_server_dialects.cpp with the server's base URL; prints one JSON object
with what each call returned, which the C++ test compares with /v1/chat/completions' answer."""
import json
import sys

import anthropic
import openai

base = sys.argv[1]
system, question, max_tokens = "You are a helpful assistant.", "Name three colors.", 12
out = {}

claude = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=60)
message = claude.messages.create(model="claude-3-5-haiku-latest", max_tokens=max_tokens, system=system,
                                 messages=[{"role": "user", "content": question}])
out["messages"] = {"text": "".join(b.text for b in message.content if b.type == "text"),
                   "stop_reason": message.stop_reason, "output_tokens": message.usage.output_tokens}
with claude.messages.stream(model="claude-3-5-haiku-latest", max_tokens=max_tokens, system=system,
                            messages=[{"role": "user", "content": question}]) as stream:
    streamed = "".join(stream.text_stream)
    final = stream.get_final_message()
out["messages_stream"] = {"text": streamed, "final_text": "".join(b.text for b in final.content if b.type == "text"),
                          "stop_reason": final.stop_reason, "output_tokens": final.usage.output_tokens}
out["count_tokens"] = claude.messages.count_tokens(model="claude-3-5-haiku-latest", system=system,
                                                   messages=[{"role": "user", "content": question}]).input_tokens

gpt = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)
response = gpt.responses.create(model="gpt-4o-mini", instructions=system, input=question, max_output_tokens=max_tokens)
out["responses"] = {"text": response.output_text, "status": response.status, "output_tokens": response.usage.output_tokens}
deltas, completed = "", None
for event in gpt.responses.create(model="gpt-4o-mini", instructions=system, input=question, max_output_tokens=max_tokens,
                                  stream=True):
    if event.type == "response.output_text.delta":
        deltas += event.delta
    elif event.type == "response.completed":
        completed = event.response
out["responses_stream"] = {"text": deltas, "final_text": completed.output_text if completed else None}

print(json.dumps(out))
