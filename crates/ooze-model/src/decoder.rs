//! The decoder shared by Qwen2/Qwen2.5, Qwen3 and Llama 3.x: pre-norm blocks of grouped-query
//! attention with RoPE and a SiLU-gated MLP, RMSNorm everywhere, an LM head tied to the embeddings
//! or not. Family quirks (q/k/v bias, q/k RMSNorm, Llama 3 RoPE scaling) come from [`ModelConfig`].
//!
//! Parameters are named exactly as in the transformers state dict (`model.layers.{i}.self_attn.q_proj.weight`
//! …), so loading and saving is a rename-free walk. Weights never hold per-request state: attention
//! context lives in a [`KvCache`] that the caller owns, so the same weights serve training (full
//! sequences, autograd) and decoding.
//!
//! Attention layouts ([`Attention`], in [`crate::attention`]): right-padded batches use the causal
//! kernel directly (padding sits after every real token, so causality already hides it); packed
//! batches use FlashAttention over variable lengths on a GPU and a block-diagonal causal mask
//! elsewhere; incremental decoding attends to the cache plus the new tokens; paged decoding (the
//! engine's block tables) runs ooze's fused kernels on a GPU. A forward pass can also run a range of blocks
//! ([`Decoder::run_layers`]), which activation recomputation replays one block at a time.

use crate::attention::{Arithmetic, KvTarget};
pub use crate::attention::{Attention, KvCache, PagedKv, KEY_ALIGN};
use crate::checkpoint::{export_model, save_weights, SaveOptions, WeightSet};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::rope;
use ooze_torch::kernels;

mod attend;
mod plan;
use ooze_torch::tch::{Device, Kind, Tensor};
use std::path::Path;

/// Norm widths from which training takes ooze's RMSNorm backward (the hidden size's norms; the
/// per-head q/k norms of Qwen3 keep ATen's).
const TRAINED_NORM_MIN_WIDTH: i64 = 256;

/// Whether training takes ooze's RMSNorm (ATen's forward bits, ooze's backward) for `x` under
/// `weight`: gradients recorded, bf16 on a GPU, contiguous rows of a fitting width.
fn trained_norm_fits(x: &Tensor, weight: &Tensor) -> bool {
    let n = weight.size()[0];
    kernels_fit(x)
        && x.kind() == Kind::BFloat16
        && weight.kind() == Kind::BFloat16
        && x.is_contiguous()
        && n >= TRAINED_NORM_MIN_WIDTH
        && kernels::rms_norm_trained_fits(n)
        && kernels::grad_enabled()
        && (x.requires_grad() || weight.requires_grad())
}

/// RMSNorm as transformers computes it: normalise in fp32, cast back, then scale.
fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Tensor {
    if trained_norm_fits(x, weight) {
        return kernels::rms_norm_trained(x, weight, eps)
            .expect("invariant: contiguous bf16 rows of a fitting width are valid");
    }
    // ATen's fused kernel: statistics in fp32, one pass; the same formula as transformers' module.
    x.rms_norm([weight.size()[0]].as_slice(), Some(weight), eps)
}

/// A linear layer's weight and optional bias.
type Projection = (Tensor, Option<Tensor>);

/// Concatenates projections along their output rows (one matmul instead of several).
fn fuse(parts: &[Projection]) -> Projection {
    let weight = Tensor::cat(&parts.iter().map(|p| &p.0).collect::<Vec<_>>(), 0);
    let bias = parts.iter().all(|p| p.1.is_some()).then(|| {
        Tensor::cat(
            &parts
                .iter()
                .map(|p| p.1.as_ref().expect("checked"))
                .collect::<Vec<_>>(),
            0,
        )
    });
    (weight, bias)
}

/// The parts of a fused projection with `rows` output rows each, as views into it (so saving and
/// in-place updates of a part see the fused tensor).
fn split(fused: &Projection, rows: &[i64]) -> Vec<Projection> {
    let mut start = 0;
    rows.iter()
        .map(|&n| {
            let part = (
                fused.0.narrow(0, start, n),
                fused.1.as_ref().map(|b| b.narrow(0, start, n)),
            );
            start += n;
            part
        })
        .collect()
}

fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Tensor {
    if x.device().is_cuda() && !x.requires_grad() {
        return as_two_rows(x, |rows| rows.linear(weight, bias));
    }
    x.linear(weight, bias)
}

/// `product(x)` for a GPU product over the rows of `x [.., k]`, with a single row run as two (the
/// row twice): cuBLAS takes another path for one row, whose sums differ in the last bits from the
/// same row's in a batch, the trainer's (measured on the 0.5B shape's down projection and on the
/// LM head). A decode step of one sequence is such a product.
fn as_two_rows(x: &Tensor, product: impl Fn(&Tensor) -> Tensor) -> Tensor {
    let size = x.size();
    let k = size[size.len() - 1];
    if x.numel() as i64 != k {
        return product(x);
    }
    let y = product(&x.reshape([1, k]).expand([2, k], false).contiguous()).narrow(0, 0, 1);
    let mut shape = size;
    let last = shape.len() - 1;
    shape[last] = y.size()[1];
    y.reshape(shape.as_slice())
}

/// `x + delta` (the residual stream and a block's output, the product rounded before the add: a
/// GEMM's accumulate-into-C rounds once, and only for some row counts, so it would make a decode
/// step's residual stream depend on its batch) and the RMSNorm of the sum under `weight`. On a
/// GPU one of ooze's kernels does both with ATen's bits: without gradients, or in bf16 training
/// (then with a backward that adds the sum's gradient into the norm's in the same pass).
fn add_rms_norm(x: &Tensor, delta: &Tensor, weight: &Tensor, eps: f64) -> (Tensor, Tensor) {
    let fused = kernels_apply(x)
        && !(kernels::grad_enabled() && (delta.requires_grad() || weight.requires_grad()))
        && x.is_contiguous()
        && delta.is_contiguous()
        && delta.size() == x.size()
        && delta.kind() == x.kind()
        && weight.kind() == x.kind()
        && weight.size()[0] % 4 == 0;
    if fused {
        let n = weight.size()[0];
        let (sum, normed) =
            kernels::add_rms_norm(&x.view([-1, n]), &delta.view([-1, n]), weight, eps)
                .expect("invariant: contiguous rows of a multiple of 4 are valid for add_rms_norm");
        return (sum.view_as(x), normed.view_as(x));
    }
    if trained_norm_fits(x, weight)
        && delta.is_contiguous()
        && delta.size() == x.size()
        && delta.kind() == x.kind()
    {
        return kernels::add_rms_norm_trained(x, delta, weight, eps)
            .expect("invariant: contiguous bf16 rows of a fitting width are valid");
    }
    let sum = x + delta;
    let normed = rms_norm(&sum, weight, eps);
    (sum, normed)
}

/// Whether ooze's CUDA kernels can stand in for libtorch operations on `x`: a CUDA tensor of a
/// dtype they take.
fn kernels_fit(x: &Tensor) -> bool {
    kernels::available() && x.device().is_cuda() && matches!(x.kind(), Kind::Float | Kind::BFloat16)
}

/// [`kernels_fit`] for the decode-only kernels, which have no backward.
fn kernels_apply(x: &Tensor) -> bool {
    kernels_fit(x) && !x.requires_grad()
}

/// `silu(gate) · up` of the fused gate/up projection output `[.., 2 · width]` (the kernel has a
/// backward, so training uses it too).
fn silu_mul(gate_up: &Tensor, width: i64) -> Tensor {
    if kernels_fit(gate_up) && gate_up.is_contiguous() {
        let mut shape = gate_up.size();
        let last = shape.len() - 1;
        shape[last] = width;
        let gated = kernels::silu_mul(&gate_up.view([-1, 2 * width]))
            .expect("invariant: a contiguous CUDA gate/up output is valid for silu_mul");
        return gated.view(shape.as_slice());
    }
    gate_up.narrow(-1, 0, width).silu() * gate_up.narrow(-1, width, width)
}

