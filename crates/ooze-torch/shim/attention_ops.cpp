// Tensor-level entry points of ooze's attention: FlashAttention-2 (ATen) for training and fresh
// prefills (cuDNN's fused attention over slots for supervised training: slot_attention.cpp); over
// paged keys, attention in FlashAttention-2's order (fa_order_attention.cu, the default numerics)
// or split attention (attention.cu, deterministic numerics, where training runs it too). Checks
// and error reporting as in ops.cpp.

#include "ops.h"

#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <vector>

namespace {

using namespace ooze_ops;

// Checks shared by the entry points of ooze's attention kernels (split attention and
// FlashAttention order): bf16 q [tokens, heads, dim] whose heads and dims are contiguous, and
// keys/values whose rows hold kv_heads · dim contiguous elements.
void check_tiled_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           int64_t kv_heads) {
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && q.dim() == 3 && q.stride(2) == 1 &&
                  q.stride(1) == q.size(2),
              "q must be bfloat16 [tokens, heads, head_dim] with contiguous heads");
  const int64_t dim = q.size(2), heads = q.size(1);
  TORCH_CHECK(dim == 64 || dim == 128, "ooze's attention kernels take head_dim 64 or 128, got ", dim);
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0 && heads / kv_heads <= 16,
              "ooze's attention kernels take at most 16 query heads per key head");
  for (const at::Tensor* t : {&k, &v}) {
    TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->device() == q.device(),
                "keys and values must be bfloat16 on q's device");
  }
}

// Query tiles of `tokens_per_tile` consecutive tokens of one sequence, for sequences of
// `lengths` tokens laid out one after another: int32 [tiles, 3] (first token, count, sequence).
at::Tensor query_tiles(const std::vector<int64_t>& lengths, int64_t tokens_per_tile,
                       const at::Device& device) {
  std::vector<int32_t> tiles;
  int64_t start = 0;
  for (size_t seq = 0; seq < lengths.size(); ++seq) {
    for (int64_t t = 0; t < lengths[seq]; t += tokens_per_tile) {
      tiles.push_back(static_cast<int32_t>(start + t));
      tiles.push_back(static_cast<int32_t>(std::min(tokens_per_tile, lengths[seq] - t)));
      tiles.push_back(static_cast<int32_t>(seq));
    }
    start += lengths[seq];
  }
  const int64_t n = static_cast<int64_t>(tiles.size() / 3);
  return at::from_blob(tiles.data(), {n, 3}, at::kInt).to(device);
}

// Runs split attention; returns out [tokens, heads, dim] and, with `want_lse`, lse [heads, tokens].
std::pair<at::Tensor, at::Tensor> split_attention(const at::Tensor& q, const at::Tensor& k,
                                                  int64_t k_stride, const at::Tensor& v,
                                                  int64_t v_stride, const at::Tensor& table,
                                                  int64_t width, int64_t block_size,
                                                  const at::Tensor& tiles,
                                                  const at::Tensor& positions, int64_t kv_heads,
                                                  int64_t max_keys, double scale, bool want_lse) {
  const int64_t tokens = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t n_tiles = tiles.size(0);
  const int splits = ooze_attention_splits(static_cast<int>(std::max<int64_t>(max_keys, 1)));
  auto f32 = q.options().dtype(at::kFloat);
  at::Tensor part_o = at::empty({n_tiles, kv_heads, splits, 16, dim}, f32);
  at::Tensor part_ml = at::empty({n_tiles, kv_heads, splits, 16, 2}, f32);
  at::Tensor out = at::empty({tokens, heads, dim}, q.options());
  at::Tensor lse = want_lse ? at::empty({heads, tokens}, f32) : at::Tensor();
  if (tokens > 0) {
    check_launch(ooze_launch_split_attention(
        q.data_ptr(), q.stride(0), k.data_ptr(), k_stride, v.data_ptr(), v_stride,
        table.data_ptr<int64_t>(), static_cast<int>(width), block_size, tiles.data_ptr<int>(),
        static_cast<int>(n_tiles), static_cast<int>(tokens), positions.data_ptr<int64_t>(),
        static_cast<int>(heads), static_cast<int>(kv_heads), static_cast<int>(dim), splits,
        static_cast<float>(scale), part_o.data_ptr<float>(), part_ml.data_ptr<float>(),
        out.data_ptr(), heads * dim, want_lse ? lse.data_ptr<float>() : nullptr, stream()));
  }
  return {out, lse};
}

