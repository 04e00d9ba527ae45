// The residual add and the RMSNorm after it in one kernel: sum = x + delta (rounded to the stored
// type, as ATen's add rounds it), then the RMSNorm of sum in ATen's arithmetic (rms_norm.cuh).
// A decode step runs it twice a block instead of an add and a norm. Bits equal ATen's add
// followed by at::rms_norm (the trainer's forward).
//
// And RMSNorm's backward for training: the input's gradient and per-block partial sums of the
// weight's in one pass over the rows, then the partials summed in a fixed order (no atomics).

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

// y = x·r·w with r = rsqrt(mean(x²) + eps) per row. For each row, with q = w·g:
//   dx = r·q − x·r³·(Σ q·x)/n (+ the gradient that reaches x by the residual stream, when
//   `residual_grad` is given), and dw = Σ over rows of g·x·r.
// `rstd` gives r per row (ATen's forward saves it); null: r is recomputed from x in fp32.
// One thread per eight columns (n a multiple of 8, at most 8192), `rows_per_block` rows per block,
// taken R at a time: their loads are in flight together (one row at a time leaves HBM waiting on
// each row's reductions), and each row's arithmetic is what it would be alone, so R does not
// change a bit. Each block writes its rows' share of dw, summed in row order, to partial[block]
// in fp32. R = 2 needs ~120 registers a thread (128 threads at most, as Qwen2.5-0.5B's 896
// columns take): 54 µs instead of 73 for its 16,384 × 896 rows on an H200; wider rows and R = 4
// were slower (docs/benchmarks.md). R = 1 is held to 64 registers, so that 8,192 columns (1,024
// threads) fit a multiprocessor's registers (71 unbounded: that launch failed).
template <int R>
__global__ void __launch_bounds__(R == 1 ? 1024 : 128, 1)
    rms_norm_backward_kernel(const __nv_bfloat16* __restrict__ x,
                             const __nv_bfloat16* __restrict__ grad,
                             const __nv_bfloat16* __restrict__ residual_grad,
                             const __nv_bfloat16* __restrict__ weight,
                             const float* __restrict__ rstd, float eps, int64_t rows, int n,
                             int rows_per_block, __nv_bfloat16* __restrict__ dx,
                             float* __restrict__ partial) {
  const int t = threadIdx.x, col = 8 * t;
  const bool active = col < n;
  float w[8], acc[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) acc[k] = 0.f;
  if (active) load8(weight + col, w);
  __shared__ float warp_dots[R][32], warp_squares[R][32];
  __shared__ float row_dot[R], row_r[R];
  const int warps = (blockDim.x + 31) / 32;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t last = first + rows_per_block < rows ? first + rows_per_block : rows;
  for (int64_t row0 = first; row0 < last; row0 += R) {
    float xv[R][8], gv[R][8], rg[R][8];
    float dot[R], squares[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      dot[i] = 0.f;
      squares[i] = 0.f;
      const int64_t row = row0 + i;
      if (active && row < last) {
        load8(x + row * n + col, xv[i]);
        load8(grad + row * n + col, gv[i]);
        if (residual_grad != nullptr) load8(residual_grad + row * n + col, rg[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
      if (active && row0 + i < last) {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          dot[i] += w[k] * gv[i][k] * xv[i][k];
          squares[i] += xv[i][k] * xv[i][k];
        }
      }
      dot[i] = warp_sum(dot[i]);
      if (rstd == nullptr) squares[i] = warp_sum(squares[i]);
      if ((t & 31) == 0) {
        warp_dots[i][t >> 5] = dot[i];
        warp_squares[i][t >> 5] = squares[i];
      }
    }
    __syncthreads();
    if (t < R && row0 + t < last) {
      float total = 0.f, total_squares = 0.f;
      for (int v = 0; v < warps; ++v) {
        total += warp_dots[t][v];
        total_squares += warp_squares[t][v];
      }
      row_dot[t] = total;
      row_r[t] =
          rstd != nullptr ? rstd[row0 + t] : rsqrtf(total_squares / static_cast<float>(n) + eps);
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int64_t row = row0 + i;
      if (!active || row >= last) continue;
      const float r = row_r[i];
      const float c = row_dot[i] * r * r * r / static_cast<float>(n);
      float d[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        d[k] = r * w[k] * gv[i][k] - xv[i][k] * c;
        acc[k] += gv[i][k] * xv[i][k] * r;
      }
      if (residual_grad != nullptr) {
#pragma unroll
        for (int k = 0; k < 8; ++k) d[k] += rg[i][k];
      }
      store8(dx + row * n + col, d);
    }
  }
  if (active) {
#pragma unroll
    for (int k = 0; k < 8; ++k) partial[static_cast<int64_t>(blockIdx.x) * n + col + k] = acc[k];
  }
}

// dw[c] = Σ over blocks of partial[block][c] in a fixed order: 32 columns per block of 256
// threads, slice s (threadIdx.y) summing partial rows s, s + 8, …, then the eight slices' sums
// added in order.
__global__ void rms_norm_weight_grad_kernel(const float* __restrict__ partial, int blocks, int n,
                                            __nv_bfloat16* __restrict__ dw) {
  const int c = blockIdx.x * 32 + threadIdx.x, slice = threadIdx.y;
  float sum = 0.f;
  if (c < n) {
#pragma unroll 4
    for (int b = slice; b < blocks; b += 8) sum += partial[static_cast<int64_t>(b) * n + c];
  }
  __shared__ float sums[8][32];
  sums[slice][threadIdx.x] = sum;
  __syncthreads();
  if (slice == 0 && c < n) {
    float total = sums[0][threadIdx.x];
    for (int k = 1; k < 8; ++k) total += sums[k][threadIdx.x];
    dw[c] = __float2bfloat16(total);
  }
}


// The backward of training's Qwen3 attention inputs: q and k heads of the fused projection's rows,
// each RMS-normalised with its own weight (q_norm or k_norm) and rotated, as rope_norm_store_kernel
// computes them. Per (token, head) of q or k, with d the incoming gradient of the rotated head:
//   g = d rotated back (pair (i, i + D/2): g1 = d1·c + d2·s, g2 = d2·c − d1·s), then the norm's
//   backward dx = r·w·g − x·r³·(Σ w·g·x)/D with r recomputed from x as the forward computed it,
//   and w's gradient Σ g·x·r over the heads of its kind.
// A v head's gradient is copied. So the whole gradient of the projection's q, k and v columns is
// written in one pass, instead of ATen's norm backward over copied heads plus the adds and
// zero-filled slices autograd builds around it.
// One warp per (token, head) item, grid-stride; lane l holds elements 4l … 4l + 3 (D = 32, 64 or
// 128), and a rotation pair's other half sits in lane l ^ D/8. Each block leaves its share of the
// two weights' gradients in partial[block] ([q_norm's D, k_norm's D], fp32), summed afterwards
// in a fixed order.
constexpr int QK_BACKWARD_THREADS = 256;

__global__ void qk_norm_rope_backward_kernel(
    const __nv_bfloat16* __restrict__ qkv, int64_t qkv_stride, const __nv_bfloat16* __restrict__ dq,
    const __nv_bfloat16* __restrict__ dk, const __nv_bfloat16* __restrict__ dv,
    const __nv_bfloat16* __restrict__ cos, const __nv_bfloat16* __restrict__ signed_sin,
    const __nv_bfloat16* __restrict__ q_norm, const __nv_bfloat16* __restrict__ k_norm, float eps,
    __nv_bfloat16* __restrict__ grad, int64_t grad_stride, float* __restrict__ partial,
    int64_t rows, int heads, int kv_heads, int dim) {
  using T = __nv_bfloat16;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int per_row = heads + 2 * kv_heads, half = dim / 2, col = 4 * lane;
  const bool active = col < dim, first = col < half;
  const int pair = first ? col : col - half;  // the rotation pair's index in the tables
  float wq[4] = {0.f, 0.f, 0.f, 0.f}, wk[4] = {0.f, 0.f, 0.f, 0.f};
  float acc_q[4] = {0.f, 0.f, 0.f, 0.f}, acc_k[4] = {0.f, 0.f, 0.f, 0.f};
  if (active) {
    Quad<T>::load(q_norm + col, wq);
    Quad<T>::load(k_norm + col, wk);
  }
  const int64_t items = rows * per_row;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * warps + warp; item < items;
       item += static_cast<int64_t>(gridDim.x) * warps) {
    const int64_t row = item / per_row;
    const int head = static_cast<int>(item - row * per_row);
    T* out = grad + row * grad_stride + static_cast<int64_t>(head) * dim + col;
    if (head >= heads + kv_heads) {
      float v[4];
      if (active) {
        Quad<T>::load(dv + (row * kv_heads + head - heads - kv_heads) * dim + col, v);
        Quad<T>::store(out, v);
      }
      continue;
    }
    const bool is_q = head < heads;
    const T* d_src = is_q ? dq + (row * heads + head) * dim : dk + (row * kv_heads + head - heads) * dim;
    float d[4] = {0.f, 0.f, 0.f, 0.f}, x[4] = {0.f, 0.f, 0.f, 0.f};
    float c[4] = {0.f, 0.f, 0.f, 0.f}, s[4] = {0.f, 0.f, 0.f, 0.f};
    if (active) {
      Quad<T>::load(d_src + col, d);
      Quad<T>::load(qkv + row * qkv_stride + static_cast<int64_t>(head) * dim + col, x);
      Quad<T>::load(cos + row * dim + pair, c);
      Quad<T>::load(signed_sin + row * dim + half + pair, s);
    }
    float g[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float other = __shfl_xor_sync(0xffffffffu, d[j], dim / 8);
      g[j] = d[j] * c[j] + (first ? other : -other) * s[j];
    }
    // r exactly as the forward computed it (rope_norm_store_kernel), from the same x.
    const float r = rms_factor(warp_sum(add_squares(0.f, x)), dim, eps);
    const float* w = is_q ? wq : wk;
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) dot += w[j] * g[j] * x[j];
    dot = warp_sum(dot);
    const float coef = dot * r * r * r / static_cast<float>(dim);
    float dx[4];
    float* acc = is_q ? acc_q : acc_k;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      dx[j] = r * w[j] * g[j] - x[j] * coef;
      acc[j] += g[j] * x[j] * r;
    }
    if (active) Quad<T>::store(out, dx);
  }
  // The block's share of both weights' gradients: its warps' sums in warp order.
  extern __shared__ float shares[];  // [warps][2 · dim]
  if (active) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      shares[warp * 2 * dim + col + j] = acc_q[j];
      shares[warp * 2 * dim + dim + col + j] = acc_k[j];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 2 * dim; i += blockDim.x) {
    float total = 0.f;
    for (int v = 0; v < warps; ++v) total += shares[v * 2 * dim + i];
    partial[static_cast<int64_t>(blockIdx.x) * 2 * dim + i] = total;
  }
}

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

