// ooze's CUDA kernels: the small fused steps of a decode step that libtorch runs as many separate
// kernels. Plain C launchers over raw pointers (no libtorch headers here: nvcc stays fast); the
// checked, tensor-level entry points are in ops.cpp. Every launcher returns the launch error.
//
// - rope_store: rotary embedding of q and k (with Qwen3's per-head q/k RMSNorm when given), the
//   rotated q written out, k and v written into their cell (block · block size + offset) of the
//   paged KV memory.
// - silu_mul: silu(gate) * up of the fused gate/up projection.
// - sample: per row, the log-softmax statistics, then the greedy or inverse-CDF token and its
//   log-prob, in one block per row (no full-vocabulary intermediate tensors).
// - split_attention: attention split along the keys at fixed positions (flash-decoding), the
//   query heads that share a key head through tensor cores together, a second kernel merging the
//   splits. Decode (one query token per row, keys through its block table), the paged prefill and
//   the trainer's forward share it, so their outputs agree bitwise.

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <stdint.h>

namespace {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}

// Rounds to T and back: the value an op of PyTorch would have stored in between.
template <typename T>
__device__ __forceinline__ float stored(float x) {
  return to_float(from_float<T>(x));
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// (x1, x2) rotated by the angle of cosine c and sine s: (x1·c − x2·s, x2·c + x1·s), every
// product and sum rounded as written (no fused multiply-add), so each kernel that rotates gets the
// same bits.
__device__ __forceinline__ void rotate(float x1, float x2, float c, float s, float& y1, float& y2) {
  y1 = __fadd_rn(__fmul_rn(x1, c), -__fmul_rn(x2, s));
  y2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

// One warp per (row, head) over the q, k and v heads of a fused projection row. Lane l handles the
// rotation pairs (i, i + D/2) for i = l, l + 32, … (D ≤ 256). The rotation reads the same cos/sin
// tables as rope_kernel and rotates with the same arithmetic, so decode and training agree.
template <typename T>
__global__ void rope_store_kernel(const T* __restrict__ qkv, int64_t qkv_stride,
                                  const int64_t* __restrict__ cells, const T* __restrict__ cos,
                                  const T* __restrict__ signed_sin, const T* __restrict__ q_norm,
                                  const T* __restrict__ k_norm, float eps, T* __restrict__ q_out,
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
  float squares = 0.f;
  int n = 0;
  for (int i = lane; i < half; i += 32, ++n) {
    x1[n] = to_float(src[i]);
    x2[n] = to_float(src[i + half]);
    squares += x1[n] * x1[n] + x2[n] * x2[n];
  }
  const T* norm = head < heads ? q_norm : k_norm;
  if (norm != nullptr) {
    // transformers' RMSNorm: normalise in fp32, round, then scale by the weight and round.
    const float r = rsqrtf(warp_sum(squares) / dim + eps);
    n = 0;
    for (int i = lane; i < half; i += 32, ++n) {
      x1[n] = stored<T>(stored<T>(x1[n] * r) * to_float(norm[i]));
      x2[n] = stored<T>(stored<T>(x2[n] * r) * to_float(norm[i + half]));
    }
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

// Split-key attention, bf16: decode (one query token per row), the engine's paged prefill and
// the trainer's forward all run this one kernel, so a (query token, head) gets bitwise the same
// output whichever of them computes it and whatever else is in its batch.
//
// Keys are split into chunks [s·CHUNK, +CHUNK) at fixed positions. Block (split, kv head, tile):
// a tile is up to 16 / G consecutive query tokens of one sequence × the G query heads of one key
// head (rows token·G + g of a 16-row tensor-core tile, padded). Pass A: scores S = Q·Kᵀ into
// shared memory (each warp a 16-key tile at a time). Softmax over the chunk per row (max, exp,
// sum; keys after the row's own token masked), P rounded to bf16. Pass B: O = P·V (each warp 16
// output columns). The partial O (unnormalised), max and sum go out per split; a second kernel
// merges the splits in order. A row's arithmetic never depends on the other rows of its tile:
// tensor-core products are per row, and the keys a row masks add exact zeros.
constexpr int ATT_CHUNK = 256;
constexpr int ATT_WARPS = 4;
constexpr int ATT_PAD = 8;  // keeps shared-memory rows off the same banks, multiple of 8 (wmma)

// Where the keys and values of a sequence live. Paged (block_size > 0): position p of sequence s
// is cell table[s · width + p / block_size] · block_size + p % block_size. Contiguous
// (block_size == 0): row table[s] + p.
struct KeyMap {
  const int64_t* table;
  int width;
  int64_t block_size;
  __device__ __forceinline__ int64_t cell(int seq, int64_t p) const {
    if (block_size == 0) return table[seq] + p;
    return table[static_cast<int64_t>(seq) * width + p / block_size] * block_size + p % block_size;
  }
};

// A tile's tokens: `tiles` is int32 [tiles, 3] (first token, token count, sequence), or null for
// decode (tile i is token i alone, of sequence i).
struct TileOf {
  int first, count, seq;
  __device__ __forceinline__ TileOf(const int* tiles, int tile) {
    if (tiles == nullptr) {
      first = tile, count = 1, seq = tile;
    } else {
      first = tiles[3 * tile], count = tiles[3 * tile + 1], seq = tiles[3 * tile + 2];
    }
  }
};

struct AttentionArgs {
  const __nv_bfloat16* q;  // [tokens, ·] rows of q_stride elements, heads · D at the start
  const __nv_bfloat16* k;  // key rows of k_stride elements, kv_heads · D at the start
  const __nv_bfloat16* v;
  int64_t q_stride, k_stride, v_stride;
  KeyMap keys;
  const int* tiles;
  const int64_t* positions;  // [tokens]: a token sees the keys of positions ≤ its own
  int heads, kv_heads, splits;
  float scale;
  float* part_o;   // [tiles, kv_heads, splits, 16, D]
  float* part_ml;  // [tiles, kv_heads, splits, 16, 2]
};

template <int D>
__global__ void __launch_bounds__(ATT_WARPS * 32) split_attention_kernel(AttentionArgs a) {
  using namespace nvcuda;
  const int split = blockIdx.x, kv = blockIdx.y, tile_index = blockIdx.z;
  const TileOf tile(a.tiles, tile_index);
  const int group = a.heads / a.kv_heads;
  const int rows = tile.count * group;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t first = static_cast<int64_t>(split) * ATT_CHUNK;
  // The tile's last token sees the most keys.
  const int64_t n_keys = a.positions[tile.first + tile.count - 1] + 1;
  const int valid = static_cast<int>(n_keys - first < ATT_CHUNK ? n_keys - first : ATT_CHUNK);
  const int64_t part = (static_cast<int64_t>(tile_index) * a.kv_heads + kv) * a.splits + split;
  float* out_o = a.part_o + part * 16 * D;
  float* out_ml = a.part_ml + part * 16 * 2;
  if (valid <= 0) {
    for (int r = tid; r < 16; r += blockDim.x) {
      out_ml[2 * r] = -INFINITY;
      out_ml[2 * r + 1] = 0.f;
    }
    return;
  }
  __shared__ __align__(32) __nv_bfloat16 s_q[16][D + ATT_PAD];
  __shared__ __align__(32) float s_s[16][ATT_CHUNK + ATT_PAD];
  __shared__ __align__(32) __nv_bfloat16 s_p[16][ATT_CHUNK + ATT_PAD];
  // Where each 16-key tile of the chunk starts (keys [first + 16t, +16) are one run of memory:
  // block sizes are multiples of 16), looked up once, up front.
  __shared__ int64_t s_cell[ATT_CHUNK / 16];
  for (int i = tid; i < 16 * D; i += blockDim.x) {
    const int r = i / D, d = i % D;
    s_q[r][d] = r < rows ? a.q[static_cast<int64_t>(tile.first + r / group) * a.q_stride +
                               (kv * group + r % group) * D + d]
                         : __float2bfloat16(0.f);
  }
  const int key_tiles = (valid + 15) / 16;
  for (int t = tid; t < key_tiles; t += blockDim.x) {
    s_cell[t] = a.keys.cell(tile.seq, first + static_cast<int64_t>(t) * 16);
  }
  __syncthreads();
  for (int t = warp; t < key_tiles; t += ATT_WARPS) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.f);
    const __nv_bfloat16* k = a.k + s_cell[t] * a.k_stride + static_cast<int64_t>(kv) * D;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> qa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> kb;
      wmma::load_matrix_sync(qa, &s_q[0][kk * 16], D + ATT_PAD);
      wmma::load_matrix_sync(kb, k + kk * 16, static_cast<unsigned>(a.k_stride));
      wmma::mma_sync(acc, qa, kb, acc);
    }
    wmma::store_matrix_sync(&s_s[0][t * 16], acc, ATT_CHUNK + ATT_PAD, wmma::mem_row_major);
  }
  __syncthreads();
  // Softmax over the chunk, one warp per row; a row sees keys up to its own token's position.
  __shared__ float s_max[16], s_sum[16];
  for (int r = warp; r < 16; r += ATT_WARPS) {
    const int64_t own = r < rows ? a.positions[tile.first + r / group] + 1 - first : 0;
    const int row_valid = static_cast<int>(own < ATT_CHUNK ? own : ATT_CHUNK);
    if (row_valid <= 0) {
      for (int j = lane; j < key_tiles * 16; j += 32) s_p[r][j] = __float2bfloat16(0.f);
      if (lane == 0) {
        s_max[r] = -INFINITY;
        s_sum[r] = 0.f;
      }
      continue;
    }
    float m = -INFINITY;
    for (int j = lane; j < row_valid; j += 32) m = fmaxf(m, s_s[r][j] * a.scale);
    for (int offset = 16; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    float l = 0.f;
    for (int j = lane; j < key_tiles * 16; j += 32) {
      const float p = j < row_valid ? __expf(s_s[r][j] * a.scale - m) : 0.f;
      l += p;
      s_p[r][j] = __float2bfloat16(p);
    }
    l = warp_sum(l);
    if (lane == 0) {
      s_max[r] = m;
      s_sum[r] = l;
    }
  }
  __syncthreads();
  // O = P·V, each warp 16 output columns at a time.
  for (int n = warp; n < D / 16; n += ATT_WARPS) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.f);
    for (int t = 0; t < key_tiles; ++t) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> pa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> vb;
      wmma::load_matrix_sync(pa, &s_p[0][t * 16], ATT_CHUNK + ATT_PAD);
      wmma::load_matrix_sync(vb, a.v + s_cell[t] * a.v_stride + static_cast<int64_t>(kv) * D + n * 16,
                             static_cast<unsigned>(a.v_stride));
      wmma::mma_sync(acc, pa, vb, acc);
    }
    wmma::store_matrix_sync(out_o + n * 16, acc, D, wmma::mem_row_major);
  }
  for (int r = tid; r < 16; r += blockDim.x) {
    out_ml[2 * r] = r < rows ? s_max[r] : -INFINITY;
    out_ml[2 * r + 1] = r < rows ? s_sum[r] : 0.f;
  }
}

