//! The rollout manager: runs prompts × `n_samples_per_prompt` through the engine with bounded
//! concurrency, scores each prompt's group, and fills a batch of groups, over-sampling past the
//! groups the filters drop (dynamic sampling: groups whose rewards have zero spread carry no GRPO
//! signal).
//!
//! Every sample's sampling seed is a function of the run seed, its group's number and its index in
//! the group, and the engine's draws depend only on (seed, position): a rollout is reproducible,
//! whatever else the engine runs beside it.

use crate::activity::ActivitySummary;
pub use crate::agent::AgentRollout;
use crate::agent::{run_one, Trajectory};
use crate::prompts::PromptItem;
use crate::scorer::{RewardFailure, RewardInput, Scorer};
use crate::seeds::sample_seed;
use ooze_core::{Sample, Status};
use ooze_engine::{EngineError, EngineHandle, Request, Sampling};
use ooze_model::Tokenizer;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// How a batch is generated.
#[derive(Debug, Clone)]
pub struct RolloutSettings {
    pub n_samples_per_prompt: usize,
    /// Sampling of every request (the seed is set per sample).
    pub sampling: Sampling,
    /// Requests in flight at once.
    pub concurrency: usize,
    pub seed: u64,
    /// Drop groups whose rewards are all equal (or, with `min_reward_std`, nearly so).
    pub dynamic_sampling: bool,
    /// With `dynamic_sampling`: also drop groups whose reward standard deviation (over
    /// executions, unbiased) is at most this (ToolOrchestra drops groups at ≤ 0.1).
    pub min_reward_std: f64,
    /// Drop groups with a response cut at `max_new_tokens`.
    pub drop_truncated_groups: bool,
    /// Keep truncated responses but train none of their tokens.
    pub mask_truncated: bool,
    /// Prompts generated per round while filling a batch (at least the batch size).
    pub over_sampling_batch_size: usize,
    /// Rounds before giving up on filling the batch (the batch is then smaller).
    pub max_rounds: usize,
    /// Run this agent per sample instead of one plain generation.
    pub agent: Option<AgentRollout>,
}

/// A prompt and its samples (every sample's `group` is the group's). Saved as one line of a
/// rollout file ([`crate::rollout_record`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// The run-wide number of this prompt draw (unique, increasing).
    pub group: u64,
    pub prompt: PromptItem,
    pub samples: Vec<Sample>,
}

impl Group {
    /// One reward per execution: the mean over its samples (siblings with a broadcast reward share
    /// it; with per-sample rewards, as the advantage computation counts them).
    pub fn rewards(&self) -> Vec<f64> {
        let mut sums: BTreeMap<usize, (f64, usize)> = BTreeMap::new();
        for s in &self.samples {
            let e = sums.entry(s.execution).or_default();
            e.0 += s.reward.unwrap_or(0.0);
            e.1 += 1;
        }
        sums.into_values().map(|(sum, n)| sum / n as f64).collect()
    }
}

/// A batch and what it cost.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    pub groups: Vec<Group>,
    /// Groups generated, kept or not.
    pub generated_groups: usize,
    pub rounds: usize,
    /// Dropped groups by reason (`zero_std`, `truncated`), and over-sampled groups left unused
    /// (`surplus`).
    pub dropped: BTreeMap<String, usize>,
    /// What the agent's executions did over the rollout (none without an agent, or in a
    /// replay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<ActivitySummary>,
}

#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    #[error("reward of prompt line {line}: {failure}")]
    Reward { line: usize, failure: RewardFailure },
    #[error("decoding a response: {0}")]
    Decode(String),
    #[error("generating group {group}: the task ended without its groups ({why})")]
    Lost { group: u64, why: String },
}

/// Seconds between the samples of a rollout's activity series.
pub const ACTIVITY_SAMPLE_SECS: f64 = 0.25;

