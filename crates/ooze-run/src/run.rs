//! The RL loop as a [`Run`] with named stages, each in its own module:
//!
//! | stage | module | what it does |
//! |---|---|---|
//! | prepare | [`crate::prepare`] | device, tokenizer, prompts and eval sets, the policy (and critic, reference, teacher), the trainer, the engine, restore from a checkpoint |
//! | roll out | [`crate::roll_out`] | `rollout.batch_size` prompts × `n_samples_per_prompt` through the engine or the agent, filtered groups dropped and over-sampled |
//! | reward | [`crate::reward`] | the scorers the rollout and the eval sets use, and the rollout's reward numbers |
//! | train | [`crate::train`] | whole groups per optimizer step, then the engine's weight update |
//! | evaluate | [`crate::evaluate`] | held-out pass@k when due ([`crate::eval`]: the eval sets and pass@k) |
//! | checkpoint | [`crate::checkpoint`] | trainer, critic and run state, atomically; the rollout-only state |
//!
//! Colocated on one device: the engine and the trainer hold the same parameter tensors
//! ([`ooze_model::Decoder::share`]), so the optimizer step is the engine's weight update (no copy;
//! the engine is only told the version changed). Everything random is a function of the recipe's
//! seeds and the run's counters, which checkpoints save: a resumed run takes the same steps as an
//! uninterrupted one.

use crate::eval::{EvalResult, EvalSet};
use crate::metrics_log::MetricsLog;
use crate::ranks::RunRanks;
use crate::recipe::{Mode, Recipe};
use ooze_engine::EngineHandle;
use ooze_model::Tokenizer;
use ooze_rollout::data::{Position, PromptOrder};
use ooze_rollout::manager::RolloutSettings;
use ooze_rollout::producer::Unfinished;
use ooze_rollout::prompts::PromptItem;
use ooze_rollout::scorer::{Registry, Scorer};
use ooze_train::Trainer;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// The run's counters: what a checkpoint saves besides the trainer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    /// Rollouts completed.
    pub rollout: u64,
    /// The next prompt draw's group number (sampling seeds derive from it).
    pub next_group: u64,
    /// Where the prompt order is.
    pub position: Position,
    /// Asynchronous rollouts: the groups started and not yet trained when the checkpoint was
    /// taken; a resumed run starts them again first, under the same numbers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unfinished: Vec<Unfinished>,
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub run_dir: PathBuf,
    pub state: RunState,
    /// Eval results at the start (if evaluated then) and at the end.
    pub first_eval: Vec<EvalResult>,
    pub last_eval: Vec<EvalResult>,
    pub report: Option<PathBuf>,
}

/// The run directory a recipe file writes to: `logging.run_dir`, or `runs/<file stem>`.
pub fn run_dir_for(recipe: &Recipe, recipe_path: &Path) -> PathBuf {
    recipe.logging.run_dir.clone().unwrap_or_else(|| {
        Path::new("runs").join(
            recipe_path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "run".into()),
        )
    })
}

/// Everything a run holds between stages.
pub struct Run {
    pub(crate) recipe: Recipe,
    pub(crate) run_dir: PathBuf,
    pub(crate) started: Instant,
    pub(crate) tokenizer: Arc<Tokenizer>,
    /// Shared with the asynchronous producer.
    pub(crate) prompts: Arc<Vec<PromptItem>>,
    pub(crate) order: PromptOrder,
    pub(crate) evals: Vec<EvalSet>,
    /// The training reward (none in replay mode).
    pub(crate) scorer: Option<Scorer>,
    pub(crate) settings: RolloutSettings,
    /// None in rollout-only mode.
    pub(crate) trainer: Option<Trainer>,
    /// The embedded engine, or the router over engines outside the trainer; none on ranks other
    /// than 0 beside outside engines (rank 0 alone generates, and the ranks exchange the groups).
    pub(crate) engine: Option<EngineHandle>,
    /// The engine's own weights beside a sharded trainer (gathered into after every step); none
    /// when the engine shares the trainer's tensors.
    pub(crate) engine_weights: Option<ooze_model::Decoder>,
    /// The engines are outside the trainer (`rollout.gpus`, `rollout.engines`): new weights go
    /// to them after every step (`rollout.weight_sync`).
    pub(crate) external_engines: bool,
    /// The engines this run started (`rollout.gpus`), on rank 0; stopped when dropped.
    pub(crate) engine_processes: Option<crate::engine_processes::EngineProcesses>,
    pub(crate) runtime: tokio::runtime::Runtime,
    /// Rank 0's (the one that writes); none on the other ranks.
    pub(crate) log: Option<MetricsLog>,
    /// The run's ranks, when it has several.
    pub(crate) ranks: Option<RunRanks>,
    pub(crate) state: RunState,
    pub(crate) first_eval: Vec<EvalResult>,
    pub(crate) last_eval: Vec<EvalResult>,
}

