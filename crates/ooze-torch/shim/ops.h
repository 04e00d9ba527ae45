// What the two files of tensor-level entry points (ops.cpp: elementwise, sampling and log-prob
// kernels; attention_ops.cpp: attention) share: the C launchers of kernels.cu and attention.cu,
// and the checks and error reporting around them.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include <exception>
#include <string>
#include <tuple>
#include <vector>

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
int ooze_launch_log_prob_forward_bf16(const void* logits, int rows, int vocab,
                                      const int64_t* targets, float inv_temp, float* log_prob,
                                      float* lse, float* entropy, cudaStream_t stream);
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

// Packed sequences copied into dense slots for cuDNN's fused attention (slot_attention.cpp): group
// g's `sequences` slots of `length` rows start at row `first_row` of a [slot_rows, heads, dim]
// buffer; `rows` (int64 [tokens], on the device) is each packed token's row in it, or empty when
// every token sits in its own row (the packed tensors are the slot buffers).
struct SlotGroup {
  int64_t first_row, sequences, length;
};
struct SlotLayout {
  at::Tensor rows;
  int64_t slot_rows = 0;
  std::vector<SlotGroup> groups;
};

// The layout from its flattened groups (first_row, sequences, length, one triple a group).
inline SlotLayout slot_layout(const at::Tensor& rows, const std::vector<int64_t>& groups,
                              int64_t slot_rows) {
  SlotLayout layout{rows, slot_rows, {}};
  for (size_t i = 0; i + 2 < groups.size(); i += 3) {
    layout.groups.push_back({groups[i], groups[i + 1], groups[i + 2]});
  }
  return layout;
}

// What the backward needs of a slot forward: q, k, v in slots, and per group its output,
// log-sum-exp and (unused without dropout) random-number state, four tensors a group.
struct SlotForward {
  at::Tensor out, q, k, v;
  std::vector<at::Tensor> per_group;
};

// Whether cuDNN's fused attention runs here: CUDA, cuDNN ≥ 9 enabled, Hopper or newer.
bool slot_attention_usable(const at::Device& device);

// Causal attention of packed q [tokens, heads, dim], k and v [tokens, kv_heads, dim] through the
// slots of `layout`; `out` [tokens, heads, dim] in packed order.
SlotForward slot_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const SlotLayout& layout, double scale);

// dq, dk, dv in packed order, from the packed output gradient and a slot forward's state.
std::tuple<at::Tensor, at::Tensor, at::Tensor> slot_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& q_slots, const at::Tensor& k_slots,
    const at::Tensor& v_slots, const std::vector<at::Tensor>& per_group, const SlotLayout& layout,
    double scale);

}  // namespace ooze_ops
