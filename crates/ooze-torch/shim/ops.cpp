// Tensor-level entry points of ooze's elementwise, sampling and log-prob kernels (kernels.cu):
// shapes, dtypes and devices are checked here, outputs allocated with PyTorch's allocator on the
// current stream (so they work under CUDA graph capture), and C++ exceptions reported through
// ooze_ops_last_error. The attention entry points are in attention_ops.cpp.

#include "ops.h"

#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <vector>

namespace ooze_ops {

thread_local std::string last_error;

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

}  // namespace ooze_ops

namespace {

using namespace ooze_ops;

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

// RMSNorm for training: the forward is ATen's own (at::rms_norm's kernel, so the same bits as
// the engine's norms), the backward ooze's one-pass kernel (ATen's takes a kernel for the input's
// gradient and a slower one for the weight's).
struct RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, double eps) {
    auto [out, rstd] = at::_fused_rms_norm(x, {x.size(-1)}, weight, eps);
    ctx->save_for_backward({x, weight, rstd});
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &rstd = saved[2];
    const at::Tensor grad = grads[0].contiguous();
    const int64_t n = x.size(-1), rows = x.numel() / n;
    at::Tensor dx = at::empty_like(x), dw = at::empty_like(weight);
    at::Tensor partial =
        at::empty({ooze_rms_norm_backward_blocks(rows), n}, x.options().dtype(at::kFloat));
    check_launch(ooze_launch_rms_norm_backward(
        x.data_ptr(), grad.data_ptr(), nullptr, weight.data_ptr(), rstd.data_ptr<float>(), 0.f,
        rows, static_cast<int>(n), dx.data_ptr(), dw.data_ptr(), partial.data_ptr<float>(),
        stream()));
    return {dx, dw, at::Tensor()};
  }
};

// The residual add and the RMSNorm after it, for training: the forward is ooze's fused kernel
// (ATen's add and rms_norm bitwise), returning the sum and the normed rows; the backward one
// pass of the norm's backward kernel that also adds the sum's own gradient (the residual stream),
// so the input and the delta get one gradient tensor without a separate add.
struct AddRmsNormFunction : public torch::autograd::Function<AddRmsNormFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& x, const at::Tensor& delta,
                                                const at::Tensor& weight, double eps) {
    const int64_t n = x.size(-1), rows = x.numel() / n;
    at::Tensor sum = at::empty_like(x), out = at::empty_like(x);
    check_launch(ooze_launch_add_rms_norm(1, x.data_ptr(), delta.data_ptr(), weight.data_ptr(),
                                          static_cast<float>(eps), rows, static_cast<int>(n),
                                          sum.data_ptr(), out.data_ptr(), stream()));
    ctx->save_for_backward({sum, weight});
    ctx->saved_data["eps"] = eps;
    return {sum, out};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &sum = saved[0], &weight = saved[1];
    const double eps = ctx->saved_data["eps"].toDouble();
    const int64_t n = sum.size(-1), rows = sum.numel() / n;
    const at::Tensor grad_sum = grads[0].defined() ? grads[0].contiguous() : at::Tensor();
    const at::Tensor grad_out =
        grads[1].defined() ? grads[1].contiguous() : at::zeros_like(sum);
    at::Tensor d = at::empty_like(sum), dw = at::empty_like(weight);
    at::Tensor partial =
        at::empty({ooze_rms_norm_backward_blocks(rows), n}, sum.options().dtype(at::kFloat));
    check_launch(ooze_launch_rms_norm_backward(
        sum.data_ptr(), grad_out.data_ptr(), grad_sum.defined() ? grad_sum.data_ptr() : nullptr,
        weight.data_ptr(), nullptr, static_cast<float>(eps), rows, static_cast<int>(n),
        d.data_ptr(), dw.data_ptr(), partial.data_ptr<float>(), stream()));
    return {d, d, dw, at::Tensor()};
  }
};

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

