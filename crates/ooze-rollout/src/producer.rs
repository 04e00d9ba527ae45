//! Asynchronous rollouts (`rollout.mode = "async"` and `"one_step_off"`): a [`Producer`] keeps
//! groups generating on the run's runtime while the trainer trains, and a training step takes the
//! first `groups_per_step` groups that are complete.
//!
//! - **Bounded staleness.** A group is started only while the groups started and not dropped stay
//!   within `(updates + max_staleness + 1) × groups_per_step + extra_groups`, `updates` being the
//!   weight updates so far (AReaL's rule): with `max_staleness` 0 and no extra groups that is a
//!   synchronous run. A step never trains a group any of whose trained tokens was drawn more
//!   than `max_staleness` versions before the weights being trained. When a step would take
//!   such a group ([`StalePolicy`]) it is dropped (counted as `stale`); or kept with those tokens
//!   no longer trained (slime's masking of a partial rollout's old-policy part: its reward
//!   still counts, and long trajectories are not selected against); or regenerated: its prompt
//!   starts again under the same group number, once (a second time it is dropped).
//! - **Over-provisioning** (APRIL): `extra_groups` more groups run than the bound needs; a step
//!   takes the first complete ones and the others go on into the next step as partial rollouts.
//! - **Partial rollouts.** At a weight update the engine pauses and the requests in flight keep
//!   their tokens and continue under the new weights ([`ooze_engine::continuation`]); every
//!   token records the version that drew it (`Sample::token_versions`). Agent tool calls hold no
//!   engine slot and go on through the update.
//! - **Nothing lost on a restart.** [`Producer::snapshot`] names every group started and not yet
//!   taken (with its prompt); a resumed run starts exactly those again, under the same group
//!   numbers and so the same seeds, before it draws new prompts.
//!
//! Groups are filtered as in synchronous rollouts ([`crate::manager::drop_reason`]); a dropped
//! group frees its place for a new one.

use crate::manager::{
    drop_reason, generate_groups_limited, Group, RolloutError, RolloutSettings,
    ACTIVITY_SAMPLE_SECS,
};
use crate::prompts::PromptItem;
use ooze_core::order::{Position, PromptOrder};
use ooze_engine::EngineHandle;
use ooze_model::Tokenizer;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, Semaphore};

/// How far ahead the producer may run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AsyncConfig {
    /// Groups a training step takes.
    pub groups_per_step: usize,
    /// Weight versions a trained token may lag the weights being trained.
    pub max_staleness: u64,
    /// Groups started beyond what the staleness bound allows (over-provisioning).
    pub extra_groups: usize,
    /// What becomes of a group with tokens staler than the bound.
    pub stale: StalePolicy,
}

/// What a step does with a group whose trained tokens are staler than the bound
/// (`rollout.stale`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StalePolicy {
    /// The group is dropped (counted as `stale`).
    #[default]
    Drop,
    /// The stale tokens stop training; the group and its reward are kept.
    Mask,
    /// The group's prompt starts again under the current weights, once; a regenerated group
    /// that is stale again is dropped.
    Regenerate,
}

/// Where prompts come from: the seeded order over `prompts`, and the next group number.
pub struct PromptDraws {
    pub order: PromptOrder,
    pub prompts: Arc<Vec<PromptItem>>,
    pub next_group: u64,
}

/// A group started and not yet taken by a step: its number and its prompt's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unfinished {
    pub group: u64,
    pub prompt: usize,
}

/// What a checkpoint keeps of the producer: where the prompt order is, and the groups a resumed
/// run must start again.
#[derive(Debug, Clone, PartialEq)]
pub struct DrawState {
    pub position: Position,
    pub next_group: u64,
    pub unfinished: Vec<Unfinished>,
}

