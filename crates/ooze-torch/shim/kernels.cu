// ooze's CUDA kernels: the small fused steps of a decode step that libtorch runs as many separate
// kernels. Plain C launchers over raw pointers (no libtorch headers here: nvcc stays fast); the
// checked, tensor-level entry points are in ops.cpp. Every launcher returns the launch error.
//
// - rope_store: rotary embedding of q and k (after Qwen3's per-head q/k RMSNorm when given), the
//   rotated q written out, k and v written into their cell (block · block size + offset) of the
//   paged KV memory.
// - silu_mul: silu(gate) * up of the fused gate/up projection.
// - sample: per row, the log-softmax statistics, then the greedy or inverse-CDF token and its
//   log-prob, in one block per row (no full-vocabulary intermediate tensors).
// - rope, silu_mul's and the LM head log-prob's backward kernels, for training.
// Attention is in attention.cu and fa_order_attention.cu, the residual add with its RMSNorm in
// rms_norm.cu.

#include "rms_norm.cuh"

namespace {

// One warp per (row, head) over the q, k and v heads of a fused projection row. Lane l handles the
// rotation pairs (i, i + D/2) for i = l, l + 32, … (D ≤ 256). The rotation reads the same cos/sin
// tables as rope_kernel and rotates with the same arithmetic, so decode and training agree.
template <typename T>
__global__ void rope_store_kernel(const T* __restrict__ qkv, int64_t qkv_stride,
                                  const int64_t* __restrict__ cells, const T* __restrict__ cos,
                                  const T* __restrict__ signed_sin, T* __restrict__ q_out,
                                  T* __restrict__ k_cache, T* __restrict__ v_cache, int rows,
                                  int heads, int kv_heads, int dim) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int per_row = heads + 2 * kv_heads;
  if (warp >= rows * per_row) return;
  const int row = warp / per_row;
  const int head = warp % per_row;
  const T* src = qkv + row * qkv_stride + head * dim;
  const int64_t cell = cells[row] * kv_heads;
  if (head >= heads + kv_heads) {
    T* dst = v_cache + (cell + head - heads - kv_heads) * dim;
    for (int i = lane; i < dim; i += 32) dst[i] = src[i];
    return;
  }
  const int half = dim / 2;
  float x1[4], x2[4];
  int n = 0;
  for (int i = lane; i < half; i += 32, ++n) {
    x1[n] = to_float(src[i]);
    x2[n] = to_float(src[i + half]);
  }
  T* dst = head < heads ? q_out + (static_cast<int64_t>(row) * heads + head) * dim
                        : k_cache + (cell + head - heads) * dim;
  n = 0;
  for (int i = lane; i < half; i += 32, ++n) {
    // The training rotation's tables: cos, and the sine with its first half negated.
    const float c = to_float(cos[row * dim + i]), sn = to_float(signed_sin[row * dim + i + half]);
    float y1, y2;
    rotate(x1[n], x2[n], c, sn, y1, y2);
    dst[i] = from_float<T>(y1);
    dst[i + half] = from_float<T>(y2);
  }
}

