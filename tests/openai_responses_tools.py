#!/usr/bin/env python3
"""Tool calling on /v1/responses with the official openai package: tests/openai_responses_tools.py PORT.

The server runs SmolLM2 with Qwen 2.5's Jinja template (Hermes-style <tool_call> tags), as for
tests/openai_tools.py. The Responses conversation (a user message, a function_call item, a new
question; later the new call's function_call_output) must render exactly as the same conversation in
chat messages (the same prompt tokens) and the greedy answer must be the chat endpoint's: a
function_call output item (id, call_id, name, arguments, status), whole and streamed as
response.output_item.added / response.function_call_arguments.delta / .done / response.output_item.done.
Tools are in the Responses shape ({"type": "function", "name", ...}); tool_choice names a function in
that shape too. Run by tests/test_server.cpp; prints "ok N" at the end, exits non-zero on a mismatch.
"""
import json
import sys

import jsonschema
from sdk_check import Checks, openai_client

port = int(sys.argv[1])
client = openai_client(port)
check = Checks()

weather_params = {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}
forecast_params = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                                    "days": {"type": "integer"}},
                   "required": ["city", "days"]}
tools = [{"type": "function", "name": "get_weather", "description": "Get the weather of a city", "parameters": weather_params},
         {"type": "function", "name": "get_forecast", "description": "The forecast of a city for some days", "parameters": forecast_params}]
# The same tools in the chat shape, as the server converts them: "strict" added (as llama-server
# does), members in sorted order (the converted request is re-serialized so).
chat_tools = json.loads(json.dumps([{"type": "function", "function": {**{k: v for k, v in t.items() if k != "type"}, "strict": True}}
                                    for t in tools], sort_keys=True))

items = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"location\": \"Paris\"}"},
    {"role": "user", "content": "What is the weather in London?"},
]
messages = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"location\": \"Paris\"}"}}]},
    {"role": "user", "content": "What is the weather in London?"},
]


def same_answer(chat, resp, what):
    """The Responses answer is the chat endpoint's for the same conversation: its prompt, text and calls."""
    check(resp.usage.input_tokens == chat.usage.prompt_tokens,
          f"{what}: items render as the chat messages ({resp.usage.input_tokens} vs {chat.usage.prompt_tokens} tokens)")
    check(resp.output_text == (chat.choices[0].message.content or ""), f"{what}: text {resp.output_text!r}")
    calls = [(o.name, o.arguments) for o in resp.output if o.type == "function_call"]
    ref = [(c.function.name, c.function.arguments) for c in chat.choices[0].message.tool_calls or []]
    check(calls == ref, f"{what}: calls {calls} vs {ref}")


# get_weather alone first (the history's tool)
ref = client.chat.completions.create(model="smol", messages=messages, tools=chat_tools[:1], max_tokens=60, temperature=0)
check(ref.choices[0].finish_reason == "tool_calls", f"chat reference calls a tool: {ref.choices[0]}")
r = client.responses.create(model="smol", input=items, tools=tools[:1], max_output_tokens=60, temperature=0)
same_answer(ref, r, "a call")
calls = [o for o in r.output if o.type == "function_call"]
check(len(calls) == 1, f"one function_call item: {r.output}")
call = calls[0]
check(call.name == "get_weather" and json.loads(call.arguments) == {"location": "London"}, f"call {call}")
check(call.call_id.startswith("call_") and len(call.call_id) > 5 and call.id == "fc_" + call.call_id[5:], f"ids {call.id!r} {call.call_id!r}")
check(call.status == "completed", f"status {call.status!r}")

# Streamed: the item is added empty, its arguments arrive as deltas, .done carries them whole.
added, deltas, args_done, item_done, completed = None, "", None, None, None
for event in client.responses.create(model="smol", input=items, tools=tools[:1], max_output_tokens=60, temperature=0, stream=True):
    if event.type == "response.output_item.added" and event.item.type == "function_call":
        added = event.item
    elif event.type == "response.function_call_arguments.delta":
        check(added is not None and event.item_id == added.id, "a delta of the added item")
        deltas += event.delta
    elif event.type == "response.function_call_arguments.done":
        args_done = event
    elif event.type == "response.output_item.done" and event.item.type == "function_call":
        item_done = event.item
    elif event.type == "response.completed":
        completed = event.response
check(added is not None and added.name == "get_weather" and added.arguments == "" and added.status == "in_progress", f"added {added}")
check(deltas == call.arguments, f"streamed arguments {deltas!r}")
check(args_done is not None and args_done.arguments == call.arguments and args_done.item_id == added.id, f"arguments done {args_done}")
check(item_done is not None and item_done.arguments == call.arguments and item_done.status == "completed"
      and item_done.call_id == added.call_id, f"item done {item_done}")
check(completed is not None and [o.type for o in completed.output] == ["function_call"]
      and completed.output[0].arguments == call.arguments, f"completed {completed}")

# A function named in the Responses shape: that function, its arguments valid for its schema.
ask = [{"role": "user", "content": "Tell me a joke about cats."}]
r = client.responses.create(model="smol", input=ask, tools=tools, max_output_tokens=80, temperature=0,
                            tool_choice={"type": "function", "name": "get_forecast"})
calls = [o for o in r.output if o.type == "function_call"]
check(len(calls) >= 1 and all(c.name == "get_forecast" for c in calls), f"named function: {r.output}")
try:
    for c in calls:
        jsonschema.validate(json.loads(c.arguments), forecast_params)
    check(True, "named function's arguments")
except (ValueError, jsonschema.ValidationError) as e:
    check(False, f"named function's arguments: {e}")

# The round trip: the call item and its output go back, as function_call / function_call_output
# items (the chat's assistant tool_calls and tool message).
back = items + [call.model_dump(exclude_none=True), {"type": "function_call_output", "call_id": call.call_id, "output": "{\"temperature\": 15}"}]
back_messages = messages + [{"role": "assistant", "content": None, "tool_calls": [
    {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
    {"role": "tool", "tool_call_id": call.call_id, "content": "{\"temperature\": 15}"}]
ref = client.chat.completions.create(model="smol", messages=back_messages, tools=chat_tools, max_tokens=16, temperature=0)
r = client.responses.create(model="smol", input=back, tools=tools, max_output_tokens=16, temperature=0)
same_answer(ref, r, "after the function's output")
check(r.usage.input_tokens > 100, f"the history is rendered: {r.usage.input_tokens} tokens")

check.report()