/// Generates and scores `prompts` (each with its group number), `n` samples (or agent
/// executions) each.
pub async fn generate_groups(
    engine: &EngineHandle,
    tokenizer: &Arc<Tokenizer>,
    scorer: &Scorer,
    prompts: Vec<(u64, PromptItem)>,
    n: usize,
    settings: &RolloutSettings,
    on_sample: &(dyn Fn() + Sync),
) -> Result<Vec<Group>, RolloutError> {
    let limit = Arc::new(Semaphore::new(settings.concurrency.max(1)));
    generate_groups_limited(
        engine, tokenizer, scorer, prompts, n, settings, &limit, on_sample,
    )
    .await
}

/// [`generate_groups`] with the requests (or agent executions) in flight bounded by `limit`,
/// which other calls may share (the asynchronous producer's groups share one).
#[allow(clippy::too_many_arguments)]
pub async fn generate_groups_limited(
    engine: &EngineHandle,
    tokenizer: &Arc<Tokenizer>,
    scorer: &Scorer,
    prompts: Vec<(u64, PromptItem)>,
    n: usize,
    settings: &RolloutSettings,
    limit: &Arc<Semaphore>,
    on_sample: &(dyn Fn() + Sync),
) -> Result<Vec<Group>, RolloutError> {
    match &settings.agent {
        Some(agent) => {
            generate_agent_groups(
                engine, tokenizer, scorer, prompts, n, settings, agent, limit, on_sample,
            )
            .await
        }
        None => {
            generate_plain_groups(
                engine, tokenizer, scorer, prompts, n, settings, limit, on_sample,
            )
            .await
        }
    }
}

/// Runs the agent `n` times per prompt (bounded concurrency), then rewards each execution: the
/// samples' own rewards, else the execution's reward broadcast to its samples, else the scorer on
/// its final response. A failed execution (agent error, missed deadline) keeps its place in the
/// group with reward 0 and nothing to train.
#[allow(clippy::too_many_arguments)]
async fn generate_agent_groups(
    engine: &EngineHandle,
    tokenizer: &Arc<Tokenizer>,
    scorer: &Scorer,
    prompts: Vec<(u64, PromptItem)>,
    n: usize,
    settings: &RolloutSettings,
    agent: &AgentRollout,
    limit: &Arc<Semaphore>,
    on_sample: &(dyn Fn() + Sync),
) -> Result<Vec<Group>, RolloutError> {
    let mut tasks = tokio::task::JoinSet::new();
    for (p, (group, prompt)) in prompts.iter().enumerate() {
        for index in 0..n {
            let (engine, tokenizer, agent) = (engine.clone(), tokenizer.clone(), agent.clone());
            let (prompt, group, limit) = (prompt.clone(), *group, limit.clone());
            let (sampling, seed) = (settings.sampling.clone(), settings.seed);
            tasks.spawn(async move {
                let _permit = limit.acquire_owned().await.expect("never closed");
                let t = run_one(
                    &agent, &engine, &tokenizer, &sampling, seed, group, index, &prompt,
                )
                .await;
                (p, t)
            });
        }
    }
    let mut runs: Vec<Vec<Option<Trajectory>>> = vec![vec![None; n]; prompts.len()];
    while let Some(joined) = tasks.join_next().await {
        let (p, t) = joined.expect("invariant: agent tasks do not panic");
        let index = t.index;
        runs[p][index] = Some(t);
        on_sample();
    }
    let runs: Vec<Vec<Trajectory>> = runs
        .into_iter()
        .map(|runs| {
            runs.into_iter()
                .map(|t| t.expect("invariant: every execution finished"))
                .collect()
        })
        .collect();
    // A scorer that waits on other processes scores the groups at once.
    let rewards: Vec<Vec<f64>> = if scorer.blocks() {
        std::thread::scope(|scope| {
            let calls: Vec<_> = prompts
                .iter()
                .zip(&runs)
                .map(|((_, prompt), runs)| {
                    scope.spawn(move || agent_rewards(scorer, prompt, runs, tokenizer))
                })
                .collect();
            calls
                .into_iter()
                .map(|c| c.join().expect("invariant: scoring does not panic"))
                .collect::<Result<_, _>>()
        })?
    } else {
        prompts
            .iter()
            .zip(&runs)
            .map(|((_, prompt), runs)| agent_rewards(scorer, prompt, runs, tokenizer))
            .collect::<Result<_, _>>()?
    };
    let mut groups = Vec::with_capacity(prompts.len());
    for (((group, prompt), runs), rewards) in prompts.into_iter().zip(runs).zip(rewards) {
        let mut samples = Vec::new();
        for (t, reward) in runs.into_iter().zip(rewards) {
            samples.extend(agent_samples(
                t, reward, &prompt, group, settings, tokenizer,
            )?);
        }
        groups.push(Group {
            group,
            prompt,
            samples,
        });
    }
    Ok(groups)
}

