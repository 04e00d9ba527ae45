"""FlashAttention-order attention against PyTorch's FlashAttention-2 forward, bitwise, and its
speed in decode against split attention. Run through run.sh (which builds the variants).

Correctness: causal sequences of mixed lengths, q/k/v random; the reference is
aten._flash_attention_forward over packed sequences (what ooze's trainer calls). Each variant runs
(a) over every token, in tiles of 16 / G tokens, and (b) as decode, the last token of each
sequence alone; both are compared element by element with the reference. Split attention's decode
is compared the same way, for the mismatch the default engine had before.

Speed (--time): decode at the 0.5B, 4B and 7B shapes (paged keys and values, blocks of 16,
shuffled table), both kernels captured in a CUDA graph, µs per call.
"""

import ctypes
import glob
import math
import os
import sys

import torch

built = sys.argv[1]
dev = torch.device("cuda")
P, I64, I32, F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float


def load_fao(path):
    lib = ctypes.CDLL(path)
    fn = lib.ooze_launch_fa_order_attention
    fn.argtypes = [P, I64, P, I64, P, I64, P, I32, I64, P, I32, P, I32, I32, I32, F32, I32, P, P,
                   P, I64, P]
    fn.restype = I32
    lib.ooze_fa_order_chunks.argtypes = [I32]
    lib.ooze_fa_order_chunks.restype = I32
    fn.chunks_of = lib.ooze_fa_order_chunks
    return fn


def load_split(path):
    lib = ctypes.CDLL(path)
    fn = lib.ooze_launch_split_attention
    fn.argtypes = [P, I64, P, I64, P, I64, P, I32, I64, P, I32, I32, P, I32, I32, I32, I32, F32,
                   P, P, P, I64, P, P]
    fn.restype = I32
    lib.ooze_attention_splits.argtypes = [I32]
    lib.ooze_attention_splits.restype = I32
    return fn, lib.ooze_attention_splits


def ptr(t):
    return None if t is None else t.data_ptr()


def stream():
    return torch.cuda.current_stream().cuda_stream


PARTS = {}


def fao_call(fn, q, k, v, table, width, block_size, tiles, positions, heads, kv, dim, scale, out,
             read_len):
    n_tiles = tiles.shape[0] if tiles is not None else q.shape[0]
    chunks = fn.chunks_of(read_len)
    key = (n_tiles, kv, chunks, dim)
    if chunks > 1 and key not in PARTS:
        PARTS[key] = (torch.empty(n_tiles * kv * chunks * 16 * dim, device=dev),
                      torch.empty(n_tiles * kv * chunks * 16 * 2, device=dev))
    part_o, part_ml = PARTS[key] if chunks > 1 else (None, None)
    rc = fn(ptr(q), q.stride(0), ptr(k), k.stride(0), ptr(v), v.stride(0), ptr(table), width,
            block_size, ptr(tiles), n_tiles, ptr(positions), heads, kv, dim, scale, chunks,
            ptr(part_o), ptr(part_ml), ptr(out), out.stride(0), stream())
    assert rc == 0, f"launch failed: {rc}"


class Split:
    def __init__(self, fn, splits_of):
        self.fn, self.splits_of = fn, splits_of

    def prepare(self, tokens, kv, dim, read_len):
        self.splits = self.splits_of(read_len)
        self.part_o = torch.empty(tokens * kv * self.splits * 16 * dim, device=dev)
        self.part_ml = torch.empty(tokens * kv * self.splits * 16 * 2, device=dev)

    def __call__(self, q, k, v, table, width, block_size, positions, heads, kv, dim, scale, out):
        rc = self.fn(ptr(q), q.stride(0), ptr(k), k.stride(0), ptr(v), v.stride(0), ptr(table),
                     width, block_size, None, q.shape[0], q.shape[0], ptr(positions), heads, kv,
                     dim, self.splits, scale, ptr(self.part_o), ptr(self.part_ml), ptr(out),
                     out.stride(0), None, stream())
        assert rc == 0, f"split launch failed: {rc}"


def flash_reference(q, k, v, lengths, scale):
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    cu = torch.tensor(offsets, dtype=torch.int32, device=dev)
    longest = max(lengths)
    out = torch.ops.aten._flash_attention_forward(
        q, k, v, cu, cu, longest, longest, 0.0, True, False, scale=scale)[0]
    return out, offsets