// How the LM head's logits are made and what the backward reads (LinearLogProbFunction).
enum class HeadLogits : int64_t {
  // fp32 from the matmul, recomputed in fp32 for the backward (activation recomputation).
  Recompute = 0,
  // fp32 from the matmul for the forward (the engine's arithmetic); kept rounded to bf16 (the
  // rounding autocast PyTorch trains with, 2 bytes per logit until the backward).
  KeepRounded = 1,
  // bf16 from the matmul, as autocast makes them, for the forward and the backward: half the
  // bytes written and read, and log-probs from the rounded logits, not the engine's.
  Bf16 = 2,
};

// log_softmax(hidden·Wᵀ / T) at the targets, with entropy (not differentiated), over all rows in
// one autograd node. With fp32 logits it works through them `chunk` rows at a time (at most
// chunk × vocab fp32 logits exist at once). The backward writes each chunk's hidden gradient into
// its rows of one tensor and accumulates the weight gradient in the GEMM itself (beta = 1): one
// [vocab, h] result for the whole head instead of one per chunk summed by autograd. The backward
// either reads bf16 logits kept since the forward (HeadLogits) or recomputes them in fp32.
struct LinearLogProbFunction : public torch::autograd::Function<LinearLogProbFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& hidden, const at::Tensor& weight,
                                                const at::Tensor& targets, double inv_temp,
                                                int64_t mode, int64_t chunk) {
    const int64_t rows = hidden.size(0), vocab = weight.size(0);
    auto f32 = hidden.options().dtype(at::kFloat);
    at::Tensor log_prob = at::empty({rows}, f32), lse = at::empty({rows}, f32),
               entropy = at::empty({rows}, f32);
    const bool bf16 = hidden.scalar_type() == at::kBFloat16;
    at::Tensor kept;
    if (bf16 && mode == static_cast<int64_t>(HeadLogits::Bf16)) {
      kept = at::mm(hidden, weight.t());
      if (rows > 0) {
        check_launch(ooze_launch_log_prob_forward_bf16(
            kept.data_ptr(), static_cast<int>(rows), static_cast<int>(vocab),
            targets.data_ptr<int64_t>(), static_cast<float>(inv_temp), log_prob.data_ptr<float>(),
            lse.data_ptr<float>(), entropy.data_ptr<float>(), stream()));
      }
    } else {
      if (bf16 && mode == static_cast<int64_t>(HeadLogits::KeepRounded)) {
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
    // d logits of rows [start, start + len) from their logits (bf16 or fp32) into `out`.
    const auto logits_backward = [&](const void* logits, bool logits_bf16, int64_t start,
                                     int64_t len, void* out) {
      check_launch(ooze_launch_log_prob_backward(
          hidden.scalar_type() == at::kBFloat16, logits, logits_bf16 ? 1 : 0,
          static_cast<int>(len), static_cast<int>(vocab), targets.data_ptr<int64_t>() + start,
          lse.data_ptr<float>() + start, grad.data_ptr<float>() + start,
          static_cast<float>(inv_temp), out, stream()));
    };
    if (kept.defined()) {
      // The logits' gradients go over the kept logits, chunk by chunk; then one product for the
      // hidden gradient and one for the head's over all rows: the head's gradient sums every row
      // in the GEMM's fp32 accumulator instead of adding bf16 chunk products, and neither product
      // is split into chunk-sized GEMMs that leave multiprocessors idle.
      for (int64_t start = 0; start < rows; start += chunk) {
        const int64_t len = std::min(chunk, rows - start);
        void* logits = kept.narrow(0, start, len).data_ptr();
        logits_backward(logits, true, start, len, logits);
      }
      at::mm_out(grad_hidden, kept, weight);
      return {grad_hidden, at::mm(kept.t(), hidden), at::Tensor(), at::Tensor(), at::Tensor(),
              at::Tensor()};
    }
    at::Tensor grad_weight = at::empty_like(weight);  // the first chunk's product writes it
    at::Tensor d_logits = at::empty({std::min(chunk, rows), vocab}, hidden.options());
    for (int64_t start = 0; start < rows; start += chunk) {
      const int64_t len = std::min(chunk, rows - start);
      const at::Tensor rows_in = hidden.narrow(0, start, len);
      const at::Tensor logits = fp32_logits(rows_in, weight);
      at::Tensor d = d_logits.narrow(0, 0, len);
      logits_backward(logits.data_ptr(), false, start, len, d.data_ptr());
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

// The inputs training's norms take: contiguous bf16 x [..., n] on a GPU, n a multiple of 8 up
// to 8192, and a contiguous bf16 weight [n] on x's device.
void check_trained_norm(const at::Tensor& x, const at::Tensor& weight) {
  check_cuda(x, "x");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.is_contiguous() && x.dim() >= 1,
              "x must be contiguous bfloat16 [..., n]");
  const int64_t n = x.size(-1);
  TORCH_CHECK(n % 8 == 0 && n <= 8192, "the norm's width must be a multiple of 8 up to 8192, got ", n);
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16 && weight.is_contiguous() &&
                  weight.numel() == n && weight.device() == x.device(),
              "weight must be contiguous bfloat16 [n] on x's device");
}

}  // namespace

extern "C" {

using namespace ooze_ops;

const char* ooze_ops_last_error() { return last_error.c_str(); }

// Whether autograd records operations on this thread (kernels without a backward check it).
int ooze_grad_enabled() { return at::GradMode::is_enabled() ? 1 : 0; }

// qkv [rows, (heads + 2 kv_heads) · dim] (rows may be strided), cells [rows] int64 (the flat
// index block · block_size + offset a row's key and value go to), cos / sin [rows, dim] (the
// rotary tables of ooze_rope: the sine with its first half negated), k_cache / v_cache [blocks,
// block_size, kv_heads, dim]; q_norm / k_norm [dim] (both or neither: Qwen3's per-head RMSNorm
// weights, applied before the rotation, head sizes 32, 64, 128 or 256). Returns the rotated q
// [rows, heads, dim].
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
    TORCH_CHECK((q_norm == nullptr) == (k_norm == nullptr), "q_norm and k_norm go together");
    if (q_norm != nullptr) {
      TORCH_CHECK(dim == 32 || dim == 64 || dim == 128 || dim == 256,
                  "fused q/k norms take head sizes 32, 64, 128 or 256, got ", dim);
      TORCH_CHECK(qkv->stride(0) % 4 == 0 && reinterpret_cast<uintptr_t>(qkv->data_ptr()) % 16 == 0,
                  "fused q/k norms read qkv in groups of 4: rows must start 16-byte aligned");
      for (const at::Tensor* t : {q_norm, k_norm}) {
        TORCH_CHECK(t->is_contiguous() && t->numel() == dim && t->scalar_type() == qkv->scalar_type(),
                    "q_norm and k_norm must be contiguous [head_dim] of qkv's dtype");
      }
    }
    at::Tensor q = at::empty({rows, heads, dim}, qkv->options());
    check_launch(ooze_launch_rope_store(
        bf16, qkv->data_ptr(), qkv->stride(0), cells->data_ptr<int64_t>(), cos->data_ptr(),
        sin->data_ptr(), q_norm != nullptr ? q_norm->data_ptr() : nullptr,
        k_norm != nullptr ? k_norm->data_ptr() : nullptr, static_cast<float>(eps), q.data_ptr(),
        k_cache->data_ptr(), v_cache->data_ptr(),
        static_cast<int>(rows), static_cast<int>(heads), static_cast<int>(kv_heads),
        static_cast<int>(dim), at::cuda::getCurrentCUDAStream().stream()));
    return q;
  });
}