// The rows' blocks of ooze_launch_rms_norm_backward, and so the partial sums it needs [blocks, n].
int64_t ooze_rms_norm_backward_blocks(int64_t rows) { return (rows + 31) / 32; }

// bf16 x, grad [rows, n] (contiguous), weight [n], fp32 rstd [rows] (null: recomputed from x
// with eps), residual_grad [rows, n] (null: none; else added into dx) → dx [rows, n], dw [n];
// `partial` holds ooze_rms_norm_backward_blocks(rows) · n floats. n a multiple of 8, ≤ 8192.
int ooze_launch_rms_norm_backward(const void* x, const void* grad, const void* residual_grad,
                                  const void* weight, const float* rstd, float eps, int64_t rows,
                                  int n, void* dx, void* dw, float* partial, cudaStream_t stream) {
  if (n % 8 != 0 || n > 8192) return static_cast<int>(cudaErrorInvalidValue);
  using T = __nv_bfloat16;
  const int64_t blocks = ooze_rms_norm_backward_blocks(rows);
  if (blocks > 0) {
    const int threads = (n / 8 + 31) / 32 * 32;
    const auto kernel = threads <= 128 ? rms_norm_backward_kernel<2> : rms_norm_backward_kernel<1>;
    kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(grad), static_cast<const T*>(residual_grad),
        static_cast<const T*>(weight), rstd, eps, rows, n, 32, static_cast<T*>(dx), partial);
  }
  rms_norm_weight_grad_kernel<<<(n + 31) / 32, dim3(32, 8), 0, stream>>>(
      partial, static_cast<int>(blocks), n, static_cast<T*>(dw));
  return static_cast<int>(cudaGetLastError());
}

