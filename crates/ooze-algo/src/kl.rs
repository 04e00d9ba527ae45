//! KL estimators between the policy and the frozen reference, from per-token log-probs
//! (Schulman, "Approximating KL divergence", 2020). With `δ = logp − logp_ref`:
//! k1 = δ; k2 = δ²/2; k3 (low-variance) = e^{−δ} − 1 + δ, clamped to [−10, 10].

use ooze_torch::tch::Tensor;
use serde::{Deserialize, Serialize};

/// Which estimator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    K1,
    K2,
    /// Also accepted as `low_var_kl`, slime's name for it.
    #[default]
    #[serde(alias = "low_var_kl")]
    K3,
}

/// k3 is clamped to this range.
pub const K3_CLAMP: f64 = 10.0;

impl KlEstimator {
    /// The estimate for one token, `delta = logp − logp_ref`.
    pub fn value(self, delta: f64) -> f64 {
        match self {
            KlEstimator::K1 => delta,
            KlEstimator::K2 => 0.5 * delta * delta,
            KlEstimator::K3 => ((-delta).exp() - 1.0 + delta).clamp(-K3_CLAMP, K3_CLAMP),
        }
    }

    /// Element-wise estimate over tensors of log-probs (differentiable in `logp`).
    pub fn tensor(self, logp: &Tensor, logp_ref: &Tensor) -> Tensor {
        let delta = logp - logp_ref;
        match self {
            KlEstimator::K1 => delta,
            KlEstimator::K2 => delta.square() * 0.5,
            KlEstimator::K3 => ((-&delta).exp() - 1.0 + &delta).clamp(-K3_CLAMP, K3_CLAMP),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimators_agree_near_zero_and_k3_is_clamped() {
        for d in [-0.01f64, 0.0, 0.02] {
            // k2 and k3 agree to second order.
            assert!((KlEstimator::K2.value(d) - KlEstimator::K3.value(d)).abs() < 1e-5);
        }
        assert_eq!(KlEstimator::K3.value(-20.0), K3_CLAMP);
        assert!(KlEstimator::K3.value(3.0) > 0.0);
        let parsed: KlEstimator = serde_json::from_str("\"low_var_kl\"").unwrap();
        assert_eq!(parsed, KlEstimator::K3);
    }
}
