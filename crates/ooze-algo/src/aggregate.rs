//! How per-token terms become one number for a step. Each mode is a weight per token, computed
//! once over the whole step; a micro-batch's loss is `Σ w_t·x_t` over its tokens, so the sum over
//! micro-batches is the step's loss exactly, however the step is split (a sample is never split).
//!
//! | mode | weight of token t of sample s (mask m) |
//! |---|---|
//! | per-rollout token mean (default) | `m_t / (max(Σ m over s's rollout, 1) · rollouts in the step)` |
//! | global token mean | `m_t / max(Σ m over the step, 1)` |
//! | sequence-mean token-sum (Dr. GRPO) | `m_t / samples in the step` |
//! | sequence-mean token-mean | `m_t / (max(Σ m over s, 1) · samples in the step)` |
//!
//! Per-rollout: all sibling samples sharing a rollout id (sub-agents, one sample per
//! conversation, compaction segments) form one unit, so a rollout that fans out into K samples
//! counts once.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Aggregation {
    #[default]
    PerRolloutTokenMean,
    GlobalTokenMean,
    SeqMeanTokenSum,
    SeqMeanTokenMean,
}

/// One sample of the step: its rollout and the mask of the tokens a term covers.
#[derive(Debug, Clone, Copy)]
pub struct StepSample<'a> {
    pub rollout: u64,
    pub mask: &'a [f32],
}

/// Per-token weights for every sample of the step (same shapes as the masks).
pub fn token_weights(samples: &[StepSample<'_>], mode: Aggregation) -> Vec<Vec<f32>> {
    let mask_sum = |m: &[f32]| m.iter().map(|&x| x as f64).sum::<f64>();
    let n_samples = samples.len().max(1) as f64;
    let scale: Vec<f64> = match mode {
        Aggregation::PerRolloutTokenMean => {
            let mut per_rollout: HashMap<u64, f64> = HashMap::new();
            for s in samples {
                *per_rollout.entry(s.rollout).or_default() += mask_sum(s.mask);
            }
            let rollouts = per_rollout.len().max(1) as f64;
            samples
                .iter()
                .map(|s| 1.0 / (per_rollout[&s.rollout].max(1.0) * rollouts))
                .collect()
        }
        Aggregation::GlobalTokenMean => {
            let total: f64 = samples.iter().map(|s| mask_sum(s.mask)).sum();
            vec![1.0 / total.max(1.0); samples.len()]
        }
        Aggregation::SeqMeanTokenSum => vec![1.0 / n_samples; samples.len()],
        Aggregation::SeqMeanTokenMean => samples
            .iter()
            .map(|s| 1.0 / (mask_sum(s.mask).max(1.0) * n_samples))
            .collect(),
    };
    samples
        .iter()
        .zip(scale)
        .map(|(s, c)| s.mask.iter().map(|&m| (m as f64 * c) as f32).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fanned_out_rollout_counts_once() {
        let (a, b, c) = ([1.0f32, 1.0], [1.0f32, 0.0, 1.0], [1.0f32; 4]);
        // Rollout 1 fans out into two samples; rollout 2 is one sample.
        let samples = [
            StepSample {
                rollout: 1,
                mask: &a,
            },
            StepSample {
                rollout: 1,
                mask: &b,
            },
            StepSample {
                rollout: 2,
                mask: &c,
            },
        ];
        let w = token_weights(&samples, Aggregation::PerRolloutTokenMean);
        let per_rollout = |r: u64| -> f32 {
            samples
                .iter()
                .zip(&w)
                .filter(|(s, _)| s.rollout == r)
                .map(|(_, w)| w.iter().sum::<f32>())
                .sum()
        };
        assert!((per_rollout(1) - 0.5).abs() < 1e-7);
        assert!((per_rollout(2) - 0.5).abs() < 1e-7);
        assert_eq!(w[1][1], 0.0, "masked tokens weigh nothing");
        for mode in [
            Aggregation::GlobalTokenMean,
            Aggregation::SeqMeanTokenMean,
            Aggregation::PerRolloutTokenMean,
        ] {
            let total: f32 = token_weights(&samples, mode).iter().flatten().sum();
            assert!((total - 1.0).abs() < 1e-6, "{mode:?} weights sum to 1");
        }
    }
}
