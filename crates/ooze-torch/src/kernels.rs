//! ooze's own CUDA kernels (`shim/kernels.cu`, `attention.cu`, `fa_order_attention.cu`,
//! `rms_norm.cu`, `sample.cu`; entry points in
//! `shim/ops.cpp` and `shim/attention_ops.cpp`): steps of a decode step that libtorch would run as
//! several kernels each. Built when the nvcc wheel is present
//! ([`available`]); callers keep the libtorch path for everything else (CPU, other dtypes, autograd).
//!
//! - [`rope_store`]: rotary embedding of q and k (after Qwen3's q/k norms when given), q
//!   returned, k and v written into their cells of the paged KV memory.
//! - [`add_rms_norm`]: the residual add and the RMSNorm after it, in ATen's arithmetic.
//! - [`silu_mul`]: `silu(gate) · up` of a fused gate/up projection.
//! - [`rms_norm_trained`]: ATen's RMSNorm forward with ooze's one-pass backward (training).
//! - [`sample`]: per row, greedy or inverse-CDF token and its log-prob, without full-vocabulary
//!   intermediates.
//! - [`decode_attention`]: one query token per row over its keys (through its block table),
//!   grouped query heads on tensor cores (bf16), in FlashAttention-2's arithmetic
//!   (`shim/fa_order_attention.cu`) or split attention's ([`PagedArithmetic`]).

use crate::tch::Tensor;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

mod attention;
mod slots;
pub use attention::*;
pub use slots::*;

/// A kernel refused its arguments or failed to launch.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(
        "ooze's CUDA kernels are not in this build (no CUDA PyTorch or no nvcc when it was built)"
    )]
    Unavailable,
    #[error("{kernel}: {message}")]
    Failed {
        kernel: &'static str,
        message: String,
    },
}

/// Whether the kernels are used: built into this binary, not turned off by `OOZE_CUDA_KERNELS=0`
/// and not by [`set_enabled`].
pub fn available() -> bool {
    cfg!(ooze_cuda_kernels) && enabled().load(Ordering::Relaxed)
}

/// Turns the kernels off (or back on) for this process: the libtorch operations run instead (for
/// comparisons and for ruling the kernels out when something looks wrong).
pub fn set_enabled(on: bool) {
    enabled().store(on, Ordering::Relaxed);
}

/// Deterministic numerics (`rollout.deterministic`): the engine's decode and the trainer's forward
/// compute every token with the same kernels in the same reduction order — split attention in
/// training too, and log-probs from the trainer's kernel — so a sampled token's log-prob equals
/// the trainer's bitwise, for any batch and row length. (Both modes run GEMMs without split-K,
/// residual adds after the product is rounded, norms and the sampler's log-sum-exp in the
/// trainer's arithmetic; the default mode's decode reproduces FlashAttention-2's arithmetic
/// instead, which is bitwise for rows of up to 4,096 keys and close past them.) Process-wide.
/// Needs the kernels (a CUDA build) to mean anything: callers check [`deterministic_supported`].
pub fn set_deterministic(on: bool) -> Result<(), crate::cuda_graph::GraphError> {
    use crate::cuda_graph::{set_gemm_reduction, GemmReduction};
    if on {
        set_gemm_reduction(GemmReduction::NoSplit)?;
    }
    DETERMINISTIC.store(on, Ordering::Relaxed);
    Ok(())
}

/// Whether [`set_deterministic`] is on.
pub fn deterministic() -> bool {
    DETERMINISTIC.load(Ordering::Relaxed)
}

static DETERMINISTIC: AtomicBool = AtomicBool::new(false);

/// Whether this build and these settings can run deterministic numerics: ooze's kernels, in bf16
/// on a GPU, head sizes 64 or 128 with at most 16 query heads per key head.
pub fn deterministic_supported(
    kind: crate::tch::Kind,
    cuda: bool,
    head_dim: i64,
    group: i64,
) -> bool {
    cuda && decode_attention_supports(kind, head_dim, group)
}

