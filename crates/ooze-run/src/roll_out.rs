//! Stage *roll out*: one rollout's groups — `rollout.batch_size` prompts drawn from the prompt
//! order, `n_samples_per_prompt` samples each, through the engine or the recipe's agent, scored as
//! they finish, filtered groups dropped and more prompts drawn until the batch is full. A replay
//! reads the groups another run saved instead. Saved rollouts (`RUN/rollouts/rollout-NNNNNN.jsonl`,
//! one group per line) are what replays and inspection read.

use crate::progress::Progress;
use crate::recipe::Mode;
use crate::run::Run;
use anyhow::Context;
use ooze_rollout::manager::{fill_batch, Batch, Group};
use ooze_rollout::prompts::PromptItem;
use std::path::{Path, PathBuf};
use std::time::Instant;

impl Run {
    /// Generates (or, in a replay, reads) rollout `index`; returns it with its seconds.
    pub(crate) fn roll_out(&mut self, index: u64) -> anyhow::Result<(Batch, f64)> {
        let t = Instant::now();
        let batch = if self.mode() == Mode::Replay {
            let from = self
                .recipe
                .trainer
                .replay_from
                .as_ref()
                .expect("invariant: the recipe check requires replay_from");
            read_rollout(from, index)?
        } else {
            self.generate(index)?
        };
        let seconds = t.elapsed().as_secs_f64();
        if self.is_first() {
            self.save_rollout(index, &batch)?;
        }
        Ok((batch, seconds))
    }

    /// Saves rollout `index` (`logging.save_rollouts`; not a replay's) and its agents' activity.
    pub(crate) fn save_rollout(&self, index: u64, batch: &Batch) -> anyhow::Result<()> {
        if self.recipe.logging.save_rollouts && self.mode() != Mode::Replay {
            write_rollout(&self.run_dir.join("rollouts"), index, batch)?;
        }
        if let Some(activity) = &batch.activity {
            write_activity(&self.run_dir.join("activity"), index, activity)?;
        }
        Ok(())
    }

    /// On several ranks, each generates its dealt share of the prompts (rank `r` of `N` takes
    /// draws `r, r + N, …` of the prompt order, with their global group numbers) and the ranks
    /// exchange their groups; afterwards every rank's order stands past the most any rank drew.
    /// Beside engines outside the trainer, rank 0 generates the whole rollout (the engines do the
    /// work, and rank 0's router spreads it over them) and the others wait for the exchange.
    fn generate(&mut self, index: u64) -> anyhow::Result<Batch> {
        let r = &self.recipe.rollout;
        let (rank, world) = match &self.ranks {
            Some(x) if !self.external_engines => (x.rank(), x.world_size()),
            Some(x) => (x.rank(), 1),
            None => (0, 1),
        };
        let share = if rank < world {
            r.batch_size / world
        } else {
            0
        };
        let progress = Progress::new(
            format!("rollout {index}/{}", r.num_rollouts),
            share * r.n_samples_per_prompt,
            self.recipe.logging.progress && rank == 0,
        );
        let first_group = self.state.next_group;
        // Draws taken from the order so far (every rank's, this rank's included).
        let mut drawn = 0u64;
        let (order, prompts) = (&mut self.order, &self.prompts);
        let mut next = |k: usize| -> Vec<(u64, PromptItem)> {
            let base = first_group + drawn;
            let dealt = order
                .take(k * world)
                .into_iter()
                .enumerate()
                .filter(|(j, _)| j % world == rank)
                .map(|(j, i)| (base + j as u64, prompts[i].clone()))
                .collect();
            drawn += (k * world) as u64;
            dealt
        };
        let batch = match &self.engine {
            Some(engine) if share > 0 => self.runtime.block_on(fill_batch(
                engine,
                &self.tokenizer,
                self.scorer.as_ref().expect("invariant: not a replay"),
                share,
                &self.settings,
                &mut next,
                &|| progress.tick(),
            ))?,
            _ => Batch::default(),
        };
        progress.finish();
        let Some(ranks) = &self.ranks else {
            self.state.next_group = first_group + drawn;
            self.state.position = self.order.position();
            return Ok(batch);
        };
        let most = ranks.max(drawn)?;
        self.order.take((most - drawn) as usize);
        self.state.next_group = first_group + most;
        self.state.position = self.order.position();
        ranks.exchange(batch)
    }
}

fn rollout_file(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("rollout-{index:06}.jsonl"))
}

/// Saves a rollout's groups, one JSON object per line (atomically).
fn write_rollout(dir: &Path, index: u64, batch: &Batch) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut body = String::new();
    for g in &batch.groups {
        body.push_str(&serde_json::to_string(g)?);
        body.push('\n');
    }
    ooze_core::atomic_file::write(&rollout_file(dir, index), body.as_bytes())?;
    Ok(())
}

/// Saves what the rollout's executions did over time (`RUN/activity/rollout-NNNNNN.json`:
/// statistics and the `[alive, generating, helper]` series), atomically.
fn write_activity(
    dir: &Path,
    index: u64,
    activity: &ooze_rollout::activity::ActivitySummary,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("rollout-{index:06}.json"));
    ooze_core::atomic_file::write(&path, serde_json::to_string(activity)?.as_bytes())?;
    Ok(())
}

/// Reads a saved rollout for replay.
fn read_rollout(run_dir: &Path, index: u64) -> anyhow::Result<Batch> {
    let path = rollout_file(&run_dir.join("rollouts"), index);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "trainer.replay_from: reading {} (was the run saved with logging.save_rollouts?)",
            path.display()
        )
    })?;
    let groups = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str::<Group>(l)
                .with_context(|| format!("{}:{}: not a saved rollout group", path.display(), i + 1))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Batch {
        generated_groups: groups.len(),
        groups,
        ..Default::default()
    })
}