/// Runs (or, with `resume`, continues) the recipe in `run_dir`; with `ranks`, as one of the run's
/// ranks (every rank calls this with the same recipe; see [`crate::ranks`]).
pub fn run(
    recipe: Recipe,
    run_dir: &Path,
    resume: bool,
    registry: &Registry,
    ranks: Option<RunRanks>,
) -> anyhow::Result<RunSummary> {
    let mut run = Run::prepare(recipe, run_dir, resume, registry, ranks)?;
    // A resumed run's weights are not the ones external engines started with.
    if run.external_engines && run.trainer.as_ref().is_some_and(|t| t.step() > 0) {
        run.push_weights()?;
    }
    run.evaluate_at_start()?;
    if let Some(bounds) = run.recipe.rollout.async_bounds() {
        run.run_overlapped(bounds)?;
        return run.finish();
    }
    while run.state.rollout < run.recipe.rollout.num_rollouts {
        let index = run.state.rollout + 1;
        let (batch, rollout_seconds) = run.roll_out(index)?;
        let agent = run.settings.agent.is_some();
        let mut line = crate::reward::rollout_line(index, &batch, rollout_seconds, agent);
        run.train(index, batch, &mut line)?;
        run.state.rollout = index;
        run.evaluate_when_due(index, &mut line)?;
        run.log_line(&mut line)?;
        run.checkpoint(index)?;
    }
    run.finish()
}

impl Run {
    pub(crate) fn mode(&self) -> Mode {
        self.recipe.trainer.mode
    }

    /// The engine (rank 0 has one in every run; other ranks only colocated ones).
    pub(crate) fn engine(&self) -> anyhow::Result<&EngineHandle> {
        self.engine.as_ref().ok_or_else(|| {
            anyhow::anyhow!("invariant: only rank 0 generates beside engines outside the trainer")
        })
    }

    /// Rank 0, or the only process: the one that evaluates, writes and prints.
    pub(crate) fn is_first(&self) -> bool {
        self.ranks.as_ref().is_none_or(|r| r.rank() == 0)
    }

    /// Writes one rollout's metrics (and its console line), with the seconds since the run
    /// started (`time/elapsed`).
    pub(crate) fn log_line(&mut self, line: &mut Map<String, Value>) -> anyhow::Result<()> {
        let Some(log) = self.log.as_mut() else {
            return Ok(());
        };
        line.insert(
            "time/elapsed".into(),
            serde_json::json!(self.started.elapsed().as_secs_f64()),
        );
        if self.recipe.logging.progress {
            eprintln!(
                "{}",
                crate::reward::summary_text(line, self.recipe.rollout.num_rollouts)
            );
        }
        log.write(line)
    }

    /// Stops the engine, saves the final model and writes the report.
    fn finish(mut self) -> anyhow::Result<RunSummary> {
        if let Some(engine) = &self.engine {
            self.runtime.block_on(engine.shutdown());
        }
        // The engines this run started are done once the last weights trained are saved below;
        // nothing generates any more.
        drop(self.engine_processes.take());
        // Every rank: a sharded policy is gathered for it, and its last checkpoint finished.
        if let Some(trainer) = self.trainer.as_ref() {
            ooze_train::checkpoint::save_final_model(
                &self.run_dir,
                &self.recipe.model.path,
                trainer,
            )?;
        }
        if !self.is_first() {
            // Rank 0 writes the final model and the report; the others return once it has.
            if let Some(trainer) = self.trainer.as_ref() {
                trainer.barrier()?;
            }
            return Ok(RunSummary {
                run_dir: self.run_dir,
                state: self.state,
                first_eval: Vec::new(),
                last_eval: Vec::new(),
                report: None,
            });
        }
        let report = if self.recipe.logging.report {
            let path = crate::report::write_report(&self.run_dir)?;
            eprintln!("report: {}", path.display());
            Some(path)
        } else {
            None
        };
        eprintln!(
            "done: {} rollouts in {:.1}s",
            self.state.rollout,
            self.started.elapsed().as_secs_f64()
        );
        if let Some(trainer) = self.trainer.as_ref() {
            trainer.barrier()?;
        }
        Ok(RunSummary {
            run_dir: self.run_dir,
            state: self.state,
            first_eval: self.first_eval,
            last_eval: self.last_eval,
            report,
        })
    }
}
