// Tensor-level entry points of ooze's CUDA kernels (kernels.cu): shapes, dtypes and devices are
// checked here, outputs allocated with PyTorch's allocator on the current stream (so they work
// under CUDA graph capture), and C++ exceptions reported through ooze_ops_last_error.

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <exception>
#include <string>
#include <vector>

extern "C" {
int ooze_launch_rope_store(int bf16, const void* qkv, int64_t qkv_stride, const int64_t* cells,
                           const void* cos, const void* signed_sin, const void* q_norm,
                           const void* k_norm, float eps, void* q_out, void* k_cache,
                           void* v_cache, int rows, int heads, int kv_heads, int dim,
                           cudaStream_t stream);
int ooze_launch_silu_mul(int bf16, const void* gate_up, void* out, int64_t rows, int64_t width,
                         cudaStream_t stream);
int ooze_launch_sample(const float* logits, int64_t stride, int vocab, const float* params,
                       int rows, double* out, cudaStream_t stream);
int ooze_launch_silu_mul_backward(int bf16, const void* gate_up, const void* grad, void* out,
                                  int64_t rows, int64_t width, cudaStream_t stream);
int ooze_launch_rope(int bf16, const void* x, int64_t stride, const void* cos,
                     const void* signed_sin, void* out, int64_t out_stride, int64_t tokens,
                     int heads, int dim, float sign, cudaStream_t stream);
int ooze_launch_log_prob_forward(const float* logits, int rows, int vocab,
                                 const int64_t* targets, float inv_temp, float* log_prob,
                                 float* lse, float* entropy, void* logits_bf16,
                                 cudaStream_t stream);
int ooze_launch_log_prob_backward(int bf16, const void* logits, int logits_bf16, int rows,
                                  int vocab, const int64_t* targets, const float* lse,
                                  const float* grad, float inv_temp, void* out,
                                  cudaStream_t stream);
int ooze_attention_splits(int read_len);
int ooze_launch_split_attention(const void* q, int64_t q_stride, const void* k, int64_t k_stride,
                                const void* v, int64_t v_stride, const int64_t* table, int width,
                                int64_t block_size, const int* tiles, int n_tiles, int tokens,
                                const int64_t* positions, int heads, int kv_heads, int dim,
                                int splits, float scale, float* part_o, float* part_ml, void* out,
                                int64_t out_stride, float* lse, cudaStream_t stream);
}

namespace {

thread_local std::string last_error;

// Runs `body`; on an exception records it and returns null.
template <typename F>
at::Tensor* guarded(F body) {
  try {
    return new at::Tensor(body());
  } catch (const std::exception& e) {
    last_error = e.what();
    return nullptr;
  }
}

bool is_bf16(const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kFloat,
              "ooze kernels take bfloat16 or float32, got ", t.scalar_type());
  return t.scalar_type() == at::kBFloat16;
}

void check_launch(int code) {
  TORCH_CHECK(code == 0, "kernel launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(code)));
}

void check_cuda(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be on a CUDA device");
}

cudaStream_t stream() { return at::cuda::getCurrentCUDAStream().stream(); }

at::Tensor silu_mul_forward(const at::Tensor& gate_up) {
  const int64_t rows = gate_up.size(0), width = gate_up.size(1) / 2;
  at::Tensor out = at::empty({rows, width}, gate_up.options());
  if (rows > 0) {
    check_launch(ooze_launch_silu_mul(is_bf16(gate_up), gate_up.data_ptr(), out.data_ptr(), rows,
                                      width, stream()));
  }
  return out;
}

// silu(gate)·up with its backward, so training uses the fused kernels too.
struct SiluMulFunction : public torch::autograd::Function<SiluMulFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& gate_up) {
    ctx->save_for_backward({gate_up});
    return silu_mul_forward(gate_up);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor gate_up = ctx->get_saved_variables()[0];
    const at::Tensor grad = grads[0].contiguous();
    at::Tensor out = at::empty_like(gate_up);
    const int64_t rows = gate_up.size(0), width = gate_up.size(1) / 2;
    if (rows > 0) {
      check_launch(ooze_launch_silu_mul_backward(is_bf16(gate_up), gate_up.data_ptr(),
                                                 grad.data_ptr(), out.data_ptr(), rows, width,
                                                 stream()));
    }
    return {out};
  }
};

