//! Rewards → per-token advantages, for one training step's samples.
//!
//! Groups are found by each sample's group id (the prompt it came from), never by position, so the
//! statistics stay right after filtering, with uneven groups, and with fan-out: the unit of a group
//! is the *rollout* (one execution of the prompt); a rollout that produced several sibling samples
//! contributes one reward — the mean of its samples' rewards, which is the broadcast reward when
//! they share one.
//!
//! | estimator | advantage of every token of sample i |
//! |---|---|
//! | grpo, gspo, cispo | `(r_i − mean_g) / (std_g + 1e-6)` (unbiased std; no division when off or n = 1) |
//! | dr_grpo | `r_i − mean_g` |
//! | rloo | `r_i − mean of the other rollouts' rewards` (0 alone) |
//! | reinforce_plus_plus | discounted return (γ) of token rewards `−kl_coef·kl_t·m_t`, plus `r_i` at the last masked token; whitened |
//! | reinforce_plus_plus_baseline | `(r_i − mean_g) − kl_coef·kl_t`; whitened |
//! | ppo | GAE(γ, λ) over token rewards `−kl_coef·kl_t` with `r_i` added at the last token and the critic's values; returns = A + V |
//!
//! `clip` bounds every advantage to `[−clip, clip]` after everything else.
//! Whitening (`normalize_advantages`, always on for the reinforce++ pair): masked mean and
//! Bessel-corrected variance over all trained tokens of the step, `A ← (A − μ)/sqrt(var + 1e-8)`.
//! On-policy distillation then subtracts `opd_coef·(logp_old − logp_teacher)` per token.
//! Everything is f64 on the host: it runs once per step over at most a few million numbers.

use crate::kl::KlEstimator;
use crate::AlgoError;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// The advantage estimator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Estimator {
    #[default]
    Grpo,
    DrGrpo,
    Rloo,
    Gspo,
    Cispo,
    ReinforcePlusPlus,
    ReinforcePlusPlusBaseline,
    Ppo,
}

impl Estimator {
    pub fn name(self) -> &'static str {
        match self {
            Estimator::Grpo => "grpo",
            Estimator::DrGrpo => "dr_grpo",
            Estimator::Rloo => "rloo",
            Estimator::Gspo => "gspo",
            Estimator::Cispo => "cispo",
            Estimator::ReinforcePlusPlus => "reinforce_plus_plus",
            Estimator::ReinforcePlusPlusBaseline => "reinforce_plus_plus_baseline",
            Estimator::Ppo => "ppo",
        }
    }

    /// Whether the reward becomes a per-token return with a KL penalty inside.
    fn uses_token_rewards(self) -> bool {
        matches!(
            self,
            Estimator::ReinforcePlusPlus | Estimator::ReinforcePlusPlusBaseline | Estimator::Ppo
        )
    }
}

/// Settings of [`compute_advantages`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdvantageConfig {
    pub estimator: Estimator,
    /// grpo / gspo / cispo: divide by the group's standard deviation.
    pub std_normalization: bool,
    /// Discount (reinforce_plus_plus, ppo).
    pub gamma: f64,
    /// GAE λ (ppo).
    pub lambda: f64,
    /// KL penalty inside the reward (reinforce_plus_plus, its baseline variant, ppo); needs
    /// reference log-probs. Exclusive with a KL loss term.
    pub kl_coef: f64,
    pub kl_estimator: KlEstimator,
    /// Batch whitening after the estimator (always on for the reinforce_plus_plus pair).
    pub normalize_advantages: bool,
    /// On-policy distillation: `A ← A − opd_coef·(logp_old − logp_teacher)`; needs teacher log-probs.
    pub opd_coef: f64,
    /// Clip every advantage to `[−clip, clip]` last (ToolOrchestra clips its group z-scores at 3).
    pub clip: Option<f64>,
}

impl Default for AdvantageConfig {
    fn default() -> Self {
        AdvantageConfig {
            estimator: Estimator::Grpo,
            std_normalization: true,
            gamma: 1.0,
            lambda: 1.0,
            kl_coef: 0.0,
            kl_estimator: KlEstimator::K3,
            normalize_advantages: false,
            opd_coef: 0.0,
            clip: None,
        }
    }
}

