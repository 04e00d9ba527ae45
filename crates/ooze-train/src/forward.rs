//! The policy's log-probs (and entropies) of the response tokens of a micro-batch: the samples are
//! packed into one row with block-diagonal causal attention, positions restart per sample, and the
//! head runs only at the positions that predict response tokens.

use crate::batch::TrainSample;
use ooze_model::scoring::head_log_probs;
use ooze_model::{Attention, Decoder, ScoreOptions};
use ooze_torch::tch::Tensor;

/// Per response token, flattened over the micro-batch's samples.
pub struct ResponseScores {
    pub log_probs: Tensor,
    pub entropy: Option<Tensor>,
}

/// The final hidden states `[N_response, hidden]` at the positions that predict each sample's
/// response tokens, and those tokens `[N_response]`.
pub fn response_hidden(decoder: &Decoder, samples: &[TrainSample]) -> (Tensor, Tensor) {
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
        for j in s.prompt_len..s.tokens.len() {
            select.push((offset + j - 1) as i64);
            targets.push(s.tokens[j] as i64);
        }
        lengths.push(s.tokens.len() as i64);
    }
    let ids = Tensor::from_slice(&ids).unsqueeze(0).to_device(device);
    let positions = Tensor::from_slice(&positions)
        .unsqueeze(0)
        .to_device(device);
    let hidden = decoder.hidden_states(&ids, &positions, Attention::Packed { lengths: &lengths });
    let hidden = hidden
        .view([-1, decoder.config.hidden_size])
        .index_select(0, &Tensor::from_slice(&select).to_device(device));
    (hidden, Tensor::from_slice(&targets).to_device(device))
}

/// `log_softmax(logits / temperature)` at each response token (gradients flow when enabled); fp32,
/// or fp64 for an fp64 model.
pub fn response_log_probs(
    decoder: &Decoder,
    samples: &[TrainSample],
    temperature: f64,
    entropy: bool,
) -> ResponseScores {
    let (hidden, targets) = response_hidden(decoder, samples);
    let options = ScoreOptions {
        temperature,
        entropy,
        ..Default::default()
    };
    let (log_probs, entropy) = head_log_probs(decoder, &hidden, &targets, &options);
    ResponseScores { log_probs, entropy }
}