struct Layer {
    input_norm: Tensor,
    /// q, k and v projections in one matrix (rows q, then k, then v): one matmul per layer.
    /// Checkpoints name the parts ([`split`]).
    qkv: Projection,
    /// gate and up projections in one matrix.
    gate_up: Projection,
    o: Projection,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    post_norm: Tensor,
    down: Projection,
}

/// Turns on deterministic numerics (`ooze_torch::kernels::set_deterministic`) for a model of
/// `config` computing in `kind` on `device`, after checking that ooze's kernels can run it there;
/// the error says what is missing (the caller names its key or flag).
pub fn enable_deterministic(
    config: &ModelConfig,
    kind: Kind,
    device: Device,
) -> Result<(), String> {
    let group = config.num_heads / config.num_kv_heads.max(1);
    if !kernels::deterministic_supported(kind, device.is_cuda(), config.head_dim, group) {
        return Err(format!(
            "needs ooze's CUDA kernels on a GPU in bf16 with head size 64 or 128 and at most 16 query heads per key head; here: {device:?}, {kind:?}, head size {}, {group} query heads per key head, kernels {}",
            config.head_dim,
            if kernels::available() { "built" } else { "not in this build or off (OOZE_CUDA_KERNELS=0)" }
        ));
    }
    kernels::set_deterministic(true).map_err(|e| e.to_string())
}

/// A loaded decoder.
pub struct Decoder {
    pub config: ModelConfig,
    embed_tokens: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    /// `None` when tied to `embed_tokens`.
    lm_head: Option<Tensor>,
    inv_freq: Tensor,
    device: Device,
    kind: Kind,
    arithmetic: Arithmetic,
}

