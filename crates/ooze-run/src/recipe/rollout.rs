//! `[rollout]`: what a rollout generates (prompts, samples, sampling, filtering) and where it
//! generates: the embedded engine beside the trainer, engines the run starts on GPUs of their own
//! (`rollout.gpus`), or running servers (`rollout.engines`).

pub use ooze_rollout::producer::StalePolicy;
pub use ooze_router::EngineApi;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `[rollout]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutSection {
    /// Rollouts (generate, then train) in the run.
    pub num_rollouts: u64,
    /// Prompts per rollout.
    pub batch_size: usize,
    pub n_samples_per_prompt: usize,
    pub max_new_tokens: usize,
    pub temperature: f64,
    pub top_p: f64,
    /// 0 = off.
    pub top_k: i64,
    pub stop: Vec<String>,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Sequences the engine runs at once (default: as many as fit in `mem_fraction` of free GPU
    /// memory, 64 on the CPU).
    pub max_running: Option<i64>,
    /// Share of the free GPU memory the KV cache may take while generating.
    pub mem_fraction: f64,
    /// Seed of the samples' sampling seeds.
    pub seed: u64,
    /// Drop prompt groups whose rewards are all equal, and over-sample to fill the batch.
    pub dynamic_sampling: bool,
    /// With `dynamic_sampling`: also drop groups whose reward standard deviation is at most this.
    pub min_reward_std: f64,
    /// Prompts generated per round while filling a filtered batch (default: `batch_size`).
    pub over_sampling_batch_size: Option<usize>,
    /// Rounds before a filtered batch is given up on and trained smaller.
    pub max_rounds: usize,
    /// Drop groups with a response cut at `max_new_tokens`.
    pub drop_truncated_groups: bool,
    /// Keep truncated responses but train none of their tokens.
    pub mask_truncated: bool,
    /// GPUs of their own for rollout (disaggregated): the run starts one `ooze serve` engine on
    /// each of this machine's GPUs after the trainer's (`trainer.gpus`), routes the rollout over
    /// them and broadcasts new weights to them after every step. 0 = colocated: each trainer
    /// rank generates on its own GPU. On a machine without GPUs (`model.device = "cpu"`) the
    /// engines are CPU processes.
    pub gpus: usize,
    /// External engines to generate on instead of the embedded one: base URLs of running servers
    /// with SGLang's native API (SGLang, `ooze serve`), loaded with the same model. New weights
    /// reach them after every step (`weight_sync`).
    pub engines: Vec<String>,
    /// A file of further engine URLs (one per line), read again every few seconds: engines added
    /// to it join the run.
    pub engines_file: Option<PathBuf>,
    /// The API of `engines`: `sglang` (SGLang's native API: SGLang, `ooze serve`) or `vllm`
    /// (vLLM's OpenAI server started with `VLLM_SERVER_DEV_MODE=1`; weights by disk).
    pub engine_api: EngineApi,
    /// How new weights reach engines outside the trainer: `disk` (an HF directory,
    /// `/update_weights_from_disk`) or `distributed` (broadcast over a process group, SGLang's
    /// `update_weights_from_distributed`: NCCL from a GPU trainer, Gloo from a CPU one); `auto`:
    /// `distributed` to the engines of `rollout.gpus`, `disk` to `rollout.engines`.
    pub weight_sync: WeightSync,
    /// The address external engines reach the trainer at (the weight group's store).
    pub trainer_address: String,
    /// True on-policy numerics: the engine's decode and the trainer's forward run the same
    /// batch-invariant kernels in the same reduction order, so every sampled token's log-prob
    /// equals the trainer's bitwise (a GPU in bf16; engines of `rollout.gpus` start with
    /// `--deterministic`, engines of `rollout.engines` must be started with it).
    pub deterministic: bool,
    /// How generation and training overlap: `sync` (generate a rollout, train on it, update
    /// the weights, repeat), `one_step_off` (the next rollout generates while the trainer
    /// trains on this one: `async` with `max_staleness` 1 and no extra groups) or `async`
    /// (groups generate continuously; a step takes the first complete ones).
    pub mode: RolloutMode,
    /// With `async`: how many weight versions a trained token may lag the weights being trained
    /// (default 2). Staler groups are dropped and counted (`rollout/dropped_stale`).
    pub max_staleness: Option<u64>,
    /// With `async`: groups started beyond what `max_staleness` allows, as a share of
    /// `batch_size` (APRIL's over-provisioning; default 0.5): a step takes the first complete
    /// groups and the rest carry into the next as partial rollouts.
    pub over_provision: Option<f64>,
    /// With `async` / `one_step_off`: what becomes of a group with tokens staler than
    /// `max_staleness`: `drop` the group (counted, `rollout/dropped_stale`), `mask` those
    /// tokens (kept in the sample, not trained, `async/masked_tokens`; the group's reward
    /// still counts, so long trajectories are not selected against), or `regenerate` it (its
    /// prompt starts again under the current weights, counted as `async/regenerated_groups`;
    /// a regenerated group stale again is dropped).
    pub stale: StalePolicy,
    /// Seconds a weight update of engines outside the trainer may take (writing or gathering
    /// the weights, the engines loading them) before the step fails, naming the engines it
    /// waited for.
    pub weight_update_timeout_secs: f64,
}

/// `rollout.mode`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RolloutMode {
    #[default]
    Sync,
    OneStepOff,
    Async,
}

/// `rollout.mode` resolved: the producer's bounds (none in `sync`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AsyncBounds {
    pub max_staleness: u64,
    /// Extra groups in flight (over-provisioning).
    pub extra_groups: usize,
    /// What becomes of stale groups.
    pub stale: StalePolicy,
}

/// `rollout.weight_sync`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum WeightSync {
    #[default]
    Auto,
    Disk,
    Distributed,
}

impl Default for RolloutSection {
    fn default() -> Self {
        RolloutSection {
            num_rollouts: 100,
            batch_size: 32,
            n_samples_per_prompt: 8,
            max_new_tokens: 512,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            stop: Vec::new(),
            concurrency: 1024,
            max_running: None,
            mem_fraction: 0.5,
            seed: 1234,
            dynamic_sampling: false,
            min_reward_std: 0.0,
            over_sampling_batch_size: None,
            max_rounds: 8,
            drop_truncated_groups: false,
            mask_truncated: false,
            gpus: 0,
            engines: Vec::new(),
            engines_file: None,
            engine_api: EngineApi::Sglang,
            weight_sync: WeightSync::Auto,
            trainer_address: "127.0.0.1".into(),
            deterministic: false,
            mode: RolloutMode::Sync,
            stale: StalePolicy::Drop,
            max_staleness: None,
            over_provision: None,
            weight_update_timeout_secs: 600.0,
        }
    }
}

impl RolloutSection {
    /// Whether the run generates on engines outside its trainer processes: engines it starts
    /// (`gpus`) or running servers (`engines`, `engines_file`).
    pub fn outside_engines(&self) -> bool {
        self.gpus > 0 || !self.engines.is_empty() || self.engines_file.is_some()
    }

    /// `weight_sync` with `auto` resolved.
    pub fn weight_sync(&self) -> WeightSync {
        match self.weight_sync {
            WeightSync::Auto if self.gpus > 0 => WeightSync::Distributed,
            WeightSync::Auto => WeightSync::Disk,
            w => w,
        }
    }

    /// The asynchronous producer's bounds; `None` in `sync` mode.
    pub fn async_bounds(&self) -> Option<AsyncBounds> {
        match self.mode {
            RolloutMode::Sync => None,
            RolloutMode::OneStepOff => Some(AsyncBounds {
                max_staleness: 1,
                extra_groups: 0,
                stale: self.stale,
            }),
            RolloutMode::Async => Some(AsyncBounds {
                max_staleness: self.max_staleness.unwrap_or(2),
                extra_groups: (self.over_provision.unwrap_or(0.5) * self.batch_size as f64).ceil()
                    as usize,
                stale: self.stale,
            }),
        }
    }

    /// Checks the keys of `mode` together.
    pub(super) fn check_mode(&self) -> Result<(), String> {
        if !(self.weight_update_timeout_secs > 0.0 && self.weight_update_timeout_secs.is_finite()) {
            return Err(format!(
                "rollout.weight_update_timeout_secs must be a positive number of seconds, got {}",
                self.weight_update_timeout_secs
            ));
        }
        if let Some(p) = self.over_provision {
            if !(p >= 0.0 && p.is_finite()) {
                return Err(format!(
                    "rollout.over_provision must be a share of batch_size ≥ 0, got {p}"
                ));
            }
        }
        if self.weight_update_timeout_secs != RolloutSection::default().weight_update_timeout_secs
            && !self.outside_engines()
        {
            return Err("rollout.weight_update_timeout_secs applies to engines outside the trainer (rollout.gpus, rollout.engines or rollout.engines_file): the embedded engine's update is the trainer's own step".into());
        }
        if self.mode == RolloutMode::Sync && self.stale != StalePolicy::Drop {
            return Err("rollout.stale applies to rollout.mode = \"async\" or \"one_step_off\" (here \"sync\": nothing is stale)".into());
        }
        let name = match self.mode {
            RolloutMode::Sync => "sync",
            RolloutMode::OneStepOff => "one_step_off",
            RolloutMode::Async => return self.check_async_fill(),
        };
        for (key, set) in [
            ("max_staleness", self.max_staleness.is_some()),
            ("over_provision", self.over_provision.is_some()),
        ] {
            if set {
                return Err(format!(
                    "rollout.{key} applies to rollout.mode = \"async\" (here \"{name}\"{})",
                    if name == "one_step_off" {
                        ", which is async with max_staleness 1 and no extra groups"
                    } else {
                        ""
                    }
                ));
            }
        }
        if self.mode == RolloutMode::OneStepOff {
            self.check_async_fill()?;
        }
        Ok(())
    }

    /// An asynchronous rollout keeps generating until a step's groups are complete: the
    /// synchronous batch-filling keys do not apply.
    fn check_async_fill(&self) -> Result<(), String> {
        if self.over_sampling_batch_size.is_some() {
            return Err("rollout.over_sampling_batch_size fills a synchronous batch; with rollout.mode = \"async\" or \"one_step_off\" the producer keeps generating until a step's groups pass the filters (set rollout.over_provision for groups beyond the bound)".into());
        }
        if self.max_rounds != RolloutSection::default().max_rounds {
            return Err("rollout.max_rounds bounds a synchronous batch's rounds; with rollout.mode = \"async\" or \"one_step_off\" there are no rounds".into());
        }
        Ok(())
    }

    /// Checks the engine keys together.
    pub(super) fn check_engines(&self) -> Result<(), String> {
        if self.gpus > 0 && (!self.engines.is_empty() || self.engines_file.is_some()) {
            return Err("rollout.gpus starts the run's own engines and rollout.engines / rollout.engines_file name running ones: choose one".into());
        }
        let listed = !self.engines.is_empty() || self.engines_file.is_some();
        if self.engine_api == EngineApi::Vllm {
            if !listed {
                return Err("rollout.engine_api applies to rollout.engines / rollout.engines_file (the engines of rollout.gpus are ooze serve's)".into());
            }
            if self.weight_sync == WeightSync::Distributed {
                return Err("rollout.weight_sync = \"distributed\" cannot reach vLLM engines: vLLM's NCCL weight transfer joins through its own Python process group; use \"disk\" (vLLM reloads the directory through /collective_rpc)".into());
            }
        }
        if !self.outside_engines() {
            if self.weight_sync != WeightSync::Auto {
                return Err("rollout.weight_sync applies to engines outside the trainer (rollout.gpus, rollout.engines or rollout.engines_file)".into());
            }
            if self.trainer_address != RolloutSection::default().trainer_address {
                return Err("rollout.trainer_address applies to engines outside the trainer (rollout.gpus, rollout.engines or rollout.engines_file)".into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{parse, MIN};
    use super::*;

    #[test]
    fn engine_keys_are_checked_together() {
        let r = parse(MIN, &["rollout.gpus=2"]).unwrap();
        assert!(r.rollout.outside_engines());
        assert_eq!(r.rollout.weight_sync(), WeightSync::Distributed);
        let r = parse(MIN, &["rollout.engines=[\"http://e:1\"]"]).unwrap();
        assert_eq!(r.rollout.weight_sync(), WeightSync::Disk);
        let e = parse(MIN, &["rollout.gpus=1", "rollout.engines=[\"http://e:1\"]"]).unwrap_err();
        assert!(e.contains("choose one"), "{e}");
        let e = parse(MIN, &["rollout.weight_sync=\"disk\""]).unwrap_err();
        assert!(e.contains("engines outside the trainer"), "{e}");
        let e = parse(MIN, &["rollout.engine_api=\"vllm\""]).unwrap_err();
        assert!(
            e.contains("rollout.engine_api applies to rollout.engines"),
            "{e}"
        );
        let e = parse(
            MIN,
            &[
                "rollout.engines=[\"http://e:1\"]",
                "rollout.engine_api=\"vllm\"",
                "rollout.weight_sync=\"distributed\"",
            ],
        )
        .unwrap_err();
        assert!(e.contains("cannot reach vLLM engines"), "{e}");
        let e = parse(
            MIN,
            &[
                "rollout.gpus=1",
                "trainer.mode=\"replay\"",
                "trainer.replay_from=\"r\"",
            ],
        )
        .unwrap_err();
        assert!(e.contains("a replay generates nothing"), "{e}");
    }

    #[test]
    fn mode_keys_are_checked_together() {
        let r = parse(MIN, &[]).unwrap();
        assert_eq!(r.rollout.async_bounds(), None, "sync by default");
        let r = parse(MIN, &["rollout.mode=\"async\""]).unwrap();
        let b = r.rollout.async_bounds().unwrap();
        assert_eq!(b.max_staleness, 2);
        assert_eq!(
            b.extra_groups,
            (r.rollout.batch_size as f64 * 0.5).ceil() as usize
        );
        let r = parse(
            MIN,
            &[
                "rollout.mode=\"async\"",
                "rollout.max_staleness=0",
                "rollout.over_provision=0",
            ],
        )
        .unwrap();
        assert_eq!(
            r.rollout.async_bounds(),
            Some(AsyncBounds {
                max_staleness: 0,
                extra_groups: 0,
                stale: StalePolicy::Drop
            })
        );
        let r = parse(MIN, &["rollout.mode=\"one_step_off\""]).unwrap();
        assert_eq!(
            r.rollout.async_bounds(),
            Some(AsyncBounds {
                max_staleness: 1,
                extra_groups: 0,
                stale: StalePolicy::Drop
            })
        );
        for (sets, says) in [
            (
                &["rollout.max_staleness=1"][..],
                "rollout.max_staleness applies to rollout.mode = \"async\" (here \"sync\")",
            ),
            (
                &["rollout.mode=\"one_step_off\"", "rollout.over_provision=1"][..],
                "which is async with max_staleness 1",
            ),
            (
                &["rollout.mode=\"async\"", "rollout.over_provision=-1"][..],
                "rollout.over_provision must be a share of batch_size ≥ 0",
            ),
            (
                &["rollout.mode=\"async\"", "rollout.max_rounds=2"][..],
                "there are no rounds",
            ),
            (
                &[
                    "rollout.mode=\"async\"",
                    "rollout.over_sampling_batch_size=4",
                ][..],
                "set rollout.over_provision",
            ),
            (
                &["rollout.stale=\"mask\""][..],
                "rollout.stale applies to rollout.mode = \"async\"",
            ),
            (
                &["rollout.weight_update_timeout_secs=5"][..],
                "applies to engines outside the trainer",
            ),
            (
                &["rollout.gpus=1", "rollout.weight_update_timeout_secs=0"][..],
                "a positive number of seconds",
            ),
            (
                &["rollout.mode=\"async\"", "trainer.mode=\"rollout_only\""][..],
                "trainer.mode = \"rollout_only\" does not train on fresh rollouts",
            ),
        ] {
            let e = parse(MIN, sets).unwrap_err();
            assert!(e.contains(says), "{sets:?}: {e}");
        }
    }
}
