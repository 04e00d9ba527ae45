//! ooze-run: `ooze train`, the RL loop end to end.
//!
//! - [`recipe`]: the TOML recipe, its defaults, `--set` overrides and checks.
//! - [`run`]: the colocated loop (rollout → train → in-place weight update), checkpoints, resume,
//!   rollout-only and replay modes.
//! - [`agents`]: the `[agent]` and `[helpers]` sections as the running agent and helper models.
//! - [`eval`]: held-out pass@k.
//! - [`metrics_log`], [`tensorboard`], [`progress`]: metrics as JSONL and TensorBoard events, and the
//!   console.
//! - [`report`], [`plot`]: the HTML report with PNG plots.

pub mod agents;
pub mod eval;
pub mod metrics_log;
pub mod plot;
pub mod progress;
pub mod recipe;
pub mod report;
pub mod run;
pub mod tensorboard;

pub use recipe::Recipe;
pub use run::{run, run_dir_for, RunState, RunSummary};