// The output [tokens, heads, dim] of an attention kernel in FlashAttention-2's order and, for rows
// split into more than one chunk of keys, the chunks' partials (undefined otherwise).
struct FaoBuffers {
  int chunks;
  at::Tensor part_o, part_ml, out;
  FaoBuffers(const at::TensorOptions& options, int64_t tokens, int64_t n_tiles, int64_t heads,
             int64_t kv_heads, int64_t dim, int64_t max_keys)
      : chunks(ooze_fa_order_chunks(static_cast<int>(std::max<int64_t>(max_keys, 1)))) {
    if (chunks > 1) {
      auto f32 = options.dtype(at::kFloat);
      part_o = at::empty({n_tiles, kv_heads, chunks, 16, dim}, f32);
      part_ml = at::empty({n_tiles, kv_heads, chunks, 16, 2}, f32);
    }
    out = at::empty({tokens, heads, dim}, options);
  }
  float* o() { return chunks > 1 ? part_o.data_ptr<float>() : nullptr; }
  float* ml() { return chunks > 1 ? part_ml.data_ptr<float>() : nullptr; }
};

// Runs attention in FlashAttention-2's order over rows that see at most max_keys keys; tiles as
// split_attention's, or undefined for decode (one token per row). Returns out [tokens, heads, dim].
at::Tensor fa_order_attention(const at::Tensor& q, const at::Tensor& k, int64_t k_stride,
                              const at::Tensor& v, int64_t v_stride, const at::Tensor& table,
                              int64_t width, int64_t block_size, const at::Tensor& tiles,
                              const at::Tensor& positions, int64_t kv_heads, int64_t max_keys,
                              double scale) {
  const int64_t tokens = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t n_tiles = tiles.defined() ? tiles.size(0) : tokens;
  FaoBuffers b(q.options(), tokens, n_tiles, heads, kv_heads, dim, max_keys);
  if (tokens > 0) {
    check_launch(ooze_launch_fa_order_attention(
        q.data_ptr(), q.stride(0), k.data_ptr(), k_stride, v.data_ptr(), v_stride,
        table.data_ptr<int64_t>(), static_cast<int>(width), block_size,
        tiles.defined() ? tiles.data_ptr<int>() : nullptr, static_cast<int>(n_tiles),
        positions.data_ptr<int64_t>(), static_cast<int>(heads), static_cast<int>(kv_heads),
        static_cast<int>(dim), static_cast<float>(scale), b.chunks, b.o(), b.ml(),
        b.out.data_ptr(), heads * dim, stream()));
  }
  return b.out;
}

// Checks a decode launch's block tables [rows, width] (int64) against its read_len and block
// size; returns the width.
int64_t checked_table_width(const at::Tensor& tables, int64_t rows, int64_t block_size,
                            int64_t read_len) {
  TORCH_CHECK(block_size % 16 == 0,
              "decode attention takes block sizes that are multiples of 16, got ", block_size);
  TORCH_CHECK(tables.scalar_type() == at::kLong && tables.is_contiguous() && tables.dim() == 2 &&
                  tables.size(0) == rows,
              "block tables must be contiguous int64 [rows, width]");
  const int64_t width = tables.size(1);
  TORCH_CHECK(read_len > 0 && read_len <= width * block_size,
              "read_len must be in 1..=table width × block size");
  return width;
}

