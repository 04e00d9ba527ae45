// The checked entry point of the master-weight AdamW kernel (master_adamw.cu): training's optimizer
// step when the model is bf16 with fp32 masters on a GPU. Checks and error reporting as in ops.cpp.

#include "master_adamw.h"
#include "ops.h"

#include <c10/cuda/CUDAGuard.h>

#include <cstring>
#include <vector>

extern "C" {

using namespace ooze_ops;

// One AdamW step for n parameters, in place: grads and models bf16, masters, exp_avgs and
// exp_avg_sqs fp32 of the same sizes, steps fp32 scalars (incremented here, then read for the bias
// corrections), weight_decays[i] for parameter i, divisor a fp32 scalar every gradient is divided
// by (clipping), all on one GPU. A non-finite divisor skips the step on the device: nothing is
// updated and the step counters stay. Returns 0, or 1 with the error recorded.
int ooze_master_adamw(at::Tensor** grads, at::Tensor** masters, at::Tensor** exp_avgs,
                      at::Tensor** exp_avg_sqs, at::Tensor** models, at::Tensor** steps,
                      const double* weight_decays, int64_t n, double lr, double beta1,
                      double beta2, double eps, const at::Tensor* divisor) {
  try {
    if (n == 0) return 0;
    const at::Device device = masters[0]->device();
    TORCH_CHECK(device.is_cuda(), "master AdamW runs on a CUDA device");
    c10::cuda::CUDAGuard guard(device);
    TORCH_CHECK(divisor->device() == device && divisor->scalar_type() == at::kFloat &&
                    divisor->numel() == 1,
                "the clipping divisor must be a fp32 scalar on the parameters' device");
    std::vector<OozeAdamWTensor> tensors(n);
    std::vector<int64_t> first_chunk(n + 1);
    std::vector<at::Tensor> step_list;
    const int64_t chunk = ooze_master_adamw_chunk();
    int64_t chunks = 0;
    for (int64_t i = 0; i < n; ++i) {
      const at::Tensor &g = *grads[i], &p = *masters[i], &m = *exp_avgs[i], &v = *exp_avg_sqs[i],
                       &w = *models[i], &s = *steps[i];
      TORCH_CHECK(g.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16,
                  "parameter ", i, ": the gradient and the model weight must be bfloat16");
      for (const at::Tensor* t : {&p, &m, &v, &s}) {
        TORCH_CHECK(t->scalar_type() == at::kFloat, "parameter ", i,
                    ": the master weight, moments and step must be float32");
      }
      for (const at::Tensor* t : {&g, &p, &m, &v, &w, &s}) {
        TORCH_CHECK(t->device() == device && t->is_contiguous(), "parameter ", i,
                    ": every tensor must be contiguous on ", device);
      }
      const int64_t numel = p.numel();
      TORCH_CHECK(g.numel() == numel && m.numel() == numel && v.numel() == numel &&
                      w.numel() == numel && s.numel() == 1,
                  "parameter ", i, ": sizes differ");
      tensors[i] = {g.data_ptr(), p.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(),
                    w.data_ptr(), s.data_ptr<float>(), numel,
                    static_cast<float>(weight_decays[i])};
      first_chunk[i] = chunks;
      chunks += (numel + chunk - 1) / chunk;
      step_list.push_back(s);
    }
    first_chunk[n] = chunks;
    // The descriptors and chunk offsets go up in one queued copy from pinned memory.
    const size_t table_bytes = n * sizeof(OozeAdamWTensor);
    const size_t bytes = table_bytes + (n + 1) * sizeof(int64_t);
    at::Tensor host = at::empty({static_cast<int64_t>(bytes)},
                                at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    std::memcpy(host.data_ptr(), tensors.data(), table_bytes);
    std::memcpy(static_cast<char*>(host.data_ptr()) + table_bytes, first_chunk.data(),
                (n + 1) * sizeof(int64_t));
    const at::Tensor table = host.to(device, /*non_blocking=*/true);
    // +1 where the divisor is finite, +0 where the kernel will skip the step.
    at::_foreach_add_(step_list, divisor->isfinite().to(at::kFloat));
    const auto* base = static_cast<const char*>(table.data_ptr());
    check_launch(ooze_launch_master_adamw(
        reinterpret_cast<const OozeAdamWTensor*>(base),
        reinterpret_cast<const int64_t*>(base + table_bytes), static_cast<int>(n), chunks,
        divisor->data_ptr<float>(), static_cast<float>(lr), static_cast<float>(beta1),
        static_cast<float>(beta2), static_cast<float>(eps), stream()));
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

}  // extern "C"