/// The reward of each execution of one prompt.
fn agent_rewards(
    scorer: &Scorer,
    prompt: &PromptItem,
    runs: &[Trajectory],
    tokenizer: &Tokenizer,
) -> Result<Vec<f64>, RolloutError> {
    let finals: Vec<String> = runs
        .iter()
        .map(
            |t| match (&t.output.final_response, t.output.samples.last()) {
                (Some(text), _) => Ok(text.clone()),
                (None, Some(last)) => tokenizer
                    .decode(last.response_tokens(), true)
                    .map_err(|e| RolloutError::Decode(e.to_string())),
                (None, None) => Ok(String::new()),
            },
        )
        .collect::<Result<_, _>>()?;
    let needs_scorer = runs
        .iter()
        .any(|t| t.error.is_none() && t.output.reward.is_none());
    let scored = if needs_scorer {
        let inputs: Vec<RewardInput<'_>> = finals
            .iter()
            .map(|f| RewardInput {
                prompt: &prompt.text,
                response: f,
                label: &prompt.label,
                metadata: &prompt.metadata,
            })
            .collect();
        scorer
            .score_group(&inputs)
            .map_err(|failure| RolloutError::Reward {
                line: prompt.source_line,
                failure,
            })?
    } else {
        vec![0.0; runs.len()]
    };
    Ok(runs
        .iter()
        .zip(scored)
        .map(|(t, s)| match (&t.error, t.output.reward) {
            (Some(_), _) => 0.0,
            (None, Some(r)) => r,
            (None, None) => s,
        })
        .collect())
}

/// An execution's samples, numbered and rewarded (a failed one as one empty sample that trains
/// nothing).
fn agent_samples(
    t: Trajectory,
    reward: f64,
    prompt: &PromptItem,
    group: u64,
    settings: &RolloutSettings,
    tokenizer: &Tokenizer,
) -> Result<Vec<Sample>, RolloutError> {
    let seed = sample_seed(settings.seed, group, t.index);
    if t.error.is_some() || t.output.samples.is_empty() {
        let mut failed = Sample {
            group,
            execution: t.index,
            reward: Some(0.0),
            status: Status::Failed,
            seed,
            error: Some(
                t.error
                    .unwrap_or_else(|| "the agent returned no samples".into()),
            ),
            metrics: t.output.metrics,
            ..Sample::with_prompt(prompt.input_ids.clone())
        };
        failed.remove();
        return Ok(vec![failed]);
    }
    let mut out = Vec::with_capacity(t.output.samples.len());
    let mut metrics = t.output.metrics;
    for (k, mut s) in t.output.samples.into_iter().enumerate() {
        s.check().map_err(|e| RolloutError::Decode(e.to_string()))?;
        // Ended by the agent (an answer, the turn limit): no single stop token stands for it.
        if s.status == Status::Pending {
            s.status = Status::Completed;
        }
        s.group = group;
        s.execution = t.index;
        s.sibling = k;
        s.seed = seed;
        s.response = tokenizer
            .decode(s.response_tokens(), false)
            .map_err(|e| RolloutError::Decode(e.to_string()))?;
        s.reward = Some(s.reward.unwrap_or(reward));
        s.metrics = std::mem::take(&mut metrics);
        if s.removed || s.truncated() && settings.mask_truncated {
            s.remove();
        }
        out.push(s);
    }
    Ok(out)
}