// Merges the splits of each (token, head) in order: out = Σ_s e^{m_s − m} O_s / Σ_s e^{m_s − m}
// l_s. Block (head, tile), a thread per output column. With `lse` ([heads, tokens] fp32), also
// the log-sum-exp of the scaled scores, m + log Σ_s e^{m_s − m} l_s.
template <int D>
__global__ void split_attention_merge(const float* __restrict__ part_o,
                                      const float* __restrict__ part_ml, const int* tiles,
                                      int tokens, int heads, int kv_heads, int splits,
                                      __nv_bfloat16* __restrict__ out, int64_t out_stride,
                                      float* __restrict__ lse) {
  const int head = blockIdx.x, d = threadIdx.x;
  const TileOf tile(tiles, blockIdx.y);
  const int group = heads / kv_heads;
  const int kv = head / group, g = head % group;
  const int64_t first = (static_cast<int64_t>(blockIdx.y) * kv_heads + kv) * splits;
  for (int token = 0; token < tile.count; ++token) {
    const int r = token * group + g;
    float m = -INFINITY;
    for (int s = 0; s < splits; ++s) m = fmaxf(m, part_ml[((first + s) * 16 + r) * 2]);
    float num = 0.f, den = 0.f;
    for (int s = 0; s < splits; ++s) {
      const float ms = part_ml[((first + s) * 16 + r) * 2];
      if (ms == -INFINITY) continue;
      const float w = __expf(ms - m);
      den += w * part_ml[((first + s) * 16 + r) * 2 + 1];
      num += w * part_o[((first + s) * 16 + r) * D + d];
    }
    const int64_t at = tile.first + token;
    out[at * out_stride + static_cast<int64_t>(head) * D + d] = __float2bfloat16(num / den);
    if (lse != nullptr && d == 0) lse[static_cast<int64_t>(head) * tokens + at] = m + logf(den);
  }
}

