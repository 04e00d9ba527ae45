//! The training loss of one micro-batch, as tensors with autograd. Tokens of the micro-batch's
//! samples are flattened into `[N]` tensors; `sample_index` says which sample each token belongs
//! to (for sequence-level ratios and weights); every term is summed with the step-level
//! aggregation weights from [`crate::aggregate`], so micro-batch losses add up to the step's loss.
//!
//! Policy term (`ratio = exp(logp − logp_old)`):
//! - PPO clip: `max(−ratio·A, −clip(ratio, 1−ε_low, 1+ε_high)·A)`; dual clip `c`: where `A < 0`,
//!   `min(·, −c·A)`. clipfrac = share of tokens where the clipped branch is the larger.
//! - GSPO: the same with the sequence ratio `exp(mean over the sample's trained tokens of
//!   (logp − logp_old))`.
//! - CISPO: `−stopgrad(clip(ratio))·A·logp`.
//! - SFT: `−logp`.
//!
//! Importance weights between trainer and rollout engine, `log w = logp_old − logp_roll`: per
//! token, per sequence (sum over trained tokens) or geometric mean (mean over them); truncated
//! (`clamp(w, low, high)`) or masked (0 outside `[low, high]`); multiply the policy term.
//!
//! Added terms: `kl_loss_coef·KL(logp, logp_ref)` (optionally × ratio, the unbiased form),
//! `−entropy_coef·H`, `value_coef·max((V_clip − G)², (V − G)²)` with
//! `V_clip = V_old + clip(V − V_old, ±value_clip)`, and `observation_coef·(−logp)` over environment
//! tokens with their own weights.

use crate::kl::KlEstimator;
use ooze_torch::tch::{Kind, Tensor};
use serde::{Deserialize, Serialize};

/// The policy-gradient term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PolicyLoss {
    #[default]
    PpoClip,
    Gspo,
    Cispo,
    /// Supervised: `−logp` (advantages unused).
    Sft,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ImportanceLevel {
    Token,
    Sequence,
    Geometric,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ImportanceMode {
    /// TIS: `clamp(w, low, high)`.
    Truncate,
    /// MIS / icepop: `w` inside `[low, high]`, 0 outside (a sequence-level weight of 0 drops the
    /// whole sample).
    Mask,
}

/// Correction for the difference between the trainer's and the rollout engine's log-probs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportanceSampling {
    pub level: ImportanceLevel,
    pub mode: ImportanceMode,
    #[serde(default)]
    pub low: f64,
    #[serde(default = "default_is_high")]
    pub high: f64,
}

fn default_is_high() -> f64 {
    2.0
}

/// Settings of the loss.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LossConfig {
    pub policy: PolicyLoss,
    pub eps_low: f64,
    /// Defaults to `eps_low` when absent.
    pub eps_high: Option<f64>,
    /// Dual-clip constant `c > 1`.
    pub dual_clip: Option<f64>,
    pub importance: Option<ImportanceSampling>,
    pub kl_loss_coef: f64,
    pub kl_estimator: KlEstimator,
    /// Multiply the KL term by `exp(logp − logp_old)`.
    pub kl_unbiased: bool,
    pub entropy_coef: f64,
    pub value_coef: f64,
    pub value_clip: f64,
    pub observation_coef: f64,
}

impl Default for LossConfig {
    fn default() -> Self {
        LossConfig {
            policy: PolicyLoss::PpoClip,
            eps_low: 0.2,
            eps_high: None,
            dual_clip: None,
            importance: None,
            kl_loss_coef: 0.0,
            kl_estimator: KlEstimator::K3,
            kl_unbiased: false,
            entropy_coef: 0.0,
            value_coef: 1.0,
            value_clip: 0.2,
            observation_coef: 0.0,
        }
    }
}

/// The flattened tokens of a micro-batch: every tensor is `[N]` (fp32 or fp64) unless said.
pub struct LossInputs<'a> {
    /// Current policy log-probs (with gradient).
    pub logp: &'a Tensor,
    pub logp_old: &'a Tensor,
    pub advantages: &'a Tensor,
    /// 1 for trained tokens.
    pub mask: &'a Tensor,
    /// Aggregation weights of the policy, KL, entropy and value terms (zero where masked).
    pub weights: &'a Tensor,
    /// int64 `[N]`: the sample (0-based within the micro-batch) each token belongs to.
    pub sample_index: &'a Tensor,
    pub num_samples: i64,
    pub logp_roll: Option<&'a Tensor>,
    pub logp_ref: Option<&'a Tensor>,
    /// Per-token entropy of the full distribution (with gradient).
    pub entropy: Option<&'a Tensor>,
    /// Critic values (with gradient), their pre-update values and the returns.
    pub values: Option<(&'a Tensor, &'a Tensor, &'a Tensor)>,
    /// Weights of the observation term (environment tokens).
    pub observation_weights: Option<&'a Tensor>,
}

/// The loss and its parts (scalars; the parts and metrics are detached).
pub struct LossTerms {
    pub total: Tensor,
    pub policy: Tensor,
    pub kl: Option<Tensor>,
    pub entropy: Option<Tensor>,
    pub value: Option<Tensor>,
    pub observation: Option<Tensor>,
    /// Weighted share of tokens where the clip was active.
    pub clipfrac: Tensor,
    /// k3 estimate of KL(new ‖ old), weighted.
    pub approx_kl: Tensor,
    /// Weighted mean importance weight (when importance sampling is on).
    pub importance_weight: Option<Tensor>,
}