// x [rows, n] contiguous, delta like x, weight [n] of x's dtype, n a multiple of 4 → the RMSNorm
// of sum = x + delta times weight, with ATen's arithmetic for both (rms_norm.cu); sum itself goes
// to *sum_out.
at::Tensor* ooze_add_rms_norm(const at::Tensor* x, const at::Tensor* delta,
                              const at::Tensor* weight, double eps, at::Tensor** sum_out) {
  return guarded([&] {
    check_cuda(*x, "x");
    c10::cuda::CUDAGuard guard(x->device());
    const bool bf16 = is_bf16(*x);
    TORCH_CHECK(x->dim() == 2 && x->is_contiguous(), "x must be contiguous [rows, n]");
    const int64_t rows = x->size(0), n = x->size(1);
    TORCH_CHECK(n % 4 == 0 && n <= (1 << 24), "the row size must be a multiple of 4, got ", n);
    TORCH_CHECK(weight->is_contiguous() && weight->numel() == n &&
                    weight->scalar_type() == x->scalar_type() && weight->device() == x->device(),
                "weight must be contiguous [n] of x's dtype and device");
    TORCH_CHECK(delta->sizes() == x->sizes() && delta->is_contiguous() &&
                    delta->scalar_type() == x->scalar_type() && delta->device() == x->device(),
                "delta must be contiguous and of x's shape, dtype and device");
    at::Tensor sum = at::empty_like(*x), out = at::empty_like(*x);
    check_launch(ooze_launch_add_rms_norm(bf16, x->data_ptr(), delta->data_ptr(),
                                          weight->data_ptr(), static_cast<float>(eps), rows,
                                          static_cast<int>(n), sum.data_ptr(), out.data_ptr(),
                                          stream()));
    *sum_out = new at::Tensor(sum);
    return out;
  });
}

