//! Attention kernels' entry points: the engine's paged attention (decode, with or without the
//! rotary step folded in, and prefill over cached keys) in either arithmetic, and packed-sequence
//! attention for training (FlashAttention-2, with the q/k rotation and norms fused, or split
//! attention's forward).

#[cfg(ooze_cuda_kernels)]
use super::ffi;
use super::{available, KernelError, QkNorm, RopeStore, SlotLayout};
use crate::tch::Tensor;

/// Whose arithmetic the paged attention kernels ([`decode_attention`],
/// [`paged_prefill_attention`]) reproduce, so that the engine's tokens get bitwise the outputs the
/// trainer's forward computes for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PagedArithmetic {
    /// FlashAttention-2's forward, operation for operation (rows of up to 4,096 keys; longer rows
    /// are split into chunks of that many and merged): the default numerics, where training runs
    /// FlashAttention-2.
    FlashOrder,
    /// Split attention's (fixed 256-key chunks, merged in order): deterministic numerics, where
    /// training runs split attention too.
    Split,
}

/// Whether [`decode_attention`] takes this shape: bf16, head_dim 64 or 128, at most 16 query heads
/// per key head.
pub fn decode_attention_supports(kind: crate::tch::Kind, head_dim: i64, group: i64) -> bool {
    available()
        && kind == crate::tch::Kind::BFloat16
        && matches!(head_dim, 64 | 128)
        && (1..=16).contains(&group)
}

/// Attention of one new query per row, `q [rows, heads, head_dim]` (bf16, contiguous), over the
/// first `positions[r] + 1` keys of row `r`'s sequence in the paged `k_cache` / `v_cache [blocks,
/// block_size, kv_heads, head_dim]`: position `p` is offset `p % block_size` of block
/// `tables[r][p / block_size]` (`tables [rows, width]` int64; block_size a multiple of 16).
/// `read_len` bounds every row's key count. Returns `[rows, heads, head_dim]`.
#[allow(unused_variables, clippy::too_many_arguments)]
pub fn decode_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    tables: &Tensor,
    positions: &Tensor,
    read_len: i64,
    scale: f64,
    arithmetic: PagedArithmetic,
) -> Result<Tensor, KernelError> {
    #[cfg(ooze_cuda_kernels)]
    {
        // SAFETY: live tensors; the shim checks them.
        let raw = unsafe {
            ffi::ooze_decode_attention(
                q.as_ptr().cast(),
                k_cache.as_ptr().cast(),
                v_cache.as_ptr().cast(),
                tables.as_ptr().cast(),
                positions.as_ptr().cast(),
                read_len,
                scale,
                (arithmetic == PagedArithmetic::FlashOrder).into(),
            )
        };
        ffi::result("decode_attention", raw)
    }
    #[cfg(not(ooze_cuda_kernels))]
    Err(KernelError::Unavailable)
}

/// [`rope_store`](super::rope_store) then [`decode_attention`] in [`PagedArithmetic::FlashOrder`],
/// as one kernel: each row's q, k and v come from `qkv [rows, (heads + 2·kv_heads)·head_dim]`
/// (bf16, unit last stride, rows 16-byte aligned), rotated by `args`' tables; the new key and
/// value go into cell `cells[r]` of the caches before the row's keys are read. The same bits in
/// the output and in the caches as the two calls
/// (`gpu_decode_attention_with_rope_equals_separate_kernels`). Models without q/k norms
/// (`args.qk_norm` must be `None`).
#[allow(unused_variables, clippy::too_many_arguments)]
pub fn decode_attention_rope(
    qkv: &Tensor,
    cells: &Tensor,
    k_cache: &mut Tensor,
    v_cache: &mut Tensor,
    args: &RopeStore<'_>,
    tables: &Tensor,
    positions: &Tensor,
    read_len: i64,
    scale: f64,
) -> Result<Tensor, KernelError> {
    if args.qk_norm.is_some() {
        return Err(KernelError::Failed {
            kernel: "decode_attention_rope",
            message: "takes no q/k norms (rope_store then decode_attention does)".into(),
        });
    }
    #[cfg(ooze_cuda_kernels)]
    {
        // SAFETY: live tensors for the duration of the call; the shim checks them.
        let raw = unsafe {
            ffi::ooze_decode_attention_rope(
                qkv.as_ptr().cast(),
                cells.as_ptr().cast(),
                args.cos.as_ptr().cast(),
                args.signed_sin.as_ptr().cast(),
                k_cache.as_mut_ptr().cast(),
                v_cache.as_mut_ptr().cast(),
                tables.as_ptr().cast(),
                positions.as_ptr().cast(),
                args.heads,
                read_len,
                scale,
            )
        };
        ffi::result("decode_attention_rope", raw)
    }
    #[cfg(not(ooze_cuda_kernels))]
    Err(KernelError::Unavailable)
}

/// Attention of new tokens appended to paged sequences, for a prefill, with [`decode_attention`]'s
/// kernel and `arithmetic`: row `b`'s `counts[b]` tokens sit one after another in `q [tokens,
/// heads, head_dim]` (bf16, heads contiguous) at positions `past[b] + i`, and see their sequence's
/// keys through `tables [rows, width]`. Returns `[tokens, heads, head_dim]`.
#[allow(unused_variables, clippy::too_many_arguments)]
pub fn paged_prefill_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    tables: &Tensor,
    past: &[i64],
    counts: &[i64],
    scale: f64,
    arithmetic: PagedArithmetic,
) -> Result<Tensor, KernelError> {
    #[cfg(ooze_cuda_kernels)]
    {
        assert_eq!(past.len(), counts.len(), "a count for every row");
        // SAFETY: live tensors and slices of `rows` entries; the shim checks the tensors.
        let raw = unsafe {
            ffi::ooze_paged_prefill_attention(
                q.as_ptr().cast(),
                k_cache.as_ptr().cast(),
                v_cache.as_ptr().cast(),
                tables.as_ptr().cast(),
                past.as_ptr(),
                counts.as_ptr(),
                past.len() as i64,
                scale,
                (arithmetic == PagedArithmetic::FlashOrder).into(),
            )
        };
        ffi::result("paged_prefill_attention", raw)
    }
    #[cfg(not(ooze_cuda_kernels))]
    Err(KernelError::Unavailable)
}