// Blocks of ooze_launch_qk_norm_rope_backward (fixed, so the weights' gradients are summed in the
// same order on every call), and so the partial sums it needs: [blocks, 2 · dim].
int64_t ooze_qk_norm_rope_backward_blocks(int64_t rows, int heads, int kv_heads) {
  const int64_t items = rows * (heads + 2 * kv_heads), warps = QK_BACKWARD_THREADS / 32;
  const int64_t wanted = (items + warps - 1) / warps;
  return wanted < 1024 ? (wanted > 0 ? wanted : 1) : 1024;
}

// bf16 throughout. qkv [rows, ≥ (heads + 2 kv_heads) · dim] (row stride qkv_stride): the forward's
// input; dq [rows, heads, dim], dk / dv [rows, kv_heads, dim] contiguous; cos / signed_sin
// [rows, dim]; q_norm / k_norm [dim]. Writes the q, k and v columns of grad (row stride
// grad_stride) and the weights' gradients dw [2 · dim] (q_norm's, then k_norm's); `partial` holds
// ooze_qk_norm_rope_backward_blocks(…) · 2 · dim floats. dim 32, 64 or 128; strides multiples of 4.
int ooze_launch_qk_norm_rope_backward(const void* qkv, int64_t qkv_stride, const void* dq,
                                      const void* dk, const void* dv, const void* cos,
                                      const void* signed_sin, const void* q_norm,
                                      const void* k_norm, float eps, void* grad,
                                      int64_t grad_stride, void* dw, float* partial, int64_t rows,
                                      int heads, int kv_heads, int dim, cudaStream_t stream) {
  if ((dim != 32 && dim != 64 && dim != 128) || qkv_stride % 4 != 0 || grad_stride % 4 != 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  using T = __nv_bfloat16;
  const int64_t blocks = ooze_qk_norm_rope_backward_blocks(rows, heads, kv_heads);
  const int threads = QK_BACKWARD_THREADS;
  if (rows > 0) {
    qk_norm_rope_backward_kernel<<<static_cast<unsigned>(blocks), threads,
                                   (threads / 32) * 2 * dim * sizeof(float), stream>>>(
        static_cast<const T*>(qkv), qkv_stride, static_cast<const T*>(dq),
        static_cast<const T*>(dk), static_cast<const T*>(dv), static_cast<const T*>(cos),
        static_cast<const T*>(signed_sin), static_cast<const T*>(q_norm),
        static_cast<const T*>(k_norm), eps, static_cast<T*>(grad), grad_stride, partial, rows,
        heads, kv_heads, dim);
  } else {
    cudaMemsetAsync(partial, 0, static_cast<size_t>(blocks) * 2 * dim * sizeof(float), stream);
  }
  // partial's rows are [q_norm's dim, k_norm's dim]: both weights' gradients in one sum.
  rms_norm_weight_grad_kernel<<<(2 * dim + 31) / 32, dim3(32, 8), 0, stream>>>(
      partial, static_cast<int>(blocks), 2 * dim, static_cast<T*>(dw));
  return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
