#!/usr/bin/env python3
"""A tool-calling round trip with the official openai Python package: tests/openai_tools.py PORT.

The server runs SmolLM2 with Qwen 2.5's Jinja template (Hermes-style <tool_call> tags). The history
shows one call of the tool, so the greedy model calls it again for the new city: the reply must come
back as OpenAI tool_calls (whole and streamed), and the tool's result then goes back into the chat.
tool_choice "required" and a named function force a call (the tool-call grammar) whose arguments
validate against the tool's schema (jsonschema); parallel_tool_calls false gives one call.
Run by tests/test_server.cpp; prints "ok N" (N checks) at the end, exits non-zero on a mismatch.
"""
import json
import sys

import jsonschema
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

# tool_choice "required": the grammar forces a call from the first token, and keeps its arguments valid
# for the declared schema (a question the model would otherwise answer in text). A forced call can
# spend its budget on what the schema allows (a 24-character city, blank lines): 200 tokens hold any
# call it admits, so the checks do not hang on the model's last-bit numerics.
forecast = {"type": "function", "function": {
    "name": "get_forecast", "description": "The forecast of a city for some days",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "maxLength": 24},
                                  "unit": {"enum": ["celsius", "fahrenheit"]},
                                  "days": {"type": "integer"},
                                  "hourly": {"type": "boolean"}},
                   "required": ["city", "unit", "days"]}}}
both = tools + [forecast]
ask = [{"role": "user", "content": "Tell me a joke about cats."}]


def valid_call(call, tool):
    params = tool["function"]["parameters"]
    try:
        jsonschema.validate(json.loads(call.function.arguments), params)
        return call.function.name == tool["function"]["name"]
    except (ValueError, jsonschema.ValidationError) as e:
        print(f"invalid arguments {call.function.arguments!r}: {e}")
        return False


r = client.chat.completions.create(model="smol", messages=ask, tools=both, tool_choice="required", max_tokens=200, temperature=0)
calls = r.choices[0].message.tool_calls or []
check(r.choices[0].finish_reason == "tool_calls" and len(calls) >= 1, f"required: {r.choices[0]}")
check(all(valid_call(c, next(t for t in both if t["function"]["name"] == c.function.name)) for c in calls), "required: valid calls")

# A named function: that function only, arguments valid for its schema; parallel_tool_calls false: one call.
for parallel in (True, False):
    r = client.chat.completions.create(model="smol", messages=ask, tools=both, max_tokens=200, temperature=0, parallel_tool_calls=parallel,
                                       tool_choice={"type": "function", "function": {"name": "get_forecast"}})
    calls = r.choices[0].message.tool_calls or []
    check(len(calls) >= 1 and all(valid_call(c, forecast) for c in calls), f"named function (parallel {parallel}): {calls}")
    check(parallel or len(calls) == 1, f"parallel_tool_calls false: {len(calls)} calls")

# Streamed, the forced call's deltas add up to a valid call (one call: parallel_tool_calls false).
arguments, name = "", ""
for chunk in client.chat.completions.create(model="smol", messages=ask, tools=both, max_tokens=200, temperature=0, stream=True,
                                            parallel_tool_calls=False,
                                            tool_choice={"type": "function", "function": {"name": "get_forecast"}}):
    for c in chunk.choices:
        for d in c.delta.tool_calls or []:
            if d.function and d.function.name:
                name += d.function.name
            if d.function and d.function.arguments:
                arguments += d.function.arguments
check(name == "get_forecast", f"streamed forced name {name!r}")
try:
    jsonschema.validate(json.loads(arguments), forecast["function"]["parameters"])
    check(True, "streamed forced arguments")
except (ValueError, jsonschema.ValidationError) as e:
    check(False, f"streamed forced arguments {arguments!r}: {e}")

# tool_choice "auto" with the lazy grammar: text stays free (the joke), no call is invented.
r = client.chat.completions.create(model="smol", messages=ask, tools=both, max_tokens=30, temperature=0)
check(r.choices[0].finish_reason != "tool_calls" and r.choices[0].message.content, f"auto: text answer {r.choices[0]}")

# A named function that is not among the tools is the client's error.
try:
    client.chat.completions.create(model="smol", messages=ask, tools=both, max_tokens=4,
                                   tool_choice={"type": "function", "function": {"name": "nope"}})
    check(False, "unknown named function accepted")
except openai.BadRequestError:
    check(True, "unknown named function refused")

# A malformed tool_choice is the client's error.
try:
    client.chat.completions.create(model="smol", messages=messages, tools=tools, tool_choice={"type": "nope"}, max_tokens=4)
    check(False, "bad tool_choice accepted")
except openai.BadRequestError:
    check(True, "bad tool_choice refused")

check.report()
