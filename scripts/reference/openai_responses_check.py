#!/usr/bin/env python3
"""Drives the OpenAI Responses endpoint of `ooze serve --gateway` with the official `openai` Python
package and the OpenAI Agents SDK (`openai-agents`). Exits 1 on the first thing that does not
behave.

Usage: openai_responses_check.py SERVER_URL MODE [MODEL_DIR] (SERVER_URL e.g. http://127.0.0.1:30000)
- MODE `tools`, against a model that answers every chat with the tool call
  get_weather {"city": "Paris"} (MODEL_DIR: that model): a tool loop sending the output items back
  as input (the second call streamed with `client.responses.stream`), one chained with
  `previous_response_id`, and an Agents SDK run; each leaves one sample that grew token-exactly,
  and the first two decode to the model's chat template (transformers) rendering the same
  conversation in chat form. Also errors (401 as
  AuthenticationError, 400 naming the field, a spent budget refusing a streamed call).
- MODE `text`, against any model: plain and streamed text (`stream=True` events).
"""
import asyncio
import json
import sys

import openai

from gateway_session import check_one_extended_sample, check_rendering, close_session, open_session

TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather for a city", "strict": True,
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                         "additionalProperties": False}}]
MODEL = "gpt-5-mini"
INSTRUCTIONS = "You answer about the weather."


def client(root, key):
    return openai.OpenAI(base_url=f"{root}/v1", api_key=key, max_retries=0, timeout=120)


def check_call(response):
    """`response` is one completed call of get_weather {"city": "Paris"}; returns the call."""
    assert response.object == "response" and response.id.startswith("resp_"), response
    assert response.status == "completed" and response.incomplete_details is None, response
    assert [item.type for item in response.output] == ["function_call"], response.output
    call = response.output[0]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}, call
    assert call.status == "completed" and call.id and call.call_id, call
    assert response.output_text == "", response.output_text
    usage = response.usage
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens and usage.output_tokens > 0, usage
    return call


CHAT_TOOLS = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                "parameters": t["parameters"]}} for t in TOOLS]