fn enabled() -> &'static AtomicBool {
    static ENABLED: OnceLock<AtomicBool> = OnceLock::new();
    ENABLED
        .get_or_init(|| AtomicBool::new(std::env::var("OOZE_CUDA_KERNELS").as_deref() != Ok("0")))
}

/// The arguments of [`rope_store`] besides the tensors it reads per row.
pub struct RopeStore<'a> {
    /// The rotary tables of each row, `[rows, head_dim]` in the activations' dtype: the cosine
    /// and the sine with its first half negated (`rope::cos_sin`), the ones training rotates with.
    pub cos: &'a Tensor,
    pub signed_sin: &'a Tensor,
    pub heads: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
    /// Qwen3's per-head q/k norms, applied before the rotation in ATen's arithmetic (head sizes
    /// in [`QK_NORM_HEAD_DIMS`]).
    pub qk_norm: Option<QkNorm<'a>>,
}

/// Per-head RMSNorm weights of q and k `[head_dim]`, and the norm's epsilon.
#[derive(Clone, Copy)]
pub struct QkNorm<'a> {
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    pub eps: f64,
}

/// The head sizes [`rope_store`] normalises q and k for itself.
pub const QK_NORM_HEAD_DIMS: [i64; 4] = [32, 64, 128, 256];

/// The head sizes [`qkv_flash_attention_varlen`] normalises q and k for itself in training (its
/// backward holds a head in one warp's lanes, four elements each).
pub const QK_NORM_TRAINING_HEAD_DIMS: [i64; 3] = [32, 64, 128];

#[cfg(ooze_cuda_kernels)]
pub(crate) mod ffi {
    use crate::tch::Tensor;
    use std::ffi::{c_char, c_void};

    /// An `at::Tensor*` (tch's `C_tensor`), passed through untyped.
    pub type CTensor = c_void;

