"""Data for the long_tail recipe: link-following tasks with a long tail of hops, and chat
demonstrations of the agent (agent.py's own prompt and tool) for the SFT warm start.

    python3 recipes/long_tail/make_data.py target/long_tail/data [--n 5000] [--seed 0]

Writes train.jsonl and test.jsonl (`{"prompt", "label", "metadata": {"links", "hops"}}` rows) and
sft.jsonl (`{"messages"}` conversations). Hops are 1 + a geometric draw (mean about 2.5, at most
15), so most chains are short and a few are long. One demonstration in four slips: at a random
hop it looks up a wrong key (which the tool does not know) and answers it, so the warm-started
policy starts imperfect and RL has something to find: copying each key exactly.
"""

import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../python"))
from agent import messages_for, observation  # noqa: E402

MAX_HOPS = 15


def key(rng):
    return f"K{rng.randrange(1000, 10000)}"


def chain_task(rng):
    hops = 1
    while hops < MAX_HOPS and rng.random() < 0.6:
        hops += 1
    keys = [key(rng)]
    while len(keys) < hops + 1:
        k = key(rng)
        if k not in keys:
            keys.append(k)
    links = {a: b for a, b in zip(keys, keys[1:])}
    prompt = f"Start at {keys[0]}. Follow {hops} hops."
    return prompt, keys, links, hops


def demonstration(rng, prompt, keys, links, hops):
    messages = messages_for(prompt)
    slip = rng.randrange(hops + 1) if rng.random() < 0.25 else None
    current = keys[0]
    for hop in range(hops):
        if hop == slip:
            wrong = key(rng)
            messages.append({"role": "assistant", "content": f"lookup {wrong}"})
            messages.append({"role": "user", "content": observation(wrong, links, 0)})
            messages.append({"role": "assistant", "content": f"answer {wrong}"})
            return {"messages": messages}
        messages.append({"role": "assistant", "content": f"lookup {current}"})
        messages.append({"role": "user",
                         "content": observation(current, links, hops - hop - 1)})
        current = links[current]
    messages.append({"role": "assistant", "content": f"answer {current}"})
    return {"messages": messages}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--n", type=int, default=5000, help="training tasks")
    parser.add_argument("--test", type=int, default=200, help="held-out tasks")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    os.makedirs(args.out, exist_ok=True)
    rows = {"test": [chain_task(rng) for _ in range(args.test)],
            "train": [chain_task(rng) for _ in range(args.n)]}
    for split, items in rows.items():
        path = os.path.join(args.out, f"{split}.jsonl")
        with open(path + ".tmp", "w") as f:
            for prompt, keys, links, hops in items:
                f.write(json.dumps({"prompt": prompt, "label": keys[-1],
                                    "metadata": {"links": links, "hops": hops}}) + "\n")
        os.replace(path + ".tmp", path)
    path = os.path.join(args.out, "sft.jsonl")
    with open(path + ".tmp", "w") as f:
        for task in rows["train"]:
            f.write(json.dumps(demonstration(rng, *task)) + "\n")
    os.replace(path + ".tmp", path)
    hops = [t[3] for t in rows["train"]]
    print(f"long_tail data: {len(rows['train'])} train, {len(rows['test'])} test tasks in "
          f"{args.out}; hops mean {sum(hops) / len(hops):.2f}, max {max(hops)}")


if __name__ == "__main__":
    main()
