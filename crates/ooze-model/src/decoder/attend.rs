//! One block's attention step (a child of `decoder`): project q/k/v, rotate, store the new keys and
//! values where the pass keeps them, and attend, through the path the pass chose once
//! ([`AttentionPlan`]): ooze's fused decode kernels, split attention (deterministic numerics),
//! FlashAttention over packed sequences, or libtorch's attention with a mask.

use super::{kernels_fit, rms_norm, Decoder};
use crate::attention::{decode_attention, gather_blocks, KvTarget, PaddedPacking};
use crate::rope;
use ooze_torch::kernels::{self, RopeStore};
use ooze_torch::tch::Tensor;

/// How every block of one forward pass attends, decided once per pass.
pub(super) struct AttentionPlan {
    pub scale: f64,
    /// Boolean mask for libtorch's attention (None: none, or `causal`).
    pub mask: Option<Tensor>,
    pub causal: bool,
    /// Packed sequences through FlashAttention: offsets, the longest, the lengths.
    pub varlen: Option<(Tensor, i64, Vec<i64>)>,
    /// …or, for `fused_qkv_varlen` under [`crate::Arithmetic::Fastest`], through cuDNN's
    /// fused attention over these slots.
    pub slots: Option<kernels::SlotLayout>,
    /// Packed sequences as a right-padded batch.
    pub padded: Option<PaddedPacking>,
    /// One token per paged row: rotary embedding and KV write in ooze's kernel…
    pub fused_rope: bool,
    /// …and ooze's decode attention kernel (FlashAttention-2's arithmetic, or split attention's
    /// under deterministic numerics).
    pub fused_attention: bool,
    /// Deterministic numerics: split attention wherever attention runs.
    pub split: bool,
    /// Packed sequences through FlashAttention, taken straight from the fused projection (q/k
    /// norms and rotary embedding included) in one differentiable operation: bf16 on a GPU, not
    /// under deterministic numerics.
    pub fused_qkv_varlen: bool,
    /// Paged prefill through the decode kernel (deterministic numerics, or rows with cached
    /// keys): the rows' cached lengths (the kernel reads the blocks).
    pub prefill_past: Option<Vec<i64>>,
    /// Causal attention over each row's own `T` tokens (rows of equal length) through
    /// FlashAttention-2 for packed sequences: plain causal passes and prefills of rows without
    /// cached keys, outside deterministic numerics.
    pub flash_causal: bool,
    /// int32 offsets `[0, T, 2T, …, B·T]`: the rows as packed sequences, for `flash_causal` and
    /// for split attention over plain causal rows.
    pub row_offsets: Option<Tensor>,
    /// One-token paged decode without the fused kernel: the additive bias of the keys read.
    pub decode_bias: Option<Tensor>,
}

impl AttentionPlan {
    /// The arithmetic the paged kernels reproduce: split attention's where training runs it
    /// (deterministic numerics), else FlashAttention-2's.
    fn paged_arithmetic(&self) -> kernels::PagedArithmetic {
        if self.split {
            kernels::PagedArithmetic::Split
        } else {
            kernels::PagedArithmetic::FlashOrder
        }
    }

    fn row_offsets(&self) -> Tensor {
        self.row_offsets
            .as_ref()
            .expect("invariant: planned for plain causal rows")
            .shallow_clone()
    }
}

