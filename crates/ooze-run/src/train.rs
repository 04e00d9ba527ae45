//! Stage *train*: the rollout's samples go to the trainer as they are (moved out of their groups,
//! not copied), whole groups in each optimizer step (`trainer.global_batch_size` samples; an
//! agent's sibling samples stay with their group). `logp_old`, the reference's and the teacher's log-probs, the critic's values and the
//! advantages are computed once per rollout, under the weights that generated it. Then the engine
//! is told its weights changed (they are the trainer's own tensors; beside a sharded trainer, its
//! own copy, which every step's weights are all-gathered into first: `time/weight_sync`). External
//! engines (`rollout.engines`) load the weights from `RUN/weights/step-N`, written after every step.
//!
//! The trainer itself — policy, reference, critic, teacher — is built by [`crate::prepare`].

use crate::recipe::{RolloutMode, WeightSync};
use crate::reward::mean;
use crate::run::Run;
use anyhow::bail;
use ooze_core::Sample;
use ooze_engine::WeightSource;
use ooze_rollout::manager::{Batch, Group};
use ooze_train::StepMetrics;
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant};

impl Run {
    /// Trains on rollout `index` (whole steps of whole groups) and updates the engine's weights;
    /// adds the steps' numbers to `line`.
    pub(crate) fn train(
        &mut self,
        index: u64,
        batch: Batch,
        line: &mut Map<String, Value>,
    ) -> anyhow::Result<()> {
        let (mut train_seconds, mut sync_seconds) = (0.0, 0.0);
        let mut push = false;
        // Asynchronous rollouts pause the engine while its weights change (partial outputs kept,
        // continued under the new weights): the embedded engine for the whole step, since it
        // shares the trainer's device and tensors; engines outside it for the push only.
        let overlapped = self.recipe.rollout.mode != RolloutMode::Sync;
        let pause_embedded = overlapped && !self.external_engines;
        if let Some(trainer) = self.trainer.as_mut() {
            let t_sync = Instant::now();
            if let Some(engine) = &self.engine {
                if pause_embedded {
                    engine.begin_weight_update();
                }
                self.runtime.block_on(engine.release_memory())?;
            }
            sync_seconds += t_sync.elapsed().as_secs_f64();
            let n = self.recipe.rollout.n_samples_per_prompt;
            let groups_per_step = self.recipe.global_batch_size() / n;
            let usable = batch.groups.len() / groups_per_step * groups_per_step;
            if usable < batch.groups.len() {
                eprintln!(
                    "rollout {index}: {} groups do not fill a step of {} samples and are left out",
                    batch.groups.len() - usable,
                    groups_per_step * n
                );
            }
            let mut groups = batch.groups;
            groups.truncate(usable);
            let sizes = step_sizes(&groups, groups_per_step);
            let samples = train_samples(groups);
            if !samples.is_empty() {
                let t_train = Instant::now();
                let steps = trainer.rl_steps(&samples, &sizes)?;
                train_seconds = t_train.elapsed().as_secs_f64();
                train_line(&steps, line);
                let t_sync = Instant::now();
                if let Some(engine) = &self.engine_weights {
                    trainer.sync_weights_into(engine)?;
                }
                if self.external_engines {
                    push = true;
                } else if let Some(engine) = &self.engine {
                    self.runtime.block_on(engine.weights_updated_in_place())?;
                }
                sync_seconds += t_sync.elapsed().as_secs_f64();
            }
            line.insert("step".into(), json!(trainer.step()));
        }
        if let (true, Some(engine)) = (pause_embedded, &self.engine) {
            engine.end_weight_update();
        }
        if push {
            let t_sync = Instant::now();
            if let (true, Some(engine)) = (overlapped, &self.engine) {
                engine.begin_weight_update();
            }
            let pushed = self.push_weights();
            if let (true, Some(engine)) = (overlapped, &self.engine) {
                engine.end_weight_update();
            }
            pushed?;
            sync_seconds += t_sync.elapsed().as_secs_f64();
        }
        line.insert("time/train".into(), json!(train_seconds));
        line.insert("time/weight_sync".into(), json!(sync_seconds));
        Ok(())
    }
}