// rope_store for Qwen3's q/k norms: each q and k head RMS-normalised in ATen's arithmetic
// (rms_norm.cuh: one warp stands for the 128-thread block, group t of 4 elements in lane t, and
// for head size 256 groups 32–63 in the same lanes as a second warp), then rotated with the
// rotary kernels' arithmetic. Head sizes 32, 64, 128 and 256: a rotation pair (i, i + D/2) is
// then either in lanes l and l ^ D/8 or, at 256, in one lane's two groups.
template <typename T>
__global__ void rope_norm_store_kernel(const T* __restrict__ qkv, int64_t qkv_stride,
                                       const int64_t* __restrict__ cells, const T* __restrict__ cos,
                                       const T* __restrict__ signed_sin,
                                       const T* __restrict__ q_norm, const T* __restrict__ k_norm,
                                       float eps, T* __restrict__ q_out, T* __restrict__ k_cache,
                                       T* __restrict__ v_cache, int rows, int heads, int kv_heads,
                                       int dim) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int per_row = heads + 2 * kv_heads;
  if (warp >= rows * per_row) return;
  const int row = warp / per_row;
  const int head = warp % per_row;
  const T* src = qkv + row * qkv_stride + head * dim;
  const int64_t cell = cells[row] * kv_heads;
  if (head >= heads + kv_heads) {
    T* dst = v_cache + (cell + head - heads - kv_heads) * dim;
    for (int i = lane; i < dim; i += 32) dst[i] = src[i];
    return;
  }
  const bool wide = dim == 256;
  const bool active = 4 * lane < dim;
  float a[4] = {0.f, 0.f, 0.f, 0.f}, b[4] = {0.f, 0.f, 0.f, 0.f};
  if (active) Quad<T>::load(src + 4 * lane, a);
  if (wide) Quad<T>::load(src + 128 + 4 * lane, b);
  const float total = __fadd_rn(warp_sum(add_squares(0.f, a)), warp_sum(add_squares(0.f, b)));
  const float r = rms_factor(total, dim, eps);
  const T* norm = head < heads ? q_norm : k_norm;
  float w[4];
  if (active) {
    Quad<T>::load(norm + 4 * lane, w);
#pragma unroll
    for (int j = 0; j < 4; ++j) a[j] = stored<T>(rms_scale(a[j], r, w[j]));
  }
  if (wide) {
    Quad<T>::load(norm + 128 + 4 * lane, w);
#pragma unroll
    for (int j = 0; j < 4; ++j) b[j] = stored<T>(rms_scale(b[j], r, w[j]));
  } else {
    // The second half of each pair from the lane holding it.
#pragma unroll
    for (int j = 0; j < 4; ++j) b[j] = __shfl_xor_sync(0xffffffffu, a[j], dim / 8);
  }
  const int half = dim / 2;
  if (4 * lane >= half) return;
  T* dst = head < heads ? q_out + (static_cast<int64_t>(row) * heads + head) * dim
                        : k_cache + (cell + head - heads) * dim;
  float c[4], sn[4], y1[4], y2[4];
  Quad<T>::load(cos + row * dim + 4 * lane, c);
  Quad<T>::load(signed_sin + row * dim + half + 4 * lane, sn);
#pragma unroll
  for (int j = 0; j < 4; ++j) rotate(a[j], b[j], c[j], sn[j], y1[j], y2[j]);
  Quad<T>::store(dst + 4 * lane, y1);
  Quad<T>::store(dst + half + 4 * lane, y2);
}

template <typename T>
__global__ void silu_mul_kernel(const T* __restrict__ gate_up, T* __restrict__ out, int64_t rows,
                                int64_t width) {
  const int64_t total = rows * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / width, col = i % width;
    const float g = to_float(gate_up[row * 2 * width + col]);
    const float u = to_float(gate_up[row * 2 * width + width + col]);
    // As PyTorch does it: silu rounded to T, then the product.
    out[i] = from_float<T>(stored<T>(g / (1.f + expf(-g))) * u);
  }
}

// Two adjacent elements as float2 (loads and stores of bf16 pairs or float pairs).
template <typename T>
struct Pair;
template <>
struct Pair<__nv_bfloat16> {
  static __device__ __forceinline__ float2 load(const __nv_bfloat16* p) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
  }
  static __device__ __forceinline__ void store(__nv_bfloat16* p, float2 v) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __float22bfloat162_rn(v);
  }
};
template <>
struct Pair<float> {
  static __device__ __forceinline__ float2 load(const float* p) {
    return *reinterpret_cast<const float2*>(p);
  }
  static __device__ __forceinline__ void store(float* p, float2 v) {
    *reinterpret_cast<float2*>(p) = v;
  }
};

