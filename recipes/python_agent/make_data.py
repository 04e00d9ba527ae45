"""Data for the python_agent recipe: multiplication questions, and chat demonstrations of the
agent (agent.py's own system prompt and tool) for the SFT warm start.

    python3 recipes/python_agent/make_data.py target/python_agent/data [--n 4000] [--seed 0]

Writes train.jsonl and test.jsonl (`{"prompt", "label"}` rows) and sft.jsonl (`{"messages",
"tools"}` conversations). The demonstrations mix a good habit with a weak one per question, so
that the warm-started policy starts imperfect and RL has something to find: one in three calls the
calculator and boxes its result; the others box an estimate (the product rounded to the nearest
ten, right only when it ends in 0).
"""

import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../python"))
from agent import TOOLS, calculate, messages_for  # noqa: E402


def question(rng):
    a, b = rng.randint(12, 99), rng.randint(12, 99)
    return f"What is {a} * {b}?", f"{a} * {b}", a * b


def demonstration(rng, prompt, expression, product):
    messages = messages_for(prompt)
    if rng.random() < 1 / 3:
        call_id = f"call_{rng.randrange(1 << 30):x}"
        messages.append({"role": "assistant", "content": "", "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": "calculator", "arguments": {"expression": expression}}}]})
        messages.append({"role": "tool", "tool_call_id": call_id,
                         "content": calculate(expression)})
        messages.append({"role": "assistant", "content": f"\\boxed{{{product}}}"})
    else:
        estimate = int(round(product, -1))
        messages.append({"role": "assistant", "content": f"\\boxed{{{estimate}}}"})
    return {"messages": messages, "tools": TOOLS}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--n", type=int, default=4000, help="training questions")
    parser.add_argument("--test", type=int, default=300, help="held-out questions")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    os.makedirs(args.out, exist_ok=True)
    seen = set()
    rows = {"train": [], "test": []}
    for split, n in (("test", args.test), ("train", args.n)):
        while len(rows[split]) < n:
            prompt, expression, product = question(rng)
            if prompt in seen:
                if len(seen) >= 88 * 88:
                    sys.exit("asked for more questions than there are")
                continue
            seen.add(prompt)
            rows[split].append((prompt, expression, product))
    for split, items in rows.items():
        with open(os.path.join(args.out, f"{split}.jsonl.tmp"), "w") as f:
            for prompt, _, product in items:
                f.write(json.dumps({"prompt": prompt, "label": str(product)}) + "\n")
        os.replace(os.path.join(args.out, f"{split}.jsonl.tmp"),
                   os.path.join(args.out, f"{split}.jsonl"))
    with open(os.path.join(args.out, "sft.jsonl.tmp"), "w") as f:
        for prompt, expression, product in rows["train"]:
            f.write(json.dumps(demonstration(rng, prompt, expression, product)) + "\n")
    os.replace(os.path.join(args.out, "sft.jsonl.tmp"), os.path.join(args.out, "sft.jsonl"))
    print(f"python_agent data: {len(rows['train'])} train, {len(rows['test'])} test questions, "
          f"{len(rows['train'])} demonstrations in {args.out}")


if __name__ == "__main__":
    main()