def differ(a, b):
    d = a.float() != b.float()
    return d.sum().item(), d.numel(), (a.float() - b.float()).abs().max().item()


def check(variants, split, dim, heads, kv, lengths, spread):
    g = torch.Generator(device=dev).manual_seed(dim * 1000 + heads)
    total = sum(lengths)
    q = (torch.randn(total, heads, dim, device=dev, generator=g) * spread).bfloat16()
    k = (torch.randn(total, kv, dim, device=dev, generator=g) * spread).bfloat16()
    v = torch.randn(total, kv, dim, device=dev, generator=g).bfloat16()
    scale = 1.0 / math.sqrt(dim)
    ref, offsets = flash_reference(q, k, v, lengths, scale)
    group = heads // kv
    per_tile = 16 // group
    tiles, positions = [], []
    for s, n in enumerate(lengths):
        for first in range(0, n, per_tile):
            tiles.append([offsets[s] + first, min(per_tile, n - first), s])
        positions.extend(range(n))
    tiles = torch.tensor(tiles, dtype=torch.int32, device=dev)
    positions = torch.tensor(positions, dtype=torch.int64, device=dev)
    starts = torch.tensor(offsets[:-1], dtype=torch.int64, device=dev)
    last = torch.tensor([o - 1 for o in offsets[1:]], device=dev)
    q_dec = q[last].contiguous()
    pos_dec = positions[last].contiguous()
    name = f"D={dim} heads {heads}/{kv}, {len(lengths)} seqs ({min(lengths)}-{max(lengths)}), x{spread}"
    for vname, fn in variants:
        out = torch.full_like(q, float("nan"))
        fao_call(fn, q.view(total, -1), k.view(total, -1), v.view(total, -1), starts, 1, 0, tiles,
                 positions, heads, kv, dim, scale, out.view(total, -1), max(lengths))
        out_dec = torch.full_like(q_dec, float("nan"))
        fao_call(fn, q_dec.view(len(lengths), -1), k.view(total, -1), v.view(total, -1), starts, 1,
                 0, None, pos_dec, heads, kv, dim, scale, out_dec.view(len(lengths), -1),
                 max(lengths))
        torch.cuda.synchronize()
        n1, t1, m1 = differ(out, ref)
        n2, t2, m2 = differ(out_dec, ref[last])
        print(f"  {vname:10s} {name}: all tokens {n1}/{t1} differ (max {m1:.3g}); "
              f"decode {n2}/{t2} differ (max {m2:.3g})")
    split.prepare(len(lengths), kv, dim, max(lengths))
    out_dec = torch.full_like(q_dec, float("nan"))
    split(q_dec.view(len(lengths), -1), k.view(total, -1), v.view(total, -1), starts, 1, 0, pos_dec,
          heads, kv, dim, scale, out_dec.view(len(lengths), -1))
    torch.cuda.synchronize()
    n2, t2, m2 = differ(out_dec, ref[last])
    print(f"  {'split':10s} {name}: decode {n2}/{t2} differ (max {m2:.3g})")


def decode_inputs(batch, dim, heads, kv, length, block=16):
    """A decode step's inputs: `batch` rows of `length` keys in paged memory (blocks of `block`
    keys behind a shuffled table), random bf16: q, k and v rows, table, width, positions."""
    g = torch.Generator(device=dev).manual_seed(7)
    width = (length + block - 1) // block
    cells = batch * width * block
    kc = torch.randn(cells, kv, dim, device=dev, generator=g).bfloat16()
    vc = torch.randn(cells, kv, dim, device=dev, generator=g).bfloat16()
    table = torch.randperm(batch * width, device=dev, generator=g).view(batch, width)
    q = torch.randn(batch, heads, dim, device=dev, generator=g).bfloat16()
    positions = torch.full((batch,), length - 1, dtype=torch.int64, device=dev)
    return q, kc.view(cells, -1), vc.view(cells, -1), table, width, positions