// Causal attention over packed sequences with split attention's arithmetic (the engine's, so a
// trained token's forward agrees bitwise with how it was sampled). The backward is
// FlashAttention-2's (ATen) over this forward's own output and log-sum-exp (FlashAttention's
// layout, [heads, tokens]): the gradient of the same function, to rounding, without running
// FlashAttention's forward again.
struct SplitAttentionFunction : public torch::autograd::Function<SplitAttentionFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& cu_seqlens, std::vector<int64_t> lengths,
                            double scale) {
    const int64_t total = q.size(0), kv_heads = k.size(1), dim = q.size(2);
    const int64_t group = q.size(1) / kv_heads;
    // Keys and values with 16 rows of room after the last sequence: a 16-key tile may run past a
    // sequence's end (those keys are masked, but they are read).
    auto padded = [&](const at::Tensor& x) {
      at::Tensor p = at::zeros({total + 16, kv_heads, dim}, x.options());
      p.narrow(0, 0, total).copy_(x);
      return p;
    };
    const at::Tensor kp = padded(k), vp = padded(v);
    std::vector<int64_t> starts, positions;
    int64_t start = 0, longest = 0;
    for (int64_t len : lengths) {
      starts.push_back(start);
      for (int64_t t = 0; t < len; ++t) positions.push_back(t);
      start += len;
      longest = std::max(longest, len);
    }
    TORCH_CHECK(start == total, "sequence lengths must sum to the token count");
    auto device = q.device();
    const at::Tensor table = at::tensor(starts, at::kLong).to(device);
    const at::Tensor pos = at::tensor(positions, at::kLong).to(device);
    const at::Tensor tiles = query_tiles(lengths, std::max<int64_t>(16 / group, 1), device);
    auto [out, lse] = split_attention(q, kp, kv_heads * dim, vp, kv_heads * dim, table, 1, 0,
                                      tiles, pos, kv_heads, longest, scale, /*want_lse=*/true);
    ctx->save_for_backward({q, k, v, cu_seqlens, out, lse});
    ctx->saved_data["longest"] = longest;
    ctx->saved_data["scale"] = scale;
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &cu = saved[3];
    const at::Tensor &out = saved[4], &lse = saved[5];
    const int64_t longest = ctx->saved_data["longest"].toInt();
    const double scale = ctx->saved_data["scale"].toDouble();
    // No dropout: the random-number state is not read (FlashAttention's forward returns these
    // empty scalars then too).
    const at::Tensor unused_seed = at::empty({}, at::kLong), unused_offset = at::empty({}, at::kLong);
    auto [dq, dk, dv] = at::_flash_attention_backward(
        grads[0].contiguous(), q, k, v, out, lse, cu, cu, longest, longest, 0.0,
        /*is_causal=*/true, unused_seed, unused_offset, scale);
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Causal attention over packed sequences straight from the fused projection's output
// qkv [tokens, ≥ (heads + 2 kv_heads) · dim] (q, k, v heads at the start of each row; columns past
// them get a zero gradient): the rotary embedding of q and k (ooze's kernel; with Qwen3's q_norm /
// k_norm, each head RMS-normalised first, in rope_store's arithmetic: the engine's bits), then
// FlashAttention-2. The backward writes the gradient of qkv as one tensor: FlashAttention's dq and
// dk rotated back into their columns (through the norms' backward, which also gives the norm
// weights' gradients), dv copied into its own. Separate operations would have autograd build
// zero-padded gradients for the q, k and v slices and add them up (ncu, 0.5B 8 × 2048: ~6 ms a
// training step of fills, copies and adds; with the norms as ATen operations, 4B 4 × 4096: ~140
// ms of norms, copies, fills and adds).
struct QkvFlashAttentionFunction : public torch::autograd::Function<QkvFlashAttentionFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& qkv,
                            const at::Tensor& cos, const at::Tensor& sin,
                            const at::Tensor& cu_seqlens, const at::Tensor& q_norm,
                            const at::Tensor& k_norm, double eps, int64_t heads, int64_t kv_heads,
                            int64_t dim, int64_t longest, double scale, const at::Tensor& slot_rows,
                            std::vector<int64_t> slot_groups, int64_t slot_total) {
    const int64_t tokens = qkv.size(0);
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["kv_heads"] = kv_heads;
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["longest"] = longest;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["eps"] = eps;
    const bool normed = q_norm.numel() > 0;
    ctx->saved_data["normed"] = normed;
    ctx->saved_data["slot_groups"] = std::vector<int64_t>{};
    if (tokens == 0) {
      ctx->save_for_backward({qkv, q_norm, k_norm});
      return at::empty({0, heads, dim}, qkv.options());
    }
    at::Tensor q, k, v;
    if (normed) {
      q = at::empty({tokens, heads, dim}, qkv.options());
      k = at::empty({tokens, kv_heads, dim}, qkv.options());
      v = at::empty({tokens, kv_heads, dim}, qkv.options());
      // Null cells: row r's k and v go to row r of k and v.
      check_launch(ooze_launch_rope_store(
          /*bf16=*/1, qkv.data_ptr(), qkv.stride(0), nullptr, cos.data_ptr(), sin.data_ptr(),
          q_norm.data_ptr(), k_norm.data_ptr(), static_cast<float>(eps), q.data_ptr(),
          k.data_ptr(), v.data_ptr(), static_cast<int>(tokens), static_cast<int>(heads),
          static_cast<int>(kv_heads), static_cast<int>(dim), stream()));
    } else {
      const at::Tensor qk = rope_apply(qkv, cos, sin, heads + kv_heads, dim, 1.f);
      q = qk.narrow(1, 0, heads);
      k = qk.narrow(1, heads, kv_heads);
      v = qkv.narrow(1, (heads + kv_heads) * dim, kv_heads * dim).view({tokens, kv_heads, dim});
    }
    if (!slot_groups.empty()) {
      try {
        SlotForward f =
            slot_attention_forward(q, k, v, slot_layout(slot_rows, slot_groups, slot_total), scale);
        std::vector<at::Tensor> saved = {qkv, q_norm, k_norm, f.q, f.k, f.v, cos, sin, slot_rows};
        saved.insert(saved.end(), f.per_group.begin(), f.per_group.end());
        ctx->save_for_backward(saved);
        ctx->saved_data["slot_groups"] = slot_groups;
        ctx->saved_data["slot_total"] = slot_total;
        return f.out;
      } catch (const c10::Error& e) {
        // A cuDNN that refuses the shape (or has no engine for it): FlashAttention-2 instead.
        static std::once_flag warned;
        std::call_once(warned, [&] {
          std::fprintf(stderr,
                       "ooze: cuDNN attention failed, training attention falls back to "
                       "FlashAttention-2: %s\n",
                       e.what_without_backtrace());
        });
      }
    }
    auto fwd = at::_flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, longest, longest,
                                            0.0, /*is_causal=*/true,
                                            /*return_debug_mask=*/false, scale);
    const at::Tensor out = std::get<0>(fwd);
    ctx->save_for_backward({qkv, q_norm, k_norm, q, k, v, cos, sin, cu_seqlens, out,
                            std::get<1>(fwd), std::get<2>(fwd), std::get<3>(fwd)});
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const int64_t kv_heads = ctx->saved_data["kv_heads"].toInt();
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const int64_t longest = ctx->saved_data["longest"].toInt();
    const double scale = ctx->saved_data["scale"].toDouble();
    const double eps = ctx->saved_data["eps"].toDouble();
    const bool normed = ctx->saved_data["normed"].toBool();
    const at::Tensor &qkv = s[0], &q_norm = s[1], &k_norm = s[2];
    // The gradients of qkv and of the norm weights (when given); the other inputs take none.
    const auto with = [](at::Tensor g, at::Tensor dq_norm, at::Tensor dk_norm) {
      torch::autograd::variable_list out(15);
      out[0] = std::move(g);
      out[4] = std::move(dq_norm);
      out[5] = std::move(dk_norm);
      return out;
    };
    const int64_t tokens = qkv.size(0), columns = qkv.size(1);
    if (tokens == 0) {
      return normed ? with(at::zeros_like(qkv), at::zeros_like(q_norm), at::zeros_like(k_norm))
                    : with(at::zeros_like(qkv), at::Tensor(), at::Tensor());
    }
    const at::Tensor &q = s[3], &k = s[4], &v = s[5], &cos = s[6], &sin = s[7];
    const std::vector<int64_t> slot_groups = ctx->saved_data["slot_groups"].toIntVector();
    at::Tensor dq, dk, dv;
    if (!slot_groups.empty()) {
      const SlotLayout layout =
          slot_layout(s[8], slot_groups, ctx->saved_data["slot_total"].toInt());
      std::tie(dq, dk, dv) =
          slot_attention_backward(grads[0].contiguous(), q, k, v,
                                  std::vector<at::Tensor>(s.begin() + 9, s.end()), layout, scale);
    } else {
      std::tie(dq, dk, dv) = at::_flash_attention_backward(grads[0].contiguous(), q, k, v, s[9],
                                                           s[10], s[8], s[8], longest, longest, 0.0,
                                                           /*is_causal=*/true, s[11], s[12], scale);
    }
    at::Tensor grad = at::empty({tokens, columns}, qkv.options());
    const int64_t used = (heads + 2 * kv_heads) * dim;
    if (columns > used) grad.narrow(1, used, columns - used).zero_();
    const at::Tensor dq_c = dq.contiguous(), dk_c = dk.contiguous();
    if (normed) {
      const at::Tensor dv_c = dv.contiguous();
      const int64_t blocks = ooze_qk_norm_rope_backward_blocks(tokens, static_cast<int>(heads),
                                                               static_cast<int>(kv_heads));
      at::Tensor partial = at::empty({blocks, 2 * dim}, qkv.options().dtype(at::kFloat));
      at::Tensor dw = at::empty({2 * dim}, q_norm.options());
      check_launch(ooze_launch_qk_norm_rope_backward(
          qkv.data_ptr(), qkv.stride(0), dq_c.data_ptr(), dk_c.data_ptr(), dv_c.data_ptr(),
          cos.data_ptr(), sin.data_ptr(), q_norm.data_ptr(), k_norm.data_ptr(),
          static_cast<float>(eps), grad.data_ptr(), grad.stride(0), dw.data_ptr(),
          partial.data_ptr<float>(), tokens, static_cast<int>(heads), static_cast<int>(kv_heads),
          static_cast<int>(dim), stream()));
      return with(grad, dw.narrow(0, 0, dim), dw.narrow(0, dim, dim));
    }
    const bool bf16 = is_bf16(qkv);
    const int64_t row = grad.stride(0);
    auto* base = static_cast<char*>(grad.data_ptr());
    const int64_t elt = grad.element_size();
    check_launch(ooze_launch_rope(bf16, dq_c.data_ptr(), heads * dim, cos.data_ptr(),
                                  sin.data_ptr(), base, row, tokens, static_cast<int>(heads),
                                  static_cast<int>(dim), -1.f, stream()));
    check_launch(ooze_launch_rope(bf16, dk_c.data_ptr(), kv_heads * dim, cos.data_ptr(),
                                  sin.data_ptr(), base + heads * dim * elt, row, tokens,
                                  static_cast<int>(kv_heads), static_cast<int>(dim), -1.f,
                                  stream()));
    grad.narrow(1, (heads + kv_heads) * dim, kv_heads * dim)
        .copy_(dv.reshape({tokens, kv_heads * dim}));
    return with(grad, at::Tensor(), at::Tensor());
  }
};

}  // namespace