// RMSNorm of bf16 x [..., n] (contiguous) with weight [n]: ATen's forward, ooze's backward.
// n a multiple of 8, at most 8192.
at::Tensor* ooze_rms_norm_trained(const at::Tensor* x, const at::Tensor* weight, double eps) {
  return guarded([&] {
    check_trained_norm(*x, *weight);
    c10::cuda::CUDAGuard guard(x->device());
    return RmsNormFunction::apply(*x, *weight, eps);
  });
}

// The residual add x + delta and its RMSNorm under weight, differentiable (bf16, contiguous
// [..., n] of one shape; n a multiple of 8 up to 8192). Returns the normed rows, the sum through
// sum_out.
at::Tensor* ooze_add_rms_norm_trained(const at::Tensor* x, const at::Tensor* delta,
                                      const at::Tensor* weight, double eps,
                                      at::Tensor** sum_out) {
  return guarded([&] {
    check_trained_norm(*x, *weight);
    c10::cuda::CUDAGuard guard(x->device());
    TORCH_CHECK(delta->sizes() == x->sizes() && delta->is_contiguous() &&
                    delta->scalar_type() == at::kBFloat16 && delta->device() == x->device(),
                "delta must be contiguous bfloat16 of x's shape on x's device");
    auto outs = AddRmsNormFunction::apply(*x, *delta, *weight, eps);
    *sum_out = new at::Tensor(outs[0]);
    return outs[1];
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

// logits [rows, vocab] float32 (unit last stride), params [3, rows] float32 (1/temperature, greedy
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

// log_softmax(hidden·Wᵀ · inv_temp) at `targets`, and the entropy of that distribution, fp32
// logits in chunks of `chunk_rows` rows; `logits_mode` a HeadLogits (0 recompute, 1 keep rounded,
// 2 bf16 logits; 1 and 2 count as 0 for fp32 hidden rows):
// hidden [rows, h], weight [vocab, h] (bf16 or fp32, contiguous), targets int64 [rows]. Writes the
// two [rows] fp32 results through `log_prob` and `entropy`; returns 0 or 1 (error recorded).
int ooze_linear_log_prob(const at::Tensor* hidden, const at::Tensor* weight,
                         const at::Tensor* targets, double inv_temp, int logits_mode,
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
    TORCH_CHECK(logits_mode >= 0 && logits_mode <= 2, "logits_mode must be 0, 1 or 2");
    auto out = LinearLogProbFunction::apply(hidden->contiguous(), *weight, targets->contiguous(),
                                            inv_temp, logits_mode, chunk_rows);
    *log_prob = new at::Tensor(out[0]);
    *entropy = new at::Tensor(out[1]);
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

}  // extern "C"