impl Run {
    /// Sends the trainer's current weights to the engines outside the trainer
    /// (`rollout.weight_sync`): as a directory they load, or broadcast over their process group.
    pub(crate) fn push_weights(&self) -> anyhow::Result<()> {
        let Some(trainer) = self.trainer.as_ref() else {
            return Ok(());
        };
        // Every rank takes part in gathering a sharded policy; rank 0 alone sends it.
        let deadline = Duration::from_secs_f64(self.recipe.rollout.weight_update_timeout_secs);
        let t = Instant::now();
        let source = match self.recipe.rollout.weight_sync() {
            WeightSync::Disk | WeightSync::Auto => {
                WeightSource::Dir(ooze_train::checkpoint::export_weights(
                    &self.run_dir.join("weights"),
                    &self.recipe.model.path,
                    trainer,
                )?)
            }
            WeightSync::Distributed => WeightSource::Tensors(trainer.whole_weights()?),
        };
        let Some(engine) = &self.engine else {
            return Ok(());
        };
        let left = deadline.saturating_sub(t.elapsed());
        // The timer belongs to the runtime: made inside it.
        match self
            .runtime
            .block_on(async { tokio::time::timeout(left, engine.update_weights(source)).await })
        {
            Ok(version) => {
                version?;
                Ok(())
            }
            Err(_) => bail!(
                "the weight update did not finish within {:.0} s (rollout.weight_update_timeout_secs); it waited for the engines to load the new weights: {}",
                deadline.as_secs_f64(),
                self.engines_named()
            ),
        }
    }

    /// The engines outside the trainer, by URL, for messages.
    fn engines_named(&self) -> String {
        let mut urls: Vec<String> = self.recipe.rollout.engines.clone();
        if let Some(p) = &self.engine_processes {
            urls.extend(p.urls());
        }
        if let Some(file) = &self.recipe.rollout.engines_file {
            urls.push(format!("those listed in {}", file.display()));
        }
        if urls.is_empty() {
            "(none named)".into()
        } else {
            urls.join(", ")
        }
    }
}

/// Samples per optimizer step: `groups_per_step` whole groups each (their trained samples).
fn step_sizes(groups: &[Group], groups_per_step: usize) -> Vec<usize> {
    groups
        .chunks(groups_per_step)
        .map(|chunk| {
            chunk
                .iter()
                .flat_map(|g| &g.samples)
                .filter(|s| s.response_length > 0)
                .count()
        })
        .filter(|&k| k > 0)
        .collect()
}

/// The trainer's samples of `groups`, in order (siblings adjacent): every sample with a response
/// (a failed execution's empty placeholder keeps its place in its group's rewards, not here).
fn train_samples(groups: Vec<Group>) -> Vec<Sample> {
    groups
        .into_iter()
        .flat_map(|g| g.samples)
        .filter(|s| s.response_length > 0)
        .collect()
}

/// The steps' numbers: means over the rollout's steps (maxima for maxima).
fn train_line(steps: &[StepMetrics], line: &mut Map<String, Value>) {
    let avg = |f: &dyn Fn(&StepMetrics) -> f64| mean(steps.iter().map(f));
    let avg_opt = |f: &dyn Fn(&StepMetrics) -> Option<f64>| {
        let v: Vec<f64> = steps.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| mean(v.into_iter()))
    };
    line.insert("train/steps".into(), json!(steps.len()));
    line.insert("train/loss".into(), json!(avg(&|s| s.loss)));
    line.insert("train/policy_loss".into(), json!(avg(&|s| s.policy_loss)));
    line.insert("train/entropy".into(), json!(avg(&|s| s.entropy)));
    line.insert("train/clipfrac".into(), json!(avg(&|s| s.clipfrac)));
    line.insert("train/approx_kl".into(), json!(avg(&|s| s.approx_kl)));
    line.insert("train/grad_norm".into(), json!(avg(&|s| s.grad_norm)));
    line.insert("train/lr".into(), json!(avg(&|s| s.lr)));
    line.insert(
        "train/tokens_per_s".into(),
        json!(avg(&|s| s.tokens_per_second)),
    );
    for (key, v) in [
        ("train/kl", avg_opt(&|s| s.kl)),
        ("train/mfu", avg_opt(&|s| s.mfu)),
        (
            "train/mismatch_mean",
            avg_opt(&|s| s.rollout_logp_diff_mean),
        ),
        ("train/importance_weight", avg_opt(&|s| s.importance_weight)),
        ("train/observation_loss", avg_opt(&|s| s.observation_loss)),
        ("train/value_loss", avg_opt(&|s| s.value_loss)),
        (
            "train/explained_variance",
            avg_opt(&|s| s.explained_variance),
        ),
        ("train/value_clipfrac", avg_opt(&|s| s.value_clipfrac)),
        ("train/critic_grad_norm", avg_opt(&|s| s.critic_grad_norm)),
        ("train/critic_lr", avg_opt(&|s| s.critic_lr)),
        ("train/teacher_logp_gap", avg_opt(&|s| s.teacher_logp_gap)),
        ("train/teacher_kl", avg_opt(&|s| s.teacher_kl)),
    ] {
        if let Some(v) = v {
            line.insert(key.into(), json!(v));
        }
    }
    if steps.iter().any(|s| s.policy_frozen) {
        line.insert(
            "train/policy_frozen_steps".into(),
            json!(steps.iter().filter(|s| s.policy_frozen).count()),
        );
    }
    if let Some(max) = steps
        .iter()
        .filter_map(|s| s.rollout_logp_diff_max)
        .reduce(f64::max)
    {
        line.insert("train/mismatch_max".into(), json!(max));
    }
}