extern "C" {

using namespace ooze_ops;

// One new query per row, q [rows, heads, dim] (bf16), over the first positions[r] + 1 keys of row
// r's sequence in k_cache / v_cache [blocks, block_size, kv_heads, dim] (bf16), found through
// tables [rows, width] int64: position p is offset p % block_size of block tables[r][p / block_size].
// read_len bounds every row's key count (it fixes the number of key splits, so a CUDA graph can be
// captured for it). Returns [rows, heads, dim] bf16. dim 64 or 128, at most 16 query heads per key
// head, block_size a multiple of 16. flash_order: FlashAttention-2's arithmetic, else split
// attention's.
at::Tensor* ooze_decode_attention(const at::Tensor* q, const at::Tensor* k_cache,
                                  const at::Tensor* v_cache, const at::Tensor* tables,
                                  const at::Tensor* positions, int64_t read_len, double scale,
                                  int flash_order) {
  return guarded([&] {
    check_cuda(*q, "q");
    c10::cuda::CUDAGuard guard(q->device());
    TORCH_CHECK(q->scalar_type() == at::kBFloat16 && q->is_contiguous() && q->dim() == 3,
                "q must be contiguous bfloat16 [rows, heads, head_dim]");
    const int64_t rows = q->size(0), heads = q->size(1), dim = q->size(2);
    for (const at::Tensor* t : {k_cache, v_cache}) {
      TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->is_contiguous() && t->dim() == 4 &&
                      t->size(3) == dim && t->sizes() == k_cache->sizes(),
                  "KV memory must be contiguous bfloat16 [blocks, block_size, kv_heads, head_dim]");
    }
    const int64_t kv_heads = k_cache->size(2), block_size = k_cache->size(1);
    TORCH_CHECK(dim == 64 || dim == 128, "decode attention takes head_dim 64 or 128, got ", dim);
    TORCH_CHECK(heads % kv_heads == 0 && heads / kv_heads <= 16,
                "decode attention takes at most 16 query heads per key head");
    const int64_t width = checked_table_width(*tables, rows, block_size, read_len);
    TORCH_CHECK(positions->scalar_type() == at::kLong && positions->is_contiguous() &&
                    positions->numel() == rows,
                "positions must be contiguous int64 [rows]");
    if (flash_order) {
      return fa_order_attention(*q, *k_cache, kv_heads * dim, *v_cache, kv_heads * dim, *tables,
                                width, block_size, at::Tensor(), *positions, kv_heads, read_len,
                                scale);
    }
    const int splits = ooze_attention_splits(static_cast<int>(read_len));
    auto f32 = q->options().dtype(at::kFloat);
    at::Tensor part_o = at::empty({rows, kv_heads, splits, 16, dim}, f32);
    at::Tensor part_ml = at::empty({rows, kv_heads, splits, 16, 2}, f32);
    at::Tensor out = at::empty({rows, heads, dim}, q->options());
    if (rows > 0) {
      check_launch(ooze_launch_split_attention(
          q->data_ptr(), heads * dim, k_cache->data_ptr(), kv_heads * dim, v_cache->data_ptr(),
          kv_heads * dim, tables->data_ptr<int64_t>(), static_cast<int>(width), block_size,
          /*tiles=*/nullptr, static_cast<int>(rows), static_cast<int>(rows),
          positions->data_ptr<int64_t>(), static_cast<int>(heads), static_cast<int>(kv_heads),
          static_cast<int>(dim), splits, static_cast<float>(scale), part_o.data_ptr<float>(),
          part_ml.data_ptr<float>(), out.data_ptr(), heads * dim, /*lse=*/nullptr, stream()));
    }
    return out;
  });
}

