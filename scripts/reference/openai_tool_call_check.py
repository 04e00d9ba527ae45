#!/usr/bin/env python3
"""Drives an `ooze serve` endpoint whose model answers every chat with
`<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>` (the scripted model
of crates/ooze/tests/serve.rs) with the official `openai` package: the call arrives as `tool_calls`,
whole and streamed, and a conversation can carry on after the tool's result. Exits 1 on the first
thing that does not behave. Usage: openai_tool_call_check.py BASE_URL
"""
import json
import sys

import openai

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def main():
    client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]

    reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=16,
                                           temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None, choice.message
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id, call
    assert call.function.name == "get_weather", call
    assert json.loads(call.function.arguments) == {"city": "Paris"}, call.function.arguments

    name, arguments, finish, text = None, "", None, ""
    for chunk in client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=16,
                                                temperature=0, stream=True):
        delta = chunk.choices[0].delta
        text += delta.content or ""
        for piece in delta.tool_calls or []:
            name = piece.function.name or name
            arguments += piece.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls", finish
    assert name == "get_weather" and json.loads(arguments) == {"city": "Paris"}, (name, arguments)
    assert "<tool_call>" not in text, f"the call's text leaked into the content: {text!r}"

    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"}]
    follow_up = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=16,
                                               temperature=0)
    assert follow_up.usage.prompt_tokens > reply.usage.prompt_tokens, "the tool result reached the template"
    assert follow_up.choices[0].finish_reason == "tool_calls", follow_up
    print(f"openai {openai.__version__}: tool calls whole, streamed and in a follow-up turn ok")


if __name__ == "__main__":
    main()