    extern "C" {
        pub fn ooze_ops_last_error() -> *const c_char;
        pub fn ooze_grad_enabled() -> i32;
        pub fn ooze_rope_store(
            qkv: *const CTensor,
            cells: *const CTensor,
            cos: *const CTensor,
            sin: *const CTensor,
            q_norm: *const CTensor,
            k_norm: *const CTensor,
            eps: f64,
            k_cache: *mut CTensor,
            v_cache: *mut CTensor,
            heads: i64,
            kv_heads: i64,
            dim: i64,
        ) -> *mut CTensor;
        pub fn ooze_add_rms_norm(
            x: *const CTensor,
            delta: *const CTensor,
            weight: *const CTensor,
            eps: f64,
            sum: *mut *mut CTensor,
        ) -> *mut CTensor;
        pub fn ooze_silu_mul(gate_up: *const CTensor) -> *mut CTensor;
        pub fn ooze_add_rms_norm_trained(
            x: *const CTensor,
            delta: *const CTensor,
            weight: *const CTensor,
            eps: f64,
            sum_out: *mut *mut CTensor,
        ) -> *mut CTensor;
        pub fn ooze_rms_norm_trained(
            x: *const CTensor,
            weight: *const CTensor,
            eps: f64,
        ) -> *mut CTensor;
        pub fn ooze_linear_log_prob(
            hidden: *const CTensor,
            weight: *const CTensor,
            targets: *const CTensor,
            inv_temp: f64,
            logits_mode: i32,
            chunk_rows: i64,
            log_prob: *mut *mut CTensor,
            entropy: *mut *mut CTensor,
        ) -> i32;
        pub fn ooze_rope(
            x: *const CTensor,
            cos: *const CTensor,
            sin: *const CTensor,
            heads: i64,
            dim: i64,
        ) -> *mut CTensor;
        pub fn ooze_sample(logits: *const CTensor, params: *const CTensor) -> *mut CTensor;
        pub fn ooze_flash_attention_varlen(
            q: *const CTensor,
            k: *const CTensor,
            v: *const CTensor,
            cu_seqlens: *const CTensor,
            max_seqlen: i64,
            scale: f64,
        ) -> *mut CTensor;
        pub fn ooze_qkv_flash_attention_varlen(
            qkv: *const CTensor,
            cos: *const CTensor,
            sin: *const CTensor,
            cu_seqlens: *const CTensor,
            q_norm: *const CTensor,
            k_norm: *const CTensor,
            eps: f64,
            heads: i64,
            kv_heads: i64,
            dim: i64,
            max_seqlen: i64,
            scale: f64,
            slot_rows: *const CTensor,
            slot_groups: *const i64,
            group_count: i64,
        ) -> *mut CTensor;
        pub fn ooze_slot_attention_usable(device: i64) -> i32;
        pub fn ooze_paged_prefill_attention(
            q: *const CTensor,
            k_cache: *const CTensor,
            v_cache: *const CTensor,
            tables: *const CTensor,
            past: *const i64,
            counts: *const i64,
            rows: i64,
            scale: f64,
            flash_order: i32,
        ) -> *mut CTensor;
        pub fn ooze_split_attention_varlen(
            q: *const CTensor,
            k: *const CTensor,
            v: *const CTensor,
            cu_seqlens: *const CTensor,
            lengths: *const i64,
            sequences: i64,
            scale: f64,
        ) -> *mut CTensor;
        pub fn ooze_log_probs(
            logits: *const CTensor,
            targets: *const CTensor,
            inv_temp: f64,
        ) -> *mut CTensor;
        pub fn ooze_decode_attention(
            q: *const CTensor,
            k_cache: *const CTensor,
            v_cache: *const CTensor,
            tables: *const CTensor,
            positions: *const CTensor,
            read_len: i64,
            scale: f64,
            flash_order: i32,
        ) -> *mut CTensor;
        pub fn ooze_decode_attention_rope(
            qkv: *const CTensor,
            cells: *const CTensor,
            cos: *const CTensor,
            sin: *const CTensor,
            k_cache: *mut CTensor,
            v_cache: *mut CTensor,
            tables: *const CTensor,
            positions: *const CTensor,
            heads: i64,
            read_len: i64,
            scale: f64,
        ) -> *mut CTensor;
    }