/// Causal attention within each of several packed sequences with the engine's arithmetic (split
/// attention), for deterministic training: `q [total, heads, head_dim]`, `k`, `v [total, kv_heads,
/// head_dim]` (bf16, CUDA), `cu_seqlens [sequences + 1]` int32 offsets on the device and the
/// same `lengths` on the host. Differentiable: the backward is FlashAttention-2's.
#[allow(unused_variables)]
pub fn split_attention_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_seqlens: &Tensor,
    lengths: &[i64],
    scale: f64,
) -> Result<Tensor, KernelError> {
    #[cfg(ooze_cuda_kernels)]
    {
        // SAFETY: live tensors and a slice of `sequences` lengths; the shim checks them.
        let raw = unsafe {
            ffi::ooze_split_attention_varlen(
                q.as_ptr().cast(),
                k.as_ptr().cast(),
                v.as_ptr().cast(),
                cu_seqlens.as_ptr().cast(),
                lengths.as_ptr(),
                lengths.len() as i64,
                scale,
            )
        };
        ffi::result("split_attention_varlen", raw)
    }
    #[cfg(not(ooze_cuda_kernels))]
    Err(KernelError::Unavailable)
}

/// Causal attention within each of several sequences packed into one: `q [total, heads, head_dim]`,
/// `k`, `v [total, kv_heads, head_dim]` (bf16 or fp16, CUDA), `cu_seqlens [sequences + 1]` int32
/// offsets, `max_seqlen` the longest. FlashAttention-2 (ATen's build of it) with its backward, so
/// training on packed micro-batches does no work across sequence boundaries.
#[allow(unused_variables)]
pub fn flash_attention_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_seqlens: &Tensor,
    max_seqlen: i64,
    scale: f64,
) -> Result<Tensor, KernelError> {
    #[cfg(ooze_cuda_kernels)]
    {
        // SAFETY: live tensors; the shim checks them.
        let raw = unsafe {
            ffi::ooze_flash_attention_varlen(
                q.as_ptr().cast(),
                k.as_ptr().cast(),
                v.as_ptr().cast(),
                cu_seqlens.as_ptr().cast(),
                max_seqlen,
                scale,
            )
        };
        ffi::result("flash_attention_varlen", raw)
    }
    #[cfg(not(ooze_cuda_kernels))]
    Err(KernelError::Unavailable)
}

/// Causal attention over packed sequences straight from the fused projection's output
/// `qkv [total, ≥ (heads + 2·kv_heads)·head_dim]` (bf16 CUDA, q then k then v heads): with
/// `qk_norm`, Qwen3's per-head RMSNorm of q and k (head sizes in [`QK_NORM_TRAINING_HEAD_DIMS`];
/// the arithmetic of [`rope_store`], so the engine's bits), then the rotary embedding of q and k
/// (`cos`, `signed_sin [total, head_dim]` as [`rope`] takes them), then FlashAttention-2 over the
/// sequences at `cu_seqlens` — or, given `slots` (of the same sequences), cuDNN's fused attention
/// over them (a cuDNN that refuses falls back to FlashAttention-2, with one warning). Returns
/// `[total, heads, head_dim]`; differentiable in `qkv` (its gradient comes back as one tensor, no
/// zero-padded per-slice gradients for autograd to add up) and in the norm weights.
#[allow(unused_variables, clippy::too_many_arguments)]
pub fn qkv_flash_attention_varlen(
    qkv: &Tensor,
    cos: &Tensor,
    signed_sin: &Tensor,
    cu_seqlens: &Tensor,
    qk_norm: Option<QkNorm<'_>>,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
    max_seqlen: i64,
    scale: f64,
    slots: Option<&SlotLayout>,
) -> Result<Tensor, KernelError> {
    #[cfg(ooze_cuda_kernels)]
    {
        let groups = slots.map_or(&[][..], |s| &s.groups[..]);
        let rows = slots.and_then(|s| s.rows.as_ref());
        // SAFETY: live tensors (or null norms and rows), groups as the shim reads them; the shim
        // checks them.
        let raw = unsafe {
            ffi::ooze_qkv_flash_attention_varlen(
                qkv.as_ptr().cast(),
                cos.as_ptr().cast(),
                signed_sin.as_ptr().cast(),
                cu_seqlens.as_ptr().cast(),
                qk_norm.map_or(std::ptr::null(), |n| n.q.as_ptr().cast()),
                qk_norm.map_or(std::ptr::null(), |n| n.k.as_ptr().cast()),
                qk_norm.map_or(0.0, |n| n.eps),
                heads,
                kv_heads,
                head_dim,
                max_seqlen,
                scale,
                rows.map_or(std::ptr::null(), |r| r.as_ptr().cast()),
                groups.as_ptr(),
                (groups.len() / 3) as i64,
            )
        };
        ffi::result("qkv_flash_attention_varlen", raw)
    }
    #[cfg(not(ooze_cuda_kernels))]
    Err(KernelError::Unavailable)
}
