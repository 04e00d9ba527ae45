//! The PPO critic: a decoder body with a scalar value head on its final hidden states, read at the
//! positions that predict response tokens (the value of the state before each token). Stored as an
//! HF model directory whose weights add `score.weight` `[1, hidden]` (the name transformers'
//! token-classification heads use); a directory without it (a policy checkpoint) starts the head
//! at zero.

use crate::batch::TrainSample;
use crate::forward::response_hidden;
use crate::TrainError;
use ooze_model::checkpoint::{export_model, SaveOptions, WeightSet};
use ooze_model::{Decoder, ModelConfig};
use ooze_torch::tch::{Device, Kind, Tensor};
use std::path::Path;

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
    pub fn values(&self, samples: &[TrainSample]) -> Tensor {
        let (hidden, _) = response_hidden(&self.body, samples);
        let values = hidden.mv(&self.head);
        if values.kind() == Kind::Double {
            values
        } else {
            values.to_kind(Kind::Float)
        }
    }

    /// Everything an optimizer updates: the body's tensors and the head.
    pub fn trainable_parameters(&self) -> Vec<(String, Tensor)> {
        let mut params = self.body.trainable_parameters();
        params.push((VALUE_HEAD.to_owned(), self.head.shallow_clone()));
        params
    }

    /// Writes the critic as an HF model directory (config and tokenizer files from `source`).
    pub fn save(&self, source: &Path, out: &Path, options: SaveOptions) -> Result<(), TrainError> {
        let mut tensors = self.body.named_parameters();
        let hidden = self.body.config.hidden_size;
        tensors.push((VALUE_HEAD.to_owned(), self.head.view([1, hidden])));
        export_model(source, out, &tensors, options)?;
        Ok(())
    }

    /// Replaces the weights with those of a saved critic directory.
    pub fn update_weights(&mut self, dir: &Path) -> Result<(), TrainError> {
        let (device, kind) = (self.body.device(), self.body.kind());
        let mut weights = WeightSet::load(dir, device, kind)?;
        let hidden = self.body.config.hidden_size;
        let head = weights.take(VALUE_HEAD, &[1, hidden])?;
        self.body.update_weights(weights)?;
        let _guard = ooze_torch::tch::no_grad_guard();
        self.head.copy_(&head.view([hidden]));
        Ok(())
    }
}