/// One sample of the step, as the advantage math sees it. Token slices cover the response tokens.
#[derive(Debug, Clone, Copy)]
pub struct SampleInput<'a> {
    /// The prompt group (samples of one prompt).
    pub group: u64,
    /// The rollout (one execution of the prompt); siblings of a fan-out share it.
    pub rollout: u64,
    pub reward: f64,
    /// 1 for tokens the policy generated (trained), 0 for tool/environment/template tokens.
    pub mask: &'a [u8],
    /// Log-probs under the policy before the update (recomputed by the trainer).
    pub logp_old: Option<&'a [f64]>,
    /// Log-probs under the frozen reference (for a KL penalty in the reward).
    pub logp_ref: Option<&'a [f64]>,
    /// The critic's values (ppo).
    pub values: Option<&'a [f64]>,
    /// A teacher's log-probs (on-policy distillation).
    pub logp_teacher: Option<&'a [f64]>,
}

/// Per-token advantages of every sample, and returns (value targets) for ppo.
#[derive(Debug, Clone, PartialEq)]
pub struct Advantages {
    pub advantages: Vec<Vec<f64>>,
    pub returns: Option<Vec<Vec<f64>>>,
}

/// A replacement for the built-in group normalisation: receives the samples and their raw
/// rewards, and writes the rewards the estimator should use.
pub type RewardHook<'h> = &'h dyn Fn(&[SampleInput<'_>], &mut [f64]);

/// Group-normalised rewards: `r − mean_g`, divided by `std_g + 1e-6` when `divide` and the group has
/// more than one rollout. Statistics over rollouts (one reward each), grouped by group id.
pub fn group_normalize(samples: &[SampleInput<'_>], divide: bool) -> Vec<f64> {
    let stats = group_stats(samples);
    samples
        .iter()
        .map(|s| {
            let g = &stats[&s.group];
            let centred = s.reward - g.mean;
            if divide && g.rollouts > 1 {
                centred / (g.std + 1e-6)
            } else {
                centred
            }
        })
        .collect()
}

struct GroupStats {
    rollouts: usize,
    sum: f64,
    mean: f64,
    /// Unbiased (n − 1) standard deviation; 0 for a single rollout.
    std: f64,
}

/// Each rollout's reward (mean over its samples), then each group's statistics over its rollouts.
fn group_stats(samples: &[SampleInput<'_>]) -> HashMap<u64, GroupStats> {
    let mut rollouts: HashMap<(u64, u64), (f64, usize)> = HashMap::new();
    let mut order: Vec<(u64, u64)> = Vec::new();
    for s in samples {
        let entry = rollouts.entry((s.group, s.rollout)).or_insert_with(|| {
            order.push((s.group, s.rollout));
            (0.0, 0)
        });
        entry.0 += s.reward;
        entry.1 += 1;
    }
    let mut per_group: HashMap<u64, Vec<f64>> = HashMap::new();
    for key in &order {
        let (sum, n) = rollouts[key];
        per_group.entry(key.0).or_default().push(sum / n as f64);
    }
    per_group
        .into_iter()
        .map(|(group, rewards)| {
            let n = rewards.len();
            let sum: f64 = rewards.iter().sum();
            let mean = sum / n as f64;
            let std = if n > 1 {
                (rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
            } else {
                0.0
            };
            (
                group,
                GroupStats {
                    rollouts: n,
                    sum,
                    mean,
                    std,
                },
            )
        })
        .collect()
}

fn check_len(
    sample: usize,
    field: &'static str,
    values: Option<&[f64]>,
    expected: usize,
) -> Result<(), AlgoError> {
    match values {
        Some(v) if v.len() != expected => Err(AlgoError::Length {
            sample,
            field,
            got: v.len(),
            expected,
        }),
        _ => Ok(()),
    }
}

fn require<'a>(
    values: Option<&'a [f64]>,
    estimator: &'static str,
    field: &'static str,
    sample: usize,
) -> Result<&'a [f64], AlgoError> {
    values.ok_or(AlgoError::Missing {
        estimator,
        field,
        sample,
    })
}

/// Per-token KL penalty terms `kl_t` of a sample (zeros when the penalty is off).
fn kl_terms(
    s: &SampleInput<'_>,
    i: usize,
    config: &AdvantageConfig,
) -> Result<Vec<f64>, AlgoError> {
    let n = s.mask.len();
    if config.kl_coef == 0.0 {
        return Ok(vec![0.0; n]);
    }
    let name = config.estimator.name();
    let old = require(s.logp_old, name, "logp_old (for the KL penalty)", i)?;
    let reference = require(s.logp_ref, name, "logp_ref (for the KL penalty)", i)?;
    Ok(old
        .iter()
        .zip(reference)
        .map(|(a, b)| config.kl_estimator.value(a - b))
        .collect())
}

/// Masked mean and Bessel-corrected variance over all trained tokens; `A ← (A − μ)/sqrt(var + 1e-8)`.
pub fn whiten(advantages: &mut [Vec<f64>], masks: &[&[u8]]) {
    let (mut sum, mut count) = (0.0, 0.0);
    for (a, m) in advantages.iter().zip(masks) {
        for (x, &w) in a.iter().zip(*m) {
            sum += x * w as f64;
            count += w as f64;
        }
    }
    if count == 0.0 {
        return;
    }
    let mean = sum / count;
    let mut squares = 0.0;
    for (a, m) in advantages.iter().zip(masks) {
        for (x, &w) in a.iter().zip(*m) {
            squares += (x - mean).powi(2) * w as f64;
        }
    }
    let var = if count > 1.0 {
        squares / (count - 1.0)
    } else {
        0.0
    };
    let scale = 1.0 / (var + 1e-8).sqrt();
    for a in advantages.iter_mut() {
        for x in a.iter_mut() {
            *x = (*x - mean) * scale;
        }
    }
}

/// Computes the advantages of one step's samples. `hook`, when given, replaces the built-in group
/// normalisation of the rewards (for the estimators that use it).
pub fn compute_advantages(
    samples: &[SampleInput<'_>],
    config: &AdvantageConfig,
    hook: Option<RewardHook<'_>>,
) -> Result<Advantages, AlgoError> {
    let est = config.estimator;
    if config.kl_coef != 0.0 && !est.uses_token_rewards() {
        return Err(AlgoError::Config(format!(
            "kl_coef (a KL penalty in the reward) applies to reinforce_plus_plus, \
             reinforce_plus_plus_baseline and ppo, not {}; use the KL loss term instead",
            est.name()
        )));
    }
    for (i, s) in samples.iter().enumerate() {
        let n = s.mask.len();
        check_len(i, "logp_old", s.logp_old, n)?;
        check_len(i, "logp_ref", s.logp_ref, n)?;
        check_len(i, "values", s.values, n)?;
        check_len(i, "logp_teacher", s.logp_teacher, n)?;
    }
    let processed = |divide: bool| -> Vec<f64> {
        match hook {
            Some(hook) => {
                let mut rewards: Vec<f64> = samples.iter().map(|s| s.reward).collect();
                hook(samples, &mut rewards);
                rewards
            }
            None => group_normalize(samples, divide),
        }
    };
    let broadcast = |values: Vec<f64>| -> Vec<Vec<f64>> {
        samples
            .iter()
            .zip(values)
            .map(|(s, v)| vec![v; s.mask.len()])
            .collect()
    };
    let mut returns = None;
    let mut advantages = match est {
        Estimator::Grpo | Estimator::Gspo | Estimator::Cispo => {
            broadcast(processed(config.std_normalization))
        }
        Estimator::DrGrpo => broadcast(processed(false)),
        Estimator::Rloo => broadcast(leave_one_out(samples)),
        Estimator::ReinforcePlusPlus => samples
            .iter()
            .enumerate()
            .map(|(i, s)| discounted_returns(s, i, config))
            .collect::<Result<Vec<_>, AlgoError>>()?,
        Estimator::ReinforcePlusPlusBaseline => {
            let centred = processed(false);
            samples
                .iter()
                .enumerate()
                .zip(centred)
                .map(|((i, s), c)| {
                    Ok(kl_terms(s, i, config)?
                        .iter()
                        .map(|k| c - config.kl_coef * k)
                        .collect())
                })
                .collect::<Result<Vec<_>, AlgoError>>()?
        }
        Estimator::Ppo => {
            let (advantages, all_returns): (Vec<_>, Vec<_>) = samples
                .iter()
                .enumerate()
                .map(|(i, s)| gae(s, i, config))
                .collect::<Result<Vec<_>, AlgoError>>()?
                .into_iter()
                .unzip();
            returns = Some(all_returns);
            advantages
        }
    };
    if config.normalize_advantages
        || matches!(
            est,
            Estimator::ReinforcePlusPlus | Estimator::ReinforcePlusPlusBaseline
        )
    {
        let masks: Vec<&[u8]> = samples.iter().map(|s| s.mask).collect();
        whiten(&mut advantages, &masks);
    }
    if config.opd_coef != 0.0 {
        add_distillation(samples, &mut advantages, config.opd_coef)?;
    }
    if let Some(c) = config.clip {
        clip(&mut advantages, c)?;
    }
    Ok(Advantages {
        advantages,
        returns,
    })
}

/// RLOO's baseline: each rollout's reward minus the mean of the other rollouts of its group (0
/// for a group of one rollout). A rollout's samples (an agent's turns) count as one.
fn leave_one_out(samples: &[SampleInput<'_>]) -> Vec<f64> {
    let stats = group_stats(samples);
    samples
        .iter()
        .map(|s| {
            let g = &stats[&s.group];
            if g.rollouts < 2 {
                return 0.0;
            }
            // This rollout's reward is one of the group's; the others' mean excludes it.
            let own: Vec<f64> = samples
                .iter()
                .filter(|o| o.group == s.group && o.rollout == s.rollout)
                .map(|o| o.reward)
                .collect();
            let own = own.iter().sum::<f64>() / own.len() as f64;
            s.reward - (g.sum - own) / (g.rollouts - 1) as f64
        })
        .collect()
}

/// REINFORCE++: per-token rewards (the KL penalty on every trained token, the reward on the
/// last), summed backwards with discount `gamma`.
fn discounted_returns(
    s: &SampleInput<'_>,
    i: usize,
    config: &AdvantageConfig,
) -> Result<Vec<f64>, AlgoError> {
    let kl = kl_terms(s, i, config)?;
    let mut rewards: Vec<f64> = kl
        .iter()
        .zip(s.mask)
        .map(|(k, &m)| -config.kl_coef * k * m as f64)
        .collect();
    if let Some(last) = s.mask.iter().rposition(|&m| m > 0) {
        rewards[last] += s.reward;
    }
    let mut running = 0.0;
    for r in rewards.iter_mut().rev() {
        running = *r + config.gamma * running;
        *r = running;
    }
    Ok(rewards)
}

/// PPO's generalised advantage estimate over the critic's values, and the returns
/// (advantage + value) the critic is trained towards.
fn gae(
    s: &SampleInput<'_>,
    i: usize,
    config: &AdvantageConfig,
) -> Result<(Vec<f64>, Vec<f64>), AlgoError> {
    let values = require(s.values, "ppo", "values (a critic)", i)?;
    let mut rewards: Vec<f64> = kl_terms(s, i, config)?
        .iter()
        .map(|k| -config.kl_coef * k)
        .collect();
    if let Some(last) = rewards.last_mut() {
        *last += s.reward;
    }
    let n = rewards.len();
    let mut adv = vec![0.0; n];
    let mut next_adv = 0.0;
    for t in (0..n).rev() {
        let next_value = if t + 1 < n { values[t + 1] } else { 0.0 };
        let delta = rewards[t] + config.gamma * next_value - values[t];
        next_adv = delta + config.gamma * config.lambda * next_adv;
        adv[t] = next_adv;
    }
    let returns = adv.iter().zip(values).map(|(a, v)| a + v).collect();
    Ok((adv, returns))
}

/// On-policy distillation: every token's advantage moves by `coef` times the teacher's log-prob
/// minus the policy's.
fn add_distillation(
    samples: &[SampleInput<'_>],
    advantages: &mut [Vec<f64>],
    coef: f64,
) -> Result<(), AlgoError> {
    for (i, (s, adv)) in samples.iter().zip(advantages).enumerate() {
        let old = require(s.logp_old, "on-policy distillation", "logp_old", i)?;
        let teacher = require(s.logp_teacher, "on-policy distillation", "logp_teacher", i)?;
        for ((a, o), t) in adv.iter_mut().zip(old).zip(teacher) {
            *a -= coef * (o - t);
        }
    }
    Ok(())
}

/// Clamps every advantage to `[-c, c]`.
fn clip(advantages: &mut [Vec<f64>], c: f64) -> Result<(), AlgoError> {
    if c.is_nan() || c <= 0.0 {
        return Err(AlgoError::Config(format!(
            "advantage clip must be > 0, got {c}"
        )));
    }
    for a in advantages.iter_mut().flatten() {
        *a = a.clamp(-c, c);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_bounds_the_z_scores() {
        let mask = [1u8; 2];
        // One outlier among equal rewards: its z-score (unbiased std) is (n − 1)/sqrt(n) ≈ 4.25
        // for n = 20.
        let mut samples: Vec<SampleInput<'_>> = (0..20).map(|i| sample(0, i, 0.0, &mask)).collect();
        samples[0].reward = 1.0;
        let config = AdvantageConfig::default();
        let free = compute_advantages(&samples, &config, None).unwrap();
        assert!((free.advantages[0][0] - 19.0 / 20f64.sqrt()).abs() < 1e-4);
        let clipped = AdvantageConfig {
            clip: Some(3.0),
            ..config
        };
        let out = compute_advantages(&samples, &clipped, None).unwrap();
        assert_eq!(out.advantages[0], vec![3.0, 3.0]);
        assert_eq!(out.advantages[1], free.advantages[1]);
        let bad = AdvantageConfig {
            clip: Some(0.0),
            ..Default::default()
        };
        assert!(compute_advantages(&samples, &bad, None).is_err());
    }

    fn sample(group: u64, rollout: u64, reward: f64, mask: &[u8]) -> SampleInput<'_> {
        SampleInput {
            group,
            rollout,
            reward,
            mask,
            logp_old: None,
            logp_ref: None,
            values: None,
            logp_teacher: None,
        }
    }

    #[test]
    fn groups_follow_ids_not_positions_and_siblings_count_once() {
        let m = [1u8, 1];
        // Group 7 interleaved with group 9; rollout 2 of group 7 fans out into two siblings.
        let samples = [
            sample(7, 1, 1.0, &m),
            sample(9, 5, 0.0, &m),
            sample(7, 2, 0.0, &m),
            sample(7, 2, 0.0, &m),
            sample(9, 6, 1.0, &m),
        ];
        let n = group_normalize(&samples, false);
        // Group 7 has rollouts {1.0, 0.0}: mean 0.5, whatever the sibling count.
        assert_eq!(n, vec![0.5, -0.5, -0.5, -0.5, 0.5]);
        let shuffled = [samples[4], samples[2], samples[0], samples[3], samples[1]];
        let m2 = group_normalize(&shuffled, true);
        let n2 = group_normalize(&samples, true);
        assert_eq!(m2[2], n2[0]);
        assert_eq!(m2[0], n2[4]);
    }

    #[test]
    fn rloo_leaves_one_out_and_singletons_get_zero() {
        let m = [1u8];
        let samples = [
            sample(1, 1, 3.0, &m),
            sample(1, 2, 1.0, &m),
            sample(1, 3, 2.0, &m),
            sample(2, 4, 5.0, &m),
        ];
        let a = compute_advantages(
            &samples,
            &AdvantageConfig {
                estimator: Estimator::Rloo,
                ..Default::default()
            },
            None,
        )
        .unwrap();
        assert_eq!(a.advantages[0], vec![3.0 - 1.5]);
        assert_eq!(a.advantages[3], vec![0.0]);
    }

    #[test]
    fn missing_inputs_are_named() {
        let m = [1u8];
        let err = compute_advantages(
            &[sample(1, 1, 1.0, &m)],
            &AdvantageConfig {
                estimator: Estimator::Ppo,
                ..Default::default()
            },
            None,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "ppo needs values (a critic) for every sample (sample 0 has none)"
        );
        let err = compute_advantages(
            &[sample(1, 1, 1.0, &m)],
            &AdvantageConfig {
                kl_coef: 0.1,
                ..Default::default()
            },
            None,
        )
        .unwrap_err();
        assert!(err.to_string().contains("not grpo"), "{err}");
    }
}
