// RMSNorm in the arithmetic of PyTorch 2.11's fused CUDA kernel (`at::rms_norm` on a GPU: the
// vectorised row kernel of layer_norm_kernel.cu with rms_norm = true), so that a norm fused into
// another of ooze's kernels gives the bits training gets from ATen:
//
// - a row of N elements (N a multiple of 4) is read as N/4 groups of 4 by 128 threads, thread t
//   taking groups t, t + 128, …; each thread sums the squares of its elements in order, one fused
//   multiply-add per element;
// - the 32 lanes of each warp are summed pairwise (offsets 16, 8, 4, 2, 1), then the four warps'
//   sums as (w0 + w2) + (w1 + w3);
// - mean square = sum / N (IEEE division), r = rsqrtf(mean square + eps), and each output
//   weight · (r · x), both products rounded, then rounded to the stored type.
//
// A reduction that follows the same grouping from fewer threads gives the same bits, since the
// absent threads' sums are +0: one warp over a q or k head of up to 128 elements (group t in lane
// t) reproduces the 128-thread block exactly.
#pragma once

#include "common.cuh"

namespace {

constexpr int RMS_THREADS = 128;

// The sum of squares of 4 values, added to `acc` in order, as each ATen thread accumulates.
__device__ __forceinline__ float add_squares(float acc, const float (&v)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) acc = __fmaf_rn(v[j], v[j], acc);
  return acc;
}

// The factor r of a row from its sum of squares.
__device__ __forceinline__ float rms_factor(float sum_squares, int n, float eps) {
  return rsqrtf(__fadd_rn(__fdiv_rn(sum_squares, static_cast<float>(n)), eps));
}

// weight · (r · x), rounded as ATen rounds it (the stored type's rounding is the caller's).
__device__ __forceinline__ float rms_scale(float x, float r, float weight) {
  return __fmul_rn(weight, __fmul_rn(r, x));
}

}  // namespace