/// Per-sample sums of `x` over the micro-batch's samples, gathered back to tokens.
fn per_sample_sum(x: &Tensor, inputs: &LossInputs<'_>) -> Tensor {
    let sums = Tensor::zeros([inputs.num_samples], (x.kind(), x.device())).index_add(
        0,
        inputs.sample_index,
        x,
    );
    sums.index_select(0, inputs.sample_index)
}

/// Per-sample mean of `x` over trained tokens, broadcast back to tokens.
fn per_sample_mean(x: &Tensor, inputs: &LossInputs<'_>) -> Tensor {
    let sum = per_sample_sum(&(x * inputs.mask), inputs);
    let count = per_sample_sum(inputs.mask, inputs).clamp_min(1.0);
    sum / count
}

fn weighted(x: &Tensor, weights: &Tensor) -> Tensor {
    (x * weights).sum(x.kind())
}

/// The loss of one micro-batch.
pub fn loss(inputs: &LossInputs<'_>, config: &LossConfig) -> LossTerms {
    let w = inputs.weights;
    let eps_high = config.eps_high.unwrap_or(config.eps_low);
    let (low, high) = (1.0 - config.eps_low, 1.0 + eps_high);
    let log_ratio = inputs.logp - inputs.logp_old;
    let a = inputs.advantages;
    let (per_token, clipped) = match config.policy {
        PolicyLoss::PpoClip | PolicyLoss::Gspo => {
            let ratio = if config.policy == PolicyLoss::Gspo {
                per_sample_mean(&log_ratio, inputs).exp()
            } else {
                log_ratio.exp()
            };
            let unclipped = -(&ratio * a);
            let clipped_term = -(ratio.clamp(low, high) * a);
            let clipped = clipped_term.gt_tensor(&unclipped);
            let mut l = unclipped.maximum(&clipped_term);
            if let Some(c) = config.dual_clip {
                let floor = a * -c;
                l = l.minimum(&floor).where_self(&a.lt(0.0), &l);
            }
            (l, clipped)
        }
        PolicyLoss::Cispo => {
            let ratio = log_ratio.exp();
            let clipped = ratio.lt(low).logical_or(&ratio.gt(high));
            let l = -(ratio.clamp(low, high).detach() * a * inputs.logp);
            (l, clipped)
        }
        PolicyLoss::Sft => {
            let none = log_ratio.zeros_like().to_kind(Kind::Bool);
            (-inputs.logp, none)
        }
    };
    let (per_token, importance_weight) = match (config.importance, inputs.logp_roll) {
        (Some(is), Some(roll)) => {
            let log_w = (inputs.logp_old - roll).detach();
            let weight = match is.level {
                ImportanceLevel::Token => log_w.exp(),
                ImportanceLevel::Sequence => per_sample_sum(&(&log_w * inputs.mask), inputs).exp(),
                ImportanceLevel::Geometric => per_sample_mean(&log_w, inputs).exp(),
            };
            let weight = match is.mode {
                ImportanceMode::Truncate => weight.clamp(is.low, is.high),
                ImportanceMode::Mask => {
                    let inside = weight.ge(is.low).logical_and(&weight.le(is.high));
                    weight.where_self(&inside, &weight.zeros_like())
                }
            };
            (per_token * &weight, Some(weighted(&weight, w).detach()))
        }
        _ => (per_token, None),
    };
    let policy = weighted(&per_token, w);
    let mut total = policy.shallow_clone();
    let kl = inputs
        .logp_ref
        .filter(|_| config.kl_loss_coef != 0.0)
        .map(|r| {
            let k = config.kl_estimator.tensor(inputs.logp, r);
            let k = if config.kl_unbiased {
                k * log_ratio.exp()
            } else {
                k
            };
            let k = weighted(&k, w);
            total = &total + &k * config.kl_loss_coef;
            k
        });
    let entropy = inputs
        .entropy
        .filter(|_| config.entropy_coef != 0.0)
        .map(|h| {
            let h = weighted(h, w);
            total = &total - &h * config.entropy_coef;
            h
        });
    let value = inputs.values.map(|(v, v_old, returns)| {
        let clipped = v_old + (v - v_old).clamp(-config.value_clip, config.value_clip);
        let l = (clipped - returns)
            .square()
            .maximum(&(v - returns).square());
        let l = weighted(&l, w);
        total = &total + &l * config.value_coef;
        l
    });
    let observation = inputs
        .observation_weights
        .filter(|_| config.observation_coef != 0.0)
        .map(|ow| {
            let o = weighted(&(-inputs.logp), ow);
            total = &total + &o * config.observation_coef;
            o
        });
    let approx_kl = weighted(
        &KlEstimator::K3.tensor(&inputs.logp.detach(), inputs.logp_old),
        w,
    );
    LossTerms {
        total,
        policy: policy.detach(),
        kl: kl.map(|t| t.detach()),
        entropy: entropy.map(|t| t.detach()),
        value: value.map(|t| t.detach()),
        observation: observation.map(|t| t.detach()),
        clipfrac: weighted(&clipped.to_kind(w.kind()), w),
        approx_kl,
        importance_weight,
    }
}
