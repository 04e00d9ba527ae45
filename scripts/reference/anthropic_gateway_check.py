#!/usr/bin/env python3
"""Drives the Anthropic Messages endpoint of `ooze serve --gateway` with the official `anthropic`
Python package. Exits 1 on the first thing that does not behave.

Usage: anthropic_gateway_check.py SERVER_URL MODE [MODEL_DIR] (SERVER_URL e.g. http://127.0.0.1:30000)
- MODE `tools`, against a model that answers every chat with the tool call
  get_weather {"city": "Paris"} (MODEL_DIR: that model): a tool loop (the call, then its result
  sent back, streamed with `client.messages.stream`, under /s/{session}/), after which the session
  holds one sample that grew token-exactly and decodes to the model's chat template (transformers)
  rendering the same conversation in chat form; errors in Anthropic's shape (401 as AuthenticationError, 400 naming the
  block, a spent budget refusing a streamed call with an HTTP error).
- MODE `text`, against any model: plain and streamed text (raw events and the stream helper).
"""
import sys

import anthropic

from gateway_session import check_one_extended_sample, check_rendering, close_session, open_session

TOOLS = [{"name": "get_weather", "description": "Weather for a city", "cache_control": {"type": "ephemeral"},
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
MODEL = "claude-sonnet-5"


def client(base_url, key):
    return anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0, timeout=120)


def tool_loop(root, model_dir):
    session = open_session(root, "anthropic-tools")
    by_key = client(root, session)
    question = {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?",
                                             "cache_control": {"type": "ephemeral"}}]}
    first = by_key.messages.create(model=MODEL, max_tokens=32, system="You answer about the weather.",
                                   tools=TOOLS, messages=[question], metadata={"user_id": "u1"},
                                   extra_body={"temperature": 1.0})
    assert first.type == "message" and first.role == "assistant" and first.id.startswith("msg_"), first
    assert first.stop_reason == "tool_use" and first.stop_sequence is None, first
    assert [b.type for b in first.content] == ["tool_use"], f"no empty text block: {first.content}"
    call = first.content[0]
    assert (call.name, call.input) == ("get_weather", {"city": "Paris"}), call
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0, first.usage

    # The call sent back with its result, under /s/{session}/ (the path names the session).
    by_path = client(f"{root}/s/{session}", "unused")
    history = [question, {"role": "assistant", "content": first.content},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                             "content": [{"type": "text", "text": "20 degrees, sunny"}]}]}]
    kinds = []
    with by_path.messages.stream(model=MODEL, max_tokens=32, system="You answer about the weather.",
                                 tools=TOOLS, messages=history) as stream:
        for event in stream:
            kinds.append(event.type)
        second = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
    for kind in ["content_block_start", "content_block_delta", "input_json", "content_block_stop"]:
        assert kind in kinds, (kind, kinds)
    assert second.stop_reason == "tool_use", second
    assert [(b.type, b.name, b.input) for b in second.content] == [("tool_use", "get_weather", {"city": "Paris"})]
    assert second.usage.input_tokens > first.usage.input_tokens, (first.usage, second.usage)

    record = close_session(root, session)
    sample = check_one_extended_sample(record, [first.usage.output_tokens, second.usage.output_tokens])
    chat_tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                    "parameters": t["input_schema"]}} for t in TOOLS]
    check_rendering(sample, model_dir, [
        {"role": "system", "content": "You answer about the weather."},
        {"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": None},
        {"role": "tool", "tool_call_id": call.id, "content": "20 degrees, sunny"},
        {"role": "assistant", "content": None}], chat_tools)
    metrics = record["metrics"]
    for ignored in ["metadata", "model", "tools.*.cache_control", "messages.*.content.*.cache_control"]:
        assert metrics.get(f"gateway/ignored_field/{ignored}", 0) >= 1, (ignored, metrics)
    assert metrics["gateway/sampling_overridden"] == 0, metrics


def errors(root):
    for bad in [client(root, "no-such-session"), client(f"{root}/s/no-such-session", "x")]:
        try:
            bad.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "x"}])
            sys.exit("an unknown session was served")
        except anthropic.AuthenticationError as e:
            assert e.status_code == 401 and e.body["error"]["type"] == "authentication_error", e.body

    session = open_session(root, "anthropic-errors", max_calls=1)
    c = client(root, session)
    try:
        c.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
        sys.exit("an image block was accepted")
    except anthropic.BadRequestError as e:
        assert e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error", e.body
        assert "messages[0].content[1]" in e.message and "only text" in e.message, e.message
    try:
        c.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "x"}],
                          tools=[{"type": "web_search_20250305", "name": "web_search"}])
        sys.exit("a server tool was accepted")
    except anthropic.BadRequestError as e:
        assert "tools[0].type" in e.message, e.message
    c.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "x"}])
    # The budget is spent: a streamed call is refused before its stream begins, with the status.
    try:
        with c.messages.stream(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "y"}]) as s:
            s.get_final_message()
        sys.exit("a call over the session's budget was served")
    except anthropic.PermissionDeniedError as e:
        assert e.body["error"]["type"] == "permission_error" and "model calls" in e.message, e.body
    close_session(root, session)


def text(root):
    session = open_session(root, "anthropic-text")
    c = client(root, session)
    plain = c.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Hello!"}],
                              thinking={"type": "disabled"}, extra_body={"top_k": 5})
    assert [b.type for b in plain.content] == ["text"], plain
    assert plain.stop_reason in ("end_turn", "max_tokens"), plain
    assert 0 < plain.usage.output_tokens <= 8, plain.usage

    events = list(c.messages.create(model=MODEL, max_tokens=8, stream=True,
                                    messages=[{"role": "user", "content": "Count"}]))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"], kinds
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"], kinds
    assert set(kinds[2:-3]) <= {"content_block_delta"}, kinds
    assert events[0].message.usage.input_tokens > 0, events[0]
    streamed = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    delta = events[-2]
    assert delta.delta.stop_reason in ("end_turn", "max_tokens") and 0 < delta.usage.output_tokens <= 8, delta

    with c.messages.stream(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Count"}]) as s:
        pieces = "".join(s.text_stream)
        final = s.get_final_message()
    assert final.content[0].text == pieces and final.usage.output_tokens <= 8, (final, pieces)
    assert final.usage.input_tokens == events[0].message.usage.input_tokens, final.usage

    record = close_session(root, session)
    assert record["metrics"]["gateway/calls"] == 3, record["metrics"]
    texts = [s["text"] for s in record["samples"]]
    assert any(t.endswith(streamed) or streamed in t for t in texts), (streamed, texts)
    assert record["metrics"]["gateway/ignored_field/thinking"] == 1, record["metrics"]


def main():
    root, mode = sys.argv[1].rstrip("/"), sys.argv[2]
    if mode == "tools":
        tool_loop(root, sys.argv[3])
        errors(root)
    elif mode == "text":
        text(root)
    else:
        sys.exit(f"unknown mode {mode}: tools or text")
    print(f"anthropic {anthropic.__version__}: messages ({mode}) ok")


if __name__ == "__main__":
    main()
