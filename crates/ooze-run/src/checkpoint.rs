//! Stage *checkpoint*: every `trainer.save_interval` rollouts (and after the last) the trainer —
//! policy, optimizer, critic — and the run's counters are saved atomically, written in the
//! background (`ooze_train::checkpoint::save_in_background`); a rollout-only run saves its counters alone
//! (`RUN/rollout_state.json`). A resumed run restores both, so it draws the same prompts and
//! samples and takes the same steps as one that was never stopped.

use crate::recipe::{Mode, Recipe};
use crate::run::{Run, RunState};
use anyhow::{bail, Context};
use ooze_train::{checkpoint, Trainer};
use std::path::{Path, PathBuf};
use std::time::Instant;

fn rollout_state_path(run_dir: &Path) -> PathBuf {
    run_dir.join("rollout_state.json")
}

/// Refuses to start a fresh run over one that has made progress.
pub(crate) fn refuse_to_overwrite(run_dir: &Path, resume: bool) -> anyhow::Result<()> {
    let has_progress =
        !checkpoint::candidates(run_dir)?.is_empty() || rollout_state_path(run_dir).exists();
    if has_progress && !resume {
        bail!(
            "{} already holds a run; continue it with `ooze train --resume {}`, or set logging.run_dir to a new directory",
            run_dir.display(),
            run_dir.display()
        );
    }
    Ok(())
}

/// The counters of a resumed run (with the trainer restored from its checkpoint), or a fresh
/// start.
pub(crate) fn restore(
    recipe: &Recipe,
    run_dir: &Path,
    resume: bool,
    trainer: Option<&mut Trainer>,
) -> anyhow::Result<RunState> {
    if !resume {
        return Ok(RunState::default());
    }
    let rollout_only_state = rollout_state_path(run_dir);
    if let Some(trainer) = trainer {
        // The newest checkpoint that loads: a corrupt one is reported and the one before tried.
        if let Some(checkpoint::Restored { dir, extra, .. }) =
            checkpoint::load_newest(run_dir, trainer)?
        {
            let state: RunState = serde_json::from_value(extra)
                .with_context(|| format!("{}: the run state is unreadable", dir.display()))?;
            eprintln!(
                "resumed from {} after rollout {}",
                dir.display(),
                state.rollout
            );
            return Ok(state);
        }
    } else if recipe.trainer.mode == Mode::RolloutOnly && rollout_only_state.exists() {
        let text = std::fs::read_to_string(&rollout_only_state)
            .with_context(|| format!("reading {}", rollout_only_state.display()))?;
        let state: RunState = serde_json::from_str(&text)
            .with_context(|| format!("{}: unreadable", rollout_only_state.display()))?;
        eprintln!("resumed rollout-only run after rollout {}", state.rollout);
        return Ok(state);
    }
    eprintln!(
        "nothing to resume in {}; starting from the beginning",
        run_dir.display()
    );
    Ok(RunState::default())
}

/// The metrics lines a (resumed) run keeps: those of the rollouts it restored (none when it
/// starts from the beginning, so its at-start line is not written twice).
pub(crate) fn metrics_kept_through(state: &RunState) -> Option<u64> {
    (state.rollout > 0).then_some(state.rollout)
}

/// Whether rollout `index` of `total` ends with a checkpoint: every `interval` rollouts, and the
/// last one always (`interval` 0: the last one only).
fn due(index: u64, total: u64, interval: u64) -> bool {
    index == total || (interval > 0 && index.is_multiple_of(interval))
}

impl Run {
    /// Saves after rollout `index` when due: a checkpoint every `trainer.save_interval` rollouts
    /// and after the last; a rollout-only run's counters after every rollout.
    /// Every rank calls it (a sharded trainer's ranks each write their part); rank 0 writes the
    /// rest.
    pub(crate) fn checkpoint(&self, index: u64) -> anyhow::Result<()> {
        let save = due(
            index,
            self.recipe.rollout.num_rollouts,
            self.recipe.trainer.save_interval,
        );
        match self.trainer.as_ref() {
            Some(trainer) if save => {
                let t = Instant::now();
                // Training waits only for the copy to host memory; the files are written in
                // the background and the checkpoint is complete at the next save or the end.
                let dir = checkpoint::save_in_background(
                    &self.run_dir,
                    &self.recipe.model.path,
                    trainer,
                    serde_json::to_value(&self.state)?,
                )?;
                if self.is_first() {
                    eprintln!(
                        "checkpoint: {} ({:.1}s, written in the background)",
                        dir.display(),
                        t.elapsed().as_secs_f64()
                    );
                }
            }
            Some(_) => {}
            None if !self.is_first() => {}
            None => checkpoint::write_atomic(
                &rollout_state_path(&self.run_dir),
                serde_json::to_string(&self.state)?.as_bytes(),
            )?,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::due;

    #[test]
    fn checkpoints_fall_every_interval_and_after_the_last_rollout() {
        let at = |total: u64, interval: u64| -> Vec<u64> {
            (1..=total).filter(|&i| due(i, total, interval)).collect()
        };
        assert_eq!(at(7, 3), [3, 6, 7]);
        assert_eq!(at(6, 3), [3, 6]);
        assert_eq!(at(4, 1), [1, 2, 3, 4]);
        assert_eq!(at(5, 0), [5], "0: the last rollout only");
    }
}
