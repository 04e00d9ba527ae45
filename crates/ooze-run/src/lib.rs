//! ooze-run: `ooze train`, the RL loop end to end.
//!
//! - [`recipe`]: the TOML recipe, its defaults, `--set` overrides and checks.
//! - [`run`]: the loop as a [`run::Run`] with named stages, each in its own module:
//!   [`prepare`], [`roll_out`], [`reward`], [`train`], [`evaluate`], [`checkpoint`]; rollout-only and
//!   replay modes; [`overlap`]: generation overlapping training (`rollout.mode` async,
//!   one_step_off).
//! - [`teacher`]: an on-policy distillation teacher behind an SGLang-compatible `/generate`.
//! - [`agents`]: the `[agent]` and `[helpers]` sections as the running agent and helper models.
//! - [`demonstrate`]: SFT demonstrations recorded from the recipe's agent, an oracle writing its
//!   turns.
//! - [`eval`]: eval sets and held-out pass@k.
//! - [`ranks`]: a run on several ranks (each its engine and a trainer replica; prompts dealt, groups
//!   exchanged).
//! - [`engine_processes`]: the engines a run starts on GPUs of their own (`rollout.gpus`).
//! - [`metrics_log`], [`tensorboard`], [`progress`]: metrics as JSONL and TensorBoard events, and the
//!   console.
//! - [`report`], [`plot`]: the HTML report with PNG plots.

pub mod agents;
pub mod checkpoint;
pub mod demonstrate;
pub mod engine_processes;
pub mod eval;
pub mod evaluate;
pub mod metrics_log;
pub mod overlap;
pub mod plot;
pub mod prepare;
pub mod progress;
pub mod ranks;
pub mod recipe;
pub mod report;
pub mod reward;
pub mod roll_out;
pub mod run;
pub mod teacher;
pub mod tensorboard;
pub mod train;

pub use recipe::Recipe;
pub use run::{run, run_dir_for, RunState, RunSummary};