    /// The error the shim's last failing entry point recorded on this thread.
    pub fn last_error() -> String {
        // SAFETY: the shim returns a pointer to a thread-local, NUL-terminated string that lives
        // until the next failing call on this thread.
        unsafe { std::ffi::CStr::from_ptr(ooze_ops_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    /// Wraps a returned tensor, or reads the error the shim recorded.
    pub fn result(kernel: &'static str, raw: *mut CTensor) -> Result<Tensor, super::KernelError> {
        if raw.is_null() {
            let message = last_error();
            return Err(super::KernelError::Failed { kernel, message });
        }
        // SAFETY: a non-null result is a heap-allocated at::Tensor the caller now owns; tch frees
        // it with delete, as it was allocated with new.
        Ok(unsafe { Tensor::from_ptr(raw.cast()) })
    }
}

/// Rotates q and k of `qkv [rows, (heads + 2·kv_heads)·head_dim]` (rows may be strided, with unit
/// last stride) by the rows' rotary tables ([`RopeStore::cos`]; the same arithmetic as [`rope`]),
/// writes k and v into `k_cache` / `v_cache [blocks,
/// block_size, kv_heads, head_dim]` at the flat cell `cells[r]` (block · block_size + offset), and
/// returns q `[rows, heads, head_dim]`. With [`RopeStore::qk_norm`], each q and k head is
/// RMS-normalised first (Qwen3), with ATen's `rms_norm` bits.
#[allow(unused_variables)]
pub fn rope_store(
    qkv: &Tensor,
    cells: &Tensor,
    k_cache: &mut Tensor,
    v_cache: &mut Tensor,
    args: &RopeStore<'_>,
) -> Result<Tensor, KernelError> {
    #[cfg(ooze_cuda_kernels)]
    {
        // SAFETY: every pointer is a live tensor for the duration of the call; the shim checks
        // shapes, dtypes and devices before touching memory.
        let raw = unsafe {
            ffi::ooze_rope_store(
                qkv.as_ptr().cast(),
                cells.as_ptr().cast(),
                args.cos.as_ptr().cast(),
                args.signed_sin.as_ptr().cast(),
                args.qk_norm
                    .map_or(std::ptr::null(), |n| n.q.as_ptr().cast()),
                args.qk_norm
                    .map_or(std::ptr::null(), |n| n.k.as_ptr().cast()),
                args.qk_norm.map_or(0.0, |n| n.eps),
                k_cache.as_mut_ptr().cast(),
                v_cache.as_mut_ptr().cast(),
                args.heads,
                args.kv_heads,
                args.head_dim,
            )
        };
        ffi::result("rope_store", raw)
    }
    #[cfg(not(ooze_cuda_kernels))]
    Err(KernelError::Unavailable)
}

/// Whether autograd records operations on this thread (libtorch's grad mode): a kernel without a
/// backward may only stand in for ATen when it is off or no input requires a gradient.
pub fn grad_enabled() -> bool {
    #[cfg(ooze_cuda_kernels)]
    {
        // SAFETY: reads a thread-local flag.
        unsafe { ffi::ooze_grad_enabled() != 0 }
    }
    #[cfg(not(ooze_cuda_kernels))]
    true
}

/// The residual add and the RMSNorm after it, in one kernel: for contiguous `x [rows, n]` (CUDA,
/// bf16 or fp32, `n` a multiple of 4), `delta` like it and `weight [n]`, returns `(sum, normed)`
/// with `sum = x + delta` and `normed` the RMSNorm of `sum` times `weight`. The bits are ATen's
/// `x + delta` followed by `at::rms_norm`, what the trainer's forward computes
/// (`shim/rms_norm.cuh`). No backward: decode and scoring only.
#[allow(unused_variables)]
pub fn add_rms_norm(
    x: &Tensor,
    delta: &Tensor,
    weight: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor), KernelError> {
    #[cfg(ooze_cuda_kernels)]
    return sum_and_normed(
        "add_rms_norm",
        ffi::ooze_add_rms_norm,
        x,
        delta,
        weight,
        eps,
    );
    #[cfg(not(ooze_cuda_kernels))]
    Err(KernelError::Unavailable)
}

/// An add-and-norm entry point of the shim: live tensors in; on success it hands over two
/// heap-allocated tensors, the sum through its out-parameter and the normed rows as the result.
#[cfg(ooze_cuda_kernels)]
fn sum_and_normed(
    kernel: &'static str,
    entry: unsafe extern "C" fn(
        *const ffi::CTensor,
        *const ffi::CTensor,
        *const ffi::CTensor,
        f64,
        *mut *mut ffi::CTensor,
    ) -> *mut ffi::CTensor,
    x: &Tensor,
    delta: &Tensor,
    weight: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor), KernelError> {
    let mut sum = std::ptr::null_mut();
    // SAFETY: live tensors; the shim checks them and owns nothing it returns.
    let normed = unsafe {
        entry(
            x.as_ptr().cast(),
            delta.as_ptr().cast(),
            weight.as_ptr().cast(),
            eps,
            &mut sum,
        )
    };
    let normed = ffi::result(kernel, normed)?;
    Ok((ffi::result(kernel, sum)?, normed))
}

/// Widths [`rms_norm_trained`] takes: multiples of 8 up to 8192.
pub fn rms_norm_trained_fits(width: i64) -> bool {
    width % 8 == 0 && (8..=8192).contains(&width)
}

/// RMSNorm of contiguous bf16 `x [..., n]` with `weight [n]`, differentiable: the forward is
/// ATen's `rms_norm` (bitwise), the backward ooze's kernel, one pass over the rows for the input's
/// gradient and the weight's partial sums (summed in a fixed order afterwards).
/// `n` must satisfy [`rms_norm_trained_fits`].
#[allow(unused_variables)]
pub fn rms_norm_trained(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor, KernelError> {
    #[cfg(ooze_cuda_kernels)]
    {
        // SAFETY: live tensors; the shim checks them.
        let raw =
            unsafe { ffi::ooze_rms_norm_trained(x.as_ptr().cast(), weight.as_ptr().cast(), eps) };
        ffi::result("rms_norm_trained", raw)
    }
    #[cfg(not(ooze_cuda_kernels))]
    Err(KernelError::Unavailable)
}

/// [`add_rms_norm`] for training: `(x + delta, rms_norm(x + delta))` with the same bits,
/// differentiable; the backward adds the sum's own gradient into the norm's in one pass. bf16,
/// contiguous, one shape; the width must satisfy [`rms_norm_trained_fits`].
#[allow(unused_variables)]
pub fn add_rms_norm_trained(
    x: &Tensor,
    delta: &Tensor,
    weight: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor), KernelError> {
    #[cfg(ooze_cuda_kernels)]
    return sum_and_normed(
        "add_rms_norm_trained",
        ffi::ooze_add_rms_norm_trained,
        x,
        delta,
        weight,
        eps,
    );
    #[cfg(not(ooze_cuda_kernels))]
    Err(KernelError::Unavailable)
}

/// `silu(gate_up[:, :w]) · gate_up[:, w:]` for a contiguous `[rows, 2w]` tensor, rounded as
/// PyTorch rounds the two operations; differentiable (a fused backward kernel).
#[allow(unused_variables)]
pub fn silu_mul(gate_up: &Tensor) -> Result<Tensor, KernelError> {
    #[cfg(ooze_cuda_kernels)]
    {
        // SAFETY: a live tensor; the shim checks it.
        let raw = unsafe { ffi::ooze_silu_mul(gate_up.as_ptr().cast()) };
        ffi::result("silu_mul", raw)
    }
    #[cfg(not(ooze_cuda_kernels))]
    Err(KernelError::Unavailable)
}

/// One token per row of fp32 `logits [rows, vocab]`: `params [3, rows]` (fp32, same device) holds
/// each row's inverse temperature `1/T` (1 for greedy; computed as [`log_probs`] is given it:
/// `(1.0 / T) as f32`), greedy flag (0 or 1) and uniform number in [0, 1). Returns `[2, rows]`
/// float64: the tokens, then their log-probs `log_softmax(logits · 1/T)`, bitwise those of
/// [`log_probs`] and [`linear_log_prob`] for the same logits (one arithmetic for the row's
/// log-sum-exp). Sampled rows take the inverse CDF in vocabulary order; each row's arithmetic is
/// fixed, so its token does not depend on the other rows.
#[allow(unused_variables)]
pub fn sample(logits: &Tensor, params: &Tensor) -> Result<Tensor, KernelError> {
    #[cfg(ooze_cuda_kernels)]
    {
        // SAFETY: live tensors; the shim checks them.
        let raw = unsafe { ffi::ooze_sample(logits.as_ptr().cast(), params.as_ptr().cast()) };
        ffi::result("sample", raw)
    }
    #[cfg(not(ooze_cuda_kernels))]
    Err(KernelError::Unavailable)
}

/// `log_softmax(logits / temperature)` at `targets [rows]` of fp32 `logits [rows, vocab]`
/// (contiguous), with the arithmetic of [`linear_log_prob`]: a sampled token's log-prob exactly
/// as the trainer computes it from the same logits.
#[allow(unused_variables)]
pub fn log_probs(
    logits: &Tensor,
    targets: &Tensor,
    temperature: f64,
) -> Result<Tensor, KernelError> {
    #[cfg(ooze_cuda_kernels)]
    {
        // SAFETY: live tensors; the shim checks them.
        let raw = unsafe {
            ffi::ooze_log_probs(
                logits.as_ptr().cast(),
                targets.as_ptr().cast(),
                1.0 / temperature,
            )
        };
        ffi::result("log_probs", raw)
    }
    #[cfg(not(ooze_cuda_kernels))]
    Err(KernelError::Unavailable)
}

/// The rotary embedding (rotate-half layout; `signed_sin` as `rope::cos_sin` makes it) of the first
/// `heads` heads of each row of `x [tokens, ≥ heads·head_dim]` (unit last stride), with `cos`,
/// `signed_sin [tokens, head_dim]`. Returns `[tokens, heads, head_dim]`; differentiable in `x`
/// (the backward rotates the gradient back).
#[allow(unused_variables)]
pub fn rope(
    x: &Tensor,
    cos: &Tensor,
    signed_sin: &Tensor,
    heads: i64,
    head_dim: i64,
) -> Result<Tensor, KernelError> {
    #[cfg(ooze_cuda_kernels)]
    {
        // SAFETY: live tensors; the shim checks them.
        let raw = unsafe {
            ffi::ooze_rope(
                x.as_ptr().cast(),
                cos.as_ptr().cast(),
                signed_sin.as_ptr().cast(),
                heads,
                head_dim,
            )
        };
        ffi::result("rope", raw)
    }
    #[cfg(not(ooze_cuda_kernels))]
    Err(KernelError::Unavailable)
}

/// How [`linear_log_prob`] makes the LM head's logits, and what its backward reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadLogits {
    /// fp32 from the matmul; the backward recomputes them in fp32 (activation recomputation).
    Recompute = 0,
    /// fp32 from the matmul (the engine's arithmetic: its log-probs are these bitwise), held
    /// rounded to bf16 for the backward (2 bytes per logit; the rounding autocast PyTorch trains
    /// with).
    KeepRounded = 1,
    /// bf16 from the matmul for the forward and the backward, as autocast makes them: half the
    /// bytes written and read, and log-probs of the rounded logits (not the engine's). bf16
    /// rows only (fp32 rows recompute).
    Bf16 = 2,
}

/// `log_softmax(hidden·Wᵀ / temperature)` at `targets [rows]` and the entropy of each row's
/// distribution, for `hidden [rows, h]` and the LM head `weight [vocab, h]` (bf16 or fp32, CUDA):
/// the logits come from the matmul as `logits` says (fp32 ones `chunk_rows` (≥ 1) rows at a time:
/// at most that many rows of fp32 logits exist at once); the log-probs are differentiable in
/// `hidden` and `weight`, the entropies are not. One autograd node covers every chunk: its
/// backward accumulates the weight gradient inside the matmul.
#[allow(unused_variables)]
pub fn linear_log_prob(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    temperature: f64,
    logits: HeadLogits,
    chunk_rows: i64,
) -> Result<(Tensor, Tensor), KernelError> {
    #[cfg(ooze_cuda_kernels)]
    {
        let (mut log_prob, mut entropy) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: live tensors in; on success the shim hands over two heap-allocated tensors.
        let code = unsafe {
            ffi::ooze_linear_log_prob(
                hidden.as_ptr().cast(),
                weight.as_ptr().cast(),
                targets.as_ptr().cast(),
                1.0 / temperature,
                logits as i32,
                chunk_rows,
                &mut log_prob,
                &mut entropy,
            )
        };
        if code != 0 {
            return ffi::result("linear_log_prob", std::ptr::null_mut())
                .map(|t| (t.shallow_clone(), t));
        }
        Ok((
            ffi::result("linear_log_prob", log_prob)?,
            ffi::result("linear_log_prob", entropy)?,
        ))
    }
    #[cfg(not(ooze_cuda_kernels))]
    Err(KernelError::Unavailable)
}