/// One step's groups and what the producer did since the step before.
#[derive(Debug, Default)]
pub struct Taken {
    pub groups: Vec<Group>,
    /// The weight version being trained (what staleness is measured against).
    pub version: u64,
    /// Per group taken: the versions its oldest trained token lags the weights being trained.
    pub staleness: Vec<u64>,
    /// Groups started since the last step.
    pub started_groups: usize,
    /// Groups finished since the last step, kept or not.
    pub generated_groups: usize,
    /// Groups dropped since the last step, by reason (the filters' reasons and `stale`).
    pub dropped: BTreeMap<String, usize>,
    /// Complete groups left waiting for the next step.
    pub buffered: usize,
    /// Groups still generating.
    pub in_flight: usize,
    /// Samples taken whose tokens span several weight versions.
    pub partial_samples: usize,
    /// Trained tokens masked for being staler than the bound ([`StalePolicy::Mask`]).
    pub masked_tokens: usize,
    /// Stale groups started again since the last step ([`StalePolicy::Regenerate`]).
    pub regenerated_groups: usize,
    /// The engine, sampled every [`ENGINE_SAMPLE_SECS`] since the last step: the share of
    /// samples with a request running, and the mean number running.
    pub engine_busy: f64,
    pub engine_concurrency: f64,
    /// Seconds the step waited for its groups.
    pub waited_seconds: f64,
}

/// Seconds between two samples of the engine's load.
pub const ENGINE_SAMPLE_SECS: f64 = 0.1;

#[derive(Default)]
struct Load {
    samples: u64,
    busy: u64,
    running: u64,
}

struct State {
    draws: PromptDraws,
    /// Groups to start before drawing new prompts (a resumed run's unfinished ones).
    restart: VecDeque<Unfinished>,
    /// Started and not yet taken, by group number: the prompt's index.
    pending: BTreeMap<u64, usize>,
    /// Complete groups, in the order they completed.
    ready: VecDeque<Group>,
    /// Groups started and not dropped: what the admission bound counts.
    admitted: u64,
    updates: u64,
    version: u64,
    started: usize,
    generated: usize,
    masked: usize,
    regenerated: usize,
    /// Groups started again for being stale (a second time they are dropped).
    regenerated_once: std::collections::BTreeSet<u64>,
    dropped: BTreeMap<String, usize>,
    load: Load,
    failed: Option<RolloutError>,
    stopping: bool,
}

impl State {
    fn new(draws: PromptDraws, restart: Vec<Unfinished>, version: u64) -> State {
        State {
            draws,
            restart: restart.into(),
            pending: BTreeMap::new(),
            ready: VecDeque::new(),
            admitted: 0,
            updates: 0,
            version,
            started: 0,
            generated: 0,
            masked: 0,
            regenerated: 0,
            regenerated_once: std::collections::BTreeSet::new(),
            dropped: BTreeMap::new(),
            load: Load::default(),
            failed: None,
            stopping: false,
        }
    }

    fn allowed(&self, config: &AsyncConfig) -> u64 {
        (self.updates + config.max_staleness + 1) * config.groups_per_step as u64
            + config.extra_groups as u64
    }

    /// The next group to start, registered as pending.
    fn next_group(&mut self) -> (u64, usize) {
        let (group, prompt) = match self.restart.pop_front() {
            Some(u) => (u.group, u.prompt),
            None => {
                let prompt = self.draws.order.take(1)[0];
                let group = self.draws.next_group;
                self.draws.next_group += 1;
                (group, prompt)
            }
        };
        self.pending.insert(group, prompt);
        self.admitted += 1;
        self.started += 1;
        (group, prompt)
    }

    fn drop_group(&mut self, group: u64, reason: &str) {
        self.pending.remove(&group);
        self.admitted -= 1;
        *self.dropped.entry(reason.to_owned()).or_default() += 1;
    }

    /// Starts a stale group's prompt again, first of the groups to start, under its own number;
    /// false (nothing done) if it was regenerated before.
    fn regenerate(&mut self, group: u64) -> bool {
        if !self.regenerated_once.insert(group) {
            return false;
        }
        let Some(prompt) = self.pending.remove(&group) else {
            return false;
        };
        self.admitted -= 1;
        self.regenerated += 1;
        self.restart.push_front(Unfinished { group, prompt });
        true
    }
}