at::Tensor rope_apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      int64_t heads, int64_t dim, float sign) {
  const int64_t tokens = x.size(0);
  at::Tensor out = at::empty({tokens, heads, dim}, x.options());
  if (tokens > 0) {
    check_launch(ooze_launch_rope(is_bf16(x), x.data_ptr(), x.stride(0), cos.data_ptr(),
                                  sin.data_ptr(), out.data_ptr(), heads * dim, tokens,
                                  static_cast<int>(heads), static_cast<int>(dim), sign, stream()));
  }
  return out;
}

// The rotary embedding of the first `heads` heads of each row of x, with its backward (the
// inverse rotation of the gradient, zero for the columns past those heads).
struct RopeFunction : public torch::autograd::Function<RopeFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& cos, const at::Tensor& sin, int64_t heads,
                            int64_t dim) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["columns"] = x.size(1);
    return rope_apply(x, cos, sin, heads, dim, 1.f);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const int64_t columns = ctx->saved_data["columns"].toInt();
    const at::Tensor grad = grads[0].contiguous();
    const int64_t tokens = grad.size(0);
    at::Tensor dx = rope_apply(grad.view({tokens, heads * dim}), saved[0], saved[1], heads, dim,
                               -1.f)
                        .view({tokens, heads * dim});
    if (columns != heads * dim) {
      dx = at::constant_pad_nd(dx, {0, columns - heads * dim}, 0);
    }
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// fp32 logits of hidden [rows, h] under weight [vocab, h] (the matmul writes fp32 itself).
// A single row goes through as two (the row twice): cuBLAS takes another path for one row, whose
// sums differ in the last bits from the same row's in a larger batch.
at::Tensor fp32_logits(const at::Tensor& hidden, const at::Tensor& weight) {
  if (hidden.scalar_type() == at::kFloat) return at::mm(hidden, weight.t());
  if (hidden.size(0) == 1) {
    return at::mm(hidden.expand({2, hidden.size(1)}).contiguous(), weight.t(), at::kFloat)
        .narrow(0, 0, 1);
  }
  return at::mm(hidden, weight.t(), at::kFloat);
}

