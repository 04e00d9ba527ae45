#!/usr/bin/env python3
"""Times ways of computing per-token log-probs through a large-vocabulary LM head on a GPU, to
choose ooze's scoring path. Usage: head_variants.py [--rows 16376] [--hidden 896] [--vocab 151936]"""
import argparse
import time

import torch


def bench(fn, iters=10):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        out = fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e3, out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=16376)
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--vocab", type=int, default=151936)
    a = p.parse_args()
    torch.manual_seed(0)
    h = torch.randn(a.rows, a.hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(a.vocab, a.hidden, device="cuda", dtype=torch.bfloat16) * 0.02
    tgt = torch.randint(0, a.vocab, (a.rows, 1), device="cuda")

    def chunked(f, chunk):
        return lambda: torch.cat([f(h[i:i + chunk], tgt[i:i + chunk]) for i in range(0, a.rows, chunk)])

    variants = {
        "mm only (bf16 out)": lambda x, t: (x @ w.t())[:, :1].float().squeeze(1),
        "mm only (fp32 out)": lambda x, t: torch.mm(x, w.t(), out_dtype=torch.float32)[:, 0],
        "bf16 mm, .float(), log_softmax, gather": lambda x, t: torch.log_softmax((x @ w.t()).float(), -1).gather(1, t).squeeze(1),
        "bf16 mm, log_softmax(dtype=float)": lambda x, t: torch.log_softmax(x @ w.t(), -1, dtype=torch.float32).gather(1, t).squeeze(1),
        "fp32-out mm, log_softmax": lambda x, t: torch.log_softmax(torch.mm(x, w.t(), out_dtype=torch.float32), -1).gather(1, t).squeeze(1),
        "fp32-out mm, logsumexp": lambda x, t: (lambda l: (l.gather(1, t) - l.logsumexp(-1, keepdim=True)).squeeze(1))(torch.mm(x, w.t(), out_dtype=torch.float32)),
        "fp32-out mm, cross_entropy": lambda x, t: -torch.nn.functional.cross_entropy(torch.mm(x, w.t(), out_dtype=torch.float32), t.squeeze(1), reduction="none"),
        "bf16 mm, _log_softmax(half_to_float)": lambda x, t: torch._log_softmax(x @ w.t(), -1, True).gather(1, t).squeeze(1),
    }
    ref = None
    for chunk in [4096, 16384]:
        for name, f in variants.items():
            try:
                ms, out = bench(chunked(f, chunk))
                if ref is None and "log_softmax" in name:
                    ref = out
                err = (out - ref).abs().max().item() if ref is not None and "mm only" not in name else float("nan")
                print(f"chunk {chunk:6d}  {name:42s} {ms:7.2f} ms   max|diff| {err:.2e}")
            except Exception as e:
                print(f"chunk {chunk:6d}  {name:42s} failed: {str(e).splitlines()[0]}")


if __name__ == "__main__":
    main()