/// One plain generation per sample.
#[allow(clippy::too_many_arguments)]
async fn generate_plain_groups(
    engine: &EngineHandle,
    tokenizer: &Arc<Tokenizer>,
    scorer: &Scorer,
    prompts: Vec<(u64, PromptItem)>,
    n: usize,
    settings: &RolloutSettings,
    limit: &Arc<Semaphore>,
    on_sample: &(dyn Fn() + Sync),
) -> Result<Vec<Group>, RolloutError> {
    let mut tasks = tokio::task::JoinSet::new();
    for (p, (group, prompt)) in prompts.iter().enumerate() {
        for index in 0..n {
            let mut sampling = settings.sampling.clone();
            let seed = sample_seed(settings.seed, *group, index);
            sampling.seed = Some(seed);
            let request = Request {
                input_ids: prompt.input_ids.clone(),
                sampling,
                session: None,
            };
            let engine = engine.clone();
            let limit = limit.clone();
            tasks.spawn(async move {
                let _permit = limit.acquire_owned().await.expect("never closed");
                (p, index, engine.generate(request).await)
            });
        }
    }
    let mut outputs: Vec<Vec<Option<ooze_engine::Output>>> = vec![vec![None; n]; prompts.len()];
    while let Some(joined) = tasks.join_next().await {
        let (p, index, output) = joined.expect("invariant: generation tasks do not panic");
        outputs[p][index] = Some(output?);
        on_sample();
    }
    let mut groups = Vec::with_capacity(prompts.len());
    for ((group, prompt), outs) in prompts.into_iter().zip(outputs) {
        let mut samples = Vec::with_capacity(n);
        for (index, out) in outs.into_iter().enumerate() {
            let out = out.expect("invariant: every sample finished");
            let mut sample = Sample {
                group,
                execution: index,
                seed: out.seed,
                response: tokenizer
                    .decode(&out.tokens, true)
                    .map_err(|e| RolloutError::Decode(e.to_string()))?,
                ..Sample::with_prompt(prompt.input_ids.clone())
            };
            sample
                .push_generated(&out.tokens, &out.log_probs, &out.versions())
                .map_err(|e| RolloutError::Decode(e.to_string()))?;
            sample.finish(&out.finish);
            if sample.truncated() && settings.mask_truncated {
                sample.remove();
            }
            samples.push(sample);
        }
        groups.push(Group {
            group,
            prompt,
            samples,
        });
    }
    score(scorer, &mut groups).await?;
    Ok(groups)
}

/// Fills in the rewards (remote scorers run on blocking threads, groups in parallel).
async fn score(scorer: &Scorer, groups: &mut [Group]) -> Result<(), RolloutError> {
    let rewards_of = |scorer: &Scorer, g: &Group| -> Result<Vec<f64>, RolloutError> {
        let inputs: Vec<RewardInput<'_>> = g
            .samples
            .iter()
            .map(|s| RewardInput {
                prompt: &g.prompt.text,
                response: &s.response,
                label: &g.prompt.label,
                metadata: &g.prompt.metadata,
            })
            .collect();
        scorer
            .score_group(&inputs)
            .map_err(|failure| RolloutError::Reward {
                line: g.prompt.source_line,
                failure,
            })
    };
    let all: Vec<Vec<f64>> = if scorer.blocks() {
        let mut tasks = tokio::task::JoinSet::new();
        for (i, g) in groups.iter().enumerate() {
            let (scorer, g) = (scorer.clone(), g.clone());
            tasks.spawn_blocking(move || (i, rewards_of(&scorer, &g)));
        }
        let mut out = vec![Vec::new(); groups.len()];
        while let Some(joined) = tasks.join_next().await {
            let (i, r) = joined.expect("invariant: reward tasks do not panic");
            out[i] = r?;
        }
        out
    } else {
        groups
            .iter()
            .map(|g| rewards_of(scorer, g))
            .collect::<Result<_, _>>()?
    };
    for (g, rewards) in groups.iter_mut().zip(all) {
        for (s, r) in g.samples.iter_mut().zip(rewards) {
            s.reward = Some(r);
        }
    }
    Ok(())
}

/// Why the filters drop a group, if they do.
pub fn drop_reason(group: &Group, settings: &RolloutSettings) -> Option<&'static str> {
    if settings.drop_truncated_groups && group.samples.iter().any(Sample::truncated) {
        return Some("truncated");
    }
    if settings.dynamic_sampling {
        let r = group.rewards();
        if r.iter().all(|&x| x == r[0]) {
            return Some("zero_std");
        }
        if settings.min_reward_std > 0.0 && std_dev(&r) <= settings.min_reward_std {
            return Some("low_std");
        }
    }
    None
}