template <int D>
int launch_split_attention(const AttentionArgs& args, int tiles, int tokens, void* out,
                           int64_t out_stride, float* lse, cudaStream_t stream) {
  split_attention_kernel<D><<<dim3(args.splits, args.kv_heads, tiles), ATT_WARPS * 32, 0, stream>>>(
      args);
  split_attention_merge<D><<<dim3(args.heads, tiles), D, 0, stream>>>(
      args.part_o, args.part_ml, args.tiles, tokens, args.heads, args.kv_heads, args.splits,
      static_cast<__nv_bfloat16*>(out), out_stride, lse);
  return static_cast<int>(cudaGetLastError());
}

// Blocks for a grid-stride loop over `total` items: enough to cover them, at most 65536.
int grid_stride_blocks(int64_t total, int threads) {
  const int64_t wanted = (total + threads - 1) / threads;
  return static_cast<int>(wanted < 65536 ? (wanted > 0 ? wanted : 1) : 65536);
}

}  // namespace

extern "C" {

int ooze_attention_splits(int read_len) { return (read_len + ATT_CHUNK - 1) / ATT_CHUNK; }

// See split_attention_kernel. q/k/v_stride: elements between consecutive tokens' (keys')
// rows. table/width/block_size: KeyMap. tiles: int32 [tiles, 3] or null (decode: tile i is token
// i of sequence i). out [tokens, ·] rows of out_stride elements; lse [heads, tokens] or null.
int ooze_launch_split_attention(const void* q, int64_t q_stride, const void* k, int64_t k_stride,
                                const void* v, int64_t v_stride, const int64_t* table, int width,
                                int64_t block_size, const int* tiles, int n_tiles, int tokens,
                                const int64_t* positions, int heads, int kv_heads, int dim,
                                int splits, float scale, float* part_o, float* part_ml, void* out,
                                int64_t out_stride, float* lse, cudaStream_t stream) {
  AttentionArgs args{static_cast<const __nv_bfloat16*>(q),
                     static_cast<const __nv_bfloat16*>(k),
                     static_cast<const __nv_bfloat16*>(v),
                     q_stride,
                     k_stride,
                     v_stride,
                     KeyMap{table, width, block_size},
                     tiles,
                     positions,
                     heads,
                     kv_heads,
                     splits,
                     scale,
                     part_o,
                     part_ml};
  if (dim == 64) return launch_split_attention<64>(args, n_tiles, tokens, out, out_stride, lse, stream);
  if (dim == 128) return launch_split_attention<128>(args, n_tiles, tokens, out, out_stride, lse, stream);
  return static_cast<int>(cudaErrorInvalidValue);
}

int ooze_launch_rope_store(int bf16, const void* qkv, int64_t qkv_stride, const int64_t* cells,
                           const void* cos, const void* signed_sin, const void* q_norm,
                           const void* k_norm, float eps, void* q_out, void* k_cache,
                           void* v_cache, int rows, int heads, int kv_heads, int dim,
                           cudaStream_t stream) {
  const int warps = rows * (heads + 2 * kv_heads);
  const int threads = 128;
  const int blocks = (warps * 32 + threads - 1) / threads;
  if (bf16) {
    using T = __nv_bfloat16;
    rope_store_kernel<T><<<blocks, threads, 0, stream>>>(
        static_cast<const T*>(qkv), qkv_stride, cells, static_cast<const T*>(cos),
        static_cast<const T*>(signed_sin), static_cast<const T*>(q_norm), static_cast<const T*>(k_norm), eps, static_cast<T*>(q_out),
        static_cast<T*>(k_cache), static_cast<T*>(v_cache), rows, heads, kv_heads, dim);
  } else {
    rope_store_kernel<float><<<blocks, threads, 0, stream>>>(
        static_cast<const float*>(qkv), qkv_stride, cells, static_cast<const float*>(cos),
        static_cast<const float*>(signed_sin), static_cast<const float*>(q_norm), static_cast<const float*>(k_norm), eps,
        static_cast<float*>(q_out), static_cast<float*>(k_cache), static_cast<float*>(v_cache),
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