def timing(fao, split, label, batch, dim, heads, kv, length, reps=20):
    block = 16
    q, kc, vc, table, width, positions = decode_inputs(batch, dim, heads, kv, length, block)
    scale = 1.0 / math.sqrt(dim)
    out_a = torch.empty_like(q)
    out_b = torch.empty_like(q)
    split.prepare(batch, kv, dim, length)
    run_a = lambda: fao_call(fao, q.view(batch, -1), kc, vc, table, width, block, None, positions,
                             heads, kv, dim, scale, out_a.view(batch, -1), length)
    run_b = lambda: split(q.view(batch, -1), kc, vc, table, width, block, positions, heads, kv,
                          dim, scale, out_b.view(batch, -1))
    result = {}
    for name, run in (("fa-order", run_a), ("split", run_b)):
        run()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                run()
        best = float("inf")
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            best = min(best, start.elapsed_time(end) * 1000 / reps)
        result[name] = best
    kv_bytes = 2 * batch * length * kv * dim * 2
    print(f"  {label}: fa-order {result['fa-order']:.1f} µs ({kv_bytes / result['fa-order'] / 1e3:.0f} GB/s), "
          f"split {result['split']:.1f} µs ({kv_bytes / result['split'] / 1e3:.0f} GB/s); "
          f"outputs differ in {(out_a != out_b).sum().item()}/{out_a.numel()} elements")


def profile_call(fao, batch, dim, heads, kv, length):
    block = 16
    q, kc, vc, table, width, positions = decode_inputs(batch, dim, heads, kv, length, block)
    out = torch.empty_like(q)
    fao_call(fao, q.view(batch, -1), kc, vc, table, width, block, None, positions, heads, kv, dim,
             1.0 / math.sqrt(dim), out.view(batch, -1), length)
    torch.cuda.synchronize()


def time_all(best, split):
    print("decode speed (CUDA graph of 20 calls, best of 5):")
    timing(best, split, "0.5B 256 x 768", 256, 64, 14, 2, 768)
    timing(best, split, "0.5B 200 x 768", 200, 64, 14, 2, 768)
    timing(best, split, "4B 128 x 1100", 128, 128, 32, 8, 1100)
    timing(best, split, "4B 128 x 1536", 128, 128, 32, 8, 1536)
    timing(best, split, "4B 100 x 1536", 100, 128, 32, 8, 1536)
    timing(best, split, "7B 64 x 1536", 64, 128, 28, 4, 1536)
    timing(best, split, "0.5B 1 x 32768", 1, 64, 14, 2, 32768)
    timing(best, split, "4B 8 x 8192", 8, 128, 32, 8, 8192)


def main():
    variants = [(os.path.basename(p)[4:-3], load_fao(p))
                for p in sorted(glob.glob(os.path.join(built, "fao_*.so")))]
    split = Split(*load_split(os.path.join(built, "split.so")))
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    timed = os.environ.get("FAO_TIME", "u1_r0").split(",")
    chosen = [(n, f) for n, f in variants if n in timed]
    if "--profile" in sys.argv:
        # One eager call per variant at the 0.5B and 7B decode shapes, for a profiler (ncu).
        for name, fn in chosen:
            shapes = (("0.5B", 256, 64, 14, 2, 768), ("7B", 64, 128, 28, 4, 1536))
            only = os.environ.get("FAO_PROFILE_SHAPES")
            for label, batch, dim, heads, kv, length in shapes:
                if only and label not in only.split(","):
                    continue
                print(f"profiling {name} at {label}")
                profile_call(fn, batch, dim, heads, kv, length)
        return
    if "--time" in sys.argv:
        for name, fn in chosen:
            print(f"variant {name}:")
            time_all(fn, split)
        return
    print("bitwise against FlashAttention-2 (aten._flash_attention_forward, varlen, causal):")
    mixed = [1, 2, 15, 16, 17, 63, 64, 65, 127, 128, 129, 300, 511, 777, 1024, 1500, 2048]
    for dim, heads, kv in ((64, 14, 2), (128, 32, 8), (128, 28, 4)):
        for spread in (1.0, 3.0):
            check(variants, split, dim, heads, kv, mixed, spread)
    print("past one chunk (4,096 keys: rows longer than it are merged, not bitwise):")
    for dim, heads, kv in ((64, 14, 2), (128, 32, 8)):
        check(chosen[:1], split, dim, heads, kv, [100, 4095, 4096, 4097, 5000, 9000, 20000], 1.0)


main()
