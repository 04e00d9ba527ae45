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

// Four consecutive elements as floats, and back (8-byte bf16 or 16-byte float accesses).
template <typename T>
struct Quad;
template <>
struct Quad<__nv_bfloat16> {
  static __device__ __forceinline__ void load(const __nv_bfloat16* p, float (&v)[4]) {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
  }
  static __device__ __forceinline__ void store(__nv_bfloat16* p, const float (&v)[4]) {
    uint2 raw;
    *reinterpret_cast<__nv_bfloat162*>(&raw.x) = __floats2bfloat162_rn(v[0], v[1]);
    *reinterpret_cast<__nv_bfloat162*>(&raw.y) = __floats2bfloat162_rn(v[2], v[3]);
    *reinterpret_cast<uint2*>(p) = raw;
  }
};
template <>
struct Quad<float> {
  static __device__ __forceinline__ void load(const float* p, float (&v)[4]) {
    const float4 raw = *reinterpret_cast<const float4*>(p);
    v[0] = raw.x, v[1] = raw.y, v[2] = raw.z, v[3] = raw.w;
  }
  static __device__ __forceinline__ void store(float* p, const float (&v)[4]) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  }
};

}  // namespace
