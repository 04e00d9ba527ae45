//! Prompt log-probs from a prefill pass: the hidden states the prefill computed anyway go through
//! the LM head at the prompt positions a caller asked to score, by the one log-prob definition
//! (`log_softmax(logits / T)` in fp32, [`ooze_model::scoring::head_log_probs`], the trainer's own
//! head: chunked, so at most 1,024 × vocab logits exist at once).

use ooze_model::scoring::head_log_probs;
use ooze_model::{Decoder, ScoreOptions};
use ooze_torch::tch::{Device, Kind, Tensor};

/// Log-probs of `prompt[from + 1 ..]`, each given the tokens before it, from one prefill row:
/// `hidden [width, H]` holds the row's positions `reused ..` (so `reused <= from`: the engine
/// computes scored positions even where a cached prefix exists). Empty when `from` is the last
/// prompt position.
pub(crate) fn prompt_log_probs(
    decoder: &Decoder,
    hidden: &Tensor,
    reused: usize,
    from: usize,
    prompt: &[u32],
    temperature: f64,
) -> Vec<f32> {
    assert!(
        reused <= from && from < prompt.len(),
        "invariant: the planner computes the scored positions ({reused} reused, from {from}, {} tokens)",
        prompt.len()
    );
    let n = prompt.len() - 1 - from;
    if n == 0 {
        return Vec::new();
    }
    // Position p predicts token p + 1: positions from ..= len - 2, at row offsets from - reused ...
    let rows = hidden
        .narrow(0, (from - reused) as i64, n as i64)
        .contiguous();
    let targets: Vec<i64> = prompt[from + 1..].iter().map(|&t| t as i64).collect();
    let targets = Tensor::from_slice(&targets).to_device(hidden.device());
    let options = ScoreOptions {
        temperature,
        ..ScoreOptions::default()
    };
    let (log_probs, _) = head_log_probs(decoder, &rows, &targets, &options);
    Vec::<f32>::try_from(log_probs.to_kind(Kind::Float).to_device(Device::Cpu))
        .expect("invariant: a 1-D fp32 tensor converts to a Vec")
}