// log_softmax(hidden·Wᵀ / T) at the targets, with entropy (not differentiated), over all rows in
// one autograd node that works through them `chunk` rows at a time (at most chunk × vocab fp32
// logits exist at once). The backward writes each chunk's hidden gradient into its rows of one
// tensor and accumulates the weight gradient in the GEMM itself (beta = 1): one [vocab, h] result
// for the whole head instead of one per chunk summed by autograd. The backward either reads the
// logits kept in bf16 by the forward kernel (`keep_logits`: the rounding autocast PyTorch trains
// with, 2 bytes per logit held until the backward) or recomputes them in fp32.
struct LinearLogProbFunction : public torch::autograd::Function<LinearLogProbFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& hidden,
                                                const at::Tensor& weight,
                                                const at::Tensor& targets, double inv_temp,
                                                bool keep_logits, int64_t chunk) {
    const int64_t rows = hidden.size(0), vocab = weight.size(0);
    auto f32 = hidden.options().dtype(at::kFloat);
    at::Tensor log_prob = at::empty({rows}, f32), lse = at::empty({rows}, f32),
               entropy = at::empty({rows}, f32);
    at::Tensor kept;
    if (keep_logits && hidden.scalar_type() == at::kBFloat16) {
      kept = at::empty({rows, vocab}, hidden.options());
    }
    for (int64_t start = 0; start < rows; start += chunk) {
      const int64_t len = std::min(chunk, rows - start);
      const at::Tensor logits = fp32_logits(hidden.narrow(0, start, len), weight);
      check_launch(ooze_launch_log_prob_forward(
          logits.data_ptr<float>(), static_cast<int>(len), static_cast<int>(vocab),
          targets.data_ptr<int64_t>() + start, static_cast<float>(inv_temp),
          log_prob.data_ptr<float>() + start, lse.data_ptr<float>() + start,
          entropy.data_ptr<float>() + start,
          kept.defined() ? kept.narrow(0, start, len).data_ptr() : nullptr, stream()));
    }
    ctx->save_for_backward({hidden, weight, targets, lse, kept});
    ctx->saved_data["inv_temp"] = inv_temp;
    ctx->saved_data["chunk"] = chunk;
    ctx->mark_non_differentiable({entropy});
    return {log_prob, entropy};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &hidden = saved[0], &weight = saved[1], &targets = saved[2], &lse = saved[3],
                     &kept = saved[4];
    const double inv_temp = ctx->saved_data["inv_temp"].toDouble();
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const int64_t rows = hidden.size(0), vocab = weight.size(0);
    at::Tensor grad = grads[0].defined() ? grads[0].to(at::kFloat).contiguous()
                                         : at::zeros({rows}, hidden.options().dtype(at::kFloat));
    at::Tensor grad_hidden = at::empty_like(hidden);
    if (rows == 0) {
      return {grad_hidden, at::zeros_like(weight), at::Tensor(), at::Tensor(), at::Tensor(),
              at::Tensor()};
    }
    at::Tensor grad_weight = at::empty_like(weight);  // the first chunk's product writes it
    at::Tensor d_logits = at::empty({std::min(chunk, rows), vocab}, hidden.options());
    for (int64_t start = 0; start < rows; start += chunk) {
      const int64_t len = std::min(chunk, rows - start);
      const at::Tensor rows_in = hidden.narrow(0, start, len);
      const at::Tensor logits =
          kept.defined() ? kept.narrow(0, start, len) : fp32_logits(rows_in, weight);
      at::Tensor d = d_logits.narrow(0, 0, len);
      check_launch(ooze_launch_log_prob_backward(
          hidden.scalar_type() == at::kBFloat16, logits.data_ptr(), kept.defined() ? 1 : 0,
          static_cast<int>(len), static_cast<int>(vocab), targets.data_ptr<int64_t>() + start,
          lse.data_ptr<float>() + start, grad.data_ptr<float>() + start,
          static_cast<float>(inv_temp), d.data_ptr(), stream()));
      at::Tensor hidden_out = grad_hidden.narrow(0, start, len);
      at::mm_out(hidden_out, d, weight);
      if (start == 0) {
        at::mm_out(grad_weight, d.t(), rows_in);
      } else {
        grad_weight.addmm_(d.t(), rows_in);
      }
    }
    return {grad_hidden, grad_weight, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Checks shared by the split-attention entry points: bf16 q [tokens, heads, dim] whose heads and
// dims are contiguous, and keys/values whose rows hold kv_heads · dim contiguous elements.
void check_split_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           int64_t kv_heads) {
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && q.dim() == 3 && q.stride(2) == 1 &&
                  q.stride(1) == q.size(2),
              "q must be bfloat16 [tokens, heads, head_dim] with contiguous heads");
  const int64_t dim = q.size(2), heads = q.size(1);
  TORCH_CHECK(dim == 64 || dim == 128, "split attention takes head_dim 64 or 128, got ", dim);
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0 && heads / kv_heads <= 16,
              "split attention takes at most 16 query heads per key head");
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