// ooze_decode_attention in FlashAttention-2's arithmetic with ooze_rope_store folded in (no q/k
// norms): q, k and v of each row come from the fused projection qkv [rows, (heads + 2 kv_heads) ·
// dim] (bf16, unit last stride), rotated by cos / sin [rows, dim] (as ooze_rope_store takes
// them); the new key and value are written into cell cells[r] of k_cache / v_cache, which the
// attention then reads. Returns [rows, heads, dim] bf16; the caches hold what ooze_rope_store
// would have written.
at::Tensor* ooze_decode_attention_rope(const at::Tensor* qkv, const at::Tensor* cells,
                                       const at::Tensor* cos, const at::Tensor* sin,
                                       at::Tensor* k_cache, at::Tensor* v_cache,
                                       const at::Tensor* tables, const at::Tensor* positions,
                                       int64_t heads, int64_t read_len, double scale) {
  return guarded([&] {
    check_cuda(*qkv, "qkv");
    c10::cuda::CUDAGuard guard(qkv->device());
    for (const at::Tensor* t : {cells, cos, sin, static_cast<const at::Tensor*>(k_cache),
                                static_cast<const at::Tensor*>(v_cache), tables, positions}) {
      TORCH_CHECK(t->device() == qkv->device(),
                  "every argument of decode attention must be on qkv's device, ", qkv->device());
    }
    for (const at::Tensor* t : {k_cache, v_cache}) {
      TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->is_contiguous() && t->dim() == 4 &&
                      t->sizes() == k_cache->sizes(),
                  "KV memory must be contiguous bfloat16 [blocks, block_size, kv_heads, head_dim]");
    }
    const int64_t rows = qkv->size(0), block_size = k_cache->size(1);
    const int64_t kv_heads = k_cache->size(2), dim = k_cache->size(3);
    TORCH_CHECK(qkv->scalar_type() == at::kBFloat16 && qkv->dim() == 2 && qkv->stride(1) == 1 &&
                    qkv->size(1) == (heads + 2 * kv_heads) * dim && qkv->stride(0) % 8 == 0 &&
                    reinterpret_cast<uintptr_t>(qkv->data_ptr()) % 16 == 0,
                "qkv must be bfloat16 [rows, (heads + 2 kv_heads) * head_dim] with unit last "
                "stride and 16-byte aligned rows");
    TORCH_CHECK(dim == 64 || dim == 128, "decode attention takes head_dim 64 or 128, got ", dim);
    TORCH_CHECK(heads % kv_heads == 0 && heads / kv_heads <= 16,
                "decode attention takes at most 16 query heads per key head");
    for (const at::Tensor* t : {cos, sin}) {
      TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->is_contiguous() &&
                      t->numel() == rows * dim && reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0,
                  "cos and sin must be contiguous bfloat16 [rows, head_dim]");
    }
    for (const at::Tensor* t : {cells, positions}) {
      TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous() && t->numel() == rows,
                  "cells and positions must be contiguous int64 [rows]");
    }
    const int64_t width = checked_table_width(*tables, rows, block_size, read_len);
    FaoBuffers b(qkv->options(), rows, rows, heads, kv_heads, dim, read_len);
    if (rows > 0) {
      check_launch(ooze_launch_fa_order_decode_rope(
          qkv->data_ptr(), qkv->stride(0), cos->data_ptr(), sin->data_ptr(),
          cells->data_ptr<int64_t>(), k_cache->data_ptr(), kv_heads * dim, v_cache->data_ptr(),
          kv_heads * dim, tables->data_ptr<int64_t>(), static_cast<int>(width), block_size,
          static_cast<int>(rows), positions->data_ptr<int64_t>(), static_cast<int>(heads),
          static_cast<int>(kv_heads), static_cast<int>(dim), static_cast<float>(scale), b.chunks,
          b.o(), b.ml(), b.out.data_ptr(), heads * dim, stream()));
    }
    return b.out;
  });
}