// silu_mul for even widths: one row per blockIdx.y, two columns per thread.
template <typename T>
__global__ void silu_mul_pairs_kernel(const T* __restrict__ gate_up, T* __restrict__ out,
                                      int64_t width) {
  const int64_t row = blockIdx.y;
  const int64_t col = 2 * (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x);
  if (col >= width) return;
  const T* in = gate_up + row * 2 * width;
  const float2 g = Pair<T>::load(in + col), u = Pair<T>::load(in + width + col);
  const float a = stored<T>(g.x / (1.f + expf(-g.x))), b = stored<T>(g.y / (1.f + expf(-g.y)));
  Pair<T>::store(out + row * width + col, make_float2(a * u.x, b * u.y));
}

template <typename T>
__global__ void silu_mul_backward_pairs_kernel(const T* __restrict__ gate_up,
                                               const T* __restrict__ grad, T* __restrict__ out,
                                               int64_t width) {
  const int64_t row = blockIdx.y;
  const int64_t col = 2 * (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x);
  if (col >= width) return;
  const T* in = gate_up + row * 2 * width;
  const float2 x = Pair<T>::load(in + col), u = Pair<T>::load(in + width + col);
  const float2 g = Pair<T>::load(grad + row * width + col);
  const float s0 = 1.f / (1.f + expf(-x.x)), s1 = 1.f / (1.f + expf(-x.y));
  T* o = out + row * 2 * width;
  Pair<T>::store(o + col, make_float2(g.x * u.x * s0 * (1.f + x.x * (1.f - s0)),
                                      g.y * u.y * s1 * (1.f + x.y * (1.f - s1))));
  Pair<T>::store(o + width + col, make_float2(g.x * x.x * s0, g.y * x.y * s1));
}

// Backward of silu(gate)·up: d_gate = g·up·σ(x)(1 + x(1 − σ(x))), d_up = g·silu(x), written into
// one [rows, 2·width] gradient (gate half, then up half).
template <typename T>
__global__ void silu_mul_backward_kernel(const T* __restrict__ gate_up, const T* __restrict__ grad,
                                         T* __restrict__ out, int64_t rows, int64_t width) {
  const int64_t total = rows * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / width, col = i % width;
    const float x = to_float(gate_up[row * 2 * width + col]);
    const float u = to_float(gate_up[row * 2 * width + width + col]);
    const float g = to_float(grad[i]);
    const float sig = 1.f / (1.f + expf(-x));
    out[row * 2 * width + col] = from_float<T>(g * u * sig * (1.f + x * (1.f - sig)));
    out[row * 2 * width + width + col] = from_float<T>(g * x * sig);
  }
}

// Rotary embedding (rotate-half layout) of `heads` heads of each token, out of place, for training:
// x [tokens, stride] with the heads at the start of each row, cos/sin [tokens, dim] (the sine with
// its first half negated, as ooze's rope::cos_sin makes it); out rows of out_stride elements with
// the heads at their start. `sign` −1 rotates backwards (the gradient of the rotation).
template <typename T>
__global__ void rope_kernel(const T* __restrict__ x, int64_t stride, const T* __restrict__ cos,
                            const T* __restrict__ signed_sin, T* __restrict__ out,
                            int64_t out_stride, int64_t tokens, int heads, int dim, float sign) {
  const int half = dim / 2;
  const int64_t total = tokens * heads * half;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t token = i / (heads * half);
    const int rest = static_cast<int>(i % (heads * half));
    const int head = rest / half, j = rest % half;
    const T* src = x + token * stride + head * dim;
    const float x1 = to_float(src[j]), x2 = to_float(src[j + half]);
    // cos repeats over the two halves; signed_sin = [−sin, sin].
    const float c = to_float(cos[token * dim + j]);
    const float sn = sign * to_float(signed_sin[token * dim + j + half]);
    float y1, y2;
    rotate(x1, x2, c, sn, y1, y2);
    T* dst = out + token * out_stride + head * dim;
    dst[j] = from_float<T>(y1);
    dst[j + half] = from_float<T>(y2);
  }
}