/// The unbiased standard deviation (0 for fewer than two values).
fn std_dev(xs: &[f64]) -> f64 {
    if xs.len() < 2 {
        return 0.0;
    }
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (xs.len() - 1) as f64).sqrt()
}

/// Fills a batch of `batch_size` groups: takes prompts from `next_prompts` (each call returns the
/// next `k` prompts with their group numbers), generates them, drops what the filters reject, and
/// repeats until the batch is full or `max_rounds` rounds were run. Over-sampled groups beyond the
/// batch are counted as `surplus` and not used.
pub async fn fill_batch(
    engine: &EngineHandle,
    tokenizer: &Arc<Tokenizer>,
    scorer: &Scorer,
    batch_size: usize,
    settings: &RolloutSettings,
    next_prompts: &mut (dyn FnMut(usize) -> Vec<(u64, PromptItem)> + Send),
    on_sample: &(dyn Fn() + Sync),
) -> Result<Batch, RolloutError> {
    let mut batch = Batch::default();
    if let Some(agent) = &settings.agent {
        agent.activity.restart();
    }
    let filtering = settings.dynamic_sampling || settings.drop_truncated_groups;
    while batch.groups.len() < batch_size && batch.rounds < settings.max_rounds.max(1) {
        let missing = batch_size - batch.groups.len();
        let take = if filtering {
            settings.over_sampling_batch_size.max(missing)
        } else {
            missing
        };
        let prompts = next_prompts(take);
        if prompts.is_empty() {
            break;
        }
        batch.rounds += 1;
        batch.generated_groups += prompts.len();
        let groups = generate_groups(
            engine,
            tokenizer,
            scorer,
            prompts,
            settings.n_samples_per_prompt,
            settings,
            on_sample,
        )
        .await?;
        for g in groups {
            if let Some(reason) = drop_reason(&g, settings) {
                *batch.dropped.entry(reason.to_owned()).or_default() += 1;
            } else if batch.groups.len() < batch_size {
                batch.groups.push(g);
            } else {
                *batch.dropped.entry("surplus".to_owned()).or_default() += 1;
            }
        }
    }
    batch.activity = settings
        .agent
        .as_ref()
        .map(|a| a.activity.summary(ACTIVITY_SAMPLE_SECS));
    Ok(batch)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(execution: usize, sibling: usize, reward: f64) -> Sample {
        Sample {
            execution,
            sibling,
            reward: Some(reward),
            ..Sample::with_prompt(vec![1])
        }
    }

    #[test]
    fn executions_count_once_and_low_spread_groups_drop() {
        let prompt = PromptItem {
            source_line: 1,
            text: String::new(),
            input_ids: vec![1],
            label: String::new(),
            metadata: serde_json::Value::Null,
            messages: Vec::new(),
            tools: None,
        };
        // Execution 0 has three siblings with per-sample rewards, execution 1 one sample.
        let group = Group {
            group: 0,
            prompt,
            samples: vec![
                sample(0, 0, 1.0),
                sample(0, 1, 0.0),
                sample(0, 2, 0.5),
                sample(1, 0, 0.2),
            ],
        };
        assert_eq!(group.rewards(), vec![0.5, 0.2]);
        let mut settings = RolloutSettings {
            n_samples_per_prompt: 2,
            sampling: Sampling::default(),
            concurrency: 1,
            seed: 0,
            dynamic_sampling: true,
            min_reward_std: 0.0,
            drop_truncated_groups: false,
            mask_truncated: false,
            over_sampling_batch_size: 1,
            max_rounds: 1,
            agent: None,
        };
        // std of {0.5, 0.2} is 0.21: kept at 0.1, dropped at 0.5.
        assert_eq!(drop_reason(&group, &settings), None);
        settings.min_reward_std = 0.1;
        assert_eq!(drop_reason(&group, &settings), None);
        settings.min_reward_std = 0.5;
        assert_eq!(drop_reason(&group, &settings), Some("low_std"));
    }
}
