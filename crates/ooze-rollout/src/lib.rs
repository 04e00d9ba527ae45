//! ooze-rollout: the rollout side of an RL run: prompts, rewards, the rollout manager and the agent
//! API.
//!
//! - [`cancel`]: cancellation tokens, and engine requests run to a deadline.
//! - [`seeds`]: per-sample sampling seeds.
//! - [`agent`]: multi-turn agents, token-in/token-out, with budgets, deadlines and cancellation.
//! - [`transcript`]: token-exact samples from the calls of an agent that runs outside ooze (the
//!   agent gateway's sessions).
//! - [`oracle`]: demonstrations recorded from the agent's own code, an oracle writing its turns.
//! - [`helpers`]: fixed helper models (judges, executors, experts) agents call by name: engines in
//!   this process or OpenAI-compatible endpoints.
//!
//! - [`http_client`]: the blocking JSON-over-HTTP client of every outbound call.
//! - [`data`]: JSONL prompt datasets (keys, `@[a:b]` slices, bad rows named or skipped) and a
//!   seeded, resumable prompt order.
//! - [`reward`]: built-in rewards chosen by name in a recipe.
//! - [`math_answer`]: final-answer extraction, normalisation and equivalence for math tasks.
//! - [`qa`]: SQuAD-normalised exact match and F1.
//! - [`prompts`]: rows → prompt token ids, with the chat template and a system prompt.
//! - [`scorer`]: the recipe's reward: built-in, task verifiers, registered Rust functions (per
//!   sample or per group), Python functions ([`python_reward`]'s worker pool), a remote reward
//!   model over HTTP.
//! - [`activity`]: what a rollout's executions do over time (effective concurrency).
//! - [`manager`]: prompts × samples through the engine, rewards, dynamic-sampling batches.
//! - [`producer`]: asynchronous rollouts: groups generated ahead of the trainer, bounded
//!   staleness, over-provisioning, partial rollouts across weight updates.
//! - [`rollout_record`]: the line format of saved rollouts (old run directories still replay).
//! - [`tasks`]: built-in synthetic tasks (arithmetic, countdown, string transformations) with
//!   generators and verifiers.

pub mod activity;
pub mod agent;
pub mod cancel;
pub mod data;
pub mod helpers;
pub mod http_client;
pub mod manager;
pub mod math_answer;
pub mod oracle;
pub mod parquet_out;
pub mod producer;
pub mod prompts;
pub mod python_reward;
pub mod qa;
pub mod reward;
pub mod rollout_record;
pub mod scorer;
pub mod seeds;
pub mod tasks;
pub mod transcript;

pub use reward::{Reward, RewardError};
pub use tasks::{Task, TaskItem};
