"""Data for the agents_sdk recipe: price questions over a catalogue with fresh prices per
question, and chat demonstrations of the agent for the SFT warm start.

    .venv/bin/python recipes/agents_sdk/make_data.py target/agents_sdk/data [--n 4000] [--seed 0]

Writes train.jsonl and test.jsonl (`{"prompt", "label", "metadata": {"prices"}}` rows, each
question from its own customer) and
sft.jsonl (`{"messages", "tools"}` conversations), with the agent's own instructions and its
tool's schema as the Agents SDK sends them (the gateway renders a Responses call in chat form, so
the demonstrations are in that form). One demonstration in three looks the price up and answers
with it; the others answer with a guess (right one time in ninety), so the warm-started policy
starts imperfect and RL has something to find.
"""

import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../python"))
from agent import INSTRUCTIONS, lookup_price  # noqa: E402

ITEMS = ["apple", "pear", "kiwi", "mango", "lemon", "lime", "peach", "plum", "grape", "melon",
         "cherry", "banana", "orange", "onion", "carrot", "potato", "tomato", "pepper", "garlic",
         "ginger", "bread", "butter", "cheese", "egg", "milk", "honey", "rice", "bean", "lentil",
         "walnut"]

# The tool as the gateway renders it: the Agents SDK's schema in chat form.
TOOLS = [{"type": "function", "function": {"name": lookup_price.name,
                                           "description": lookup_price.description,
                                           "parameters": lookup_price.params_json_schema}}]


def question(rng, customer):
    prices = {item: rng.randint(10, 99) for item in ITEMS}
    item = rng.choice(ITEMS)
    return f"Customer {customer} asks: how much does one {item} cost?", item, prices


def demonstration(rng, prompt, item, prices):
    messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": prompt}]
    if rng.random() < 1 / 3:
        call_id = f"call_{rng.randrange(1 << 30):x}"
        messages.append({"role": "assistant", "content": "", "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": "lookup_price", "arguments": {"item": item}}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": f"${prices[item]}"})
        price = prices[item]
    else:
        price = rng.randint(10, 99)
    messages.append({"role": "assistant", "content": f"One {item} costs ${price}."})
    return {"messages": messages, "tools": TOOLS}


def write(path, lines):
    with open(path + ".tmp", "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    os.replace(path + ".tmp", path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--n", type=int, default=4000, help="training questions")
    parser.add_argument("--test", type=int, default=200, help="held-out questions")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    os.makedirs(args.out, exist_ok=True)
    # Every question names its own customer, so no held-out question is also a training one.
    customers = rng.sample(range(10_000, 100_000), args.n + args.test)
    splits = {"train": [question(rng, c) for c in customers[:args.n]],
              "test": [question(rng, c) for c in customers[args.n:]]}
    for split, rows in splits.items():
        write(os.path.join(args.out, f"{split}.jsonl"),
              [{"prompt": p, "label": str(prices[item]), "metadata": {"prices": prices}}
               for p, item, prices in rows])
    write(os.path.join(args.out, "sft.jsonl"),
          [demonstration(rng, *row) for row in splits["train"]])
    print(f"agents_sdk data: {args.n} train, {args.test} test questions, {args.n} demonstrations "
          f"in {args.out}")


if __name__ == "__main__":
    main()
