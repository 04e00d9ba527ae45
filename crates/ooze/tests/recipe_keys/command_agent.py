"""The recipe-key table's agent program (`[agent] type = "command"`), standard library only.

It reads the task on stdin and chats with the policy through the agent gateway (one conversation,
"Go on." after each reply) until a call is refused (max_turns, max_response_tokens) or it has made
its calls: `argv[1]`, default 8. Its result line reports what the command keys change:

- `peak_programs`: the most programs of this run registered at once (a counter file per ooze
  process and gateway port beside this file, under a lock; each waits up to 1 s for a second
  one before its first call);
- `in_cwd`: 1 when its working directory holds a file `command-agent-cwd`;
- `reserved_mb`: 256 when it could map 256 MiB of address space, else 0;
- `interfaces`: the network interfaces it sees (1, loopback, in the network namespace that
  `agent.network = "gateway"` gives it; the host's with `"host"`);
- `reward`: `$AGENT_REWARD` when set; else its answer (the last reply) is left to `[reward]`.
"""

import fcntl
import json
import mmap
import os
import socket
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def counter(change):
    """Adds `change` to the run's count of running programs; returns the count and its peak."""
    port = os.environ["OOZE_GATEWAY_URL"].rsplit(":", 1)[1]
    os.makedirs(os.path.join(HERE, "counters"), exist_ok=True)
    path = os.path.join(HERE, "counters", f"{os.getppid()}-{port}")
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read()
        state = json.loads(text) if text else {"now": 0, "peak": 0}
        state["now"] += change
        state["peak"] = max(state["peak"], state["now"])
        f.seek(0)
        f.truncate()
        f.write(json.dumps(state))
        return state["now"], state["peak"]


def chat(messages):
    """One call to the policy; None when the gateway refuses it."""
    body = {"model": "policy", "messages": messages}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request) as reply:
            return json.load(reply)["choices"][0]["message"]["content"] or ""
    except urllib.error.HTTPError as e:
        print(f"refused: {e.code} {e.read().decode(errors='replace')}", file=sys.stderr)
        return None


def reserved_mb(mb=256):
    try:
        mmap.mmap(-1, mb << 20).close()
        return mb
    except OSError:
        return 0


def main():
    task = json.loads(sys.stdin.readline())
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    counter(1)
    waited = time.monotonic()
    while counter(0)[0] < 2 and time.monotonic() - waited < 1:
        time.sleep(0.01)
    messages = [{"role": "user", "content": task["prompt"]}]
    answer = ""
    for _ in range(calls):
        text = chat(messages)
        if text is None:
            break
        answer = text
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Go on."}]
    _, peak = counter(-1)
    metrics = {"peak_programs": peak, "in_cwd": int(os.path.exists("command-agent-cwd")),
               "reserved_mb": reserved_mb(), "interfaces": len(socket.if_nameindex())}
    result = {"answer": answer, "metrics": metrics}
    if "AGENT_REWARD" in os.environ:
        result["reward"] = float(os.environ["AGENT_REWARD"])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