constexpr int SAMPLE_THREADS = 1024;

struct Moments {
  float max, sum, weighted;  // running max m, Σ e^{x−m}, Σ e^{x−m}·x
};

__device__ __forceinline__ Moments merge_moments(Moments a, Moments b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return {m, 0.f, 0.f};
  const float ea = expf(a.max - m), eb = expf(b.max - m);
  return {m, a.sum * ea + b.sum * eb, a.weighted * ea + b.weighted * eb};
}

// Per row of fp32 logits [rows, vocab] (x = logits · inv_temp): the log-prob of the target,
// logsumexp and entropy (lse − E[x]), one block per row, no full-vocabulary output.
__global__ void log_prob_forward_kernel(const float* __restrict__ logits, int vocab,
                                        const int64_t* __restrict__ targets, float inv_temp,
                                        float* __restrict__ log_prob, float* __restrict__ lse_out,
                                        float* __restrict__ entropy,
                                        __nv_bfloat16* __restrict__ logits_bf16) {
  const int row = blockIdx.x, tid = threadIdx.x;
  const float* x = logits + static_cast<int64_t>(row) * vocab;
  Moments acc{-INFINITY, 0.f, 0.f};
  if (vocab % 4 == 0) {
    // Four at a time: one local max, then one merge.
    const float4* x4 = reinterpret_cast<const float4*>(x);
    __nv_bfloat16* keep =
        logits_bf16 ? logits_bf16 + static_cast<int64_t>(row) * vocab : nullptr;
    for (int i = tid; i < vocab / 4; i += SAMPLE_THREADS) {
      const float4 q = x4[i];
      if (keep) {
        Pair<__nv_bfloat16>::store(keep + 4 * i, make_float2(q.x, q.y));
        Pair<__nv_bfloat16>::store(keep + 4 * i + 2, make_float2(q.z, q.w));
      }
      const float a = q.x * inv_temp, b = q.y * inv_temp, c = q.z * inv_temp, d = q.w * inv_temp;
      const float m = fmaxf(fmaxf(a, b), fmaxf(c, d));
      const float ea = expf(a - m), eb = expf(b - m), ec = expf(c - m), ed = expf(d - m);
      acc = merge_moments(acc, Moments{m, ea + eb + ec + ed, ea * a + eb * b + ec * c + ed * d});
    }
  } else {
    for (int i = tid; i < vocab; i += SAMPLE_THREADS) {
      if (logits_bf16) logits_bf16[static_cast<int64_t>(row) * vocab + i] = __float2bfloat16(x[i]);
      const float v = x[i] * inv_temp;
      acc = merge_moments(acc, Moments{v, 1.f, v});
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    acc = merge_moments(acc, Moments{__shfl_xor_sync(0xffffffffu, acc.max, offset),
                                     __shfl_xor_sync(0xffffffffu, acc.sum, offset),
                                     __shfl_xor_sync(0xffffffffu, acc.weighted, offset)});
  }
  __shared__ Moments s_part[32];
  const int warp = tid >> 5, lane = tid & 31;
  if (lane == 0) s_part[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = s_part[lane];
    for (int offset = 16; offset > 0; offset >>= 1) {
      acc = merge_moments(acc, Moments{__shfl_xor_sync(0xffffffffu, acc.max, offset),
                                       __shfl_xor_sync(0xffffffffu, acc.sum, offset),
                                       __shfl_xor_sync(0xffffffffu, acc.weighted, offset)});
    }
    if (lane == 0) {
      const float lse = acc.max + logf(acc.sum);
      lse_out[row] = lse;
      log_prob[row] = x[targets[row]] * inv_temp - lse;
      entropy[row] = lse - acc.weighted / acc.sum;
    }
  }
}

// d logits = g · inv_temp · (onehot(target) − softmax(x)), written in T (the matmul's dtype).
template <typename TIn, typename T>
__global__ void log_prob_backward_kernel(const TIn* __restrict__ logits, int vocab,
                                         const int64_t* __restrict__ targets,
                                         const float* __restrict__ lse,
                                         const float* __restrict__ grad, float inv_temp,
                                         T* __restrict__ out) {
  const int row = blockIdx.x;
  const int64_t base = static_cast<int64_t>(row) * vocab;
  const float g = grad[row] * inv_temp, l = lse[row];
  const int64_t target = targets[row];
  if (vocab % 4 == 0) {
    for (int i = threadIdx.x; i < vocab / 4; i += blockDim.x) {
      const int j = 4 * i;
      const float2 lo = Pair<TIn>::load(logits + base + j), hi = Pair<TIn>::load(logits + base + j + 2);
      const float4 q = make_float4(lo.x, lo.y, hi.x, hi.y);
      const float d0 = g * ((j == target ? 1.f : 0.f) - expf(q.x * inv_temp - l));
      const float d1 = g * ((j + 1 == target ? 1.f : 0.f) - expf(q.y * inv_temp - l));
      const float d2 = g * ((j + 2 == target ? 1.f : 0.f) - expf(q.z * inv_temp - l));
      const float d3 = g * ((j + 3 == target ? 1.f : 0.f) - expf(q.w * inv_temp - l));
      Pair<T>::store(out + base + j, make_float2(d0, d1));
      Pair<T>::store(out + base + j + 2, make_float2(d2, d3));
    }
    return;
  }
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float p = expf(to_float(logits[base + i]) * inv_temp - l);
    out[base + i] = from_float<T>(g * ((i == target ? 1.f : 0.f) - p));
  }
}

