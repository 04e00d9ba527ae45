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
// One thread per eight columns (n a multiple of 8, at most 8192), `rows_per_block` rows per block;
// each block writes its rows' share of dw to partial[block] in fp32.
__global__ void rms_norm_backward_kernel(const __nv_bfloat16* __restrict__ x,
                                         const __nv_bfloat16* __restrict__ grad,
                                         const __nv_bfloat16* __restrict__ residual_grad,
                                         const __nv_bfloat16* __restrict__ weight,
                                         const float* __restrict__ rstd, float eps, int64_t rows,
                                         int n, int rows_per_block, __nv_bfloat16* __restrict__ dx,
                                         float* __restrict__ partial) {
  const int t = threadIdx.x, col = 8 * t;
  const bool active = col < n;
  float w[8], acc[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) acc[k] = 0.f;
  if (active) load8(weight + col, w);
  __shared__ float warp_dots[32], warp_squares[32];
  __shared__ float row_dot, row_r;
  const int warps = (blockDim.x + 31) / 32;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t last = first + rows_per_block < rows ? first + rows_per_block : rows;
  for (int64_t row = first; row < last; ++row) {
    float xv[8], gv[8];
    float dot = 0.f, squares = 0.f;
    if (active) {
      load8(x + row * n + col, xv);
      load8(grad + row * n + col, gv);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        dot += w[k] * gv[k] * xv[k];
        squares += xv[k] * xv[k];
      }
    }
    dot = warp_sum(dot);
    if (rstd == nullptr) squares = warp_sum(squares);
    if ((t & 31) == 0) {
      warp_dots[t >> 5] = dot;
      warp_squares[t >> 5] = squares;
    }
    __syncthreads();
    if (t == 0) {
      float total = 0.f, total_squares = 0.f;
      for (int i = 0; i < warps; ++i) {
        total += warp_dots[i];
        total_squares += warp_squares[i];
      }
      row_dot = total;
      row_r = rstd != nullptr ? rstd[row] : rsqrtf(total_squares / static_cast<float>(n) + eps);
    }
    __syncthreads();
    if (active) {
      const float r = row_r;
      const float c = row_dot * r * r * r / static_cast<float>(n);
      float d[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        d[k] = r * w[k] * gv[k] - xv[k] * c;
        acc[k] += gv[k] * xv[k] * r;
      }
      if (residual_grad != nullptr) {
        float rg[8];
        load8(residual_grad + row * n + col, rg);
#pragma unroll
        for (int k = 0; k < 8; ++k) d[k] += rg[k];
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
    rms_norm_backward_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(grad),
        static_cast<const T*>(residual_grad), static_cast<const T*>(weight), rstd, eps, rows, n, 32,
        static_cast<T*>(dx), partial);
  }
  rms_norm_weight_grad_kernel<<<(n + 31) / 32, dim3(32, 8), 0, stream>>>(
      partial, static_cast<int>(blocks), n, static_cast<T*>(dw));
  return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
