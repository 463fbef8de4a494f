#!/usr/bin/env python3
"""A tool-calling round trip with the official openai Python package: tests/openai_tools.py PORT.

The server runs SmolLM2 with Qwen 2.5's Jinja template (Hermes-style <tool_call> tags). The history
shows one call of the tool, so the greedy model calls it again for the new city: the reply must come
back as OpenAI tool_calls (whole and streamed), and the tool's result then goes back into the chat.
Run by tests/test_server.cpp; prints "ok N" (N checks) at the end, exits non-zero on a mismatch.
"""
import json
import sys

import openai
from sdk_check import Checks, openai_client

port = int(sys.argv[1])
client = openai_client(port)
check = Checks()


tools = [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather of a city",
                                           "parameters": {"type": "object", "properties": {"location": {"type": "string"}},
                                                          "required": ["location"]}}}]
messages = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"location\": \"Paris\"}"}}]},
    {"role": "user", "content": "What is the weather in London?"},
]

r = client.chat.completions.create(model="smol", messages=messages, tools=tools, tool_choice="auto", max_tokens=60, temperature=0)
choice = r.choices[0]
check(choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason!r}")
calls = choice.message.tool_calls or []
check(len(calls) == 1, f"{len(calls)} tool calls")
call = calls[0]
check(call.type == "function" and call.function.name == "get_weather", f"call {call}")
check(json.loads(call.function.arguments) == {"location": "London"}, f"arguments {call.function.arguments!r}")
check(call.id.startswith("call_") and len(call.id) > 5, f"id {call.id!r}")
check(choice.message.content is None, f"content {choice.message.content!r}")

# Streamed: OpenAI's incremental tool_calls deltas add up to the same call.
name, arguments, ids, finish = "", "", set(), None
for chunk in client.chat.completions.create(model="smol", messages=messages, tools=tools, max_tokens=60, temperature=0, stream=True):
    for c in chunk.choices:
        for d in c.delta.tool_calls or []:
            check(d.index == 0, "one call")
            if d.id:
                ids.add(d.id)
            if d.function and d.function.name:
                name += d.function.name
            if d.function and d.function.arguments:
                arguments += d.function.arguments
        finish = c.finish_reason or finish
check(name == "get_weather" and len(ids) == 1, f"streamed name {name!r}, ids {ids}")
check(arguments == call.function.arguments, f"streamed arguments {arguments!r}")
check(finish == "tool_calls", f"streamed finish_reason {finish!r}")

# tool_choice "none": no tools offered, no calls parsed.
r = client.chat.completions.create(model="smol", messages=messages, tools=tools, tool_choice="none", max_tokens=20, temperature=0)
check(not r.choices[0].message.tool_calls and r.choices[0].finish_reason != "tool_calls", "tool_choice none")

# The tool's result goes back: the template renders the assistant call and the tool message.
messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
             {"role": "tool", "tool_call_id": call.id, "content": "{\"temperature\": 15}"}]
r = client.chat.completions.create(model="smol", messages=messages, tools=tools, max_tokens=20, temperature=0)
check(r.choices[0].message.role == "assistant" and r.usage.prompt_tokens > 100, "answer after the tool result")

# A malformed tool_choice is the client's error.
try:
    client.chat.completions.create(model="smol", messages=messages, tools=tools, tool_choice={"type": "nope"}, max_tokens=4)
    check(False, "bad tool_choice accepted")
except openai.BadRequestError:
    check(True, "bad tool_choice refused")

check.report()
