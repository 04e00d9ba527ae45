//! ooze-algo: the RL objectives as pure functions, specified in `shared/reference/algorithms.md`.
//!
//! - [`kl`]: the k1 / k2 / k3 estimators of KL to the reference policy.
//! - [`advantage`]: rewards → per-token advantages (grpo, dr_grpo, rloo, gspo, cispo,
//!   reinforce_plus_plus, reinforce_plus_plus_baseline, ppo with GAE), group statistics by group id,
//!   batch whitening, on-policy distillation. Host-side f64: computed once per step.
//! - [`aggregate`]: how token terms become one number (per-rollout token mean, global token mean,
//!   sequence-mean token-sum, sequence-mean token-mean), as per-token weights computed over the
//!   whole step so that any micro-batch split sums to the same loss.
//! - [`loss`]: PPO clip (dual clip, GSPO sequence ratio, CISPO), importance weights between trainer
//!   and rollout engine (truncated or masked; token, sequence or geometric-mean level), KL loss,
//!   entropy bonus, value loss with clipping, SFT and the observation (world-model) term — tensor
//!   functions with autograd.

pub mod advantage;
pub mod aggregate;
pub mod kl;
pub mod loss;

pub use advantage::{compute_advantages, AdvantageConfig, Advantages, Estimator, SampleInput};
pub use aggregate::{token_weights, Aggregation, StepSample};
pub use kl::KlEstimator;
pub use loss::{
    ImportanceLevel, ImportanceMode, ImportanceSampling, LossConfig, LossInputs, LossTerms,
    PolicyLoss,
};

/// Inputs the RL math refuses, naming the field at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AlgoError {
    #[error(
        "sample {sample}: {field} has {got} entries, expected {expected} (one per response token)"
    )]
    Length {
        sample: usize,
        field: &'static str,
        got: usize,
        expected: usize,
    },
    #[error("{estimator} needs {field} for every sample (sample {sample} has none)")]
    Missing {
        estimator: &'static str,
        field: &'static str,
        sample: usize,
    },
    #[error("{0}")]
    Config(String),
}