struct MaxSum {
  float max, sum;
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return {m, 0.f};
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

struct ArgMax {
  float value;
  int index;
};

__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) {
  // The first index wins ties (PyTorch's argmax); NaN never wins.
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

// One block per row. params is [3, rows]: temperature (1 for greedy), greedy flag (0/1), uniform
// in [0, 1). out is [2, rows] (double): the token, then its log-prob log_softmax(logits / T).
__global__ void sample_kernel(const float* __restrict__ logits, int64_t stride, int vocab,
                              const float* __restrict__ params, int rows,
                              double* __restrict__ out) {
  const int row = blockIdx.x;
  const int tid = threadIdx.x;
  const float* x = logits + row * stride;
  const float temp = params[row];
  const bool greedy = params[rows + row] != 0.f;
  const float u = params[2 * rows + row];

  // Pass 1: max and sum of exponentials (online), and the argmax.
  MaxSum ms{-INFINITY, 0.f};
  ArgMax am{-INFINITY, vocab};
  for (int i = tid; i < vocab; i += SAMPLE_THREADS) {
    const float v = x[i] / temp;
    ms = merge(ms, MaxSum{v, 1.f});
    am = better(am, ArgMax{v, i});
  }
  __shared__ float s_max[32], s_sum[32], s_val[32];
  __shared__ int s_idx[32];
  for (int offset = 16; offset > 0; offset >>= 1) {
    ms = merge(ms, MaxSum{__shfl_xor_sync(0xffffffffu, ms.max, offset),
                          __shfl_xor_sync(0xffffffffu, ms.sum, offset)});
    am = better(am, ArgMax{__shfl_xor_sync(0xffffffffu, am.value, offset),
                           __shfl_xor_sync(0xffffffffu, am.index, offset)});
  }
  const int warp = tid >> 5, lane = tid & 31;
  if (lane == 0) {
    s_max[warp] = ms.max;
    s_sum[warp] = ms.sum;
    s_val[warp] = am.value;
    s_idx[warp] = am.index;
  }
  __syncthreads();
  if (warp == 0) {
    ms = MaxSum{s_max[lane], s_sum[lane]};
    am = ArgMax{s_val[lane], s_idx[lane]};
    for (int offset = 16; offset > 0; offset >>= 1) {
      ms = merge(ms, MaxSum{__shfl_xor_sync(0xffffffffu, ms.max, offset),
                            __shfl_xor_sync(0xffffffffu, ms.sum, offset)});
      am = better(am, ArgMax{__shfl_xor_sync(0xffffffffu, am.value, offset),
                             __shfl_xor_sync(0xffffffffu, am.index, offset)});
    }
    if (lane == 0) {
      s_max[0] = ms.max;
      s_sum[0] = ms.sum;
      s_idx[0] = min(am.index, vocab - 1);
    }
  }
  __syncthreads();
  const float max = s_max[0];
  const float log_total = logf(s_sum[0]);
  __shared__ int s_token;
  if (greedy) {
    if (tid == 0) s_token = s_idx[0];
  } else {
    // Pass 2: inverse CDF in vocabulary order. Thread t sums its contiguous segment; a scan of the
    // segment sums finds the segment holding u · total; that thread walks it to the token. The
    // arithmetic per row is fixed, so a row's token does not depend on its neighbours.
    const int segment = (vocab + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int begin = min(tid * segment, vocab), end = min(begin + segment, vocab);
    float part = 0.f;
    for (int i = begin; i < end; ++i) part += expf(x[i] / temp - max);
    __shared__ float s_prefix[SAMPLE_THREADS + 1];
    // Inclusive scan within the warp, then across warp totals.
    float incl = part;
    for (int offset = 1; offset < 32; offset <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, incl, offset);
      if (lane >= offset) incl += y;
    }
    __shared__ float s_warp[32];
    if (lane == 31) s_warp[warp] = incl;
    __syncthreads();
    if (warp == 0) {
      float w = s_warp[lane];
      for (int offset = 1; offset < 32; offset <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, w, offset);
        if (lane >= offset) w += y;
      }
      s_warp[lane] = w;  // inclusive totals of warps 0..lane
    }
    __syncthreads();
    const float before_warp = warp == 0 ? 0.f : s_warp[warp - 1];
    s_prefix[tid] = before_warp + incl - part;  // exclusive prefix of this segment
    if (tid == SAMPLE_THREADS - 1) s_prefix[SAMPLE_THREADS] = before_warp + incl;
    if (tid == 0) s_token = -1;
    __syncthreads();
    const float target = u * s_prefix[SAMPLE_THREADS];
    if (begin < end && s_prefix[tid] <= target && target < s_prefix[tid + 1]) {
      float acc = s_prefix[tid];
      int pick = -1;
      for (int i = begin; i < end; ++i) {
        const float p = expf(x[i] / temp - max);
        if (p > 0.f) pick = i;
        acc += p;
        if (acc > target) break;
      }
      if (pick >= 0) s_token = pick;
    }
    __syncthreads();
    // Rounding left no segment owning the target (u·total at the very end): the last token with
    // any mass, as PyTorch's clamped searchsorted would give.
    if (s_token < 0 && tid == 0) {
      int pick = s_idx[0];
      for (int i = vocab - 1; i >= 0; --i) {
        if (expf(x[i] / temp - max) > 0.f) {
          pick = i;
          break;
        }
      }
      s_token = pick;
    }
  }
  __syncthreads();
  if (tid == 0) {
    const int token = s_token;
    out[row] = static_cast<double>(token);
    out[rows + row] = static_cast<double>(x[token] / temp - max - log_total);
  }
}

