#!/usr/bin/env python3
"""The PyTorch training step beside `ooze bench train`: a transformers causal LM with fp32 weights
under bf16 autocast (fp32 master weights, bf16 compute — what ooze does), next-token cross-entropy
over every token, global-norm clipping at 1.0 and torch's fused AdamW, on the same batch shape of
random tokens. Prints the median step time, tokens/s, TFLOP/s (same FLOP count as ooze: 6 per
parameter per token plus causal attention) and MFU against the GPU's dense bf16 peak.

Usage: transformers_train.py --model DIR [--batch 8] [--seq-len 2048] [--iters 5]
"""
import argparse
import time

import torch
import transformers

PEAKS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--iters", type=int, default=5)
    a = p.parse_args()
    dev = torch.device("cuda")
    model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="sdpa").to(dev)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.0, fused=True)
    torch.manual_seed(0)
    ids = torch.randint(model.config.vocab_size, (a.batch, a.seq_len), device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.size(-1)).float(), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(a.iters):
        t = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    times.sort()
    median = times[len(times) // 2]
    c = model.config
    n = sum(p.numel() for p in model.parameters())
    tokens = a.batch * a.seq_len
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    attention = a.batch * 2 * c.num_hidden_layers * c.num_attention_heads * head_dim * a.seq_len ** 2
    flops = (2 * n * tokens + attention) * 3
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAKS.items() if k in name), None)
    mfu = f", MFU {100 * flops / median / peak:.1f}%" if peak else ""
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {name}")
    print(f"transformers train step {a.batch}x{a.seq_len} bf16 autocast + fused AdamW: median {median * 1e3:.1f} ms, "
          f"{tokens / median:.0f} tokens/s, {flops / median / 1e12:.1f} TFLOP/s{mfu}; loss {loss.item():.4f}, "
          f"peak mem {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
