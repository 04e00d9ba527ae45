//! The loop of `rollout.mode = "async"` and `"one_step_off"`: rollouts generate while the trainer
//! trains ([`ooze_rollout::producer`]).
//!
//! Each step takes the first complete groups the producer has, trains on them and updates the
//! engine's weights; the producer meanwhile keeps starting groups within the staleness bound.
//! How the update meets the requests in flight depends on where the engine is:
//!
//! - **Engines outside the trainer** (`rollout.gpus`, `rollout.engines`) generate through the
//!   whole step. Only the weight push pauses them: their requests end with their partial outputs,
//!   the weights go over, and the requests continue under them.
//! - **The embedded engine** shares the trainer's device (and, unsharded, its very tensors), so
//!   it pauses for the whole step, partial outputs kept; agents' tool calls, rewards and helper
//!   models go on meanwhile, and the step never waits for the slowest trajectory.
//!
//! Only rank 0 produces; the other ranks (a trainer over several ranks beside engines outside it)
//! receive its groups. Checkpoints save the groups started and not yet trained, which a resumed
//! run starts again under the same numbers, so no group is lost or trained twice.

use crate::recipe::AsyncBounds;
use crate::run::Run;
use anyhow::bail;
use ooze_rollout::manager::Batch;
use ooze_rollout::producer::{AsyncConfig, Generation, Producer, PromptDraws, StalePolicy, Taken};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Instant;

impl Run {
    /// Runs the remaining rollouts with generation overlapping training.
    pub(crate) fn run_overlapped(&mut self, bounds: AsyncBounds) -> anyhow::Result<()> {
        if let Some(ranks) = &self.ranks {
            if ranks.world_size() > 1 && !self.external_engines {
                bail!(
                    "rollout.mode = {} with {} colocated ranks: asynchronous rollouts run on engines outside the trainer when the trainer has several ranks (set rollout.gpus, or rollout.engines)",
                    crate::recipe::quoted(&self.recipe.rollout.mode),
                    ranks.world_size()
                );
            }
        }
        let producer = if self.is_first() {
            Some(self.start_producer(bounds)?)
        } else {
            None
        };
        let result = self.overlapped_rollouts(producer.as_ref());
        if let Some(producer) = producer {
            self.runtime.block_on(producer.stop());
        }
        result
    }

    fn overlapped_rollouts(&mut self, producer: Option<&Producer>) -> anyhow::Result<()> {
        let mut step_started = Instant::now();
        while self.state.rollout < self.recipe.rollout.num_rollouts {
            let index = self.state.rollout + 1;
            let (batch, taken) = self.take_groups(producer, index)?;
            let agent = self.settings.agent.is_some();
            let waited = taken.as_ref().map_or(0.0, |t| t.waited_seconds);
            let mut line = crate::reward::rollout_line(index, &batch, waited, agent);
            if let Some(taken) = &taken {
                async_line(taken, &mut line);
            }
            self.train(index, batch, &mut line)?;
            if let Some(producer) = producer {
                let version = self
                    .runtime
                    .block_on(self.engine()?.stats())?
                    .weight_version;
                producer.advance(version);
            }
            let step_seconds = step_started.elapsed().as_secs_f64();
            step_started = Instant::now();
            let train = line
                .get("time/train")
                .and_then(Value::as_f64)
                .unwrap_or(0.0);
            line.insert("time/step".into(), json!(step_seconds));
            line.insert(
                "async/trainer_busy".into(),
                json!(train / step_seconds.max(1e-9)),
            );
            self.state.rollout = index;
            self.evaluate_when_due(index, &mut line)?;
            self.log_line(&mut line)?;
            if let Some(producer) = producer {
                let draws = producer.snapshot();
                self.state.position = draws.position;
                self.state.next_group = draws.next_group;
                self.state.unfinished = draws.unfinished;
            }
            self.checkpoint(index)?;
        }
        Ok(())
    }

