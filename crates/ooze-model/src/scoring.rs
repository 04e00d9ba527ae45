//! Per-token log-probabilities and entropies of given target tokens — the quantity RL trains on.
//!
//! `log p(target) = log_softmax(logits / temperature)[target]`, with logits from the LM head. Only
//! positions that have a target go through the head, in chunks of [`ScoreOptions::chunk_tokens`]
//! rows, so at most `chunk × vocab` fp32 logits exist at once (a 152k vocabulary over 16k tokens
//! would otherwise need 10 GB). Autograd flows through when the caller enables it.

use crate::decoder::{Attention, Decoder};
use crate::error::{ModelError, Result};
use ooze_torch::tch::{Kind, Tensor};

#[derive(Debug, Clone, Copy)]
pub struct ScoreOptions {
    /// Sampling temperature the log-probs are defined at (1.0 = plain softmax).
    pub temperature: f64,
    /// Rows of fp32 logits materialised at once.
    pub chunk_tokens: i64,
    /// Also compute the entropy of each position's distribution.
    pub entropy: bool,
    /// The entropy must carry gradients (an entropy bonus in the loss): the head runs as libtorch
    /// operations instead of ooze's fused log-prob kernel, whose entropy is a plain value.
    pub entropy_gradient: bool,
    /// With gradients: recompute the logits in the backward pass instead of holding them (2
    /// bytes per logit) until then (activation recomputation).
    pub recompute_logits: bool,
}

impl Default for ScoreOptions {
    fn default() -> Self {
        ScoreOptions {
            temperature: 1.0,
            chunk_tokens: 1024,
            entropy: false,
            entropy_gradient: false,
            recompute_logits: false,
        }
    }
}

/// Log-probs (and entropies) of `targets [N]` under the head applied to `hidden [N, H]`.
///
/// On a GPU (bf16 or fp32 weights) the head matmul writes fp32 logits directly, with and without
/// gradients (cuBLAS accumulates in fp32 anyway): no bf16 rounding of the logits and no separate
/// upcast pass — 27% faster than bf16 logits + upcast on an H200 (docs/benchmarks.md). Under
/// [`crate::Arithmetic::Fastest`] a pass with gradients takes bf16 logits from the matmul instead,
/// read by the same fused kernel (no upcast pass either). Elsewhere
/// (the CPU, or an entropy that needs gradients outside deterministic numerics) the logits come
/// out in the model dtype and are upcast. `options.chunk_tokens` below 1 counts as 1.
pub fn head_log_probs(
    decoder: &Decoder,
    hidden: &Tensor,
    targets: &Tensor,
    options: &ScoreOptions,
) -> (Tensor, Option<Tensor>) {
    let n = hidden.size()[0];
    // On a GPU: ooze's fused kernel (fp32 logits from the matmul, one pass per row, a backward
    // that recomputes the logits), the same arithmetic with and without gradients, every chunk in
    // one autograd node.
    // Deterministic numerics keep the fused kernel's log-probs (the engine's arithmetic) even when
    // the entropy needs gradients: the entropy then comes from a second pass of its own.
    let deterministic = ooze_torch::kernels::deterministic();
    let fused = hidden.device().is_cuda()
        && ooze_torch::kernels::available()
        && matches!(decoder.kind(), Kind::BFloat16 | Kind::Float)
        && (!options.entropy_gradient || deterministic);
    let chunk = options.chunk_tokens.max(1);
    let chunks = || {
        (0..n)
            .step_by(chunk as usize)
            .map(move |start| (start, chunk.min(n - start)))
    };
    if fused {
        use ooze_torch::kernels::HeadLogits;
        // A pass with gradients holds its logits for the backward: in bf16 from the matmul under
        // the fastest arithmetic (supervised steps), else fp32 rounded (the engine's log-probs).
        let logits = if !hidden.requires_grad() || options.recompute_logits {
            HeadLogits::Recompute
        } else if decoder.arithmetic() == crate::Arithmetic::Fastest && !deterministic {
            HeadLogits::Bf16
        } else {
            HeadLogits::KeepRounded
        };
        let (log_probs, entropy) = ooze_torch::kernels::linear_log_prob(
            hidden,
            decoder.head_weight(),
            targets,
            options.temperature,
            logits,
            chunk,
        )
        .expect("invariant: hidden rows, head and targets on one GPU are valid");
        let entropy = match (options.entropy, options.entropy_gradient) {
            (false, _) => None,
            (true, false) => Some(entropy),
            (true, true) => Some(cat_rows(
                chunks()
                    .map(|(start, len)| {
                        let logits =
                            logits_at(decoder, &hidden.narrow(0, start, len), options.temperature);
                        entropy_of(&logits.log_softmax(-1, Kind::Float), Kind::Float)
                    })
                    .collect(),
                hidden,
            )),
        };
        return (log_probs, entropy);
    }
    let mut log_probs = Vec::new();
    let mut entropies = Vec::new();
    for (start, len) in chunks() {
        let rows = hidden.narrow(0, start, len);
        let tgt = targets.narrow(0, start, len).unsqueeze(1);
        let logits = logits_at(decoder, &rows, options.temperature);
        // fp32 statistics, or fp64 for an fp64 model (gradient checks).
        let kind = if logits.kind() == Kind::Double {
            Kind::Double
        } else {
            Kind::Float
        };
        let logp = logits.log_softmax(-1, kind);
        log_probs.push(logp.gather(1, &tgt, false).squeeze_dim(1));
        if options.entropy {
            entropies.push(entropy_of(&logp, kind));
        }
    }
    let entropy = options.entropy.then(|| cat_rows(entropies, hidden));
    (cat_rows(log_probs, hidden), entropy)
}

