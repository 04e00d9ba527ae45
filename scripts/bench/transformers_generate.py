#!/usr/bin/env python3
"""Baseline for `ooze bench generate`: Hugging Face transformers `generate` on the same checkpoint,
batch and lengths, on the same GPU. Usage:
transformers_generate.py --model DIR [--batch 256] [--input-len 512] [--output-len 512] [--chunk 256]

Random prompt ids, sampling at temperature 1, EOS ignored (min_new_tokens = max_new_tokens), all
requests in batches of --chunk. Prints output tokens/s."""
import argparse
import time

import torch
import transformers
from transformers import AutoModelForCausalLM


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=512)
    p.add_argument("--chunk", type=int, default=256)
    a = p.parse_args()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
    vocab = model.config.vocab_size
    torch.manual_seed(0)
    ids = torch.randint(0, vocab, (a.batch, a.input_len), device="cuda")
    kw = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=a.output_len,
              min_new_tokens=a.output_len, pad_token_id=0)
    with torch.no_grad():
        # Warm-up at the timed run's shapes (a chunk of full prompts, two new tokens), as `ooze
        # bench generate` warms up, so neither run pays first-launch costs in its timed window.
        warm = ids[:a.chunk]
        model.generate(warm, attention_mask=torch.ones_like(warm), **dict(kw, max_new_tokens=2, min_new_tokens=2))
        torch.cuda.synchronize()
        t = time.perf_counter()
        generated = 0
        for i in range(0, a.batch, a.chunk):
            out = model.generate(ids[i:i + a.chunk], attention_mask=torch.ones_like(ids[i:i + a.chunk]), **kw)
            generated += (out.shape[1] - a.input_len) * out.shape[0]
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name()}")
    print(f"transformers generate {a.batch} x ({a.input_len} in + {a.output_len} out) bf16: {dt:.2f} s, {generated / dt:.0f} output tokens/s")


if __name__ == "__main__":
    main()
