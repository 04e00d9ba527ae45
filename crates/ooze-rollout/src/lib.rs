//! ooze-rollout: the rollout side of an RL run. So far the reward functions; data sources, the
//! rollout manager and the agent API follow (issues 5 and 6).
//!
//! - [`data`]: JSONL prompt datasets (keys, `@[a:b]` slices, bad rows named or skipped) and a
//!   seeded, resumable prompt order.
//! - [`reward`]: built-in rewards chosen by name in a recipe.
//! - [`math_answer`]: final-answer extraction, normalisation and equivalence for math tasks.
//! - [`qa`]: SQuAD-normalised exact match and F1.
//! - [`tasks`]: built-in synthetic tasks (arithmetic, countdown, string transformations) with
//!   generators and verifiers.

pub mod data;
pub mod math_answer;
pub mod qa;
pub mod reward;
pub mod tasks;

pub use reward::{Reward, RewardError, RewardSpec};
pub use tasks::{Task, TaskItem};