// Blocks for a grid-stride loop over `total` items: enough to cover them, at most 65536.
int grid_stride_blocks(int64_t total, int threads) {
  const int64_t wanted = (total + threads - 1) / threads;
  return static_cast<int>(wanted < 65536 ? (wanted > 0 ? wanted : 1) : 65536);
}

}  // namespace

extern "C" {

int ooze_launch_rope_store(int bf16, const void* qkv, int64_t qkv_stride, const int64_t* cells,
                           const void* cos, const void* signed_sin, const void* q_norm,
                           const void* k_norm, float eps, void* q_out, void* k_cache,
                           void* v_cache, int rows, int heads, int kv_heads, int dim,
                           cudaStream_t stream) {
  const int warps = rows * (heads + 2 * kv_heads);
  const int threads = 128;
  const int blocks = (warps * 32 + threads - 1) / threads;
  if (q_norm != nullptr) {
    if (bf16) {
      using T = __nv_bfloat16;
      rope_norm_store_kernel<T><<<blocks, threads, 0, stream>>>(
          static_cast<const T*>(qkv), qkv_stride, cells, static_cast<const T*>(cos),
          static_cast<const T*>(signed_sin), static_cast<const T*>(q_norm),
          static_cast<const T*>(k_norm), eps, static_cast<T*>(q_out), static_cast<T*>(k_cache),
          static_cast<T*>(v_cache), rows, heads, kv_heads, dim);
    } else {
      rope_norm_store_kernel<float><<<blocks, threads, 0, stream>>>(
          static_cast<const float*>(qkv), qkv_stride, cells, static_cast<const float*>(cos),
          static_cast<const float*>(signed_sin), static_cast<const float*>(q_norm),
          static_cast<const float*>(k_norm), eps, static_cast<float*>(q_out),
          static_cast<float*>(k_cache), static_cast<float*>(v_cache), rows, heads, kv_heads, dim);
    }
    return static_cast<int>(cudaGetLastError());
  }
  if (bf16) {
    using T = __nv_bfloat16;
    rope_store_kernel<T><<<blocks, threads, 0, stream>>>(
        static_cast<const T*>(qkv), qkv_stride, cells, static_cast<const T*>(cos),
        static_cast<const T*>(signed_sin), static_cast<T*>(q_out),
        static_cast<T*>(k_cache), static_cast<T*>(v_cache), rows, heads, kv_heads, dim);
  } else {
    rope_store_kernel<float><<<blocks, threads, 0, stream>>>(
        static_cast<const float*>(qkv), qkv_stride, cells, static_cast<const float*>(cos),
        static_cast<const float*>(signed_sin), static_cast<float*>(q_out), static_cast<float*>(k_cache), static_cast<float*>(v_cache),
        rows, heads, kv_heads, dim);
  }
  return static_cast<int>(cudaGetLastError());
}

int ooze_launch_silu_mul(int bf16, const void* gate_up, void* out, int64_t rows, int64_t width,
                         cudaStream_t stream) {
  if (width % 2 == 0 && rows <= 65535) {
    const dim3 grid(static_cast<unsigned>((width / 2 + 255) / 256), static_cast<unsigned>(rows));
    if (bf16) {
      using T = __nv_bfloat16;
      silu_mul_pairs_kernel<T><<<grid, 256, 0, stream>>>(static_cast<const T*>(gate_up),
                                                         static_cast<T*>(out), width);
    } else {
      silu_mul_pairs_kernel<float><<<grid, 256, 0, stream>>>(static_cast<const float*>(gate_up),
                                                             static_cast<float*>(out), width);
    }
    return static_cast<int>(cudaGetLastError());
  }
  const int threads = 256;
  const int blocks = grid_stride_blocks(rows * width, threads);
  if (bf16) {
    silu_mul_kernel<__nv_bfloat16><<<blocks, threads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(gate_up), static_cast<__nv_bfloat16*>(out), rows, width);
  } else {
    silu_mul_kernel<float><<<blocks, threads, 0, stream>>>(static_cast<const float*>(gate_up),
                                                           static_cast<float*>(out), rows, width);
  }
  return static_cast<int>(cudaGetLastError());
}

