#!/usr/bin/env python3
"""Drives an `ooze serve` endpoint with the official `openai` Python package: models, chat (with
tools and a tool-call history), logprobs, streaming, completions, and an error. Exits 1 on the first
thing that does not behave. Usage: openai_client_check.py BASE_URL (e.g. http://127.0.0.1:30000/v1)
"""
import sys

import openai


def main():
    client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id

    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello!"}],
                                          max_tokens=8, logprobs=True, seed=1)
    choice = chat.choices[0]
    assert choice.message.role == "assistant", choice
    assert len(choice.logprobs.content) == chat.usage.completion_tokens, choice.logprobs
    assert all(t.logprob <= 0 for t in choice.logprobs.content)

    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                              "required": ["city"]}}}]
    history = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3 degrees, snow"},
    ]
    with_tools = client.chat.completions.create(model=model, messages=history, tools=tools, max_tokens=8)
    assert with_tools.choices[0].finish_reason in ("stop", "length", "tool_calls"), with_tools
    assert with_tools.usage.prompt_tokens > chat.usage.prompt_tokens, "tools and history reached the template"

    pieces, finish = [], None
    for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count"}],
                                                max_tokens=6, stream=True, stream_options={"include_usage": True}):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        elif chunk.usage:
            assert chunk.usage.completion_tokens == 6, chunk.usage
    assert finish == "length", finish

    completion = client.completions.create(model=model, prompt="Question: Alice has", max_tokens=4, n=2, seed=3)
    assert len(completion.choices) == 2 and completion.usage.completion_tokens == 8, completion

    # Agents name models of their own and send fields ooze does not act on: served, never a 400.
    agent = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}],
                                           max_tokens=2, store=False, metadata={"task": "t"})
    assert agent.usage.completion_tokens == 2, agent
    try:
        client.chat.completions.create(model=model, messages=[{"role": "robot", "content": "x"}])
        sys.exit("an unknown role was accepted")
    except openai.BadRequestError as e:
        assert "messages[0].role" in str(e), e
    print(f"openai {openai.__version__}: models, chat, tools, logprobs, streaming, completions, errors ok")


if __name__ == "__main__":
    main()
