//! The PPO critic: a decoder body with a scalar value head on its final hidden states, read at the
//! positions that predict response tokens (the value of the state before each token). Stored as an
//! HF model directory whose weights add `score.weight` `[1, hidden]` (the name transformers'
//! token-classification heads use); a directory without it (a policy checkpoint) starts the head
//! at zero.

use crate::forward::response_hidden;
use crate::schedule::Schedule;
use crate::TrainError;
use ooze_core::Sample;
use ooze_model::checkpoint::{export_model, SaveOptions, WeightSet};
use ooze_model::{Decoder, ModelConfig};
use ooze_torch::tch::{Device, Kind, Tensor};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// How the critic learns: its own learning-rate schedule (the policy's shape with its own peak)
/// and a warm-up in which only the critic learns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CriticConfig {
    pub schedule: Schedule,
    /// Optimizer steps at the start of training in which the critic learns and the policy's
    /// weights stay as they are (values fitted before they steer the policy).
    pub warmup_steps: u64,
}

impl Default for CriticConfig {
    fn default() -> Self {
        CriticConfig {
            schedule: Schedule {
                lr: 1e-5,
                ..Schedule::default()
            },
            warmup_steps: 0,
        }
    }
}

/// The share of the return's variance the critic's values explain over trained tokens:
/// `1 − Var(G − V) / Var(G)` (1 is perfect, 0 no better than the mean, negative worse); `None`
/// when the returns do not vary.
pub fn explained_variance(
    masks: &[&[u8]],
    values: &[Vec<f64>],
    returns: &[Vec<f64>],
) -> Option<f64> {
    let mut pairs = Vec::new();
    for ((mask, v), g) in masks.iter().zip(values).zip(returns) {
        for ((&m, &v), &g) in mask.iter().zip(v).zip(g) {
            if m != 0 {
                pairs.push((v, g));
            }
        }
    }
    let n = pairs.len() as f64;
    if n < 2.0 {
        return None;
    }
    let mean = |f: &dyn Fn(&(f64, f64)) -> f64| pairs.iter().map(f).sum::<f64>() / n;
    let g_mean = mean(&|p| p.1);
    let r_mean = mean(&|p| p.1 - p.0);
    let var_g = mean(&|p| (p.1 - g_mean).powi(2));
    let var_r = mean(&|p| (p.1 - p.0 - r_mean).powi(2));
    (var_g > 1e-12).then(|| 1.0 - var_r / var_g)
}

pub const VALUE_HEAD: &str = "score.weight";

pub struct Critic {
    pub body: Decoder,
    /// `[hidden]`, in the body's dtype.
    head: Tensor,
}

impl Critic {
    /// Loads a critic (or a policy model, with a zero head) from an HF directory.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Critic, TrainError> {
        let config = ModelConfig::load(dir)?;
        let hidden = config.hidden_size;
        let mut weights = WeightSet::load(dir, device, kind)?;
        let head = if weights.contains(VALUE_HEAD) {
            weights.take(VALUE_HEAD, &[1, hidden])?.view([hidden])
        } else {
            Tensor::zeros([hidden], (kind, device))
        };
        let body = Decoder::from_weights(config, weights, device, kind)?;
        Ok(Critic { body, head })
    }

    /// Values `[N_response]` of the samples' response positions (fp32; fp64 for fp64 models).
    pub fn values(&self, samples: &[Sample]) -> Tensor {
        let (hidden, _) = response_hidden(&self.body, samples);
        self.values_of(&hidden)
    }

    /// The values of final hidden states `[N, hidden]` (fp32; fp64 for fp64 models).
    pub(crate) fn values_of(&self, hidden: &Tensor) -> Tensor {
        let values = hidden.mv(&self.head);
        if values.kind() == Kind::Double {
            values
        } else {
            values.to_kind(Kind::Float)
        }
    }

    /// The value head under its checkpoint name (the tensor itself, shallow: sharding it reaches
    /// the critic).
    pub(crate) fn named_head(&self) -> (String, Tensor) {
        (VALUE_HEAD.to_owned(), self.head.shallow_clone())
    }

    /// Everything an optimizer updates: the body's tensors and the head.
    pub fn trainable_parameters(&self) -> Vec<(String, Tensor)> {
        let mut params = self.body.trainable_parameters();
        params.push((VALUE_HEAD.to_owned(), self.head.shallow_clone()));
        params
    }

    /// Writes the critic as an HF model directory (config and tokenizer files from `source`).
    pub fn save(&self, source: &Path, out: &Path, options: SaveOptions) -> Result<(), TrainError> {
        export_model(source, out, &self.named_tensors(), options)?;
        Ok(())
    }

    /// Every tensor under its checkpoint name (the head as `[1, hidden]`).
    pub(crate) fn named_tensors(&self) -> Vec<(String, Tensor)> {
        let mut tensors = self.body.named_parameters();
        let hidden = self.body.config.hidden_size;
        tensors.push((VALUE_HEAD.to_owned(), self.head.view([1, hidden])));
        tensors
    }

    /// Replaces the weights with those of a saved critic directory.
    pub fn update_weights(&mut self, dir: &Path) -> Result<(), TrainError> {
        let (device, kind) = (self.body.device(), self.body.kind());
        self.update_from(WeightSet::load(dir, device, kind)?)
    }

    /// Replaces the weights with `weights` (a saved critic's).
    pub(crate) fn update_from(&mut self, mut weights: WeightSet) -> Result<(), TrainError> {
        let hidden = self.body.config.hidden_size;
        let head = weights.take(VALUE_HEAD, &[1, hidden])?;
        self.body.update_weights(weights)?;
        let _guard = ooze_torch::tch::no_grad_guard();
        self.head.copy_(&head.view([hidden]));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::explained_variance;

    #[test]
    fn explained_variance_of_perfect_mean_and_masked_values() {
        let mask = [1u8, 1, 1, 0];
        let g = vec![vec![1.0, 2.0, 3.0, 100.0]];
        assert_eq!(explained_variance(&[&mask], &g, &g), Some(1.0));
        let mean = vec![vec![2.0, 2.0, 2.0, -7.0]];
        assert!(explained_variance(&[&mask], &mean, &g).unwrap().abs() < 1e-12);
        let flat = vec![vec![1.0; 4]];
        assert_eq!(explained_variance(&[&mask], &mean, &flat), None);
    }
}
