// ooze's CUDA kernels: the small fused steps of a decode step that libtorch runs as many separate
// kernels. Plain C launchers over raw pointers (no libtorch headers here: nvcc stays fast); the
// checked, tensor-level entry points are in ops.cpp. Every launcher returns the launch error.
//
// - rope_store: rotary embedding of q and k (after Qwen3's per-head q/k RMSNorm when given), the
//   rotated q written out, k and v written into their cell (block · block size + offset) of the
//   paged KV memory.
// - silu_mul: silu(gate) * up of the fused gate/up projection.
// - rope and silu_mul's backward kernels, for training.
// Elementwise kernels over bf16 rows whose widths allow it read and write eight elements at a time
// (16-byte accesses): the arithmetic is the narrower kernels', so either gives the same bits.
// Attention is in attention.cu and fa_order_attention.cu, the residual add with its RMSNorm in
// rms_norm.cu, sampling and the LM head's log-probs in sample.cu.

#include "rms_norm.cuh"

namespace {

// The (row, head) a rope_store warp works on, over the q, k and v heads of the fused projection's
// rows, its source and its KV cell (block · block size + offset, times kv_heads).
template <typename T>
struct HeadSlot {
  int row, head;
  int64_t cell;
  const T* src;  // null when nothing is left for the warp
};

// This warp's HeadSlot. A v head is copied into its cell here (and gets a null source, as does a
// warp past the end). Null `cells`: row r's cell is r (k and v written as [rows, kv_heads, dim]).
template <typename T>
__device__ __forceinline__ HeadSlot<T> rope_store_head(const T* __restrict__ qkv,
                                                       int64_t qkv_stride,
                                                       const int64_t* __restrict__ cells,
                                                       T* __restrict__ v_cache, int rows,
                                                       int heads, int kv_heads, int dim) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int per_row = heads + 2 * kv_heads;
  if (warp >= rows * per_row) return {0, 0, 0, nullptr};
  const int row = warp / per_row, head = warp % per_row;
  const T* src = qkv + row * qkv_stride + head * dim;
  const int64_t cell = (cells != nullptr ? cells[row] : row) * kv_heads;
  if (head >= heads + kv_heads) {
    T* dst = v_cache + (cell + head - heads - kv_heads) * dim;
    for (int i = lane; i < dim; i += 32) dst[i] = src[i];
    return {row, head, cell, nullptr};
  }
  return {row, head, cell, src};
}

// One warp per (row, head) over the q, k and v heads of a fused projection row. Lane l handles the
// rotation pairs (i, i + D/2) for i = l, l + 32, … (D ≤ 256). The rotation reads the same cos/sin
// tables as rope_kernel and rotates with the same arithmetic, so decode and training agree.
template <typename T>
__global__ void rope_store_kernel(const T* __restrict__ qkv, int64_t qkv_stride,
                                  const int64_t* __restrict__ cells, const T* __restrict__ cos,
                                  const T* __restrict__ signed_sin, T* __restrict__ q_out,
                                  T* __restrict__ k_cache, T* __restrict__ v_cache, int rows,
                                  int heads, int kv_heads, int dim) {
  const int lane = threadIdx.x & 31;
  const auto [row, head, cell, src] =
      rope_store_head(qkv, qkv_stride, cells, v_cache, rows, heads, kv_heads, dim);
  if (src == nullptr) return;
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
  const int lane = threadIdx.x & 31;
  const auto [row, head, cell, src] =
      rope_store_head(qkv, qkv_stride, cells, v_cache, rows, heads, kv_heads, dim);
  if (src == nullptr) return;
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

// Calls f(row, col) for every eight columns col of `rows` rows of `width` (a multiple of 8), one
// call per thread of a grid-stride loop.
template <typename F>
__device__ __forceinline__ void for_each_octet(int64_t rows, int64_t width, F f) {
  const int64_t per_row = width / 8, total = rows * per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / per_row;
    f(row, (i - row * per_row) * 8);
  }
}

// silu_mul_pairs_kernel's arithmetic over eight columns per thread (bf16, width a multiple of 8,
// 16-byte aligned rows): 16-byte loads and stores keep more bytes in flight per thread.
__global__ void silu_mul_octets_kernel(const __nv_bfloat16* __restrict__ gate_up,
                                       __nv_bfloat16* __restrict__ out, int64_t rows,
                                       int64_t width) {
  using T = __nv_bfloat16;
  for_each_octet(rows, width, [&](int64_t row, int64_t col) {
    const T* in = gate_up + row * 2 * width;
    float g[8], u[8], o[8];
    load8(in + col, g);
    load8(in + width + col, u);
#pragma unroll
    for (int k = 0; k < 8; ++k) o[k] = stored<T>(g[k] / (1.f + expf(-g[k]))) * u[k];
    store8(out + row * width + col, o);
  });
}

