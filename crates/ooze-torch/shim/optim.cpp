// libtorch's fused AdamW (one multi-tensor kernel for all parameters on a GPU, a vectorised loop on
// the CPU), which tch does not bind. Only ATen headers: built whenever the PyTorch headers are
// there, with or without CUDA.

#include <ATen/ATen.h>

#include <algorithm>
#include <exception>
#include <string>
#include <vector>

namespace {
thread_local std::string last_error;

std::vector<at::Tensor> list(at::Tensor** tensors, int64_t n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (int64_t i = 0; i < n; ++i) out.push_back(*tensors[i]);
  return out;
}
}  // namespace

extern "C" {

const char* ooze_optim_last_error() { return last_error.c_str(); }

// One AdamW step over n parameters, in place: params, grads, first and second moments, and the
// per-parameter step counters (float32 scalars, incremented here by one multi-tensor kernel, then
// read by the update for the bias correction). Returns 0, or 1 with
// the error in ooze_optim_last_error.
//
// `grad_scale` (may be null): a float32 scalar the kernel divides every gradient by (gradient
// clipping without rewriting the gradients).
int ooze_fused_adamw(at::Tensor** params, at::Tensor** grads, at::Tensor** exp_avgs,
                     at::Tensor** exp_avg_sqs, at::Tensor** steps, int64_t n, double lr,
                     double beta1, double beta2, double weight_decay, double eps,
                     const at::Tensor* grad_scale) {
  try {
    auto p = list(params, n), g = list(grads, n), m = list(exp_avgs, n),
         v = list(exp_avg_sqs, n), s = list(steps, n);
    std::optional<at::Tensor> scale;
    if (grad_scale) scale = *grad_scale;
    at::_foreach_add_(s, at::Scalar(1.0));
    at::_fused_adamw_(p, g, m, v, {}, s, lr, beta1, beta2, weight_decay, eps,
                      /*amsgrad=*/false, /*maximize=*/false, scale, std::nullopt);
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

// The L2 norms of n tensors as one float32 tensor [n] (one multi-tensor kernel on a GPU), summed in
// float32 whatever the tensors' dtype.
at::Tensor* ooze_foreach_norm(at::Tensor** tensors, int64_t n) {
  try {
    auto all = list(tensors, n);
    // fp32 tensors as before (the same kernels and sums); 16-bit ones summed in fp32.
    const bool fp32 = std::all_of(all.begin(), all.end(),
                                  [](const at::Tensor& t) { return t.scalar_type() == at::kFloat; });
    return new at::Tensor(at::stack(fp32 ? at::_foreach_norm(all, 2)
                                         : at::_foreach_norm(all, 2, at::kFloat)));
  } catch (const std::exception& e) {
    last_error = e.what();
    return nullptr;
  }
}

// dst[i] ← src[i] for n pairs (dtype conversion included), one multi-tensor kernel on a GPU.
int ooze_foreach_copy(at::Tensor** dst, at::Tensor** src, int64_t n) {
  try {
    auto d = list(dst, n);
    at::_foreach_copy_(d, list(src, n), false);
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

// Drops a tensor's gradient (Python's `p.grad = None`): its memory goes back to the allocator.
void ooze_clear_grad(at::Tensor* t) { t->mutable_grad().reset(); }

}  // extern "C"
