//! Stage *reward*: the scorers that turn responses into rewards — the recipe's `[reward]` for
//! training (built-in task checks, registered functions, a remote reward model), and per eval set
//! the task's own check where the set is a built-in task — and the rollout's numbers once its
//! groups are scored: reward mean, spread and positive share counted once per execution (an
//! agent's sibling samples share one), response lengths, filtering, agent counts.
//!
//! Samples are scored as their group finishes, inside the rollout manager, because dynamic
//! sampling keeps or drops a group by its rewards before the batch is full.

use crate::recipe::{Mode, Recipe};
use ooze_rollout::manager::Batch;
use ooze_rollout::scorer::{Registry, RewardConfig, Scorer};
use ooze_rollout::Task;
use serde_json::{json, Map, Value};

/// The training reward (none in replay mode, which scores nothing).
pub(crate) fn train_scorer(recipe: &Recipe, registry: &Registry) -> anyhow::Result<Option<Scorer>> {
    if recipe.trainer.mode == Mode::Replay {
        return Ok(None);
    }
    Scorer::new(&recipe.reward, recipe.data.task, registry)
        .map(Some)
        .map_err(anyhow::Error::msg)
}

/// An eval set's reward: a built-in task is checked by its own answer check; otherwise the
/// recipe's reward. `at` names the set in errors.
pub(crate) fn eval_scorer(
    recipe: &Recipe,
    task: Option<Task>,
    registry: &Registry,
    at: &str,
) -> anyhow::Result<Scorer> {
    match (&recipe.reward, task) {
        (RewardConfig::Task, Some(t)) => Ok(Scorer::Task(t)),
        (config, task) => {
            Scorer::new(config, task, registry).map_err(|m| anyhow::anyhow!("{at}: {m}"))
        }
    }
}

pub(crate) fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        0.0
    } else {
        s / n as f64
    }
}

/// The rollout's own numbers.
/// `is_agent`: the samples are an agent's (executions, siblings, failures are counted).
pub(crate) fn rollout_line(
    index: u64,
    batch: &Batch,
    seconds: f64,
    is_agent: bool,
) -> Map<String, Value> {
    let samples: Vec<_> = batch.groups.iter().flat_map(|g| &g.samples).collect();
    // One reward per execution: an agent's siblings count once.
    let rewards: Vec<f64> = batch.groups.iter().flat_map(|g| g.rewards()).collect();
    let m = mean(rewards.iter().copied());
    let std = mean(rewards.iter().map(|r| (r - m) * (r - m))).sqrt();
    let lens: Vec<f64> = samples.iter().map(|s| s.response_length as f64).collect();
    let tokens: f64 = lens.iter().sum();
    let mut line = Map::new();
    line.insert("rollout".into(), json!(index));
    line.insert("reward/mean".into(), json!(m));
    line.insert("reward/std".into(), json!(std));
    line.insert(
        "reward/positive_frac".into(),
        json!(mean(rewards.iter().map(|&r| (r > 0.0) as u8 as f64))),
    );
    line.insert("rollout/samples".into(), json!(samples.len()));
    line.insert(
        "rollout/response_len_mean".into(),
        json!(mean(lens.iter().copied())),
    );
    line.insert(
        "rollout/response_len_max".into(),
        json!(lens.iter().cloned().fold(0.0, f64::max)),
    );
    line.insert(
        "rollout/truncated_frac".into(),
        json!(mean(samples.iter().map(|s| s.truncated() as u8 as f64))),
    );
    line.insert(
        "rollout/generated_groups".into(),
        json!(batch.generated_groups),
    );
    line.insert("rollout/rounds".into(), json!(batch.rounds));
    // Agent counts, averaged over executions (turns, tool calls, …), and failed executions.
    let executions: Vec<_> = samples.iter().filter(|s| s.sibling == 0).collect();
    let mut agent: std::collections::BTreeMap<&str, f64> = Default::default();
    for s in &executions {
        for (k, v) in &s.metrics {
            *agent.entry(k.as_str()).or_default() += v;
        }
    }
    for (k, sum) in agent {
        line.insert(format!("agent/{k}"), json!(sum / executions.len() as f64));
    }
    if is_agent {
        line.insert(
            "agent/failed_frac".into(),
            json!(mean(
                executions.iter().map(|s| s.error.is_some() as u8 as f64)
            )),
        );
        line.insert(
            "agent/samples_per_execution".into(),
            json!(samples.len() as f64 / executions.len().max(1) as f64),
        );
    }
    for (reason, count) in &batch.dropped {
        line.insert(format!("rollout/dropped_{reason}"), json!(count));
    }
    // Effective concurrency: executions alive, with a policy turn in the engine, waiting on a
    // helper model (time-weighted over the rollout).
    if let Some(a) = &batch.activity {
        for (name, stats) in [
            ("alive", &a.alive),
            ("generating", &a.generating),
            ("helper", &a.helper),
        ] {
            for (stat, value) in [
                ("mean", stats.mean),
                ("median", stats.median),
                ("p90", stats.p90),
                ("max", stats.max),
            ] {
                line.insert(format!("concurrency/{name}_{stat}"), json!(value));
            }
        }
    }
    if seconds > 0.0 {
        line.insert("rollout/tokens_per_s".into(), json!(tokens / seconds));
    }
    line.insert("time/rollout".into(), json!(seconds));
    line
}

/// One console line per rollout.
pub(crate) fn summary_text(line: &Map<String, Value>, total: u64) -> String {
    let f = |k: &str| line.get(k).and_then(Value::as_f64);
    let mut parts = vec![format!(
        "rollout {}/{total}",
        line.get("rollout").and_then(Value::as_u64).unwrap_or(0)
    )];
    for (key, label, digits) in [
        ("reward/mean", "reward", 3),
        ("rollout/response_len_mean", "len", 1),
        ("rollout/dropped_zero_std", "dropped", 0),
        ("train/loss", "loss", 4),
        ("train/entropy", "entropy", 3),
        ("train/value_loss", "value loss", 4),
        ("train/teacher_logp_gap", "teacher gap", 3),
    ] {
        if let Some(v) = f(key) {
            parts.push(format!("{label} {v:.digits$}"));
        }
    }
    if let Some(v) = f("train/mismatch_mean") {
        parts.push(format!("mismatch {v:.1e}"));
    }
    parts.push(format!(
        "{:.1}s gen + {:.1}s train",
        f("time/rollout").unwrap_or(0.0),
        f("time/train").unwrap_or(0.0)
    ));
    for (k, v) in line {
        if k.starts_with("eval/") && k.contains("pass@") {
            parts.push(format!("{} {:.3}", &k[5..], v.as_f64().unwrap_or(0.0)));
        }
    }
    parts.join(" · ")
}
