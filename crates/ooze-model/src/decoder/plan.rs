//! How one forward pass attends, decided once for all its blocks (a child of `decoder`): which
//! path the layout, device, dtype and numerics mode call for ([`AttentionPlan`]), and where the
//! pass keeps the keys and values it writes ([`KvTarget`]).

use super::attend::AttentionPlan;
use super::{kernels_apply, Decoder};
use crate::attention::{
    decode_bias, offset_causal_mask, packed_mask, paged_mask, Arithmetic, Attention, KvTarget,
    PaddedPacking,
};
use ooze_torch::kernels;
use ooze_torch::tch::{Kind, Tensor};
use ooze_torch::transfer::upload;

impl Decoder {
    /// The plan and KV target of a pass over `x [B, T, hidden]` under `attention`.
    pub(super) fn plan_attention<'a>(
        &self,
        attention: Attention<'a>,
        x: &Tensor,
        t: i64,
    ) -> (AttentionPlan, KvTarget<'a>) {
        let c = &self.config;
        // One new token per row into paged memory, on a GPU: rotary embedding and the KV write in
        // one kernel, and (bf16) ooze's decode attention kernel.
        let paged_one_token = matches!(
            attention,
            Attention::Paged { .. } | Attention::PagedDecode { .. }
        ) && t == 1
            && self.device.is_cuda();
        let fused_rope = paged_one_token && kernels_apply(x) && self.rope_kernel_fits();
        let fused_attention = fused_rope && self.decode_attention_kernel_fits();
        // Packed sequences on a GPU in 16 bits: FlashAttention over variable lengths instead of a
        // dense [N, N] block-diagonal mask (no work across sequence boundaries).
        let varlen = match &attention {
            Attention::Packed { lengths }
                if self.device.is_cuda()
                    && matches!(self.kind, Kind::BFloat16 | Kind::Half)
                    && kernels::available()
                    && self.flash_attention_fits() =>
            {
                let mut offsets = vec![0i32];
                for &l in lengths.iter() {
                    offsets.push(offsets[offsets.len() - 1] + l as i32);
                }
                let longest = lengths.iter().copied().max().unwrap_or(0);
                Some((upload(&offsets, self.device), longest, lengths.to_vec()))
            }
            _ => None,
        };
        // Elsewhere: as a right-padded batch under plain causal attention when that is cheaper
        // than the dense block-diagonal mask.
        let padded = match &attention {
            Attention::Packed { lengths } if varlen.is_none() => {
                PaddedPacking::new(lengths, self.device)
            }
            _ => None,
        };
        // Deterministic numerics: every attention runs split attention (the decode kernel's
        // arithmetic), for the engine's prefill and for training alike.
        let split = kernels::deterministic() && self.decode_attention_fused();
        // Otherwise training runs FlashAttention-2, and the engine reproduces its arithmetic: a
        // prefill whose rows have no cached keys runs FlashAttention-2 itself over the new keys;
        // one with cached keys runs the decode kernel (FlashAttention-2's order) over the blocks.
        let fresh_prefill = matches!(&attention, Attention::Paged { past, .. }
            if t > 1 && !split && self.decode_attention_fused() && past.iter().all(|&p| p == 0));
        let prefill_past = match &attention {
            Attention::Paged { past, .. }
                if t > 1 && self.decode_attention_fused() && !fresh_prefill =>
            {
                Some(past.to_vec())
            }
            _ => None,
        };
        // Rows of equal length under plain causal attention, on a GPU in 16 bits: FlashAttention-2
        // over them as packed sequences (its kernel for variable lengths never splits the keys,
        // whatever the batch, so every row gets the trainer's arithmetic).
        let flash_causal = fresh_prefill
            || (matches!(attention, Attention::Causal)
                && !split
                && self.device.is_cuda()
                && matches!(self.kind, Kind::BFloat16 | Kind::Half)
                && kernels::available()
                && self.flash_attention_fits());
        let dense_packed_mask = varlen.is_none() && padded.is_none();
        let (mask, target, causal) =
            self.mask_and_target(attention, t, dense_packed_mask, fused_attention);
        let scale = 1.0 / (c.head_dim as f64).sqrt();
        let group = c.num_heads / c.num_kv_heads;
        // Otherwise one-token paged decode on a GPU calls the memory-efficient kernel with an
        // additive bias, built once for all layers.
        let decode_bias = match &mask {
            Some(mask) if paged_one_token && !fused_attention => {
                Some(decode_bias(mask, c.num_kv_heads, group, self.kind))
            }
            _ => None,
        };
        // Packed training or scoring in bf16, outside deterministic numerics (which run split
        // attention): Qwen3's q/k norms (where the kernels take the head size), the rotary
        // embedding and FlashAttention as one operation on the projection's output.
        // (Packed sequences write no KV memory, and FlashAttention's head sizes suit the rotary
        // kernel.)
        let fused_qkv_varlen = varlen.is_some()
            && !split
            && self.kind == Kind::BFloat16
            && (!c.qk_norm || kernels::QK_NORM_TRAINING_HEAD_DIMS.contains(&c.head_dim));
        // The trainer's passes there: cuDNN's fused attention over slots where it pays.
        let slots = match &varlen {
            Some((_, _, lengths))
                if fused_qkv_varlen
                    && self.arithmetic == Arithmetic::Fastest
                    && matches!(c.head_dim, 64 | 128) =>
            {
                kernels::SlotLayout::plan(lengths, c.num_heads, c.head_dim, self.device)
            }
            _ => None,
        };
        // The rows as packed sequences of `t` tokens, for the kernels that take packed sequences
        // over plain causal rows: uploaded once for every block, without waiting for the device.
        let row_offsets = (flash_causal || (split && causal && varlen.is_none())).then(|| {
            let b = x.size()[0];
            let offsets: Vec<i32> = (0..=b).map(|r| (r * t) as i32).collect();
            upload(&offsets, self.device)
        });
        let plan = AttentionPlan {
            scale,
            mask,
            causal,
            fused_qkv_varlen,
            flash_causal,
            row_offsets,
            varlen,
            slots,
            padded,
            fused_rope,
            fused_attention,
            split,
            prefill_past,
            decode_bias,
        };
        (plan, target)
    }

    /// The mask a pass under `attention` needs (none for plain causal rows, for packed rows that
    /// run a kernel of their own — `dense_packed_mask` false — and for ooze's decode kernels), where
    /// it keeps its keys and values, and whether attention is plain causal.
    fn mask_and_target<'a>(
        &self,
        attention: Attention<'a>,
        t: i64,
        dense_packed_mask: bool,
        fused_attention: bool,
    ) -> (Option<Tensor>, KvTarget<'a>, bool) {
        match attention {
            Attention::Causal => (None, KvTarget::None, true),
            Attention::Packed { lengths } => (
                dense_packed_mask.then(|| packed_mask(lengths, self.device)),
                KvTarget::None,
                false,
            ),
            Attention::Cached(cache) => {
                let past = cache.len;
                // One new token attends to everything; several need the causal part written out,
                // because the kernel's is_causal aligns the triangle to the top-left corner.
                let mask = (t > 1).then(|| offset_causal_mask(past, t, self.device));
                (mask, KvTarget::Contiguous(cache), false)
            }
            Attention::PagedDecode {
                cache,
                tables,
                past,
                read_len,
                write_cells,
                ..
            } => {
                // ooze's decode kernels read each row's own keys: no mask to build.
                let mask = (!fused_attention).then(|| paged_mask(past, 1, read_len));
                let target = KvTarget::Paged {
                    cache,
                    write_cells: write_cells.view([-1, 1]),
                    tables: tables.shallow_clone(),
                    past: past.shallow_clone(),
                    read_len,
                };
                (mask, target, false)
            }
            Attention::Paged {
                cache,
                tables,
                past,
            } => {
                let (target, mask) = KvTarget::paged_from_host(cache, tables, past, t, self.device);
                (Some(mask), target, false)
            }
        }
    }
}
