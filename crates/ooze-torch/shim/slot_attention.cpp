// Causal attention over packed sequences through cuDNN's fused attention (ATen's dense entry
// points, `_cudnn_attention_forward` / `_backward`), for supervised training steps: on Hopper it
// runs 1.5x (head size 64) to 1.8x (128) FlashAttention-2's speed, forward and backward
// (docs/benchmarks.md). Its outputs are ~1e-3 (relative) from FlashAttention-2's, which the
// engine reproduces bitwise, so RL steps keep FlashAttention-2. cuDNN's packed-sequence path is unusable in PyTorch 2.11 (a plan built on
// every call, wrong gradients), so the sequences are copied into slots: group g holds `sequences`
// sequences, each right-padded with zeros to `length` rows, as a dense [sequences, heads, length,
// dim] batch. Under a causal mask, padding at a sequence's end changes none of its real rows, and
// with a zero output gradient on the padding rows it adds nothing to any gradient. Plans are
// cached by ATen per shape, so the caller buckets lengths and sequence counts
// (ooze_torch::kernels::SlotLayout).

#include "ops.h"

#include <ATen/detail/CUDAHooksInterface.h>

namespace ooze_ops {

bool slot_attention_usable(const at::Device& device) {
  if (!device.is_cuda() || !at::globalContext().userEnabledCuDNN() ||
      !at::detail::getCUDAHooks().hasCuDNN() || at::detail::getCUDAHooks().versionCuDNN() < 90000) {
    return false;
  }
  // Measured on Hopper only; Ampere's cuDNN kernels are not FlashAttention-2's betters.
  return at::cuda::getDeviceProperties(device.index())->major >= 9;
}

namespace {

// Rows [first_row, first_row + sequences · length) of a slot buffer [rows, heads, dim] as the
// dense batch [sequences, heads, length, dim] cuDNN takes (strides of a [sequences, length,
// heads, dim] layout).
at::Tensor group_view(const at::Tensor& slots, const SlotGroup& g) {
  return slots.narrow(0, g.first_row, g.sequences * g.length)
      .view({g.sequences, g.length, slots.size(1), slots.size(2)})
      .transpose(1, 2);
}

// x [tokens, heads, dim] copied into a zeroed slot buffer [slot_rows, heads, dim] (x itself when
// every token already sits in its row: `rows` empty).
at::Tensor to_slots(const at::Tensor& x, const at::Tensor& rows, int64_t slot_rows) {
  if (rows.numel() == 0) return x;
  at::Tensor slots = at::zeros({slot_rows, x.size(1), x.size(2)}, x.options());
  slots.index_copy_(0, rows, x);
  return slots;
}

// The packed tokens' rows [tokens, heads, dim] of per-group dense results [sequences, heads,
// length, dim], in slot order.
at::Tensor from_groups(const std::vector<at::Tensor>& per_group, const at::Tensor& rows) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : per_group) {
    flat.push_back(t.transpose(1, 2).reshape({-1, t.size(1), t.size(3)}));
  }
  const at::Tensor all = flat.size() == 1 ? flat[0] : at::cat(flat, 0);
  return rows.numel() == 0 ? all : all.index_select(0, rows);
}

}  // namespace

SlotForward slot_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const SlotLayout& layout, double scale) {
  SlotForward f;
  f.q = to_slots(q, layout.rows, layout.slot_rows);
  f.k = to_slots(k, layout.rows, layout.slot_rows);
  f.v = to_slots(v, layout.rows, layout.slot_rows);
  std::vector<at::Tensor> outs;
  for (const SlotGroup& g : layout.groups) {
    auto r = at::_cudnn_attention_forward(
        group_view(f.q, g), group_view(f.k, g), group_view(f.v, g), std::nullopt, std::nullopt,
        std::nullopt, g.length, g.length, /*compute_log_sumexp=*/true, 0.0, /*is_causal=*/true,
        /*return_debug_mask=*/false, scale);
    outs.push_back(std::get<0>(r));
    f.per_group.push_back(std::get<0>(r));
    f.per_group.push_back(std::get<1>(r));
    f.per_group.push_back(std::get<6>(r));
    f.per_group.push_back(std::get<7>(r));
  }
  f.out = from_groups(outs, layout.rows);
  return f;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> slot_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& q_slots, const at::Tensor& k_slots,
    const at::Tensor& v_slots, const std::vector<at::Tensor>& per_group, const SlotLayout& layout,
    double scale) {
  const at::Tensor grad_slots = to_slots(grad_out, layout.rows, layout.slot_rows);
  std::vector<at::Tensor> dq, dk, dv;
  for (size_t i = 0; i < layout.groups.size(); ++i) {
    const SlotGroup& g = layout.groups[i];
    const at::Tensor& out = per_group[4 * i];
    auto [gq, gk, gv] = at::_cudnn_attention_backward(
        group_view(grad_slots, g), group_view(q_slots, g), group_view(k_slots, g),
        group_view(v_slots, g), out, per_group[4 * i + 1], per_group[4 * i + 2],
        per_group[4 * i + 3], at::Tensor(), at::Tensor(), at::Tensor(), g.length, g.length, 0.0,
        /*is_causal=*/true, scale);
    dq.push_back(gq);
    dk.push_back(gk);
    dv.push_back(gv);
  }
  return {from_groups(dq, layout.rows), from_groups(dk, layout.rows), from_groups(dv, layout.rows)};
}

}  // namespace ooze_ops