int ooze_launch_silu_mul_backward(int bf16, const void* gate_up, const void* grad, void* out,
                                  int64_t rows, int64_t width, cudaStream_t stream) {
  if (width % 2 == 0 && rows <= 65535) {
    const dim3 grid(static_cast<unsigned>((width / 2 + 255) / 256), static_cast<unsigned>(rows));
    if (bf16) {
      using T = __nv_bfloat16;
      silu_mul_backward_pairs_kernel<T><<<grid, 256, 0, stream>>>(
          static_cast<const T*>(gate_up), static_cast<const T*>(grad), static_cast<T*>(out), width);
    } else {
      silu_mul_backward_pairs_kernel<float><<<grid, 256, 0, stream>>>(
          static_cast<const float*>(gate_up), static_cast<const float*>(grad),
          static_cast<float*>(out), width);
    }
    return static_cast<int>(cudaGetLastError());
  }
  const int threads = 256;
  const int blocks = grid_stride_blocks(rows * width, threads);
  if (bf16) {
    using T = __nv_bfloat16;
    silu_mul_backward_kernel<T><<<blocks, threads, 0, stream>>>(
        static_cast<const T*>(gate_up), static_cast<const T*>(grad), static_cast<T*>(out), rows,
        width);
  } else {
    silu_mul_backward_kernel<float><<<blocks, threads, 0, stream>>>(
        static_cast<const float*>(gate_up), static_cast<const float*>(grad),
        static_cast<float*>(out), rows, width);
  }
  return static_cast<int>(cudaGetLastError());
}