// Causal attention over packed variable-length sequences (FlashAttention-2 through ATen, with its
// autograd backward): q [total, heads, dim], k and v [total, kv_heads, dim] (bf16/fp16),
// cu_seqlens [sequences + 1] int32 offsets. Returns [total, heads, dim].
at::Tensor* ooze_flash_attention_varlen(const at::Tensor* q, const at::Tensor* k,
                                        const at::Tensor* v, const at::Tensor* cu_seqlens,
                                        int64_t max_seqlen, double scale) {
  return guarded([&] {
    check_cuda(*q, "q");
    c10::cuda::CUDAGuard guard(q->device());
    TORCH_CHECK(q->dim() == 3 && k->dim() == 3 && v->dim() == 3,
                "q, k, v must be [total, heads, head_dim]");
    TORCH_CHECK(cu_seqlens->scalar_type() == at::kInt && cu_seqlens->dim() == 1,
                "cu_seqlens must be int32 [sequences + 1]");
    auto result = at::_flash_attention_forward(*q, *k, *v, *cu_seqlens, *cu_seqlens, max_seqlen,
                                               max_seqlen, 0.0, /*is_causal=*/true,
                                               /*return_debug_mask=*/false, scale);
    return std::get<0>(result);
  });
}

// Causal attention over packed sequences from the fused projection output qkv [total,
// ≥ (heads + 2 kv_heads) · dim] (bf16, unit last stride; q, k, v heads at the start of each row):
// rotary embedding of q and k (cos / sin [total, dim] as ooze_rope takes them), after Qwen3's
// per-head RMSNorm with q_norm / k_norm [dim] and eps (both null: none), then FlashAttention-2;
// differentiable in qkv and the norm weights, qkv's gradient one tensor. cu_seqlens
// [sequences + 1] int32 offsets. With `group_count` > 0 groups (first_row, sequences, length) in
// slot_groups, the attention itself runs in cuDNN's fused kernels over those slots
// (slot_attention.cpp) where cuDNN can: slot_rows (int64 [total] on qkv's device) gives each
// token's row, null when every token sits in its own. Returns [total, heads, dim].
at::Tensor* ooze_qkv_flash_attention_varlen(const at::Tensor* qkv, const at::Tensor* cos,
                                            const at::Tensor* sin, const at::Tensor* cu_seqlens,
                                            const at::Tensor* q_norm, const at::Tensor* k_norm,
                                            double eps, int64_t heads, int64_t kv_heads,
                                            int64_t dim, int64_t max_seqlen, double scale,
                                            const at::Tensor* slot_rows, const int64_t* slot_groups,
                                            int64_t group_count) {
  return guarded([&] {
    check_cuda(*qkv, "qkv");
    c10::cuda::CUDAGuard guard(qkv->device());
    TORCH_CHECK(qkv->scalar_type() == at::kBFloat16, "qkv must be bfloat16");
    TORCH_CHECK(qkv->dim() == 2 && qkv->stride(1) == 1 &&
                    qkv->size(1) >= (heads + 2 * kv_heads) * dim && dim % 2 == 0 &&
                    kv_heads > 0 && heads % kv_heads == 0,
                "qkv must be [total, ≥ (heads + 2 kv_heads) · head_dim] with unit last stride");
    for (const at::Tensor* t : {cos, sin}) {
      TORCH_CHECK(t->is_contiguous() && t->dim() == 2 && t->size(0) == qkv->size(0) &&
                      t->size(1) == dim && t->scalar_type() == qkv->scalar_type(),
                  "cos and sin must be contiguous [total, head_dim] of qkv's dtype");
    }
    TORCH_CHECK(cu_seqlens->scalar_type() == at::kInt && cu_seqlens->dim() == 1,
                "cu_seqlens must be int32 [sequences + 1]");
    TORCH_CHECK((q_norm == nullptr) == (k_norm == nullptr), "q_norm and k_norm go together");
    if (q_norm != nullptr) {
      TORCH_CHECK(dim == 32 || dim == 64 || dim == 128,
                  "fused q/k norms in training take head sizes 32, 64 or 128, got ", dim);
      TORCH_CHECK(qkv->stride(0) % 4 == 0 && reinterpret_cast<uintptr_t>(qkv->data_ptr()) % 16 == 0,
                  "fused q/k norms read qkv in groups of 4: rows must start 16-byte aligned");
      for (const at::Tensor* t : {q_norm, k_norm}) {
        check_cuda(*t, "q_norm / k_norm");
        TORCH_CHECK(t->is_contiguous() && t->numel() == dim && t->scalar_type() == at::kBFloat16,
                    "q_norm and k_norm must be contiguous bfloat16 [head_dim]");
      }
    }
    // Without norms, empty stand-ins: autograd records every tensor argument's metadata, which an
    // undefined tensor does not have.
    const at::Tensor none = at::empty({0}, qkv->options());
    std::vector<int64_t> groups;
    int64_t slot_total = 0;
    if (group_count > 0 && slot_attention_usable(qkv->device())) {
      TORCH_CHECK(slot_rows == nullptr ||
                      (slot_rows->scalar_type() == at::kLong && slot_rows->dim() == 1 &&
                       slot_rows->size(0) == qkv->size(0) && slot_rows->device() == qkv->device()),
                  "slot_rows must be int64 [total] on qkv's device");
      for (int64_t g = 0; g < group_count; ++g) {
        const int64_t* t = slot_groups + 3 * g;
        TORCH_CHECK(t[0] == slot_total && t[1] > 0 && t[2] > 0,
                    "slot groups must follow one another, each with sequences and rows");
        slot_total += t[1] * t[2];
        groups.insert(groups.end(), t, t + 3);
      }
      TORCH_CHECK(slot_rows != nullptr || slot_total == qkv->size(0),
                  "without slot_rows, the slots must hold exactly the packed tokens");
    }
    return QkvFlashAttentionFunction::apply(
        *qkv, *cos, *sin, *cu_seqlens, q_norm != nullptr ? *q_norm : none,
        k_norm != nullptr ? *k_norm : none, eps, heads, kv_heads, dim, max_seqlen, scale,
        slot_rows != nullptr ? *slot_rows : none, groups, slot_total);
  });
}