// Causal attention over packed sequences with split attention's arithmetic (the engine's, so a
// trained token's forward agrees bitwise with how it was sampled). The backward is
// FlashAttention-2's (ATen), from a forward of its own: the gradient of the same function, to
// rounding.
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
    auto out = split_attention(q, kp, kv_heads * dim, vp, kv_heads * dim, table, 1, 0, tiles, pos,
                               kv_heads, longest, scale, false)
                   .first;
    ctx->save_for_backward({q, k, v, cu_seqlens});
    ctx->saved_data["longest"] = longest;
    ctx->saved_data["scale"] = scale;
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &cu = saved[3];
    const int64_t longest = ctx->saved_data["longest"].toInt();
    const double scale = ctx->saved_data["scale"].toDouble();
    auto fwd = at::_flash_attention_forward(q, k, v, cu, cu, longest, longest, 0.0,
                                            /*is_causal=*/true, /*return_debug_mask=*/false, scale);
    auto [dq, dk, dv] = at::_flash_attention_backward(
        grads[0].contiguous(), q, k, v, std::get<0>(fwd), std::get<1>(fwd), cu, cu, longest,
        longest, 0.0, /*is_causal=*/true, std::get<2>(fwd), std::get<3>(fwd), scale);
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Causal attention over packed sequences straight from the fused projection's output
// qkv [tokens, ≥ (heads + 2 kv_heads) · dim] (q, k, v heads at the start of each row; columns past
// them get a zero gradient): the rotary embedding of q and k (ooze's kernel), then
// FlashAttention-2 with v read in place. The backward writes the gradient of qkv as one tensor:
// FlashAttention's dq and dk rotated back into their columns, dv copied into its own. Separate
// operations would have autograd build zero-padded gradients for the q, k and v slices and add
// them up (ncu, 0.5B 8 × 2048: ~6 ms a training step of fills, copies and adds).
struct QkvFlashAttentionFunction : public torch::autograd::Function<QkvFlashAttentionFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& qkv,
                            const at::Tensor& cos, const at::Tensor& sin,
                            const at::Tensor& cu_seqlens, int64_t heads, int64_t kv_heads,
                            int64_t dim, int64_t longest, double scale) {
    const int64_t tokens = qkv.size(0);
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["kv_heads"] = kv_heads;
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["longest"] = longest;
    ctx->saved_data["scale"] = scale;
    if (tokens == 0) {
      ctx->save_for_backward({qkv});
      return at::empty({0, heads, dim}, qkv.options());
    }
    const at::Tensor qk = rope_apply(qkv, cos, sin, heads + kv_heads, dim, 1.f);
    const at::Tensor q = qk.narrow(1, 0, heads), k = qk.narrow(1, heads, kv_heads);
    const at::Tensor v =
        qkv.narrow(1, (heads + kv_heads) * dim, kv_heads * dim).view({tokens, kv_heads, dim});
    auto fwd = at::_flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, longest, longest,
                                            0.0, /*is_causal=*/true,
                                            /*return_debug_mask=*/false, scale);
    const at::Tensor out = std::get<0>(fwd);
    ctx->save_for_backward({qkv, qk, cos, sin, cu_seqlens, out, std::get<1>(fwd),
                            std::get<2>(fwd), std::get<3>(fwd)});
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto s = ctx->get_saved_variables();
    // The gradient of qkv; the other eight inputs take none.
    const auto only_qkv = [](at::Tensor g) {
      torch::autograd::variable_list out(9);
      out[0] = std::move(g);
      return out;
    };
    if (s.size() == 1) return only_qkv(at::zeros_like(s[0]));  // no tokens
    const at::Tensor &qkv = s[0], &qk = s[1], &cos = s[2], &sin = s[3], &cu = s[4];
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const int64_t kv_heads = ctx->saved_data["kv_heads"].toInt();
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const int64_t longest = ctx->saved_data["longest"].toInt();
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t tokens = qkv.size(0), columns = qkv.size(1);
    const at::Tensor q = qk.narrow(1, 0, heads), k = qk.narrow(1, heads, kv_heads);
    const at::Tensor v =
        qkv.narrow(1, (heads + kv_heads) * dim, kv_heads * dim).view({tokens, kv_heads, dim});
    auto [dq, dk, dv] = at::_flash_attention_backward(
        grads[0].contiguous(), q, k, v, s[5], s[6], cu, cu, longest, longest, 0.0,
        /*is_causal=*/true, s[7], s[8], scale);
    at::Tensor grad = at::empty({tokens, columns}, qkv.options());
    const bool bf16 = is_bf16(qkv);
    const int64_t row = grad.stride(0);
    auto* base = static_cast<char*>(grad.data_ptr());
    const int64_t elt = grad.element_size();
    const at::Tensor dq_c = dq.contiguous(), dk_c = dk.contiguous();
    check_launch(ooze_launch_rope(bf16, dq_c.data_ptr(), heads * dim, cos.data_ptr(),
                                  sin.data_ptr(), base, row, tokens, static_cast<int>(heads),
                                  static_cast<int>(dim), -1.f, stream()));
    check_launch(ooze_launch_rope(bf16, dk_c.data_ptr(), kv_heads * dim, cos.data_ptr(),
                                  sin.data_ptr(), base + heads * dim * elt, row, tokens,
                                  static_cast<int>(kv_heads), static_cast<int>(dim), -1.f,
                                  stream()));
    grad.narrow(1, (heads + kv_heads) * dim, kv_heads * dim)
        .copy_(dv.reshape({tokens, kv_heads * dim}));
    const int64_t used = (heads + 2 * kv_heads) * dim;
    if (columns > used) grad.narrow(1, used, columns - used).zero_();
    return only_qkv(grad);
  }
};

}  // namespace

