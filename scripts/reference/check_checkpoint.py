#!/usr/bin/env python3
"""Loads a model directory that ooze wrote with transformers and checks that it reproduces
reference log-probs. Usage: check_checkpoint.py MODEL_DIR EXPECTED_JSON [--tolerance 1e-4]

EXPECTED_JSON: {"sequences": [{"tokens": [...], "log_probs": [...]}, ...],
                "chat": [{"messages", "tools", "kwargs", "add_generation_prompt", "text", "ids"}, ...]}
"chat" is optional: when present, the directory's tokenizer must load in transformers and
apply_chat_template must give exactly that text and those ids. Exits 1 on any mismatch.
"""
import argparse
import json
import sys

import torch
from transformers import AutoModelForCausalLM


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("expected")
    p.add_argument("--tolerance", type=float, default=1e-4)
    args = p.parse_args()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.eval()
    expected = json.load(open(args.expected))
    worst = 0.0
    for seq in expected["sequences"]:
        ids = seq["tokens"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)
        worst = max(worst, (lp - torch.tensor(seq["log_probs"])).abs().max().item())
    print(f"{args.model}: max |log-prob error| {worst:.2e} over {len(expected['sequences'])} sequences")
    if worst > args.tolerance:
        sys.exit(f"mismatch: {worst} > {args.tolerance}")
    chats = expected.get("chat", [])
    if chats:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(args.model)
        for i, case in enumerate(chats):
            text = tok.apply_chat_template(case["messages"], tools=case.get("tools"), tokenize=False,
                                           add_generation_prompt=case["add_generation_prompt"], **case.get("kwargs", {}))
            if text != case["text"]:
                sys.exit(f"chat case {i}: transformers renders\n{text!r}\nooze rendered\n{case['text']!r}")
            ids = tok.encode(text, add_special_tokens=False)
            if ids != case["ids"]:
                sys.exit(f"chat case {i}: token ids differ:\n{ids}\n{case['ids']}")
        print(f"{args.model}: {len(chats)} chat renders identical in transformers")


if __name__ == "__main__":
    main()