// Attention of new tokens appended to paged sequences, for the engine's prefill, with the decode
// kernel's arithmetic (flash_order: FlashAttention-2's, else split attention's): q [tokens, heads,
// dim] (bf16, heads contiguous), row b's `counts[b]` tokens one after another at positions
// past[b] + i, k_cache / v_cache [blocks, block_size, kv_heads, dim], tables [rows, width] int64.
// Returns [tokens, heads, dim].
at::Tensor* ooze_paged_prefill_attention(const at::Tensor* q, const at::Tensor* k_cache,
                                         const at::Tensor* v_cache, const at::Tensor* tables,
                                         const int64_t* past, const int64_t* counts, int64_t rows,
                                         double scale, int flash_order) {
  return guarded([&] {
    check_cuda(*q, "q");
    c10::cuda::CUDAGuard guard(q->device());
    TORCH_CHECK(k_cache->dim() == 4 && k_cache->is_contiguous() && v_cache->is_contiguous() &&
                    v_cache->sizes() == k_cache->sizes() && k_cache->size(3) == q->size(2),
                "KV memory must be contiguous [blocks, block_size, kv_heads, head_dim]");
    const int64_t kv_heads = k_cache->size(2), block_size = k_cache->size(1), dim = q->size(2);
    check_tiled_attention(*q, *k_cache, *v_cache, kv_heads);
    TORCH_CHECK(block_size % 16 == 0, "paged attention takes block sizes that are multiples of 16");
    TORCH_CHECK(tables->scalar_type() == at::kLong && tables->is_contiguous() &&
                    tables->dim() == 2 && tables->size(0) == rows,
                "block tables must be contiguous int64 [rows, width]");
    std::vector<int64_t> lengths(counts, counts + rows), positions;
    int64_t max_keys = 0;
    for (int64_t b = 0; b < rows; ++b) {
      TORCH_CHECK(past[b] + counts[b] <= tables->size(1) * block_size,
                  "row ", b, "'s positions run past its block table");
      for (int64_t i = 0; i < counts[b]; ++i) positions.push_back(past[b] + i);
      max_keys = std::max(max_keys, past[b] + counts[b]);
    }
    TORCH_CHECK(static_cast<int64_t>(positions.size()) == q->size(0),
                "q must hold the rows' tokens one after another");
    const int64_t group = q->size(1) / kv_heads;
    auto device = q->device();
    const at::Tensor pos = at::tensor(positions, at::kLong).to(device);
    const at::Tensor tiles = query_tiles(lengths, std::max<int64_t>(16 / group, 1), device);
    if (flash_order) {
      return fa_order_attention(*q, *k_cache, kv_heads * dim, *v_cache, kv_heads * dim, *tables,
                                tables->size(1), block_size, tiles, pos, kv_heads, max_keys,
                                scale);
    }
    return split_attention(*q, *k_cache, kv_heads * dim, *v_cache, kv_heads * dim, *tables,
                           tables->size(1), block_size, tiles, pos, kv_heads, max_keys, scale,
                           false)
        .first;
  });
}