extern "C" {

const char* ooze_ops_last_error() { return last_error.c_str(); }

// qkv [rows, (heads + 2 kv_heads) · dim] (rows may be strided), cells [rows] int64 (the flat
// index block · block_size + offset a row's key and value go to), cos / sin [rows, dim] (the
// rotary tables of ooze_rope: the sine with its first half negated), q_norm / k_norm [dim] or
// null, k_cache / v_cache [blocks, block_size, kv_heads, dim]. Returns the rotated q [rows, heads,
// dim].
at::Tensor* ooze_rope_store(const at::Tensor* qkv, const at::Tensor* cells,
                            const at::Tensor* cos, const at::Tensor* sin,
                            const at::Tensor* q_norm, const at::Tensor* k_norm, double eps,
                            at::Tensor* k_cache, at::Tensor* v_cache, int64_t heads,
                            int64_t kv_heads, int64_t dim) {
  return guarded([&] {
    check_cuda(*qkv, "qkv");
    c10::cuda::CUDAGuard guard(qkv->device());
    const bool bf16 = is_bf16(*qkv);
    const int64_t rows = qkv->size(0);
    TORCH_CHECK(qkv->dim() == 2 && qkv->stride(1) == 1 && qkv->size(1) == (heads + 2 * kv_heads) * dim,
                "qkv must be [rows, (heads + 2 kv_heads) * head_dim] with unit last stride");
    TORCH_CHECK(dim % 2 == 0 && dim <= 256, "head_dim must be even and at most 256, got ", dim);
    TORCH_CHECK(cells->scalar_type() == at::kLong && cells->is_contiguous() &&
                    cells->numel() == rows,
                "cells must be contiguous int64 [rows]");
    for (const at::Tensor* t : {cos, sin}) {
      TORCH_CHECK(t->is_contiguous() && t->numel() == rows * dim &&
                      t->scalar_type() == qkv->scalar_type(),
                  "cos and sin must be contiguous [rows, head_dim] of qkv's dtype");
    }
    for (const at::Tensor* t : {k_cache, v_cache}) {
      TORCH_CHECK(t->scalar_type() == qkv->scalar_type() && t->is_contiguous() && t->dim() == 4 &&
                      t->size(2) == kv_heads && t->size(3) == dim,
                  "KV memory must be contiguous [blocks, block_size, kv_heads, head_dim] of qkv's dtype");
    }
    for (const at::Tensor* t : {q_norm, k_norm}) {
      TORCH_CHECK(t == nullptr || (t->scalar_type() == qkv->scalar_type() && t->is_contiguous() &&
                                   t->numel() == dim),
                  "q/k norm weights must be contiguous [head_dim] of qkv's dtype");
    }
    at::Tensor q = at::empty({rows, heads, dim}, qkv->options());
    check_launch(ooze_launch_rope_store(
        bf16, qkv->data_ptr(), qkv->stride(0), cells->data_ptr<int64_t>(), cos->data_ptr(),
        sin->data_ptr(),
        q_norm ? q_norm->data_ptr() : nullptr, k_norm ? k_norm->data_ptr() : nullptr,
        static_cast<float>(eps), q.data_ptr(), k_cache->data_ptr(), v_cache->data_ptr(),
        static_cast<int>(rows), static_cast<int>(heads), static_cast<int>(kv_heads),
        static_cast<int>(dim), at::cuda::getCurrentCUDAStream().stream()));
    return q;
  });
}

// gate_up [rows, 2 · width] contiguous → silu(gate) · up [rows, width].
at::Tensor* ooze_silu_mul(const at::Tensor* gate_up) {
  return guarded([&] {
    check_cuda(*gate_up, "gate_up");
    c10::cuda::CUDAGuard guard(gate_up->device());
    const bool bf16 = is_bf16(*gate_up);
    TORCH_CHECK(gate_up->dim() == 2 && gate_up->is_contiguous() && gate_up->size(1) % 2 == 0,
                "gate_up must be contiguous [rows, 2 * width]");
    (void)bf16;
    return SiluMulFunction::apply(*gate_up);
  });
}

// logits [rows, vocab] float32 (unit last stride), params [3, rows] float32 (temperature, greedy
// flag, uniform) → [2, rows] float64 (token, log-prob).
at::Tensor* ooze_sample(const at::Tensor* logits, const at::Tensor* params) {
  return guarded([&] {
    check_cuda(*logits, "logits");
    c10::cuda::CUDAGuard guard(logits->device());
    TORCH_CHECK(logits->scalar_type() == at::kFloat && logits->dim() == 2 && logits->stride(1) == 1,
                "logits must be float32 [rows, vocab] with unit last stride");
    const int64_t rows = logits->size(0);
    TORCH_CHECK(params->scalar_type() == at::kFloat && params->is_contiguous() &&
                    params->dim() == 2 && params->size(0) == 3 && params->size(1) == rows,
                "params must be contiguous float32 [3, rows]");
    TORCH_CHECK(params->device() == logits->device(), "params must be on the logits' device");
    at::Tensor out = at::empty({2, rows}, logits->options().dtype(at::kDouble));
    if (rows > 0) {
      check_launch(ooze_launch_sample(logits->data_ptr<float>(), logits->stride(0),
                                      static_cast<int>(logits->size(1)), params->data_ptr<float>(),
                                      static_cast<int>(rows), out.data_ptr<double>(),
                                      at::cuda::getCurrentCUDAStream().stream()));
    }
    return out;
  });
}

// One new query per row, q [rows, heads, dim] (bf16), over the first positions[r] + 1 keys of row
// r's sequence in k_cache / v_cache [blocks, block_size, kv_heads, dim] (bf16), found through
// tables [rows, width] int64: position p is offset p % block_size of block tables[r][p / block_size].
// read_len bounds every row's key count (it fixes the number of key splits, so a CUDA graph can be
// captured for it). Returns [rows, heads, dim] bf16. dim 64 or 128, at most 16 query heads per key
// head, block_size a multiple of 16.
at::Tensor* ooze_decode_attention(const at::Tensor* q, const at::Tensor* k_cache,
                                  const at::Tensor* v_cache, const at::Tensor* tables,
                                  const at::Tensor* positions, int64_t read_len, double scale) {
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
    TORCH_CHECK(block_size % 16 == 0, "decode attention takes block sizes that are multiples of 16, got ",
                block_size);
    TORCH_CHECK(tables->scalar_type() == at::kLong && tables->is_contiguous() && tables->dim() == 2 &&
                    tables->size(0) == rows,
                "block tables must be contiguous int64 [rows, width]");
    const int64_t width = tables->size(1);
    TORCH_CHECK(read_len > 0 && read_len <= width * block_size,
                "read_len must be in 1..=table width × block size");
    TORCH_CHECK(positions->scalar_type() == at::kLong && positions->is_contiguous() &&
                    positions->numel() == rows,
                "positions must be contiguous int64 [rows]");
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
// rotary embedding of q and k (cos / sin [total, dim] as ooze_rope takes them), then
// FlashAttention-2; differentiable in qkv, its gradient one tensor. cu_seqlens [sequences + 1]
// int32 offsets. Returns [total, heads, dim].
at::Tensor* ooze_qkv_flash_attention_varlen(const at::Tensor* qkv, const at::Tensor* cos,
                                            const at::Tensor* sin, const at::Tensor* cu_seqlens,
                                            int64_t heads, int64_t kv_heads, int64_t dim,
                                            int64_t max_seqlen, double scale) {
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
    return QkvFlashAttentionFunction::apply(*qkv, *cos, *sin, *cu_seqlens, heads, kv_heads, dim,
                                            max_seqlen, scale);
  });
}

