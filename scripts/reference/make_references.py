#!/usr/bin/env python3
"""Writes the reference values ooze's tests compare against, computed with PyTorch + transformers.

Usage: make_references.py OUT_DIR [--hf-data DIR]

The official tokenizer files are the ones scripts/setup.sh fetches (scripts/fetch_tokenizers.py:
$OOZE_HF_DATA, else .cache/hf in the repository); they are checked against their pinned hashes first.

OUT_DIR/models/<case>/       random-weight checkpoints written by transformers (save_pretrained)
OUT_DIR/models/<case>/expected.json
                             sequences of different lengths and, per sequence, the log-prob and
                             entropy of every next token (CPU, fp32, each sequence alone, no padding)
OUT_DIR/chat_cases.json      conversations rendered by transformers.apply_chat_template with the
                             official Qwen2.5, Qwen3 and Llama 3.1 tokenizers: text and token ids,
                             or the exception the template raised
OUT_DIR/tokenization.json    ids of a varied text set under each official tokenizer

Everything is seeded; re-running gives the same files.
"""
import argparse
import json
import os
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from conversations import CONVERSATIONS, TEXTS  # noqa: E402

sys.path.insert(0, os.path.dirname(HERE))
import fetch_tokenizers  # noqa: E402  (scripts/: where the official tokenizer files are)

MODEL_CASES = {
    # Qwen2.5-style: q/k/v bias, untied head.
    "qwen2": dict(model_type="qwen2", vocab_size=300, hidden_size=64, intermediate_size=160,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
                  max_position_embeddings=512, use_sliding_window=False),
    # Qwen3: q/k RMSNorm, explicit head_dim different from hidden/heads, tied.
    "qwen3": dict(model_type="qwen3", vocab_size=300, hidden_size=64, intermediate_size=160,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
                  max_position_embeddings=512, attention_bias=False),
    # Llama 3.2-style: llama3 RoPE scaling (small original context so the scaling bands matter), tied.
    "llama": dict(model_type="llama", vocab_size=300, hidden_size=64, intermediate_size=160,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                  rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
                  max_position_embeddings=2048,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
}
LENGTHS = [37, 5, 64, 18]


def token_scores(model, ids, temperature=1.0):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float() / temperature
    logp = torch.log_softmax(logits, -1)
    target = torch.tensor(ids[1:]).unsqueeze(1)
    chosen = logp.gather(1, target).squeeze(1)
    entropy = -(logp.exp() * logp).sum(-1)
    return chosen.tolist(), entropy.tolist()


def make_models(out):
    for name, fields in MODEL_CASES.items():
        fields = dict(fields)
        model_type = fields.pop("model_type")
        config = AutoConfig.for_model(model_type, **fields)
        torch.manual_seed(1234)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        # Non-trivial norms and biases, so a wrong formula cannot hide behind ones and zeros.
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "norm" in pname or pname.endswith(".bias"):
                    p.copy_(1.0 + 0.2 * torch.randn_like(p) if "norm" in pname else 0.1 * torch.randn_like(p))
        model.eval()
        directory = os.path.join(out, "models", name)
        model.save_pretrained(directory, safe_serialization=True)
        gen = torch.Generator().manual_seed(99)
        sequences = [torch.randint(0, config.vocab_size, (n,), generator=gen).tolist() for n in LENGTHS]
        records = []
        for ids in sequences:
            lp, ent = token_scores(model, ids)
            lp_t, _ = token_scores(model, ids, temperature=0.7)
            records.append({"tokens": ids, "log_probs": lp, "entropy": ent, "log_probs_t07": lp_t})
        with open(os.path.join(directory, "expected.json"), "w") as f:
            json.dump({"sequences": records}, f)
        print(f"reference model {name}: {sum(p.numel() for p in model.parameters())} parameters")


def make_chat_cases(out, hf_data):
    cases = []
    for family in ["qwen2.5", "qwen3", "llama3.1"]:
        tok = AutoTokenizer.from_pretrained(os.path.join(hf_data, family))
        for conv in CONVERSATIONS:
            if family not in conv.get("families", [family]):
                continue
            kwargs = dict(conv.get("kwargs", {}))
            case = {"family": family, "name": conv["name"], "messages": conv["messages"],
                    "tools": conv.get("tools"), "kwargs": kwargs,
                    "add_generation_prompt": conv.get("add_generation_prompt", False)}
            try:
                text = tok.apply_chat_template(conv["messages"], tools=conv.get("tools"), tokenize=False,
                                               add_generation_prompt=case["add_generation_prompt"], **kwargs)
                case["text"] = text
                case["ids"] = tok.encode(text, add_special_tokens=False)
            except Exception as e:  # the template raised: ooze must raise the same message
                case["error"] = str(e)
            cases.append(case)
    with open(os.path.join(out, "chat_cases.json"), "w") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
    rendered = sum("text" in c for c in cases)
    print(f"chat cases: {len(cases)} ({rendered} rendered, {len(cases) - rendered} raising)")


def make_tokenization(out, hf_data):
    from tokenizers import Tokenizer
    result = {}
    for family in ["qwen2.5", "qwen3", "llama3.1"]:
        tok = Tokenizer.from_file(os.path.join(hf_data, family, "tokenizer.json"))
        result[family] = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids,
                           "ids_special": tok.encode(t, add_special_tokens=True).ids,
                           "decoded": tok.decode(tok.encode(t, add_special_tokens=False).ids, skip_special_tokens=False)}
                          for t in TEXTS]
    with open(os.path.join(out, "tokenization.json"), "w") as f:
        json.dump(result, f, ensure_ascii=False)
    print(f"tokenization: {len(TEXTS)} texts x {len(result)} tokenizers")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--hf-data", default=fetch_tokenizers.default_dir(),
                        help="the official tokenizer files (default: $OOZE_HF_DATA, else .cache/hf)")
    args = parser.parse_args()
    fetch_tokenizers.verify(args.hf_data)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    os.makedirs(args.out, exist_ok=True)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    make_models(args.out)
    make_chat_cases(args.out, args.hf_data)
    make_tokenization(args.out, args.hf_data)
    import rl_golden  # next to this script
    rl_golden.write(os.path.join(args.out, "rl_golden.json"))


if __name__ == "__main__":
    main()