// silu_mul_backward_pairs_kernel's arithmetic over eight columns per thread (as above).
__global__ void silu_mul_backward_octets_kernel(const __nv_bfloat16* __restrict__ gate_up,
                                                const __nv_bfloat16* __restrict__ grad,
                                                __nv_bfloat16* __restrict__ out, int64_t rows,
                                                int64_t width) {
  using T = __nv_bfloat16;
  for_each_octet(rows, width, [&](int64_t row, int64_t col) {
    const T* in = gate_up + row * 2 * width;
    float x[8], u[8], g[8], d_gate[8], d_up[8];
    load8(in + col, x);
    load8(in + width + col, u);
    load8(grad + row * width + col, g);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float s = 1.f / (1.f + expf(-x[k]));
      d_gate[k] = g[k] * u[k] * s * (1.f + x[k] * (1.f - s));
      d_up[k] = g[k] * x[k] * s;
    }
    T* o = out + row * 2 * width;
    store8(o + col, d_gate);
    store8(o + width + col, d_up);
  });
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

// rope_kernel over eight rotation pairs per thread (bf16; half the head size, both row strides
// and the cos/sin rows multiples of 8; 16-byte aligned pointers): the same arithmetic with
// 16-byte loads and stores.
__global__ void rope_octets_kernel(const __nv_bfloat16* __restrict__ x, int64_t stride,
                                   const __nv_bfloat16* __restrict__ cos,
                                   const __nv_bfloat16* __restrict__ signed_sin,
                                   __nv_bfloat16* __restrict__ out, int64_t out_stride,
                                   int64_t tokens, int heads, int dim, float sign) {
  const int half = dim / 2, per_head = half / 8;
  const int64_t total = tokens * heads * per_head;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t token = i / (heads * per_head);
    const int rest = static_cast<int>(i - token * heads * per_head);
    const int head = rest / per_head, j = (rest % per_head) * 8;
    const __nv_bfloat16* src = x + token * stride + head * dim;
    float x1[8], x2[8], c[8], sn[8], y1[8], y2[8];
    load8(src + j, x1);
    load8(src + j + half, x2);
    load8(cos + token * dim + j, c);
    load8(signed_sin + token * dim + j + half, sn);
#pragma unroll
    for (int k = 0; k < 8; ++k) rotate(x1[k], x2[k], c[k], sign * sn[k], y1[k], y2[k]);
    __nv_bfloat16* dst = out + token * out_stride + head * dim;
    store8(dst + j, y1);
    store8(dst + j + half, y2);
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
  if (bf16 && width % 8 == 0 && aligned16(gate_up) && aligned16(out)) {
    const int threads = 256;
    silu_mul_octets_kernel<<<grid_stride_blocks(rows * width / 8, threads), threads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(gate_up), static_cast<__nv_bfloat16*>(out), rows,
        width);
    return static_cast<int>(cudaGetLastError());
  }
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
  if (bf16 && width % 8 == 0 && aligned16(gate_up) && aligned16(grad) && aligned16(out)) {
    const int threads = 256;
    silu_mul_backward_octets_kernel<<<grid_stride_blocks(rows * width / 8, threads), threads, 0,
                                      stream>>>(static_cast<const __nv_bfloat16*>(gate_up),
                                                static_cast<const __nv_bfloat16*>(grad),
                                                static_cast<__nv_bfloat16*>(out), rows, width);
    return static_cast<int>(cudaGetLastError());
  }
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
  if (bf16 && (dim / 2) % 8 == 0 && stride % 8 == 0 && out_stride % 8 == 0 && aligned16(x) &&
      aligned16(cos) && aligned16(signed_sin) && aligned16(out)) {
    using T = __nv_bfloat16;
    rope_octets_kernel<<<grid_stride_blocks(tokens * heads * (dim / 16), threads), threads, 0,
                         stream>>>(static_cast<const T*>(x), stride, static_cast<const T*>(cos),
                                   static_cast<const T*>(signed_sin), static_cast<T*>(out),
                                   out_stride, tokens, heads, dim, sign);
    return static_cast<int>(cudaGetLastError());
  }
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

}  // extern "C"
