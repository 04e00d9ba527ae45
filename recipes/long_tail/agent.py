"""A long-tail tool agent: follow a chain of links, one `lookup` tool call per hop, then answer.

Turns per trajectory spread widely, as in real agent workloads: most chains are 1 to 3 hops,
a few are up to 15 (`make_data.py` draws them), and every lookup is a "remote" call that takes
0.2 to 1 s. A synchronous RL step waits for its longest chain; an asynchronous one does not.

The model writes `lookup K1234`; the tool answers `K1234 -> K5678 (2 hops left)`; after the last
hop the model writes `answer K5678`. The reward is 1 for the chain's last key, else 0. Only the
standard library: the calls go to the agent gateway's Chat Completions endpoint over HTTP.

Run by ooze (`[agent] type = "command"`), once per execution.
"""

import json
import os
import random
import re
import time
import urllib.request

import ooze_agent

SYSTEM = ("Follow the links from the start key. Look each key up with `lookup KEY`; when no hops "
          "are left, write `answer KEY` with the last key.")

# Seconds one lookup takes (a remote API call).
LATENCY = (float(os.environ.get("LONG_TAIL_MIN_LATENCY", "0.2")),
           float(os.environ.get("LONG_TAIL_MAX_LATENCY", "1.0")))


def messages_for(prompt):
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]


def observation(key, links, hops_left):
    """What the tool says about `key`."""
    if key not in links:
        return f"{key} is not a key"
    return f"{key} -> {links[key]} ({hops_left} hops left)"


def chat(messages, max_tokens):
    url, key = os.environ["OOZE_GATEWAY_URL"], os.environ["OOZE_SESSION_ID"]
    body = {"model": "policy", "messages": messages, "max_tokens": max_tokens}
    request = urllib.request.Request(
        url + "/v1/chat/completions", data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    with urllib.request.urlopen(request) as reply:
        return json.load(reply)["choices"][0]["message"]["content"] or ""


def agent(task):
    links = task["metadata"]["links"]
    hops = task["metadata"]["hops"]
    rng = random.Random(os.environ.get("OOZE_SESSION_ID"))
    messages = messages_for(task["prompt"])
    done = 0
    model_seconds = tool_seconds = 0.0
    for _ in range(hops + 2):
        t = time.monotonic()
        text = chat(messages, 12)
        model_seconds += time.monotonic() - t
        messages.append({"role": "assistant", "content": text})
        m = re.fullmatch(r"\s*(lookup|answer) (K\d+)\s*", text)
        if not m or m.group(1) == "answer":
            break
        t = time.monotonic()
        time.sleep(rng.uniform(*LATENCY))
        tool_seconds += time.monotonic() - t
        done += 1
        messages.append({"role": "user",
                         "content": observation(m.group(2), links, max(0, hops - done))})
    answer = messages[-1]["content"] if messages[-1]["role"] == "assistant" else ""
    correct = answer.strip() == f"answer {task['label']}"
    return {"reward": float(correct),
            "metrics": {"hops": hops, "lookups": done, "model_seconds": model_seconds,
                        "tool_seconds": tool_seconds}}


if __name__ == "__main__":
    ooze_agent.run(agent)
