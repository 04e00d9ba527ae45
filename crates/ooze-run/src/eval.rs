//! Held-out evaluation: each eval set's prompts × `n_samples` through the engine, scored with the
//! recipe's reward (a sample passes when its reward is positive), summarised as pass@k with the
//! unbiased estimator of Chen et al. (2021): per prompt with `c` passing of `n` samples,
//! `pass@k = 1 − C(n−c, k) / C(n, k)`, averaged over prompts.

use ooze_engine::{EngineHandle, Sampling};
use ooze_model::Tokenizer;
use ooze_rollout::manager::{generate_groups, AgentRollout, Group, RolloutError, RolloutSettings};
use ooze_rollout::prompts::PromptItem;
use ooze_rollout::scorer::Scorer;
use std::sync::Arc;

/// Unbiased pass@k of one prompt with `c` of `n` samples passing.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    assert!(
        k >= 1 && k <= n && c <= n,
        "pass@{k} needs 1 ≤ k ≤ n = {n}, c = {c} ≤ n"
    );
    if n - c < k {
        return 1.0;
    }
    // C(n−c, k)/C(n, k) = Π_{i = n−c+1}^{n} (1 − k/i)
    1.0 - ((n - c + 1)..=n)
        .map(|i| 1.0 - k as f64 / i as f64)
        .product::<f64>()
}

/// A prepared eval set.
pub struct EvalSet {
    pub name: String,
    pub prompts: Vec<PromptItem>,
    pub scorer: Scorer,
    pub n_samples: usize,
    pub sampling: Sampling,
    pub pass_k: Vec<usize>,
}

/// One eval set's results.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EvalResult {
    pub name: String,
    /// `(k, pass@k)` in the order asked.
    pub pass_at: Vec<(usize, f64)>,
    pub mean_reward: f64,
    pub mean_response_tokens: f64,
}

/// Runs `set` through the engine (through `agent`, when the recipe has one). Sampling seeds come from `seed` and the prompt's position, so the
/// same weights give the same result.
pub async fn evaluate(
    engine: &EngineHandle,
    tokenizer: &Arc<Tokenizer>,
    set: &EvalSet,
    concurrency: usize,
    seed: u64,
    agent: Option<&AgentRollout>,
) -> Result<EvalResult, RolloutError> {
    let settings = RolloutSettings {
        n_samples_per_prompt: set.n_samples,
        sampling: set.sampling.clone(),
        concurrency,
        seed,
        dynamic_sampling: false,
        min_reward_std: 0.0,
        drop_truncated_groups: false,
        mask_truncated: false,
        over_sampling_batch_size: 0,
        max_rounds: 1,
        // An agent recipe is evaluated through its agent.
        agent: agent.cloned(),
    };
    let prompts = set
        .prompts
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, p)| (i as u64, p))
        .collect();
    let groups = generate_groups(
        engine,
        tokenizer,
        &set.scorer,
        prompts,
        set.n_samples,
        &settings,
        &|| {},
    )
    .await?;
    let prompts = groups.len().max(1) as f64;
    let pass_at = set
        .pass_k
        .iter()
        .map(|&k| {
            let sum: f64 = groups
                .iter()
                .map(|g| {
                    let c = successes(g);
                    pass_at_k(set.n_samples, c, k)
                })
                .sum();
            (k, sum / prompts)
        })
        .collect();
    let samples: Vec<_> = groups.iter().flat_map(|g| &g.samples).collect();
    let count = samples.len().max(1) as f64;
    Ok(EvalResult {
        name: set.name.clone(),
        pass_at,
        mean_reward: samples.iter().filter_map(|s| s.reward).sum::<f64>() / count,
        mean_response_tokens: samples
            .iter()
            .map(|s| s.response_length as f64)
            .sum::<f64>()
            / count,
    })
}

/// Executions of `group` that succeeded: one verdict per execution (an agent's siblings share
/// it) — the agent's own `correct` count when it reports one (a shaped or cost-penalised reward
/// is not a verdict), else a positive reward.
fn successes(group: &Group) -> usize {
    let rewards = group.rewards();
    let firsts = group.samples.iter().filter(|s| s.sibling == 0);
    firsts
        .zip(rewards)
        .filter(|(s, r)| match s.metrics.get("correct") {
            Some(&c) => c > 0.0,
            None => *r > 0.0,
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, by counting subsets.
    fn pass_at_k_by_subsets(n: usize, c: usize, k: usize) -> f64 {
        fn choose(n: usize, k: usize) -> f64 {
            if k > n {
                return 0.0;
            }
            (0..k).map(|i| (n - i) as f64 / (i + 1) as f64).product()
        }
        1.0 - choose(n - c, k) / choose(n, k)
    }

    #[test]
    fn unbiased_estimator_matches_the_definition() {
        for n in 1..=12 {
            for c in 0..=n {
                for k in 1..=n {
                    let a = pass_at_k(n, c, k);
                    let b = pass_at_k_by_subsets(n, c, k);
                    assert!((a - b).abs() < 1e-12, "n {n} c {c} k {k}: {a} vs {b}");
                }
            }
        }
        assert_eq!(pass_at_k(4, 1, 1), 0.25);
        assert_eq!(pass_at_k(4, 0, 4), 0.0);
        assert_eq!(pass_at_k(4, 1, 4), 1.0);
    }
}
