"""Opening and closing sessions of `ooze serve --gateway`, and the checks on what a closed session
leaves, shared by the gateway's SDK checks (anthropic_gateway_check.py,
openai_responses_check.py)."""
import json
import urllib.error
import urllib.request


def _request(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return json.load(reply)
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{method} {url}: {e.code} {e.read().decode()}") from None


def open_session(root, name, **options):
    """Opens session `name` (`POST /gateway/sessions`); returns its token."""
    return _request("POST", f"{root}/gateway/sessions", {"session": name, "seed": 1, **options})["session"]


def close_session(root, name):
    """Closes session `name` (`DELETE /gateway/sessions/NAME`); returns its samples and metrics."""
    return _request("DELETE", f"{root}/gateway/sessions/{name}")


def runs_of_ones(mask):
    """The lengths of the runs of 1s in a loss mask."""
    runs, current = [], 0
    for m in mask + [0]:
        if m == 1:
            current += 1
        elif current:
            runs.append(current)
            current = 0
    return runs


def check_one_extended_sample(record, generated):
    """The session's calls grew one sample token-exactly: one sample whose loss mask is 1 exactly
    over the generated turns (`generated`: each call's output tokens, in order), and no assistant
    message was re-tokenised."""
    samples, metrics = record["samples"], record["metrics"]
    assert len(samples) == 1, f"{len(samples)} samples: {[s['text'] for s in samples]}"
    sample = samples[0]
    assert len(sample["loss_mask"]) == len(sample["tokens"]) - sample["prompt_length"], sample
    assert runs_of_ones(sample["loss_mask"]) == generated, (runs_of_ones(sample["loss_mask"]), generated)
    assert metrics["gateway/retokenized_turns"] == 0, metrics
    assert metrics["gateway/calls"] == len(generated), metrics
    assert metrics["gateway/turns"] == len(generated), metrics
    assert metrics["gateway/conversations"] == 1, metrics
    return sample


def check_rendering(sample, model_dir, conversation, tools):
    """The sample decodes exactly to the model's own chat template (transformers'
    `apply_chat_template`) rendering `conversation`, OpenAI chat messages ending in an assistant
    turn, with `tools` (Chat Completions tools). Assistant turns are `None` in `conversation`: each
    is the text of the sample's matching generated (mask-1) run, as the model wrote it; the last is
    appended to the rendering with the generation prompt, as it was generated."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    generated = sample["tokens"][sample["prompt_length"]:]
    runs, current = [], []
    for token, m in zip(generated + [None], sample["loss_mask"] + [0]):
        if m == 1:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current, skip_special_tokens=False))
            current = []
    assistant = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
    assert len(assistant) == len(runs) and assistant[-1] == len(conversation) - 1, (conversation, runs)
    eos = tokenizer.eos_token or ""
    shown = list(conversation)
    for i, text in zip(assistant, runs):
        shown[i] = {"role": "assistant", "content": text.removesuffix(eos)}
    expected = tokenizer.apply_chat_template(shown[:-1], tools=tools, tokenize=False,
                                             add_generation_prompt=True) + runs[-1]
    decoded = tokenizer.decode(sample["tokens"], skip_special_tokens=False)
    assert decoded == expected, f"\n{decoded!r}\n!=\n{expected!r}"
    return runs