impl Decoder {
    /// Loads `config.json` and the safetensors weights of an HF model directory.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Decoder> {
        let config = ModelConfig::load(dir)?;
        let weights = WeightSet::load(dir, device, kind)?;
        Self::from_weights(config, weights, device, kind)
    }

    /// Builds the decoder from loaded tensors, checking every name and shape against the config.
    pub fn from_weights(
        config: ModelConfig,
        mut w: WeightSet,
        device: Device,
        kind: Kind,
    ) -> Result<Decoder> {
        if device.is_cuda() {
            // bf16/fp16 GEMMs without split-K, process-wide: a row's product then does not
            // depend on how many rows share the GEMM (a decode step's batch against the trainer's
            // sequences).
            ooze_torch::cuda_graph::set_gemm_reduction(
                ooze_torch::cuda_graph::GemmReduction::NoSplit,
            )
            .map_err(|e| {
                crate::ModelError::Invalid(format!("setting cuBLAS's GEMM reduction: {e}"))
            })?;
        }
        let c = &config;
        let (h, q_dim, kv_dim) = (
            c.hidden_size,
            c.num_heads * c.head_dim,
            c.num_kv_heads * c.head_dim,
        );
        let proj = |w: &mut WeightSet,
                    name: String,
                    out: i64,
                    inp: i64,
                    bias: bool|
         -> Result<Projection> {
            let weight = w.take(&format!("{name}.weight"), &[out, inp])?;
            let bias = if bias {
                Some(w.take(&format!("{name}.bias"), &[out])?)
            } else {
                None
            };
            Ok((weight, bias))
        };
        let embed_tokens = w.take("model.embed_tokens.weight", &[c.vocab_size, h])?;
        let mut layers = Vec::with_capacity(c.num_layers as usize);
        for i in 0..c.num_layers {
            let p = format!("model.layers.{i}");
            let attn = format!("{p}.self_attn");
            let mlp = format!("{p}.mlp");
            let q = proj(&mut w, format!("{attn}.q_proj"), q_dim, h, c.qkv_bias)?;
            let k = proj(&mut w, format!("{attn}.k_proj"), kv_dim, h, c.qkv_bias)?;
            let v = proj(&mut w, format!("{attn}.v_proj"), kv_dim, h, c.qkv_bias)?;
            let gate = proj(
                &mut w,
                format!("{mlp}.gate_proj"),
                c.intermediate_size,
                h,
                c.mlp_bias,
            )?;
            let up = proj(
                &mut w,
                format!("{mlp}.up_proj"),
                c.intermediate_size,
                h,
                c.mlp_bias,
            )?;
            layers.push(Layer {
                qkv: fuse(&[q, k, v]),
                gate_up: fuse(&[gate, up]),
                input_norm: w.take(&format!("{p}.input_layernorm.weight"), &[h])?,
                o: proj(&mut w, format!("{attn}.o_proj"), h, q_dim, c.o_bias)?,
                q_norm: if c.qk_norm {
                    Some(w.take(&format!("{attn}.q_norm.weight"), &[c.head_dim])?)
                } else {
                    None
                },
                k_norm: if c.qk_norm {
                    Some(w.take(&format!("{attn}.k_norm.weight"), &[c.head_dim])?)
                } else {
                    None
                },
                post_norm: w.take(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                down: proj(
                    &mut w,
                    format!("{mlp}.down_proj"),
                    h,
                    c.intermediate_size,
                    c.mlp_bias,
                )?,
            });
        }
        let norm = w.take("model.norm.weight", &[h])?;
        let lm_head = if c.tie_word_embeddings {
            w.discard("lm_head.weight");
            None
        } else {
            Some(w.take("lm_head.weight", &[c.vocab_size, h])?)
        };
        w.finish()?;
        let inv_freq = rope::inverse_frequencies(&c.rope, c.head_dim, device);
        Ok(Decoder {
            config,
            embed_tokens,
            layers,
            norm,
            lm_head,
            inv_freq,
            device,
            kind,
            arithmetic: Arithmetic::default(),
        })
    }

    /// A second decoder over the same parameter storage (no copy): a colocated rollout engine and
    /// trainer each hold one, so an optimizer step that writes the parameters in place is the
    /// weight update of the engine too. Its packed attention is the default (the engine's
    /// arithmetic), whatever this one's.
    pub fn share(&self) -> Decoder {
        let p = |(w, b): &Projection| (w.shallow_clone(), b.as_ref().map(Tensor::shallow_clone));
        let o = |t: &Option<Tensor>| t.as_ref().map(Tensor::shallow_clone);
        Decoder {
            config: self.config.clone(),
            embed_tokens: self.embed_tokens.shallow_clone(),
            layers: self
                .layers
                .iter()
                .map(|l| Layer {
                    input_norm: l.input_norm.shallow_clone(),
                    qkv: p(&l.qkv),
                    gate_up: p(&l.gate_up),
                    o: p(&l.o),
                    q_norm: o(&l.q_norm),
                    k_norm: o(&l.k_norm),
                    post_norm: l.post_norm.shallow_clone(),
                    down: p(&l.down),
                })
                .collect(),
            norm: self.norm.shallow_clone(),
            lm_head: o(&self.lm_head),
            inv_freq: self.inv_freq.shallow_clone(),
            device: self.device,
            kind: self.kind,
            arithmetic: Arithmetic::default(),
        }
    }

    /// The arithmetic of packed passes from now on ([`Arithmetic`]).
    pub fn set_arithmetic(&mut self, arithmetic: Arithmetic) {
        self.arithmetic = arithmetic;
    }

    /// The arithmetic of packed passes ([`Decoder::set_arithmetic`]).
    pub fn arithmetic(&self) -> Arithmetic {
        self.arithmetic
    }

    pub fn device(&self) -> Device {
        self.device
    }
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The LM head matrix `[vocab, hidden]`.
    pub fn head_weight(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }

    /// All parameters with their transformers state-dict names, in checkpoint order.
    pub fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.parameters(false)
    }

    /// The tensors an optimizer updates (each exactly once): the fused q/k/v and gate/up matrices
    /// themselves — named `…self_attn.qkv_proj.weight` / `…mlp.gate_up_proj.weight` — instead of
    /// the per-projection views that [`Decoder::named_parameters`] lists for checkpoints.
    pub fn trainable_parameters(&self) -> Vec<(String, Tensor)> {
        self.parameters(true)
    }

    /// The parameters in checkpoint order, with the projections as the fused matrices or as the
    /// per-projection views.
    fn parameters(&self, fused: bool) -> Vec<(String, Tensor)> {
        (0..self.num_units())
            .flat_map(|u| self.unit(u, fused))
            .collect()
    }

    /// Units of parameters, the parts sharded training gathers one at a time: the embeddings,
    /// then every block, then the final norm with an untied LM head.
    pub fn num_units(&self) -> usize {
        self.layers.len() + 2
    }

    /// Unit `u`'s trainable tensors ([`Decoder::trainable_parameters`] order). With a tied head
    /// the head is the embeddings, unit 0.
    pub fn unit_parameters(&self, u: usize) -> Vec<(String, Tensor)> {
        self.unit(u, true)
    }

    fn unit(&self, u: usize, fused: bool) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        let mut push = |name: String, t: &Tensor| out.push((name, t.shallow_clone()));
        if u == 0 {
            push("model.embed_tokens.weight".into(), &self.embed_tokens);
        } else if u == self.layers.len() + 1 {
            push("model.norm.weight".into(), &self.norm);
            if let Some(head) = &self.lm_head {
                push("lm_head.weight".into(), head);
            }
        } else {
            let (i, l) = (u - 1, &self.layers[u - 1]);
            let c = &self.config;
            let p = format!("model.layers.{i}");
            push(format!("{p}.input_layernorm.weight"), &l.input_norm);
            let projections: Vec<(&str, Projection)> = if fused {
                let p = |(w, b): &Projection| {
                    (w.shallow_clone(), b.as_ref().map(|b| b.shallow_clone()))
                };
                vec![
                    ("self_attn.qkv_proj", p(&l.qkv)),
                    ("self_attn.o_proj", p(&l.o)),
                    ("mlp.gate_up_proj", p(&l.gate_up)),
                    ("mlp.down_proj", p(&l.down)),
                ]
            } else {
                let (q, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
                let mut qkv = split(&l.qkv, &[q, kv, kv]).into_iter();
                let mut gate_up = split(&l.gate_up, &[c.intermediate_size; 2]).into_iter();
                let next = |parts: &mut std::vec::IntoIter<Projection>| {
                    parts.next().expect("invariant: split gives every part")
                };
                vec![
                    ("self_attn.q_proj", next(&mut qkv)),
                    ("self_attn.k_proj", next(&mut qkv)),
                    ("self_attn.v_proj", next(&mut qkv)),
                    (
                        "self_attn.o_proj",
                        (
                            l.o.0.shallow_clone(),
                            l.o.1.as_ref().map(|b| b.shallow_clone()),
                        ),
                    ),
                    ("mlp.gate_proj", next(&mut gate_up)),
                    ("mlp.up_proj", next(&mut gate_up)),
                    (
                        "mlp.down_proj",
                        (
                            l.down.0.shallow_clone(),
                            l.down.1.as_ref().map(|b| b.shallow_clone()),
                        ),
                    ),
                ]
            };
            for (name, (weight, bias)) in projections {
                push(format!("{p}.{name}.weight"), &weight);
                if let Some(b) = bias {
                    push(format!("{p}.{name}.bias"), &b);
                }
            }
            if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
                push(format!("{p}.self_attn.q_norm.weight"), qn);
                push(format!("{p}.self_attn.k_norm.weight"), kn);
            }
            push(format!("{p}.post_attention_layernorm.weight"), &l.post_norm);
        }
        out
    }

    /// Replaces the weights in place (same shapes, same device and dtype as now) with `weights`,
    /// e.g. a newer checkpoint of the same model. Every parameter must be present with its shape.
    pub fn update_weights(&mut self, mut weights: WeightSet) -> Result<()> {
        let _guard = ooze_torch::tch::no_grad_guard();
        let params = self.named_parameters();
        // Check everything first, so a bad checkpoint changes nothing.
        let mut incoming = Vec::with_capacity(params.len());
        for (name, param) in &params {
            incoming.push(weights.take(name, &param.size())?);
        }
        if self.config.tie_word_embeddings {
            weights.discard("lm_head.weight");
        }
        weights.finish()?;
        for ((_, mut param), new) in params.into_iter().zip(incoming) {
            param.f_copy_(&new)?;
        }
        Ok(())
    }

    /// Saves a complete model directory into `out`: these weights, with the config and tokenizer
    /// files of the model directory `source` they were loaded from.
    pub fn save(&self, source: &Path, out: &Path, options: SaveOptions) -> Result<()> {
        export_model(source, out, &self.named_parameters(), options)
    }

    /// Saves only the weights into `dir`.
    pub fn save_weights(&self, dir: &Path, options: SaveOptions) -> Result<()> {
        save_weights(dir, &self.named_parameters(), options)?;
        Ok(())
    }

    /// Runs the blocks and the final norm: token ids `[B, T]` (int64) and positions `[B, T]` →
    /// hidden states `[B, T, hidden]`.
    pub fn hidden_states(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        attention: Attention<'_>,
    ) -> Tensor {
        let x = self.embed(input_ids);
        let (x, last) = self.run_blocks(x, 0..self.layers.len(), positions, attention);
        match last {
            Some(delta) => add_rms_norm(&x, &delta, &self.norm, self.config.rms_norm_eps).1,
            None => self.final_norm(&x),
        }
    }

    /// The token embeddings `[B, T, hidden]` of `input_ids [B, T]`.
    pub fn embed(&self, input_ids: &Tensor) -> Tensor {
        Tensor::embedding(&self.embed_tokens, input_ids, -1, false, false)
    }

    /// The final RMSNorm (after the last block).
    pub fn final_norm(&self, x: &Tensor) -> Tensor {
        rms_norm(x, &self.norm, self.config.rms_norm_eps)
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Runs blocks `layers` on the residual stream `x [B, T, hidden]` (the embeddings, or the
    /// output of the blocks before): what activation recomputation replays one block at a time.
    pub fn run_layers(
        &self,
        x: Tensor,
        layers: std::ops::Range<usize>,
        positions: &Tensor,
        attention: Attention<'_>,
    ) -> Tensor {
        // Out of place (not `+=`): an in-place add would overwrite a tensor that autograd saved
        // for the backward pass of the norm before it.
        match self.run_blocks(x, layers, positions, attention) {
            (x, Some(delta)) => x + delta,
            (x, None) => x,
        }
    }

    /// [`Decoder::run_layers`] without the last block's residual add: the residual stream and
    /// the output of the last block's MLP still to be added to it (`None` for no blocks), so the
    /// add can run with the norm that follows it.
    fn run_blocks(
        &self,
        mut x: Tensor,
        layers: std::ops::Range<usize>,
        positions: &Tensor,
        attention: Attention<'_>,
    ) -> (Tensor, Option<Tensor>) {
        let c = &self.config;
        let size = x.size();
        let (b, t) = (size[0], size[1]);
        let (cos, sin) = match &attention {
            Attention::PagedDecode { rope, past, .. } => rope.rows(past),
            _ => rope::cos_sin(&self.inv_freq, positions, self.kind),
        };
        let (plan, mut target) = self.plan_attention(attention, &x, t);
        // Each block's last residual add waits for the next block's first norm (or the caller's
        // final norm), so the two run as one kernel where they can (add_rms_norm).
        let mut pending: Option<Tensor> = None;
        for (i, l) in self
            .layers
            .iter()
            .enumerate()
            .take(layers.end)
            .skip(layers.start)
        {
            let hn = match pending.take() {
                Some(delta) => {
                    let (sum, hn) = add_rms_norm(&x, &delta, &l.input_norm, c.rms_norm_eps);
                    x = sum;
                    hn
                }
                None => rms_norm(&x, &l.input_norm, c.rms_norm_eps),
            };
            let qkv = linear(&hn, &l.qkv.0, l.qkv.1.as_ref());
            let attn = self.attend(i, &qkv, &cos, &sin, &mut target, &plan, b, t);
            let attn = attn
                .transpose(1, 2)
                .reshape([b, t, c.num_heads * c.head_dim]);
            let attn = linear(&attn, &l.o.0, l.o.1.as_ref());
            let (sum, hn) = add_rms_norm(&x, &attn, &l.post_norm, c.rms_norm_eps);
            x = sum;
            let gate_up = linear(&hn, &l.gate_up.0, l.gate_up.1.as_ref());
            let gated = silu_mul(&gate_up, c.intermediate_size);
            pending = Some(linear(&gated, &l.down.0, l.down.1.as_ref()));
        }
        if let (KvTarget::Contiguous(cache), true) = (target, layers.end == self.layers.len()) {
            cache.len += t;
        }
        (x, pending)
    }

    fn rope_kernel_fits(&self) -> bool {
        self.config.head_dim % 2 == 0 && self.config.head_dim <= 256
    }

    /// FlashAttention-2 takes head sizes that are multiples of 8, up to 256.
    fn flash_attention_fits(&self) -> bool {
        self.config.head_dim % 8 == 0 && self.config.head_dim <= 256
    }

    fn decode_attention_kernel_fits(&self) -> bool {
        let c = &self.config;
        kernels::decode_attention_supports(self.kind, c.head_dim, c.num_heads / c.num_kv_heads)
    }

    /// The rotary tables of positions `0..len` ([`Attention::PagedDecode`]'s `rope`).
    pub fn rope_tables(&self, len: i64) -> rope::RopeTables {
        rope::RopeTables::new(&self.inv_freq, len, self.kind)
    }

    /// Whether one-token decode steps run ooze's decode attention kernel: its cost follows each
    /// row's own key count, not the number of positions read (see `PagedDecode::read_len`).
    pub fn decode_attention_fused(&self) -> bool {
        self.device.is_cuda()
            && kernels::available()
            && self.rope_kernel_fits()
            && self.decode_attention_kernel_fits()
    }

    /// Logits `[.., vocab]` for hidden states `[.., hidden]`, in the model dtype.
    pub fn logits(&self, hidden: &Tensor) -> Tensor {
        hidden.matmul(&self.head_weight().tr())
    }

    /// fp32 logits `[N, vocab]` (fp64 for an fp64 model) for hidden states `[N, hidden]`. On a GPU in bf16/fp16 without
    /// autograd the head's matrix multiply writes fp32 itself: the logits are never rounded to 16
    /// bits (so sampling and scoring see the same values) and there is no separate upcast pass.
    pub fn logits_f32(&self, hidden: &Tensor) -> Tensor {
        if hidden.device().is_cuda()
            && matches!(self.kind, Kind::BFloat16 | Kind::Half)
            && !hidden.requires_grad()
        {
            as_two_rows(hidden, |rows| {
                rows.mm_dtype(&self.head_weight().tr(), Kind::Float)
            })
        } else if self.kind == Kind::Double {
            // fp64 models (gradient checks) keep their precision.
            self.logits(hidden)
        } else {
            self.logits(hidden).to_kind(Kind::Float)
        }
    }

    /// One decoding step for a batch whose rows all have `cache.len()` cached tokens: appends
    /// `tokens [B, T]` and returns the fp32 logits of the last position `[B, vocab]`.
    pub fn decode_step(&self, tokens: &Tensor, cache: &mut KvCache) -> Tensor {
        let (b, t) = tokens.size2().expect("invariant: tokens is [B, T]");
        let positions = Tensor::arange_start(cache.len, cache.len + t, (Kind::Int64, self.device))
            .unsqueeze(0)
            .expand([b, t], false);
        let hidden = self.hidden_states(tokens, &positions, Attention::Cached(cache));
        self.logits(&hidden.select(1, t - 1)).to_kind(Kind::Float)
    }
}