    /// Starts the producer on rank 0: the prompt order moves into it, and a resumed run's
    /// unfinished groups start first.
    fn start_producer(&mut self, bounds: AsyncBounds) -> anyhow::Result<Producer> {
        let r = &self.recipe.rollout;
        let engine = self.engine()?.clone();
        let version = self.runtime.block_on(engine.stats())?.weight_version;
        let order = std::mem::replace(
            &mut self.order,
            ooze_rollout::data::PromptOrder::new(0, 0, false, Default::default()),
        );
        let generation = Generation {
            engine,
            tokenizer: self.tokenizer.clone(),
            scorer: self
                .scorer
                .clone()
                .expect("invariant: only a replay has no scorer, and it is synchronous"),
            settings: self.settings.clone(),
            on_sample: Arc::new(|| {}),
        };
        let config = AsyncConfig {
            groups_per_step: r.batch_size,
            max_staleness: bounds.max_staleness,
            extra_groups: bounds.extra_groups,
            stale: bounds.stale,
        };
        if self.is_first() {
            eprintln!(
                "rollout: {}, {} groups a step, at most {} version(s) stale ({} older tokens), {} extra group(s) in flight{}",
                crate::recipe::quoted(&r.mode),
                r.batch_size,
                bounds.max_staleness,
                match bounds.stale {
                    StalePolicy::Drop => "dropping groups with",
                    StalePolicy::Mask => "masking",
                    StalePolicy::Regenerate => "regenerating groups with",
                },
                bounds.extra_groups,
                if self.state.unfinished.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; {} unfinished group(s) of the checkpoint start again",
                        self.state.unfinished.len()
                    )
                }
            );
        }
        Ok(Producer::start(
            self.runtime.handle(),
            generation,
            config,
            PromptDraws {
                order,
                prompts: self.prompts.clone(),
                next_group: self.state.next_group,
            },
            std::mem::take(&mut self.state.unfinished),
            version,
        ))
    }

    /// Rank 0 takes a step's groups from the producer; the other ranks receive them.
    fn take_groups(
        &mut self,
        producer: Option<&Producer>,
        index: u64,
    ) -> anyhow::Result<(Batch, Option<Taken>)> {
        let (batch, taken) = match producer {
            Some(producer) => {
                let mut taken = self.runtime.block_on(producer.take())?;
                let batch = Batch {
                    groups: std::mem::take(&mut taken.groups),
                    generated_groups: taken.generated_groups,
                    rounds: 0,
                    dropped: taken.dropped.clone(),
                    activity: producer.activity(),
                };
                (batch, Some(taken))
            }
            None => (Batch::default(), None),
        };
        let batch = match &self.ranks {
            Some(ranks) => ranks.exchange(batch)?,
            None => batch,
        };
        if self.is_first() {
            self.save_rollout(index, &batch)?;
        }
        Ok((batch, taken))
    }
}

/// The producer's numbers for one step: the weight version trained, staleness (mean, max, and a histogram as
/// `async/staleness_N` groups), the buffer, the groups in flight, partial rollouts, and the
/// engine's busy share and effective concurrency since the step before.
fn async_line(taken: &Taken, line: &mut Map<String, Value>) {
    let n = taken.staleness.len().max(1) as f64;
    line.insert("async/policy_version".into(), json!(taken.version));
    line.insert(
        "async/staleness_mean".into(),
        json!(taken.staleness.iter().sum::<u64>() as f64 / n),
    );
    line.insert(
        "async/staleness_max".into(),
        json!(taken.staleness.iter().copied().max().unwrap_or(0)),
    );
    let mut histogram = std::collections::BTreeMap::<u64, usize>::new();
    for &s in &taken.staleness {
        *histogram.entry(s).or_default() += 1;
    }
    for (s, count) in histogram {
        line.insert(format!("async/staleness_{s}"), json!(count));
    }
    line.insert("async/started_groups".into(), json!(taken.started_groups));
    line.insert("async/buffered_groups".into(), json!(taken.buffered));
    line.insert("async/in_flight_groups".into(), json!(taken.in_flight));
    line.insert("async/partial_samples".into(), json!(taken.partial_samples));
    line.insert("async/masked_tokens".into(), json!(taken.masked_tokens));
    line.insert(
        "async/regenerated_groups".into(),
        json!(taken.regenerated_groups),
    );
    line.insert("async/engine_busy".into(), json!(taken.engine_busy));
    line.insert(
        "async/engine_concurrency".into(),
        json!(taken.engine_concurrency),
    );
}