// Split attention (the decode kernel's arithmetic) of new tokens appended to paged sequences, for
// the engine's prefill: q [tokens, heads, dim] (bf16, heads contiguous), row b's `counts[b]` tokens
// one after another at positions past[b] + i, k_cache / v_cache [blocks, block_size, kv_heads,
// dim], tables [rows, width] int64. Returns [tokens, heads, dim].
at::Tensor* ooze_split_attention_paged(const at::Tensor* q, const at::Tensor* k_cache,
                                       const at::Tensor* v_cache, const at::Tensor* tables,
                                       const int64_t* past, const int64_t* counts, int64_t rows,
                                       double scale) {
  return guarded([&] {
    check_cuda(*q, "q");
    c10::cuda::CUDAGuard guard(q->device());
    TORCH_CHECK(k_cache->dim() == 4 && k_cache->is_contiguous() && v_cache->is_contiguous() &&
                    v_cache->sizes() == k_cache->sizes() && k_cache->size(3) == q->size(2),
                "KV memory must be contiguous [blocks, block_size, kv_heads, head_dim]");
    const int64_t kv_heads = k_cache->size(2), block_size = k_cache->size(1), dim = q->size(2);
    check_split_attention(*q, *k_cache, *v_cache, kv_heads);
    TORCH_CHECK(block_size % 16 == 0, "split attention takes block sizes that are multiples of 16");
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
    check_split_attention(*q, *k, *v, k->size(1));
    TORCH_CHECK(cu_seqlens->scalar_type() == at::kInt && cu_seqlens->numel() == sequences + 1,
                "cu_seqlens must be int32 [sequences + 1]");
    return SplitAttentionFunction::apply(*q, *k, *v, *cu_seqlens,
                                         std::vector<int64_t>(lengths, lengths + sequences), scale);
  });
}

