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
//! Per-rollout: all sibling samples of one rollout — one execution of a prompt, named by its group
//! and its number in the group — (sub-agents, one sample per conversation, compaction segments)
//! form one unit, so a rollout that fans out into K samples counts once.

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

/// One sample of the step, borrowed: its rollout (group, execution in the group) and the 0/1 mask
/// of the tokens a term covers.
#[derive(Debug, Clone, Copy)]
pub struct StepSample<'a> {
    pub group: u64,
    pub rollout: u64,
    pub mask: &'a [u8],
}

/// Per-token weights for every sample of the step (same shapes as the masks).
pub fn token_weights(samples: &[StepSample<'_>], mode: Aggregation) -> Vec<Vec<f32>> {
    let mask_sum = |m: &[u8]| m.iter().map(|&x| x as f64).sum::<f64>();
    let n_samples = samples.len().max(1) as f64;
    let scale: Vec<f64> = match mode {
        Aggregation::PerRolloutTokenMean => {
            let mut per_rollout: HashMap<(u64, u64), f64> = HashMap::new();
            for s in samples {
                *per_rollout.entry((s.group, s.rollout)).or_default() += mask_sum(s.mask);
            }
            let rollouts = per_rollout.len().max(1) as f64;
            samples
                .iter()
                .map(|s| 1.0 / (per_rollout[&(s.group, s.rollout)].max(1.0) * rollouts))
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
        let (a, b, c) = ([1u8, 1], [1u8, 0, 1], [1u8; 4]);
        // Rollout 1 of group 5 fans out into two samples; rollout 1 of group 6 is one sample.
        let step = |group, mask| StepSample {
            group,
            rollout: 1,
            mask,
        };
        let samples = [step(5, &a[..]), step(5, &b[..]), step(6, &c[..])];
        let w = token_weights(&samples, Aggregation::PerRolloutTokenMean);
        let per_rollout = |group: u64| -> f32 {
            samples
                .iter()
                .zip(&w)
                .filter(|(s, _)| s.group == group)
                .map(|(_, w)| w.iter().sum::<f32>())
                .sum()
        };
        assert!((per_rollout(5) - 0.5).abs() < 1e-7);
        assert!((per_rollout(6) - 0.5).abs() < 1e-7);
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
