//! The policy's log-probs (and entropies) of the response tokens of a micro-batch: the samples are
//! packed into one row with block-diagonal causal attention, positions restart per sample, and the
//! head runs only at the positions that predict response tokens.

use ooze_core::Sample;
use ooze_model::scoring::head_log_probs;
use ooze_model::{Attention, Decoder, ScoreOptions};
use ooze_torch::tch::Tensor;
use ooze_torch::transfer::upload;

/// What the entropy of each position is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntropyUse {
    None,
    /// A metric: a plain value.
    Value,
    /// A loss term: it carries gradients (the head runs as libtorch operations).
    Gradient,
}

pub(crate) fn head_options(
    temperature: f64,
    entropy: EntropyUse,
    recompute_logits: bool,
) -> ScoreOptions {
    ScoreOptions {
        temperature,
        entropy: entropy != EntropyUse::None,
        entropy_gradient: entropy == EntropyUse::Gradient,
        recompute_logits,
        ..Default::default()
    }
}

/// Per response token, flattened over the micro-batch's samples.
pub struct ResponseScores {
    pub log_probs: Tensor,
    pub entropy: Option<Tensor>,
}

/// A micro-batch packed into one row: token ids and positions `[1, total]`, sequence lengths, the
/// flat positions that predict response tokens and those tokens. Uploaded without waiting for the
/// GPU (a plain `to_device` would drain the work still queued, such as the micro-batch before).
pub(crate) struct Packed {
    pub(crate) ids: Tensor,
    pub(crate) positions: Tensor,
    pub(crate) lengths: Vec<i64>,
    pub(crate) select: Tensor,
    pub(crate) targets: Tensor,
}

pub(crate) fn pack_tokens(decoder: &Decoder, samples: &[Sample]) -> Packed {
    let device = decoder.device();
    let total: usize = samples.iter().map(|s| s.tokens.len()).sum();
    let (mut ids, mut positions) = (Vec::with_capacity(total), Vec::with_capacity(total));
    let (mut select, mut targets) = (Vec::new(), Vec::new());
    let mut lengths = Vec::with_capacity(samples.len());
    for s in samples {
        let offset = ids.len();
        for (j, &t) in s.tokens.iter().enumerate() {
            ids.push(t as i64);
            positions.push(j as i64);
        }
        for j in s.prompt_length()..s.tokens.len() {
            select.push((offset + j - 1) as i64);
            targets.push(s.tokens[j] as i64);
        }
        lengths.push(s.tokens.len() as i64);
    }
    Packed {
        ids: upload(&ids, device).unsqueeze(0),
        positions: upload(&positions, device).unsqueeze(0),
        lengths,
        select: upload(&select, device),
        targets: upload(&targets, device),
    }
}

/// The final hidden states `[N_response, hidden]` at the positions that predict each sample's
/// response tokens, and those tokens `[N_response]`.
pub fn response_hidden(decoder: &Decoder, samples: &[Sample]) -> (Tensor, Tensor) {
    let p = pack_tokens(decoder, samples);
    let hidden = decoder.hidden_states(
        &p.ids,
        &p.positions,
        Attention::Packed {
            lengths: &p.lengths,
        },
    );
    let hidden = hidden
        .view([-1, decoder.config.hidden_size])
        .index_select(0, &p.select);
    (hidden, p.targets)
}

/// Activation recomputation: the blocks ran without gradients, keeping only each block's input;
/// [`Recomputed::backward`] replays them one at a time with gradients, after the loss's backward
/// pass has reached the last block's output. Memory: one block's activations instead of all.
pub struct Recomputed {
    pub(crate) packed: Packed,
    /// Input of every block (detached).
    pub(crate) inputs: Vec<Tensor>,
    /// The last block's output: a leaf whose gradient the loss's backward pass fills.
    pub(crate) last: Tensor,
}

impl Recomputed {
    /// Carries the gradient from the last block's output down through every block (recomputed
    /// with gradients, in reverse) into the embeddings; parameter gradients accumulate.
    pub fn backward(self, decoder: &Decoder) {
        let mut grad = self.last.grad();
        assert!(
            grad.defined(),
            "invariant: the loss's backward pass reached the last block"
        );
        let lengths = &self.packed.lengths;
        for (i, input) in self.inputs.iter().enumerate().rev() {
            let x = input.detach().set_requires_grad(true);
            let y = decoder.run_layers(
                x.shallow_clone(),
                i..i + 1,
                &self.packed.positions,
                Attention::Packed { lengths },
            );
            (y * &grad).sum(grad.kind()).backward();
            grad = x.grad();
        }
        let embedded = decoder.embed(&self.packed.ids);
        (embedded * &grad).sum(grad.kind()).backward();
    }
}

/// [`response_log_probs`] with activation recomputation: call [`Recomputed::backward`] after the
/// loss's own `backward()`.
pub fn response_log_probs_recomputed(
    decoder: &Decoder,
    samples: &[Sample],
    temperature: f64,
    entropy: EntropyUse,
) -> (ResponseScores, Recomputed) {
    let packed = pack_tokens(decoder, samples);
    let mut inputs = Vec::with_capacity(decoder.num_layers());
    let last = {
        let _guard = ooze_torch::tch::no_grad_guard();
        let mut x = decoder.embed(&packed.ids);
        for i in 0..decoder.num_layers() {
            // A copy: without autograd the blocks add their residuals into `x` in place.
            inputs.push(x.copy());
            x = decoder.run_layers(
                x,
                i..i + 1,
                &packed.positions,
                Attention::Packed {
                    lengths: &packed.lengths,
                },
            );
        }
        x
    };
    let last = last.detach().set_requires_grad(true);
    let hidden = decoder
        .final_norm(&last)
        .view([-1, decoder.config.hidden_size])
        .index_select(0, &packed.select);
    let options = head_options(temperature, entropy, true);
    let (log_probs, entropy) = head_log_probs(decoder, &hidden, &packed.targets, &options);
    (
        ResponseScores { log_probs, entropy },
        Recomputed {
            packed,
            inputs,
            last,
        },
    )
}

/// `log_softmax(logits / temperature)` at each response token (gradients flow when enabled); fp32,
/// or fp64 for an fp64 model.
pub fn response_log_probs(
    decoder: &Decoder,
    samples: &[Sample],
    temperature: f64,
    entropy: EntropyUse,
) -> ResponseScores {
    let (hidden, targets) = response_hidden(decoder, samples);
    let (log_probs, entropy) = head_log_probs(
        decoder,
        &hidden,
        &targets,
        &head_options(temperature, entropy, false),
    );
    ResponseScores { log_probs, entropy }
}