// Causal split attention over packed sequences (SplitAttentionFunction): q [total, heads, dim],
// k and v [total, kv_heads, dim] (bf16), cu_seqlens [sequences + 1] int32 on the device and the
// same lengths on the host. Returns [total, heads, dim]; differentiable.
at::Tensor* ooze_split_attention_varlen(const at::Tensor* q, const at::Tensor* k,
                                        const at::Tensor* v, const at::Tensor* cu_seqlens,
                                        const int64_t* lengths, int64_t sequences, double scale) {
  return guarded([&] {
    check_cuda(*q, "q");
    c10::cuda::CUDAGuard guard(q->device());
    TORCH_CHECK(k->dim() == 3 && v->dim() == 3 && k->sizes() == v->sizes() &&
                    k->size(0) == q->size(0) && k->size(2) == q->size(2),
                "k and v must be [total, kv_heads, head_dim] like q");
    check_tiled_attention(*q, *k, *v, k->size(1));
    TORCH_CHECK(cu_seqlens->scalar_type() == at::kInt && cu_seqlens->numel() == sequences + 1,
                "cu_seqlens must be int32 [sequences + 1]");
    return SplitAttentionFunction::apply(*q, *k, *v, *cu_seqlens,
                                         std::vector<int64_t>(lengths, lengths + sequences), scale);
  });
}

// Whether ooze_qkv_flash_attention_varlen can run cuDNN's fused attention on CUDA device
// `device` (1) or not (0).
int ooze_slot_attention_usable(int64_t device) {
  try {
    return slot_attention_usable(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device))) ? 1
                                                                                               : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

}  // extern "C"