def tool_loop(root, model_dir):
    session = open_session(root, "responses-tools")
    c = client(root, session)
    question = [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]}]
    first = c.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=question, tools=TOOLS,
                               max_output_tokens=32, store=True, metadata={"task": "t"}, temperature=1.0)
    call = check_call(first)

    history = question + first.output + [{"type": "function_call_output", "call_id": call.call_id,
                                          "output": "20 degrees, sunny"}]
    kinds, numbers = [], []
    with c.responses.stream(model=MODEL, instructions=INSTRUCTIONS, input=history, tools=TOOLS,
                            max_output_tokens=32) as stream:
        for event in stream:
            kinds.append(event.type)
            numbers.append(event.sequence_number)
        second = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed", kinds
    for kind in ["response.output_item.added", "response.function_call_arguments.delta",
                 "response.function_call_arguments.done", "response.output_item.done"]:
        assert kind in kinds, (kind, kinds)
    assert numbers == list(range(len(numbers))), numbers
    check_call(second)
    assert second.usage.input_tokens > first.usage.input_tokens, (first.usage, second.usage)

    record = close_session(root, session)
    sample = check_one_extended_sample(record, [first.usage.output_tokens, second.usage.output_tokens])
    check_rendering(sample, model_dir, [
        {"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None},
        {"role": "tool", "tool_call_id": call.call_id, "content": "20 degrees, sunny"},
        {"role": "assistant", "content": None}], CHAT_TOOLS)
    for ignored in ["store", "metadata", "tools.*.strict"]:
        assert record["metrics"].get(f"gateway/ignored_field/{ignored}", 0) >= 1, (ignored, record["metrics"])


def chained(root, model_dir):
    """Three calls, each naming the previous response instead of sending the history."""
    session = open_session(root, "responses-chained")
    c = client(root, session)
    previous = c.responses.create(model=MODEL, instructions=INSTRUCTIONS, input="Weather in Paris?",
                                  tools=TOOLS, max_output_tokens=32)
    generated = [previous.usage.output_tokens]
    for turn in range(2):
        call = check_call(previous)
        previous = c.responses.create(model=MODEL, instructions=INSTRUCTIONS, previous_response_id=previous.id,
                                      input=[{"type": "function_call_output", "call_id": call.call_id,
                                              "output": f"{20 + turn} degrees"}],
                                      tools=TOOLS, max_output_tokens=32, stream=turn == 1)
        if turn == 1:
            events = list(previous)
            assert events[-1].type == "response.completed", [e.type for e in events]
            previous = events[-1].response
        generated.append(previous.usage.output_tokens)
    assert previous.previous_response_id is not None, previous
    try:
        c.responses.create(model=MODEL, previous_response_id="resp_unknown", input="x")
        sys.exit("an unknown previous_response_id was accepted")
    except openai.BadRequestError as e:
        assert "previous_response_id" in e.message, e.message
    sample = check_one_extended_sample(close_session(root, session), generated)
    conversation = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": "Weather in Paris?"}]
    for turn in range(2):
        conversation += [{"role": "assistant", "content": None},
                         {"role": "tool", "tool_call_id": "x", "content": f"{20 + turn} degrees"}]
    check_rendering(sample, model_dir, conversation + [{"role": "assistant", "content": None}], CHAT_TOOLS)


def agents_sdk(root):
    """The OpenAI Agents SDK's Responses model: a tool run that stops at the tool's result, and one
    that calls the model again (twice, then hits max_turns), streamed."""
    import agents

    agents.set_tracing_disabled(True)

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Weather for a city."""
        return f"20 degrees in {city}"

    session = open_session(root, "responses-agents")
    model = agents.OpenAIResponsesModel(model=MODEL, openai_client=openai.AsyncOpenAI(
        base_url=f"{root}/v1", api_key=session, max_retries=0, timeout=120))
    settings = agents.ModelSettings(max_tokens=32)
    stopping = agents.Agent(name="weather", instructions=INSTRUCTIONS, tools=[get_weather], model=model,
                            model_settings=settings, tool_use_behavior="stop_on_first_tool")
    result = asyncio.run(agents.Runner.run(stopping, "Weather in Paris?"))
    assert result.final_output == "20 degrees in Paris", result.final_output
    close_session(root, session)

    session = open_session(root, "responses-agents-loop")
    model = agents.OpenAIResponsesModel(model=MODEL, openai_client=openai.AsyncOpenAI(
        base_url=f"{root}/v1", api_key=session, max_retries=0, timeout=120))
    looping = agents.Agent(name="weather", instructions=INSTRUCTIONS, tools=[get_weather], model=model,
                           model_settings=settings)
    generated = []

    async def run_streamed():
        run = agents.Runner.run_streamed(looping, "Weather in Paris?", max_turns=2)
        async for event in run.stream_events():
            if event.type == "raw_response_event" and event.data.type == "response.completed":
                generated.append(event.data.response.usage.output_tokens)

    try:
        asyncio.run(run_streamed())
        sys.exit("the looping agent ended")
    except agents.MaxTurnsExceeded:
        pass
    assert len(generated) == 2, generated
    check_one_extended_sample(close_session(root, session), generated)


def errors(root):
    try:
        client(root, "no-such-session").responses.create(model=MODEL, input="x")
        sys.exit("an unknown session was served")
    except openai.AuthenticationError as e:
        assert e.status_code == 401, e
    session = open_session(root, "responses-errors", max_calls=1)
    c = client(root, session)
    image = [{"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                           {"type": "input_image", "image_url": "https://example.com/a.png"}]}]
    for tools, input, field in [([{"type": "web_search"}], "x", "tools[0].type"), (TOOLS, image, "input[0].content[1]")]:
        try:
            c.responses.create(model=MODEL, tools=tools, input=input)
            sys.exit(f"{field}: accepted")
        except openai.BadRequestError as e:
            assert field in e.message and e.body["type"] == "invalid_request_error", (e.message, e.body)
    c.responses.create(model=MODEL, input="x", max_output_tokens=4)
    try:
        with c.responses.stream(model=MODEL, input="y", max_output_tokens=4) as s:
            s.get_final_response()
        sys.exit("a call over the session's budget was served")
    except openai.PermissionDeniedError as e:
        assert "model calls" in e.message, e.message
    close_session(root, session)


def text(root):
    session = open_session(root, "responses-text")
    c = client(root, session)
    plain = c.responses.create(model=MODEL, input="Hello!", max_output_tokens=8, reasoning={"effort": "low"},
                               include=["message.output_text.logprobs"], truncation="auto")
    assert [item.type for item in plain.output] == ["message"], plain.output
    assert isinstance(plain.output_text, str) and plain.output[0].content[0].type == "output_text", plain
    assert 0 < plain.usage.output_tokens <= 8, plain.usage
    if plain.status == "incomplete":
        assert plain.incomplete_details.reason == "max_output_tokens" and plain.usage.output_tokens == 8, plain
    else:
        assert plain.status == "completed", plain

    events = list(c.responses.create(model=MODEL, input="Count", instructions="Count.", max_output_tokens=8,
                                     stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"], kinds
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"], kinds
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == streamed == events[-4].text, (final.output_text, streamed)
    assert final.id == events[0].response.id and final.output[0].id == events[2].item.id, final
    record = close_session(root, session)
    assert record["metrics"]["gateway/calls"] == 2, record["metrics"]
    for ignored in ["reasoning", "include", "truncation"]:
        assert record["metrics"].get(f"gateway/ignored_field/{ignored}") == 1, (ignored, record["metrics"])


def main():
    root, mode = sys.argv[1].rstrip("/"), sys.argv[2]
    if mode == "tools":
        tool_loop(root, sys.argv[3])
        chained(root, sys.argv[3])
        agents_sdk(root)
        errors(root)
    elif mode == "text":
        text(root)
    else:
        sys.exit(f"unknown mode {mode}: tools or text")
    print(f"openai {openai.__version__}: responses ({mode}) ok")


if __name__ == "__main__":
    main()
