#!/usr/bin/env python3
"""Tool use on Anthropic's /v1/messages with the official anthropic package: tests/anthropic_tools.py PORT.

The server runs SmolLM2 with Qwen 2.5's Jinja template (Hermes-style <tool_call> tags), as for
tests/openai_tools.py. tool_choice "any" and "tool" force a call (the tool-call grammar): the answer has
tool_use blocks whose input validates against the tool's input_schema (jsonschema) and stop_reason
"tool_use"; streamed, the SDK assembles the same input from input_json_delta events; "none" and
disable_parallel_tool_use are honoured; tool_use and tool_result blocks go back into the template.
Run by tests/test_server.cpp; prints "ok N" (N checks) at the end, exits non-zero on a mismatch.
"""
import sys

import anthropic
import jsonschema
from sdk_check import Checks

port = int(sys.argv[1])
claude = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="unused", max_retries=0, timeout=120)
check = Checks()
model = "claude-3-5-haiku-latest"

weather = {"name": "get_weather", "description": "Get the weather of a city",
           "input_schema": {"type": "object", "properties": {"location": {"type": "string", "maxLength": 24}}, "required": ["location"]}}
forecast = {"name": "get_forecast", "description": "The forecast of a city for some days",
            "input_schema": {"type": "object",
                             "properties": {"city": {"type": "string", "maxLength": 24},
                                            "unit": {"enum": ["celsius", "fahrenheit"]},
                                            "days": {"type": "integer"}},
                             "required": ["city", "unit", "days"]}}
tools = [weather, forecast]
schemas = {t["name"]: t["input_schema"] for t in tools}
messages = [{"role": "user", "content": "What is the weather in London?"}]


def tool_uses(message):
    return [b for b in message.content if b.type == "tool_use"]


def valid(block, name=None):
    try:
        jsonschema.validate(block.input, schemas[block.name])
    except (KeyError, jsonschema.ValidationError) as e:
        print(f"invalid tool_use {block}: {e}")
        return False
    return block.id.startswith("toolu_") and (name is None or block.name == name)


# "any": a call is forced; the answer's blocks are tool_use, stop_reason tool_use.
m = claude.messages.create(model=model, max_tokens=80, extra_body={"temperature": 0}, tools=tools, tool_choice={"type": "any"}, messages=messages)
uses = tool_uses(m)
check(m.stop_reason == "tool_use" and len(uses) >= 1, f"any: {m}")
check(all(valid(b) for b in uses), "any: valid input")

# "tool": that tool only; disable_parallel_tool_use: one call.
m = claude.messages.create(model=model, max_tokens=80, extra_body={"temperature": 0}, tools=tools, messages=messages,
                           tool_choice={"type": "tool", "name": "get_forecast", "disable_parallel_tool_use": True})
uses = tool_uses(m)
check(m.stop_reason == "tool_use" and len(uses) == 1 and valid(uses[0], "get_forecast"), f"tool: {m}")
forced = uses[0]

# Streamed: the SDK assembles the tool_use input from input_json_delta events; the same call.
with claude.messages.stream(model=model, max_tokens=80, extra_body={"temperature": 0}, tools=tools, messages=messages,
                            tool_choice={"type": "tool", "name": "get_forecast", "disable_parallel_tool_use": True}) as stream:
    deltas = [e for e in stream if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    final = stream.get_final_message()
uses = tool_uses(final)
check(len(deltas) >= 1, "streamed input_json_delta events")
check(final.stop_reason == "tool_use" and len(uses) == 1 and valid(uses[0], "get_forecast"), f"streamed: {final}")
check(uses[0].input == forced.input, f"streamed input {uses[0].input} vs {forced.input}")

# "none": no tools offered, no tool_use blocks.
m = claude.messages.create(model=model, max_tokens=16, extra_body={"temperature": 0}, tools=tools, tool_choice={"type": "none"}, messages=messages)
check(not tool_uses(m) and m.stop_reason != "tool_use", f"none: {m}")

# The call and its result go back into the template: a longer prompt, an answer.
history = messages + [{"role": "assistant", "content": [{"type": "tool_use", "id": forced.id, "name": forced.name, "input": forced.input}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": forced.id, "content": "Sunny, 21 degrees."}]}]
before = claude.messages.count_tokens(model=model, tools=tools, messages=messages).input_tokens
after = claude.messages.count_tokens(model=model, tools=tools, messages=history).input_tokens
check(after > before + 10, f"tool_use and tool_result rendered: {before} -> {after} tokens")
m = claude.messages.create(model=model, max_tokens=16, extra_body={"temperature": 0}, tools=tools, tool_choice={"type": "none"}, messages=history)
check(m.usage.input_tokens > 0 and any(b.type == "text" for b in m.content), f"answer after the result: {m}")

# An unknown tool_choice type is the client's error.
try:
    claude.messages.create(model=model, max_tokens=4, tools=tools, tool_choice={"type": "sometimes"}, messages=messages)
    check(False, "bad tool_choice accepted")
except anthropic.BadRequestError:
    check(True, "bad tool_choice refused")

check.report()