impl Decoder {
    /// Block `i`'s attention output `[B, heads, T, head_dim]` from its fused projection `qkv`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attend(
        &self,
        i: usize,
        qkv: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        target: &mut KvTarget<'_>,
        plan: &AttentionPlan,
        b: i64,
        t: i64,
    ) -> Tensor {
        let c = &self.config;
        let l = &self.layers[i];
        match target {
            KvTarget::Paged {
                cache,
                write_cells,
                tables,
                past,
                read_len,
            } if plan.fused_rope => {
                let (rows, cos, sin) = (
                    qkv.view([b, -1]),
                    cos.view([b, c.head_dim]),
                    sin.view([b, c.head_dim]),
                );
                // Qwen3's q/k norms in ATen's arithmetic (the trainer's): inside the rotary
                // kernel where it takes the head size, else as ATen's own rms_norm before it.
                let fused_norm = kernels::QK_NORM_HEAD_DIMS.contains(&c.head_dim);
                let (rows, qk_norm) = match (&l.q_norm, &l.k_norm) {
                    (Some(q), Some(k)) if fused_norm => (
                        rows,
                        Some(kernels::QkNorm {
                            q,
                            k,
                            eps: c.rms_norm_eps,
                        }),
                    ),
                    (Some(qn), Some(kn)) => (self.normed_qk_rows(&rows, qn, kn, b), None),
                    _ => (rows, None),
                };
                let args = RopeStore {
                    cos: &cos,
                    signed_sin: &sin,
                    heads: c.num_heads,
                    kv_heads: c.num_kv_heads,
                    head_dim: c.head_dim,
                    qk_norm,
                };
                let arithmetic = plan.paged_arithmetic();
                if plan.fused_attention
                    && arithmetic == kernels::PagedArithmetic::FlashOrder
                    && args.qk_norm.is_none()
                    && [&rows, &cos, &sin].iter().all(|x| rows_aligned_16(x))
                    && cos.is_contiguous()
                    && sin.is_contiguous()
                {
                    // The rotation and the KV write inside the attention kernel: one launch fewer.
                    return kernels::decode_attention_rope(
                        &rows,
                        &write_cells.view([b]),
                        &mut cache.k[i],
                        &mut cache.v[i],
                        &args,
                        tables,
                        past,
                        *read_len,
                        plan.scale,
                    )
                    .expect("invariant: bf16 decode rows are valid for decode_attention_rope")
                    .view([b, c.num_heads, t, c.head_dim]);
                }
                let q = kernels::rope_store(
                    &rows,
                    &write_cells.view([b]),
                    &mut cache.k[i],
                    &mut cache.v[i],
                    &args,
                )
                .expect("invariant: decode rows and paged memory are valid for rope_store");
                if plan.fused_attention {
                    kernels::decode_attention(
                        &q,
                        &cache.k[i],
                        &cache.v[i],
                        tables,
                        past,
                        *read_len,
                        plan.scale,
                        arithmetic,
                    )
                    .expect("invariant: bf16 decode rows are valid for decode_attention")
                    .view([b, c.num_heads, t, c.head_dim])
                } else {
                    let bias = plan
                        .decode_bias
                        .as_ref()
                        .expect("invariant: built when not fused");
                    decode_attention(
                        &q.view([b, c.num_heads, t, c.head_dim]),
                        &gather_blocks(&cache.k[i], tables, *read_len),
                        &gather_blocks(&cache.v[i], tables, *read_len),
                        bias,
                        plan.scale,
                    )
                }
            }
            KvTarget::None if plan.fused_qkv_varlen => {
                let (offsets, longest, _) = plan
                    .varlen
                    .as_ref()
                    .expect("invariant: the fused path is planned for packed sequences");
                let flat = |x: &Tensor| x.view([b * t, c.head_dim]);
                let qk_norm = match (&l.q_norm, &l.k_norm) {
                    (Some(q), Some(k)) => Some(kernels::QkNorm {
                        q,
                        k,
                        eps: c.rms_norm_eps,
                    }),
                    _ => None,
                };
                kernels::qkv_flash_attention_varlen(
                    &qkv.view([b * t, -1]),
                    &flat(cos),
                    &flat(sin),
                    offsets,
                    qk_norm,
                    c.num_heads,
                    c.num_kv_heads,
                    c.head_dim,
                    *longest,
                    plan.scale,
                    plan.slots.as_ref(),
                )
                .expect("invariant: a packed bf16 projection on a GPU is valid for flash attention")
                // [T, heads, D] → [1, heads, T, D].
                .transpose(0, 1)
                .unsqueeze(0)
            }
            _ => {
                let gather = plan.prefill_past.is_none() && !plan.flash_causal;
                let (q, k, v) = self.project_and_store(i, qkv, cos, sin, target, b, t, gather);
                self.attend_projected(i, &q, &k, &v, target, plan, b, t)
            }
        }
    }

    /// Attention over q, k, v as [`Decoder::project_and_store`] gives them (with paged memory,
    /// through the decode kernel or FlashAttention-2 over the new tokens, k and v are only the new
    /// ones: the decode kernel reads the blocks itself).
    #[allow(clippy::too_many_arguments)]
    fn attend_projected(
        &self,
        i: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        target: &KvTarget<'_>,
        plan: &AttentionPlan,
        b: i64,
        t: i64,
    ) -> Tensor {
        let c = &self.config;
        // [B, heads, T, D] ↔ [B·T, heads, D] (views of the rotary kernel's output).
        let tokens = |x: &Tensor| x.transpose(1, 2).reshape([b * t, -1, c.head_dim]);
        let heads_first = |x: Tensor| x.view([b, t, -1, c.head_dim]).transpose(1, 2);
        if let (Some(past), KvTarget::Paged { cache, tables, .. }) = (&plan.prefill_past, target) {
            let out = kernels::paged_prefill_attention(
                &tokens(q),
                &cache.k[i],
                &cache.v[i],
                tables,
                past,
                &vec![t; b as usize],
                plan.scale,
                plan.paged_arithmetic(),
            )
            .expect("invariant: bf16 prefill rows are valid for paged attention");
            heads_first(out)
        } else if plan.split && (plan.varlen.is_some() || plan.causal) {
            let (offsets, lengths) = match &plan.varlen {
                Some((offsets, _, lengths)) => (offsets.shallow_clone(), lengths.clone()),
                None => (plan.row_offsets(), vec![t; b as usize]),
            };
            let out = kernels::split_attention_varlen(
                &tokens(q),
                &tokens(k),
                &tokens(v),
                &offsets,
                &lengths,
                plan.scale,
            )
            .expect("invariant: bf16 CUDA rows are valid for split attention");
            heads_first(out)
        } else if plan.flash_causal {
            let out = kernels::flash_attention_varlen(
                &tokens(q),
                &tokens(k),
                &tokens(v),
                &plan.row_offsets(),
                t,
                plan.scale,
            )
            .expect("invariant: 16-bit CUDA rows are valid for flash attention");
            heads_first(out)
        } else if let Some((offsets, longest, _)) = &plan.varlen {
            // [1, heads, T, D] → [T, heads, D] and back.
            let tokens = |x: &Tensor| x.squeeze_dim(0).transpose(0, 1);
            let out = kernels::flash_attention_varlen(
                &tokens(q),
                &tokens(k),
                &tokens(v),
                offsets,
                *longest,
                plan.scale,
            )
            .expect("invariant: packed 16-bit CUDA rows are valid for flash attention");
            out.transpose(0, 1).unsqueeze(0)
        } else if let Some(p) = &plan.padded {
            let out = Tensor::scaled_dot_product_attention(
                &p.to_rows(q),
                &p.to_rows(k),
                &p.to_rows(v),
                None::<&Tensor>,
                0.0,
                true,
                plan.scale,
                c.num_kv_heads != c.num_heads,
            );
            p.to_packed(&out)
        } else {
            match &plan.decode_bias {
                Some(bias) => decode_attention(q, k, v, bias, plan.scale),
                _ => Tensor::scaled_dot_product_attention(
                    q,
                    k,
                    v,
                    plan.mask.as_ref(),
                    0.0,
                    plan.causal,
                    plan.scale,
                    c.num_kv_heads != c.num_heads,
                ),
            }
        }
    }

    /// Layer `i`'s q, k and v (`[B, heads, T, head_dim]`, k and v over everything attended to —
    /// or only the new ones without `gather` from paged memory) from its fused projection output,
    /// with the rotary embedding applied and the new keys and values stored in `target`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn project_and_store(
        &self,
        i: usize,
        qkv: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        target: &mut KvTarget<'_>,
        b: i64,
        t: i64,
        gather: bool,
    ) -> (Tensor, Tensor, Tensor) {
        let c = &self.config;
        let l = &self.layers[i];
        let heads = |x: &Tensor, n: i64| x.view([b, t, n, c.head_dim]);
        {
            let (q_dim, kv_dim) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
            let v = heads(&qkv.narrow(-1, q_dim + kv_dim, kv_dim), c.num_kv_heads).transpose(1, 2);
            // q and k are adjacent in the fused projection: rotate them in one go.
            // The q and k heads, and the same as rows `[B·T, ≥ (heads + kv)·head_dim]` for the
            // rotary kernel.
            let (qk, rows) = match (&l.q_norm, &l.k_norm) {
                (Some(qn), Some(kn)) => {
                    let q = rms_norm(
                        &heads(&qkv.narrow(-1, 0, q_dim), c.num_heads),
                        qn,
                        c.rms_norm_eps,
                    );
                    let k = rms_norm(
                        &heads(&qkv.narrow(-1, q_dim, kv_dim), c.num_kv_heads),
                        kn,
                        c.rms_norm_eps,
                    );
                    let qk = Tensor::cat(&[q, k], 2);
                    let rows = qk.view([b * t, -1]);
                    (qk, rows)
                }
                _ => (
                    heads(
                        &qkv.narrow(-1, 0, q_dim + kv_dim),
                        c.num_heads + c.num_kv_heads,
                    ),
                    qkv.view([b * t, -1]),
                ),
            };
            let qk = if kernels_fit(&rows) && c.head_dim % 2 == 0 {
                let n = c.num_heads + c.num_kv_heads;
                let flat = |x: &Tensor| x.view([b * t, c.head_dim]);
                kernels::rope(&rows, &flat(cos), &flat(sin), n, c.head_dim)
                    .expect("invariant: projection rows and rotary tables are valid for rope")
                    .view([b, t, n, c.head_dim])
                    .transpose(1, 2)
            } else {
                rope::apply(&qk.transpose(1, 2), cos, sin)
            };
            let q = qk.narrow(1, 0, c.num_heads);
            let k = qk.narrow(1, c.num_heads, c.num_kv_heads);
            let (k, v) = match target {
                KvTarget::None => (k, v),
                KvTarget::Contiguous(cache) => {
                    let (k, v) = match cache.layers[i].take() {
                        Some((pk, pv)) => (Tensor::cat(&[pk, k], 2), Tensor::cat(&[pv, v], 2)),
                        None => (k, v),
                    };
                    cache.layers[i] = Some((k.shallow_clone(), v.shallow_clone()));
                    (k, v)
                }
                KvTarget::Paged {
                    cache,
                    write_cells,
                    tables,
                    read_len,
                    ..
                } => {
                    let (kv, d) = (c.num_kv_heads, c.head_dim);
                    let index = [Some(write_cells.view([-1]))];
                    // [B, kv, T, D] → [B·T, kv, D], the cell layout.
                    let rows = |x: &Tensor| x.transpose(1, 2).reshape([-1, kv, d]);
                    let _ = cache.k[i]
                        .view([-1, kv, d])
                        .index_put_(&index, &rows(&k), false);
                    let _ = cache.v[i]
                        .view([-1, kv, d])
                        .index_put_(&index, &rows(&v), false);
                    if !gather {
                        // The caller reads through the block tables itself.
                        return (q, k, v);
                    }
                    (
                        gather_blocks(&cache.k[i], tables, *read_len),
                        gather_blocks(&cache.v[i], tables, *read_len),
                    )
                }
            };
            (q, k, v)
        }
    }

    /// Decode rows `[B, (heads + 2·kv_heads)·head_dim]` with q and k RMS-normalised per head
    /// (Qwen3), as training normalises them.
    fn normed_qk_rows(&self, rows: &Tensor, q_norm: &Tensor, k_norm: &Tensor, b: i64) -> Tensor {
        let c = &self.config;
        let (q_dim, kv_dim) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let part = |from: i64, len: i64, heads: i64| {
            rows.narrow(1, from, len).reshape([b, heads, c.head_dim])
        };
        let q = rms_norm(&part(0, q_dim, c.num_heads), q_norm, c.rms_norm_eps);
        let k = rms_norm(&part(q_dim, kv_dim, c.num_kv_heads), k_norm, c.rms_norm_eps);
        Tensor::cat(
            &[
                q.view([b, -1]),
                k.view([b, -1]),
                rows.narrow(1, q_dim + kv_dim, kv_dim),
            ],
            1,
        )
    }
}

/// Whether every row of the 2-D `x` starts 16-byte aligned (the fused decode kernel reads rows
/// eight bf16 elements at a time).
fn rows_aligned_16(x: &Tensor) -> bool {
    let bytes = x.kind().elt_size_in_bytes() as i64;
    (x.data_ptr() as usize).is_multiple_of(16)
        && (x.stride()[0] * bytes) % 16 == 0
        && x.stride()[1] == 1
}