// log_softmax(logits · inv_temp) at `targets` of fp32 logits [rows, vocab] (contiguous), with the
// arithmetic of ooze_linear_log_prob's forward: the engine reports its sampled tokens' log-probs
// exactly as the trainer computes them. Returns [rows] fp32.
at::Tensor* ooze_log_probs(const at::Tensor* logits, const at::Tensor* targets, double inv_temp) {
  return guarded([&] {
    check_cuda(*logits, "logits");
    c10::cuda::CUDAGuard guard(logits->device());
    TORCH_CHECK(logits->scalar_type() == at::kFloat && logits->dim() == 2 && logits->is_contiguous(),
                "logits must be contiguous float32 [rows, vocab]");
    const int64_t rows = logits->size(0);
    TORCH_CHECK(targets->scalar_type() == at::kLong && targets->is_contiguous() &&
                    targets->numel() == rows,
                "targets must be contiguous int64 [rows]");
    auto f32 = logits->options();
    at::Tensor log_prob = at::empty({rows}, f32), lse = at::empty({rows}, f32),
               entropy = at::empty({rows}, f32);
    if (rows > 0) {
      check_launch(ooze_launch_log_prob_forward(
          logits->data_ptr<float>(), static_cast<int>(rows), static_cast<int>(logits->size(1)),
          targets->data_ptr<int64_t>(), static_cast<float>(inv_temp), log_prob.data_ptr<float>(),
          lse.data_ptr<float>(), entropy.data_ptr<float>(), nullptr, stream()));
    }
    return log_prob;
  });
}