/// Each row's entropy `−Σ p·log p` from its log-probabilities, summed in `kind`.
fn entropy_of(logp: &Tensor, kind: Kind) -> Tensor {
    -(logp.exp() * logp).sum_dim_intlist([-1i64].as_slice(), false, kind)
}

/// Per-row results of the chunks, in order (an empty fp32 tensor for no rows).
fn cat_rows(parts: Vec<Tensor>, hidden: &Tensor) -> Tensor {
    if parts.is_empty() {
        Tensor::zeros([0], (Kind::Float, hidden.device()))
    } else {
        Tensor::cat(&parts, 0)
    }
}

/// fp32 logits of `rows` under the head, divided by `temperature`.
fn logits_at(decoder: &Decoder, rows: &Tensor, temperature: f64) -> Tensor {
    let logits = decoder.logits_f32(rows);
    if temperature == 1.0 {
        logits
    } else {
        logits / temperature
    }
}

/// Scores of one sequence: `log_probs[i]` is the log-prob of `tokens[i + 1]` given `tokens[..=i]`.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceScores {
    pub log_probs: Vec<f32>,
    pub entropy: Option<Vec<f32>>,
}

/// How a batch of sequences is laid out for the forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// `[B, max_len]`, right-padded: the causal kernel, no mask.
    #[default]
    Padded,
    /// `[1, Σ len]`, with a block-diagonal causal mask and positions restarting per sequence.
    Packed,
}

/// Scores every next token of each sequence in one forward pass.
pub fn score_sequences(
    decoder: &Decoder,
    sequences: &[Vec<u32>],
    layout: Layout,
    options: &ScoreOptions,
) -> Result<Vec<SequenceScores>> {
    if options.temperature <= 0.0 {
        return Err(ModelError::Invalid(format!(
            "temperature must be > 0 for scoring, got {}",
            options.temperature
        )));
    }
    let vocab = decoder.config.vocab_size;
    for (i, seq) in sequences.iter().enumerate() {
        if seq.is_empty() {
            return Err(ModelError::Invalid(format!("sequence {i} is empty")));
        }
        if let Some(&bad) = seq.iter().find(|&&t| t as i64 >= vocab) {
            return Err(ModelError::Invalid(format!(
                "sequence {i} has token id {bad}, outside the vocabulary of {vocab}"
            )));
        }
    }
    if sequences.is_empty() {
        return Ok(Vec::new());
    }
    let device = decoder.device();
    let lengths: Vec<i64> = sequences.iter().map(|s| s.len() as i64).collect();
    let _guard = ooze_torch::tch::no_grad_guard();
    // `select` lists, per sequence, the flat indices of positions that predict a next token.
    let (hidden, flat_targets, select) = match layout {
        Layout::Padded => {
            let width = *lengths.iter().max().expect("invariant: non-empty batch");
            let mut ids = vec![0i64; sequences.len() * width as usize];
            let mut select = Vec::new();
            let mut targets = Vec::new();
            for (row, seq) in sequences.iter().enumerate() {
                let base = row * width as usize;
                for (j, &tok) in seq.iter().enumerate() {
                    ids[base + j] = tok as i64;
                    if j + 1 < seq.len() {
                        select.push((base + j) as i64);
                        targets.push(seq[j + 1] as i64);
                    }
                }
            }
            let ids = Tensor::from_slice(&ids)
                .view([sequences.len() as i64, width])
                .to_device(device);
            let positions = Tensor::arange(width, (Kind::Int64, device))
                .unsqueeze(0)
                .expand([sequences.len() as i64, width], false);
            let hidden = decoder.hidden_states(&ids, &positions, Attention::Causal);
            (
                hidden.view([-1, decoder.config.hidden_size]),
                targets,
                select,
            )
        }
        Layout::Packed => {
            let mut ids = Vec::new();
            let mut positions = Vec::new();
            let mut select = Vec::new();
            let mut targets = Vec::new();
            for seq in sequences {
                for (j, &tok) in seq.iter().enumerate() {
                    if j + 1 < seq.len() {
                        select.push(ids.len() as i64);
                        targets.push(seq[j + 1] as i64);
                    }
                    ids.push(tok as i64);
                    positions.push(j as i64);
                }
            }
            let ids = Tensor::from_slice(&ids).unsqueeze(0).to_device(device);
            let positions = Tensor::from_slice(&positions)
                .unsqueeze(0)
                .to_device(device);
            let hidden =
                decoder.hidden_states(&ids, &positions, Attention::Packed { lengths: &lengths });
            (
                hidden.view([-1, decoder.config.hidden_size]),
                targets,
                select,
            )
        }
    };
    let index = Tensor::from_slice(&select).to_device(device);
    let targets = Tensor::from_slice(&flat_targets).to_device(device);
    let (log_probs, entropy) =
        head_log_probs(decoder, &hidden.index_select(0, &index), &targets, options);
    let log_probs = Vec::<f32>::try_from(log_probs.to_device(ooze_torch::tch::Device::Cpu))?;
    let entropy = entropy
        .map(|e| Vec::<f32>::try_from(e.to_device(ooze_torch::tch::Device::Cpu)))
        .transpose()?;
    let mut out = Vec::with_capacity(sequences.len());
    let mut offset = 0;
    for len in lengths {
        let n = (len - 1) as usize;
        out.push(SequenceScores {
            log_probs: log_probs[offset..offset + n].to_vec(),
            entropy: entropy.as_ref().map(|e| e[offset..offset + n].to_vec()),
        });
        offset += n;
    }
    Ok(out)
}
