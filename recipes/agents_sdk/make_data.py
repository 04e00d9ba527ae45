"""Data for the agents_sdk recipe: price questions over a catalogue with fresh prices per
question, and chat demonstrations of the agent for the SFT warm start.

    .venv/bin/python recipes/agents_sdk/make_data.py target/agents_sdk/data [--n 4000] [--seed 0]

Writes train.jsonl and test.jsonl (`{"prompt", "label", "metadata": {"prices"}}` rows; the
held-out questions are customer-item pairs training never asks, and every question has prices of
its own) and sft.jsonl (`{"messages", "tools"}` conversations), with the agent's own instructions
and its tool's schema as the Agents SDK sends them (the gateway renders a Responses call in chat
form, so the demonstrations are in that form). Half the demonstrations look the price up and answer
with it; the others answer with a guess (right one time in ninety), so the warm-started policy
starts imperfect and RL has something to find.

Copying the looked-up price is what a small model warm-started from scratch finds hardest: on an
H100 the `small` model (3.2M parameters) copied it only with half the demonstrations using the tool
and 4000 SFT steps; with a third of them, or 2000 steps, it answered at random (docs/recipes/
python-agents-gpu.md).
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


# Customers are named, not numbered: the only digits a question's context holds are then the
# price the tool returns, which a small model warm-started from scratch must learn to copy.
CUSTOMERS = ["Ada", "Alan", "Anna", "Ben", "Bella", "Carl", "Cora", "Dan", "Dora", "Eli", "Emma",
             "Finn", "Fay", "Gus", "Gina", "Hal", "Hope", "Ivan", "Iris", "Jack", "June", "Kai",
             "Kate", "Leo", "Lily", "Max", "Mia", "Ned", "Nora", "Otto", "Olga", "Paul", "Pia",
             "Rex", "Rosa", "Sam", "Sara", "Tom", "Tess", "Umar", "Vera", "Walt", "Wren", "Yuri",
             "Zoe", "Zack"]


def question(rng, customer, item):
    prices = {name: rng.randint(10, 99) for name in ITEMS}
    return f"{customer} asks: how much does one {item} cost?", item, prices


def demonstration(rng, prompt, item, prices, tool_share):
    messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": prompt}]
    if rng.random() < tool_share:
        call_id = f"call_{rng.randrange(1 << 30):x}"
        messages.append({"role": "assistant", "content": "", "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": "lookup_price", "arguments": {"item": item}}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": f"${prices[item]}"})
        messages.append({"role": "assistant", "content": f"One {item} costs ${prices[item]}."})
    else:
        messages.append({"role": "assistant",
                         "content": f"Sorry, I do not know today's price of one {item}."})
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
    parser.add_argument("--tool-share", type=float, default=1 / 3,
                        help="the share of demonstrations that look the price up (default 1/3)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    os.makedirs(args.out, exist_ok=True)
    # A held-out question is a customer-item pair that training never asks (every customer and
    # every item is seen in training, in other pairs), with prices of its own.
    pairs = [(customer, item) for customer in CUSTOMERS for item in ITEMS]
    rng.shuffle(pairs)
    if args.test >= len(pairs):
        parser.error(f"--test: at most {len(pairs) - 1} held-out questions")
    held_out, training = pairs[:args.test], pairs[args.test:]
    splits = {"train": [question(rng, *rng.choice(training)) for _ in range(args.n)],
              "test": [question(rng, *pair) for pair in held_out]}
    for split, rows in splits.items():
        write(os.path.join(args.out, f"{split}.jsonl"),
              [{"prompt": p, "label": str(prices[item]), "metadata": {"prices": prices}}
               for p, item, prices in rows])
    write(os.path.join(args.out, "sft.jsonl"),
          [demonstration(rng, *row, args.tool_share) for row in splits["train"]])
    print(f"agents_sdk data: {args.n} train, {args.test} test questions, {args.n} demonstrations "
          f"in {args.out}")


if __name__ == "__main__":
    main()
