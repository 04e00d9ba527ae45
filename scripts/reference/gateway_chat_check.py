"""Token-exactness of the agent gateway's Chat Completions, checked with the real `openai` client
and Hugging Face's own chat-template rendering (transformers).

Usage: gateway_chat_check.py BASE_URL MODEL_DIR   (BASE_URL: `ooze serve --gateway`'s root URL;
MODEL_DIR: the scripted tool model, which answers every chat with a get_weather tool call).

A tool loop of three calls (plain, streamed, plain with logprobs), each sending back the previous
assistant message as the SDK returned it, then a call with another system prompt. Checks:
- one sample for the loop (each call extended the last) and a sibling for the other system prompt;
- the loop sample's tokens decode exactly to the template's rendering of the final conversation,
  each assistant turn rendered as the model wrote it;
- its mask-1 tokens are exactly the generated tokens, with the log-probs the calls returned;
- no turn was retokenised; a bad key is the SDK's AuthenticationError.
"""

import json
import sys
import urllib.request

import openai
from transformers import AutoTokenizer

base, model_dir = sys.argv[1].rstrip("/"), sys.argv[2]
if base.endswith("/v1"):
    base = base[:-3]


def admin(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, method=method,
                                     headers={"content-type": "application/json"})
    return json.load(urllib.request.urlopen(request))


session = admin("POST", "/gateway/sessions", {"session": "chat-exact", "seed": 7})["session"]
client = openai.OpenAI(base_url=base + "/v1", api_key=session, max_retries=0)

try:
    openai.OpenAI(base_url=base + "/v1", api_key="no-such-session", max_retries=0) \
        .chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    sys.exit("a bad key was accepted")
except openai.AuthenticationError:
    pass

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
messages = [{"role": "system", "content": "You check the weather."},
            {"role": "user", "content": "Weather in Paris?"}]
generated = []   # per call: (token texts, log-probs)
raw_turns = []   # per call: the text the model wrote


def record(logprobs):
    texts = [t.token for t in logprobs]
    generated.append(([t.token for t in logprobs], [t.logprob for t in logprobs]))
    raw_turns.append("".join(texts))


for call in range(3):
    if call == 1:
        stream = client.chat.completions.create(
            model="gpt-4o", messages=messages, tools=TOOLS, stream=True, logprobs=True,
            temperature=0.2, max_tokens=16)
        calls, content, lps = {}, "", []
        for chunk in stream:
            choice = chunk.choices[0]
            if choice.logprobs and choice.logprobs.content:
                lps.extend(choice.logprobs.content)
            delta = choice.delta
            content += delta.content or ""
            for c in delta.tool_calls or []:
                calls[c.index] = {"id": c.id, "type": "function",
                                  "function": {"name": c.function.name,
                                               "arguments": c.function.arguments}}
        assert choice.finish_reason == "tool_calls", choice.finish_reason
        record(lps)
        message = {"role": "assistant", "content": content or None,
                   "tool_calls": [calls[i] for i in sorted(calls)]}
    else:
        reply = client.chat.completions.create(
            model="gpt-4o", messages=messages, tools=TOOLS, logprobs=True, max_tokens=16,
            store=True, metadata={"run": "x"})
        assert reply.choices[0].finish_reason == "tool_calls", reply.choices[0]
        record(reply.choices[0].logprobs.content)
        message = reply.choices[0].message.model_dump(exclude_none=True)
    messages.append(message)
    for c in message["tool_calls"]:
        messages.append({"role": "tool", "tool_call_id": c["id"], "content": "Sunny, 21 C"})

# Another system prompt: a sibling.
client.chat.completions.create(model="claude-x", max_tokens=4, messages=[
    {"role": "system", "content": "Another agent."}, {"role": "user", "content": "Hi"}])

closed = admin("DELETE", f"/gateway/sessions/{session}")
samples, metrics = closed["samples"], closed["metrics"]
assert len(samples) == 2, [s["text"] for s in samples]
assert metrics["gateway/conversations"] == 2 and metrics["gateway/retokenized_turns"] == 0, metrics
assert metrics["gateway/sampling_overridden"] == 1, metrics
assert metrics.get("gateway/ignored_field/store") == 2, metrics

loop = samples[0]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
# The final conversation as the model wrote it: each assistant turn's raw text.
eos = "<|im_end|>"
shown, turn = [], 0
for m in messages:
    if m["role"] == "assistant":
        shown.append({"role": "assistant", "content": raw_turns[turn].removesuffix(eos)})
        turn += 1
    else:
        shown.append(m)
# Up to the last assistant turn with the generation prompt, then that turn as generated (the
# tool result after it in `messages` was never sent).
last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
expected = tokenizer.apply_chat_template(shown[:last], tools=TOOLS, tokenize=False,
                                         add_generation_prompt=True) + raw_turns[-1]
decoded = tokenizer.decode(loop["tokens"], skip_special_tokens=False)
assert decoded == expected, f"\n{decoded!r}\n!=\n{expected!r}"

mask = loop["loss_mask"]
trained = [t for t, m in zip(loop["tokens"][loop["prompt_length"]:], mask) if m == 1]
trained_lps = [lp for lp, m in zip(loop["rollout_log_probs"], mask) if m == 1]
want_texts = [t for texts, _ in generated for t in texts]
want_lps = [lp for _, lps in generated for lp in lps]
assert [tokenizer.decode([t], skip_special_tokens=False) for t in trained] == want_texts, \
    (trained, want_texts)
assert len(trained_lps) == len(want_lps) and all(
    abs(a - b) <= 1e-6 * max(1.0, abs(b)) for a, b in zip(trained_lps, want_lps)), \
    (trained_lps, want_lps)
print(f"gateway chat: {len(want_texts)} generated tokens over 3 calls in one sample, exact")
