#!/usr/bin/env python3
"""Profiles one decode-step attention layer over slot KV memory (the ooze engine's layout:
[slots, max_len, kv_heads, head_dim]) with torch.profiler, to see which kernel dominates."""
import torch
from torch.profiler import ProfilerActivity, profile

B, L, KV, H, D = 64, 544, 2, 14, 64
dev, dt = "cuda", torch.bfloat16
cache_k = torch.zeros(B, L, KV, D, device=dev, dtype=dt)
cache_v = torch.zeros_like(cache_k)
past = torch.randint(500, 520, (B,), device=dev)
slots = torch.arange(B, device=dev)
q = torch.randn(B, H, 1, D, device=dev, dtype=dt)
k = torch.randn(B, KV, 1, D, device=dev, dtype=dt)
v = torch.randn_like(k)
read_len = int(past.max()) + 1


def step(variant):
    cache_k.index_put_((slots.view(B, 1), past.view(B, 1)), k.transpose(1, 2))
    cache_v.index_put_((slots.view(B, 1), past.view(B, 1)), v.transpose(1, 2))
    kk = cache_k.index_select(0, slots).narrow(1, 0, read_len).transpose(1, 2)
    vv = cache_v.index_select(0, slots).narrow(1, 0, read_len).transpose(1, 2)
    mask = (torch.arange(read_len, device=dev).view(1, 1, read_len) <= past.view(B, 1, 1)).unsqueeze(1)
    if variant == "bool mask + gqa":
        return torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, enable_gqa=True)
    if variant == "float mask, kv repeated":
        bias = torch.zeros(mask.shape, device=dev, dtype=dt).masked_fill(~mask, float("-inf"))
        return torch.nn.functional.scaled_dot_product_attention(q, kk.repeat_interleave(H // KV, 1), vv.repeat_interleave(H // KV, 1), attn_mask=bias)
    if variant == "no mask + gqa (timing only)":
        return torch.nn.functional.scaled_dot_product_attention(q, kk, vv, enable_gqa=True)


for variant in ["bool mask + gqa", "float mask, kv repeated", "no mask + gqa (timing only)"]:
    for _ in range(3):
        step(variant)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step(variant)
        torch.cuda.synchronize()
    print(f"== {variant}")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=70))