struct Shared {
    state: Mutex<State>,
    config: AsyncConfig,
    /// Wakes the driver: a version advanced, or the producer stops.
    to_driver: Notify,
    /// Wakes a waiting step: a group completed or failed.
    to_taker: Notify,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .expect("invariant: producer state is never poisoned")
    }
}

/// Keeps groups generating in the background; see the module docs.
pub struct Producer {
    shared: Arc<Shared>,
    driver: tokio::task::JoinHandle<()>,
    sampler: tokio::task::JoinHandle<()>,
    activity: Option<crate::activity::Activity>,
}

/// What the producer's groups are generated with.
pub struct Generation {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub scorer: crate::scorer::Scorer,
    pub settings: RolloutSettings,
    /// Called as each sample (or agent execution) finishes.
    pub on_sample: Arc<dyn Fn() + Send + Sync>,
}

impl Producer {
    /// Starts producing on `runtime`: first the `restart` groups, then new draws. `version` is
    /// the engine's weight version now.
    pub fn start(
        runtime: &tokio::runtime::Handle,
        generation: Generation,
        config: AsyncConfig,
        draws: PromptDraws,
        restart: Vec<Unfinished>,
        version: u64,
    ) -> Producer {
        let activity = generation
            .settings
            .agent
            .as_ref()
            .map(|a| a.activity.clone());
        if let Some(a) = &activity {
            a.restart();
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(draws, restart, version)),
            config,
            to_driver: Notify::new(),
            to_taker: Notify::new(),
        });
        let engine = generation.engine.clone();
        let driver = runtime.spawn(drive(shared.clone(), Arc::new(generation)));
        let sampler = runtime.spawn(sample_load(shared.clone(), engine));
        Producer {
            shared,
            driver,
            sampler,
            activity,
        }
    }

    /// Waits for a step's groups: the first `groups_per_step` complete ones, none staler than
    /// `max_staleness` against the weights now being trained (older ones are dropped).
    pub async fn take(&self) -> Result<Taken, RolloutError> {
        let start = Instant::now();
        let config = self.shared.config;
        loop {
            let notified = self.shared.to_taker.notified();
            {
                let mut st = self.shared.lock();
                if let Some(e) = st.failed.take() {
                    return Err(e);
                }
                let version = st.version;
                let ready = std::mem::take(&mut st.ready);
                let before = ready.len();
                let oldest = version.saturating_sub(config.max_staleness);
                for mut g in ready {
                    if staleness(&g, version) <= config.max_staleness {
                        st.ready.push_back(g);
                        continue;
                    }
                    match config.stale {
                        StalePolicy::Mask => {
                            st.masked += g
                                .samples
                                .iter_mut()
                                .map(|s| s.mask_older_than(oldest))
                                .sum::<usize>();
                            st.ready.push_back(g);
                        }
                        StalePolicy::Regenerate if st.regenerate(g.group) => {}
                        StalePolicy::Regenerate | StalePolicy::Drop => {
                            st.drop_group(g.group, "stale")
                        }
                    }
                }
                if st.ready.len() < before {
                    // Their places go to new groups.
                    self.shared.to_driver.notify_one();
                }
                if st.ready.len() >= config.groups_per_step {
                    let groups: Vec<Group> = st.ready.drain(..config.groups_per_step).collect();
                    for g in &groups {
                        st.pending.remove(&g.group);
                    }
                    let load = std::mem::take(&mut st.load);
                    let taken = Taken {
                        version,
                        staleness: groups.iter().map(|g| staleness(g, version)).collect(),
                        masked_tokens: std::mem::take(&mut st.masked),
                        regenerated_groups: std::mem::take(&mut st.regenerated),
                        partial_samples: groups
                            .iter()
                            .flat_map(|g| &g.samples)
                            .filter(|s| s.weight_versions.len() > 1)
                            .count(),
                        started_groups: std::mem::take(&mut st.started),
                        generated_groups: std::mem::take(&mut st.generated),
                        dropped: std::mem::take(&mut st.dropped),
                        buffered: st.ready.len(),
                        in_flight: st.pending.len() - st.ready.len(),
                        engine_busy: ratio(load.busy, load.samples),
                        engine_concurrency: ratio(load.running, load.samples),
                        waited_seconds: start.elapsed().as_secs_f64(),
                        groups,
                    };
                    return Ok(taken);
                }
            }
            notified.await;
        }
    }

    /// What the agent's executions did since the last call (none without an agent).
    pub fn activity(&self) -> Option<crate::activity::ActivitySummary> {
        self.activity.as_ref().map(|a| {
            let summary = a.summary(ACTIVITY_SAMPLE_SECS);
            a.restart();
            summary
        })
    }

    /// The weights are now `version` (one more update): more groups may start.
    pub fn advance(&self, version: u64) {
        {
            let mut st = self.shared.lock();
            st.version = version;
            st.updates += 1;
        }
        self.shared.to_driver.notify_one();
    }

    /// Where the prompt order is and which groups are started and not taken.
    pub fn snapshot(&self) -> DrawState {
        let st = self.shared.lock();
        let mut unfinished: Vec<Unfinished> = st
            .restart
            .iter()
            .copied()
            .chain(
                st.pending
                    .iter()
                    .map(|(&group, &prompt)| Unfinished { group, prompt }),
            )
            .collect();
        unfinished.sort_by_key(|u| u.group);
        DrawState {
            position: st.draws.order.position(),
            next_group: st.draws.next_group,
            unfinished,
        }
    }

    /// Stops starting groups and abandons the ones in flight (their requests are aborted).
    pub async fn stop(self) {
        self.shared.lock().stopping = true;
        self.shared.to_driver.notify_one();
        self.sampler.abort();
        let _ = self.driver.await;
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// How many versions a group's oldest trained token lags `version` (0 for a group with no
/// trained token of known version).
pub fn staleness(group: &Group, version: u64) -> u64 {
    group
        .samples
        .iter()
        .filter_map(|s| s.oldest_trained_version())
        .map(|v| version.saturating_sub(v))
        .max()
        .unwrap_or(0)
}

/// Starts groups while the bound allows, and files each finished one.
async fn drive(shared: Arc<Shared>, generation: Arc<Generation>) {
    let limit = Arc::new(Semaphore::new(generation.settings.concurrency.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    let mut ids = std::collections::HashMap::new();
    loop {
        let notified = shared.to_driver.notified();
        {
            let mut st = shared.lock();
            if st.stopping {
                break;
            }
            while st.admitted < st.allowed(&shared.config) {
                let (group, index) = st.next_group();
                let prompt = st.draws.prompts[index].clone();
                let (generation, limit) = (generation.clone(), limit.clone());
                let handle = tasks.spawn(async move {
                    let on_sample = generation.on_sample.clone();
                    let groups = generate_groups_limited(
                        &generation.engine,
                        &generation.tokenizer,
                        &generation.scorer,
                        vec![(group, prompt)],
                        generation.settings.n_samples_per_prompt,
                        &generation.settings,
                        &limit,
                        &move || on_sample(),
                    )
                    .await;
                    (group, groups)
                });
                ids.insert(handle.id(), group);
            }
        }
        tokio::select! {
            Some(joined) = tasks.join_next_with_id() => {
                match joined {
                    Ok((id, (group, result))) => {
                        ids.remove(&id);
                        file(&shared, group, result, &generation.settings);
                    }
                    // A group's task that panicked ends the run with its group named, not a
                    // step waiting for ever.
                    Err(e) => {
                        let group = ids.remove(&e.id()).unwrap_or(u64::MAX);
                        shared.lock().failed.get_or_insert(RolloutError::Lost {
                            group,
                            why: e.to_string(),
                        });
                    }
                }
                shared.to_taker.notify_one();
            }
            _ = notified => {}
        }
    }
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
}

/// A finished group goes to the buffer, or is dropped by the filters; a failure stops the run.
fn file(
    shared: &Shared,
    group: u64,
    result: Result<Vec<Group>, RolloutError>,
    settings: &RolloutSettings,
) {
    let mut st = shared.lock();
    match result {
        Err(e) => {
            st.failed.get_or_insert(e);
        }
        Ok(groups) => {
            for g in groups {
                st.generated += 1;
                match drop_reason(&g, settings) {
                    Some(reason) => st.drop_group(group, reason),
                    None => st.ready.push_back(g),
                }
            }
        }
    }
}

/// Samples the engine's load for the busy share and the effective concurrency.
async fn sample_load(shared: Arc<Shared>, engine: EngineHandle) {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(ENGINE_SAMPLE_SECS));
    loop {
        tick.tick().await;
        let Ok(stats) = engine.stats().await else {
            return;
        };
        let mut st = shared.lock();
        st.load.samples += 1;
        st.load.busy += u64::from(stats.running > 0);
        st.load.running += stats.running as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ooze_core::Sample;

    fn group(versions: &[&[u64]]) -> Group {
        Group {
            group: 0,
            prompt: PromptItem {
                source_line: 1,
                text: String::new(),
                input_ids: vec![1],
                label: String::new(),
                metadata: serde_json::Value::Null,
                messages: Vec::new(),
                tools: None,
            },
            samples: versions
                .iter()
                .map(|v| {
                    let mut s = Sample::with_prompt(vec![1]);
                    s.push_generated(&vec![2; v.len()], &vec![-1.0; v.len()], v)
                        .unwrap();
                    s
                })
                .collect(),
        }
    }

    #[test]
    fn a_group_is_as_stale_as_its_oldest_trained_token() {
        let g = group(&[&[5, 5, 6], &[4, 6, 7]]);
        assert_eq!(staleness(&g, 7), 3);
        assert_eq!(staleness(&g, 4), 0, "never negative");
        let mut removed = g.clone();
        removed.samples[1].remove();
        assert_eq!(staleness(&removed, 7), 2, "untrained tokens do not count");
    }

    #[test]
    fn the_bound_admits_a_step_ahead_per_version_of_staleness() {
        let config = |max_staleness, extra_groups| AsyncConfig {
            groups_per_step: 4,
            max_staleness,
            extra_groups,
            stale: StalePolicy::Drop,
        };
        let mut st = State::new(
            PromptDraws {
                order: PromptOrder::new(3, 1, true, Position::default()),
                prompts: Arc::new(Vec::new()),
                next_group: 10,
            },
            vec![Unfinished {
                group: 2,
                prompt: 1,
            }],
            0,
        );
        assert_eq!(st.allowed(&config(0, 0)), 4, "synchronous");
        assert_eq!(st.allowed(&config(2, 3)), 15);
        st.updates = 2;
        assert_eq!(st.allowed(&config(1, 0)), 16);
        // A resumed run's unfinished group first, under its own number; then new draws.
        assert_eq!(st.next_group(), (2, 1));
        let (g, _) = st.next_group();
        assert_eq!(g, 10);
        assert_eq!(st.admitted, 2);
        st.drop_group(10, "zero_std");
        assert_eq!(st.admitted, 1);
        assert_eq!(st.pending.keys().copied().collect::<Vec<_>>(), vec![2]);
        assert_eq!(st.dropped["zero_std"], 1);
        // A stale group regenerated goes first, under its number and with its prompt, once.
        let (g, prompt) = st.next_group();
        assert!(st.regenerate(g));
        assert_eq!(st.admitted, 1);
        assert_eq!(st.regenerated, 1);
        assert_eq!(st.next_group(), (g, prompt));
        assert!(!st.regenerate(g), "a second time it is dropped");
    }
}
