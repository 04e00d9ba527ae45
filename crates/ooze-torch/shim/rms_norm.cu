// The residual add and the RMSNorm after it in one kernel: sum = x + delta (rounded to the stored
// type, as ATen's add rounds it), then the RMSNorm of sum in ATen's arithmetic (rms_norm.cuh).
// A decode step runs it twice a block instead of an add and a norm. Bits equal ATen's add
// followed by at::rms_norm (the trainer's forward).

#include "rms_norm.cuh"

namespace {

// One block of RMS_THREADS threads per row; n a multiple of 4; rows of x, delta, sum and out are
// `n` apart.
template <typename T>
__global__ void __launch_bounds__(RMS_THREADS)
    add_rms_norm_kernel(const T* __restrict__ x, const T* __restrict__ delta,
                        const T* __restrict__ weight, float eps, int n, T* __restrict__ sum,
                        T* __restrict__ out) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * n;
  const int groups = n / 4;
  float acc = 0.f;
  for (int g = threadIdx.x; g < groups; g += RMS_THREADS) {
    float v[4], d[4];
    Quad<T>::load(x + base + 4 * g, v);
    Quad<T>::load(delta + base + 4 * g, d);
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = stored<T>(__fadd_rn(v[j], d[j]));
    Quad<T>::store(sum + base + 4 * g, v);
    acc = add_squares(acc, v);
  }
  __shared__ float warp_sums[RMS_THREADS / 32];
  __shared__ float factor;
  acc = warp_sum(acc);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    const float total = __fadd_rn(__fadd_rn(warp_sums[0], warp_sums[2]),
                                  __fadd_rn(warp_sums[1], warp_sums[3]));
    factor = rms_factor(total, n, eps);
  }
  __syncthreads();
  const float r = factor;
  for (int g = threadIdx.x; g < groups; g += RMS_THREADS) {
    // Each thread reads back only what it wrote itself.
    float v[4], w[4];
    Quad<T>::load(sum + base + 4 * g, v);
    Quad<T>::load(weight + 4 * g, w);
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = rms_scale(v[j], r, w[j]);
    Quad<T>::store(out + base + 4 * g, v);
  }
}

static_assert(RMS_THREADS == 128, "the four-warp combination above assumes 128 threads");

}  // namespace

extern "C" {

int ooze_launch_add_rms_norm(int bf16, const void* x, const void* delta, const void* weight,
                             float eps, int64_t rows, int n, void* sum, void* out,
                             cudaStream_t stream) {
  if (rows == 0) return 0;
  const unsigned blocks = static_cast<unsigned>(rows);
  if (bf16) {
    using T = __nv_bfloat16;
    add_rms_norm_kernel<T><<<blocks, RMS_THREADS, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(delta), static_cast<const T*>(weight), eps,
        n, static_cast<T*>(sum), static_cast<T*>(out));
  } else {
    add_rms_norm_kernel<float><<<blocks, RMS_THREADS, 0, stream>>>(
        static_cast<const float*>(x), static_cast<const float*>(delta),
        static_cast<const float*>(weight), eps, n, static_cast<float*>(sum),
        static_cast<float*>(out));
  }
  return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
