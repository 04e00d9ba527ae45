// What the two files of tensor-level entry points (ops.cpp: elementwise, sampling and log-prob
// kernels; attention_ops.cpp: attention) share: the C launchers of kernels.cu and attention.cu,
// and the checks and error reporting around them.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include <exception>
#include <string>

extern "C" {
int ooze_launch_rope_store(int bf16, const void* qkv, int64_t qkv_stride, const int64_t* cells,
                           const void* cos, const void* signed_sin, const void* q_norm,
                           const void* k_norm, float eps, void* q_out, void* k_cache,
                           void* v_cache, int rows, int heads, int kv_heads, int dim,
                           cudaStream_t stream);
int ooze_launch_add_rms_norm(int bf16, const void* x, const void* delta, const void* weight,
                             float eps, int64_t rows, int n, void* sum, void* out,
                             cudaStream_t stream);
int64_t ooze_rms_norm_backward_blocks(int64_t rows);
int ooze_launch_rms_norm_backward(const void* x, const void* grad, const void* residual_grad,
                                  const void* weight, const float* rstd, float eps, int64_t rows,
                                  int n, void* dx, void* dw, float* partial, cudaStream_t stream);
int64_t ooze_qk_norm_rope_backward_blocks(int64_t rows, int heads, int kv_heads);
int ooze_launch_qk_norm_rope_backward(const void* qkv, int64_t qkv_stride, const void* dq,
                                      const void* dk, const void* dv, const void* cos,
                                      const void* signed_sin, const void* q_norm,
                                      const void* k_norm, float eps, void* grad,
                                      int64_t grad_stride, void* dw, float* partial, int64_t rows,
                                      int heads, int kv_heads, int dim, cudaStream_t stream);
int ooze_launch_silu_mul(int bf16, const void* gate_up, void* out, int64_t rows, int64_t width,
                         cudaStream_t stream);
int ooze_launch_sample(const float* logits, int64_t stride, int vocab, const float* params,
                       int rows, double* out, cudaStream_t stream);
int ooze_launch_silu_mul_backward(int bf16, const void* gate_up, const void* grad, void* out,
                                  int64_t rows, int64_t width, cudaStream_t stream);
int ooze_launch_rope(int bf16, const void* x, int64_t stride, const void* cos,
                     const void* signed_sin, void* out, int64_t out_stride, int64_t tokens,
                     int heads, int dim, float sign, cudaStream_t stream);
int ooze_launch_log_prob_forward(const float* logits, int rows, int vocab,
                                 const int64_t* targets, float inv_temp, float* log_prob,
                                 float* lse, float* entropy, void* logits_bf16,
                                 cudaStream_t stream);
int ooze_launch_log_prob_backward(int bf16, const void* logits, int logits_bf16, int rows,
                                  int vocab, const int64_t* targets, const float* lse,
                                  const float* grad, float inv_temp, void* out,
                                  cudaStream_t stream);
int ooze_attention_splits(int read_len);
int ooze_launch_split_attention(const void* q, int64_t q_stride, const void* k, int64_t k_stride,
                                const void* v, int64_t v_stride, const int64_t* table, int width,
                                int64_t block_size, const int* tiles, int n_tiles, int tokens,
                                const int64_t* positions, int heads, int kv_heads, int dim,
                                int splits, float scale, float* part_o, float* part_ml, void* out,
                                int64_t out_stride, float* lse, cudaStream_t stream);
int ooze_fa_order_chunks(int read_len);
int ooze_launch_fa_order_attention(const void* q, int64_t q_stride, const void* k,
                                   int64_t k_stride, const void* v, int64_t v_stride,
                                   const int64_t* table, int width, int64_t block_size,
                                   const int* tiles, int n_tiles, const int64_t* positions,
                                   int heads, int kv_heads, int dim, float scale, int chunks,
                                   float* part_o, float* part_ml, void* out, int64_t out_stride,
                                   cudaStream_t stream);
int ooze_launch_fa_order_decode_rope(const void* qkv, int64_t qkv_stride, const void* cos,
                                     const void* signed_sin, const int64_t* cells, void* k,
                                     int64_t k_stride, void* v, int64_t v_stride,
                                     const int64_t* table, int width, int64_t block_size, int rows,
                                     const int64_t* positions, int heads, int kv_heads, int dim,
                                     float scale, int chunks, float* part_o, float* part_ml,
                                     void* out, int64_t out_stride, cudaStream_t stream);
}

namespace ooze_ops {

// The message of the last exception an entry point caught on this thread (ooze_ops_last_error).
extern thread_local std::string last_error;

// Runs `body`; on an exception records it and returns null.
template <typename F>
at::Tensor* guarded(F body) {
  try {
    return new at::Tensor(body());
  } catch (const std::exception& e) {
    last_error = e.what();
    return nullptr;
  }
}

inline bool is_bf16(const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kFloat,
              "ooze kernels take bfloat16 or float32, got ", t.scalar_type());
  return t.scalar_type() == at::kBFloat16;
}

inline void check_launch(int code) {
  TORCH_CHECK(code == 0, "kernel launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(code)));
}

inline void check_cuda(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be on a CUDA device");
}

inline cudaStream_t stream() { return at::cuda::getCurrentCUDAStream().stream(); }

// The rotary embedding (sign 1) or its inverse (sign -1) of the first `heads` heads of each row of
// x [tokens, ≥ heads · dim]; returns [tokens, heads, dim].
at::Tensor rope_apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      int64_t heads, int64_t dim, float sign);

}  // namespace ooze_ops
