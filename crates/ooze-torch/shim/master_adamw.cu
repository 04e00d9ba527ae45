// AdamW over fp32 master weights with bf16 gradients and model weights, in one pass: each element's
// bf16 gradient is read, divided by the clipping divisor, the master and both moments updated in
// fp32 with the arithmetic of PyTorch's fused AdamW (`_fused_adamw_`, ADAMW mode), and the master
// written back to the bf16 model weight. libtorch's path needs three passes around its fused
// kernel: the gradients upcast into an fp32 buffer, the update, the masters copied down to the
// model (at the 4B shape 52 ms of a training step, against 28 bytes an element in one pass here).
// One block per chunk of a parameter; a block finds its parameter by binary search over the
// parameters' first chunks.

#include "master_adamw.h"

#include <cuda_bf16.h>

namespace {

constexpr int64_t CHUNK = 65536;
constexpr int THREADS = 256;

__device__ __forceinline__ void adamw_element(float g, float& p, float& m, float& v, float lr,
                                              float beta1, float beta2, float eps,
                                              float weight_decay, float step_size,
                                              float bias_correction2_sqrt) {
  p -= lr * weight_decay * p;
  m = beta1 * m + (1.f - beta1) * g;
  v = beta2 * v + (1.f - beta2) * g * g;
  const float denom = sqrtf(v) / bias_correction2_sqrt + eps;
  p -= step_size * m / denom;
}

__global__ void __launch_bounds__(THREADS)
    master_adamw_kernel(const OozeAdamWTensor* __restrict__ tensors,
                        const int64_t* __restrict__ first_chunk, int n,
                        const float* __restrict__ divisor, float lr, float beta1, float beta2,
                        float eps) {
  const float scale = *divisor;
  // A non-finite gradient norm makes the divisor non-finite: the step is skipped, nothing written
  // (the caller reads the norm afterwards and reports it), so it needs no wait before the launch.
  if (!isfinite(scale)) return;
  const int64_t chunk = blockIdx.x;
  int lo = 0, hi = n - 1;  // the last tensor whose first chunk is ≤ this one
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first_chunk[mid] <= chunk) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const OozeAdamWTensor t = tensors[lo];
  const int64_t begin = (chunk - first_chunk[lo]) * CHUNK;
  const int64_t end = begin + CHUNK < t.numel ? begin + CHUNK : t.numel;
  const float step = *t.step;
  const float bias_correction1 = 1.f - powf(beta1, step);
  const float bias_correction2_sqrt = sqrtf(1.f - powf(beta2, step));
  const float step_size = lr / bias_correction1;
  const auto* grad = static_cast<const __nv_bfloat16*>(t.grad);
  auto* model = static_cast<__nv_bfloat16*>(t.model);
  const bool vector =
      (reinterpret_cast<uintptr_t>(grad) | reinterpret_cast<uintptr_t>(model)) % 8 == 0 &&
      (reinterpret_cast<uintptr_t>(t.master) | reinterpret_cast<uintptr_t>(t.exp_avg) |
       reinterpret_cast<uintptr_t>(t.exp_avg_sq)) % 16 == 0;
  // Whole rounds of 4 · THREADS elements four at a time (when aligned), then the rest one by one.
  const int64_t rounds_end = vector ? begin + (end - begin) / (4 * THREADS) * (4 * THREADS) : begin;
  for (int64_t i = begin + 4 * threadIdx.x; i < rounds_end; i += 4 * THREADS) {
    const uint2 graw = *reinterpret_cast<const uint2*>(grad + i);
    const float2 g01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&graw.x));
    const float2 g23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&graw.y));
    float4 p = *reinterpret_cast<const float4*>(t.master + i);
    float4 m = *reinterpret_cast<const float4*>(t.exp_avg + i);
    float4 v = *reinterpret_cast<const float4*>(t.exp_avg_sq + i);
    const float wd = t.weight_decay, bc2 = bias_correction2_sqrt;
    adamw_element(g01.x / scale, p.x, m.x, v.x, lr, beta1, beta2, eps, wd, step_size, bc2);
    adamw_element(g01.y / scale, p.y, m.y, v.y, lr, beta1, beta2, eps, wd, step_size, bc2);
    adamw_element(g23.x / scale, p.z, m.z, v.z, lr, beta1, beta2, eps, wd, step_size, bc2);
    adamw_element(g23.y / scale, p.w, m.w, v.w, lr, beta1, beta2, eps, wd, step_size, bc2);
    *reinterpret_cast<float4*>(t.master + i) = p;
    *reinterpret_cast<float4*>(t.exp_avg + i) = m;
    *reinterpret_cast<float4*>(t.exp_avg_sq + i) = v;
    uint2 out;
    *reinterpret_cast<__nv_bfloat162*>(&out.x) = __floats2bfloat162_rn(p.x, p.y);
    *reinterpret_cast<__nv_bfloat162*>(&out.y) = __floats2bfloat162_rn(p.z, p.w);
    *reinterpret_cast<uint2*>(model + i) = out;
  }
  for (int64_t j = rounds_end + threadIdx.x; j < end; j += THREADS) {
    float p = t.master[j], m = t.exp_avg[j], v = t.exp_avg_sq[j];
    adamw_element(__bfloat162float(grad[j]) / scale, p, m, v, lr, beta1, beta2, eps,
                  t.weight_decay, step_size, bias_correction2_sqrt);
    t.master[j] = p;
    t.exp_avg[j] = m;
    t.exp_avg_sq[j] = v;
    model[j] = __float2bfloat16_rn(p);
  }
}

}  // namespace

extern "C" {

int64_t ooze_master_adamw_chunk() { return CHUNK; }

int ooze_launch_master_adamw(const OozeAdamWTensor* tensors, const int64_t* first_chunk, int n,
                             int64_t chunks, const float* divisor, float lr, float beta1,
                             float beta2, float eps, cudaStream_t stream) {
  if (n == 0 || chunks == 0) return 0;
  if (chunks > 2147483647) return static_cast<int>(cudaErrorInvalidValue);
  master_adamw_kernel<<<static_cast<unsigned>(chunks), THREADS, 0, stream>>>(
      tensors, first_chunk, n, divisor, lr, beta1, beta2, eps);
  return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