int ooze_launch_rope(int bf16, const void* x, int64_t stride, const void* cos,
                     const void* signed_sin, void* out, int64_t out_stride, int64_t tokens,
                     int heads, int dim, float sign, cudaStream_t stream) {
  const int threads = 256;
  const int blocks = grid_stride_blocks(tokens * heads * (dim / 2), threads);
  if (bf16) {
    using T = __nv_bfloat16;
    rope_kernel<T><<<blocks, threads, 0, stream>>>(
        static_cast<const T*>(x), stride, static_cast<const T*>(cos),
        static_cast<const T*>(signed_sin), static_cast<T*>(out), out_stride, tokens, heads, dim,
        sign);
  } else {
    rope_kernel<float><<<blocks, threads, 0, stream>>>(
        static_cast<const float*>(x), stride, static_cast<const float*>(cos),
        static_cast<const float*>(signed_sin), static_cast<float*>(out), out_stride, tokens, heads,
        dim, sign);
  }
  return static_cast<int>(cudaGetLastError());
}

int ooze_launch_log_prob_forward(const float* logits, int rows, int vocab,
                                 const int64_t* targets, float inv_temp, float* log_prob,
                                 float* lse, float* entropy, void* logits_bf16,
                                 cudaStream_t stream) {
  log_prob_forward_kernel<<<rows, SAMPLE_THREADS, 0, stream>>>(
      logits, vocab, targets, inv_temp, log_prob, lse, entropy,
      static_cast<__nv_bfloat16*>(logits_bf16));
  return static_cast<int>(cudaGetLastError());
}

int ooze_launch_log_prob_backward(int bf16, const void* logits, int logits_bf16, int rows,
                                  int vocab, const int64_t* targets, const float* lse,
                                  const float* grad, float inv_temp, void* out,
                                  cudaStream_t stream) {
  using B = __nv_bfloat16;
  if (logits_bf16) {
    log_prob_backward_kernel<B, B><<<rows, 1024, 0, stream>>>(
        static_cast<const B*>(logits), vocab, targets, lse, grad, inv_temp, static_cast<B*>(out));
  } else if (bf16) {
    log_prob_backward_kernel<float, B><<<rows, 1024, 0, stream>>>(
        static_cast<const float*>(logits), vocab, targets, lse, grad, inv_temp,
        static_cast<B*>(out));
  } else {
    log_prob_backward_kernel<float, float><<<rows, 1024, 0, stream>>>(
        static_cast<const float*>(logits), vocab, targets, lse, grad, inv_temp,
        static_cast<float*>(out));
  }
  return static_cast<int>(cudaGetLastError());
}

int ooze_launch_sample(const float* logits, int64_t stride, int vocab, const float* params,
                       int rows, double* out, cudaStream_t stream) {
  sample_kernel<<<rows, SAMPLE_THREADS, 0, stream>>>(logits, stride, vocab, params, rows, out);
  return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
