#!/usr/bin/env python3
"""Baseline for `ooze bench forward`: the same full-sequence pass in transformers on the same GPU.

Usage: transformers_forward.py --model DIR [--batch 8] [--seq-len 2048] [--iters 10] [--dtype bf16]

Measures (a) model(input_ids).logits and (b) that plus per-token log-probs of the next tokens the
way transformers users compute them (fp32 log_softmax over the full logits, then gather). Prints
median milliseconds and tokens/s for each.
"""
import argparse
import time

import torch
from transformers import AutoModelForCausalLM


def timed(fn, iters):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2], times[0]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--attn", default="sdpa")
    a = p.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype, attn_implementation=a.attn).cuda().eval()
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (a.batch, a.seq_len), device="cuda")
    tokens = a.batch * a.seq_len

    @torch.no_grad()
    def blocks_only():
        return model.model(ids).last_hidden_state

    @torch.no_grad()
    def logits_only():
        return model(ids).logits

    @torch.no_grad()
    def with_logprobs():
        logits = model(ids).logits[:, :-1].float()
        return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)

    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name()}, {a.batch}x{a.seq_len} {a.dtype} attn={a.attn}")
    for name, fn in [("blocks (hidden states)", blocks_only), ("forward (logits)", logits_only), ("forward+logprobs", with_logprobs)]:
        try:
            median, best = timed(fn, a.iters)
            print(f"transformers {name}: median {median * 1e3:.1f} ms ({tokens / median:.0f} tokens/s), min {best * 1e3:.1f} ms, peak mem {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
        except torch.OutOfMemoryError:
            print(f"transformers {name}: out of memory")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