// Rotary embedding (rotate-half layout, ooze's signed sine) of the first `heads` heads of each row
// of x [tokens, columns ≥ heads·dim] (unit last stride); cos, sin [tokens, dim] contiguous, x's
// dtype. Returns [tokens, heads, dim]; differentiable in x.
at::Tensor* ooze_rope(const at::Tensor* x, const at::Tensor* cos, const at::Tensor* sin,
                      int64_t heads, int64_t dim) {
  return guarded([&] {
    check_cuda(*x, "x");
    c10::cuda::CUDAGuard guard(x->device());
    is_bf16(*x);
    TORCH_CHECK(x->dim() == 2 && x->stride(1) == 1 && x->size(1) >= heads * dim && dim % 2 == 0,
                "x must be [tokens, ≥ heads * head_dim] with unit last stride");
    for (const at::Tensor* t : {cos, sin}) {
      TORCH_CHECK(t->is_contiguous() && t->dim() == 2 && t->size(0) == x->size(0) &&
                      t->size(1) == dim && t->scalar_type() == x->scalar_type(),
                  "cos and sin must be contiguous [tokens, head_dim] of x's dtype");
    }
    return RopeFunction::apply(*x, *cos, *sin, heads, dim);
  });
}

// log_softmax(hidden·Wᵀ · inv_temp) at `targets`, and the entropy of that distribution, in
// chunks of `chunk_rows` rows:
// hidden [rows, h], weight [vocab, h] (bf16 or fp32, contiguous), targets int64 [rows]. Writes the
// two [rows] fp32 results through `log_prob` and `entropy`; returns 0 or 1 (error recorded).
int ooze_linear_log_prob(const at::Tensor* hidden, const at::Tensor* weight,
                         const at::Tensor* targets, double inv_temp, int keep_logits,
                         int64_t chunk_rows, at::Tensor** log_prob, at::Tensor** entropy) {
  try {
    check_cuda(*hidden, "hidden");
    c10::cuda::CUDAGuard guard(hidden->device());
    is_bf16(*hidden);
    TORCH_CHECK(hidden->dim() == 2 && weight->dim() == 2 && hidden->size(1) == weight->size(1),
                "hidden [rows, h] and weight [vocab, h] must agree");
    TORCH_CHECK(hidden->scalar_type() == weight->scalar_type(),
                "hidden and weight must share a dtype");
    TORCH_CHECK(targets->scalar_type() == at::kLong && targets->numel() == hidden->size(0),
                "targets must be int64 [rows]");
    TORCH_CHECK(chunk_rows > 0, "chunk_rows must be positive");
    auto out = LinearLogProbFunction::apply(hidden->contiguous(), *weight, targets->contiguous(),
                                            inv_temp, keep_logits != 0, chunk_rows);
    *log_prob = new at::Tensor(out[0]);
    *entropy = new at::Tensor(out[1]);
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

}  // extern "C"
