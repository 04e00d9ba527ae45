//! ooze-train: the trainer.
//!
//! - [`batch`]: training samples and micro-batch packing to a token budget.
//! - [`forward`]: the policy's log-probs and entropies of response tokens, packed.
//! - [`optimizer`]: AdamW with fp32 master weights (libtorch's fused kernel), weight-decay groups,
//!   global-norm clipping.
//! - [`memory`]: the memory plan (what training takes per GPU, checked before loading).
//! - [`schedule`]: learning-rate schedules (warmup; constant, linear or cosine decay).
//! - [`trainer`]: RL and SFT steps, with step metrics.
//! - [`critic`]: the PPO critic (decoder body + value head) and its settings.
//! - [`data_parallel`]: ranks sharing a step (each its span of the samples, gradients summed).
//! - `sharding`, `sharded_forward`: sharded training (ZeRO-3): parameters, gradients, masters and
//!   moments split over the ranks, each unit gathered only while it runs.
//! - [`teacher`]: the on-policy distillation teacher (a model in process or a remote scorer).
//! - [`checkpoint`]: atomic checkpoints and exact resume.
//! - [`sft_data`]: chat JSONL → training samples with assistant-only masks.
//! - [`sft`]: the supervised fine-tuning run (`ooze sft`): batches, steps, held-out loss,
//!   checkpoints and resume.

pub mod batch;
pub mod checkpoint;
pub mod critic;
pub mod data_parallel;
pub mod forward;
pub mod memory;
pub mod optimizer;
pub mod schedule;
pub mod sft;
pub mod sft_data;
mod sharded_checkpoint;
mod sharded_forward;
mod sharding;
mod step;
pub mod teacher;
pub mod trainer;

pub use critic::{Critic, CriticConfig};
pub use ooze_core::Sample;
pub use optimizer::OptimizerConfig;
pub use schedule::{Decay, Schedule};
pub use teacher::{Teacher, TeacherScorer};
pub use trainer::{Sharding, StepMetrics, Trainer, TrainerConfig};

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("sample {index}: {what}")]
    Sample { index: usize, what: String },
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    NonFinite(String),
    #[error("optimizer: {0}")]
    Optimizer(String),
    #[error("teacher: {0}")]
    Teacher(String),
    /// A collective between ranks failed (a peer died, timed out, or the build has none).
    #[error("ranks: {0}")]
    Dist(String),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// A file or directory that could not be read, created or removed (`action` says which).
    #[error("{path}: cannot {action}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file or directory that could not be written or renamed into place.
    #[error(transparent)]
    Write(#[from] ooze_core::atomic_file::AtomicFileError),
    #[error(transparent)]
    Model(#[from] ooze_model::ModelError),
    #[error(transparent)]
    Algo(#[from] ooze_algo::AlgoError),
    #[error("{file}:{line}: {message}")]
    Data {
        file: PathBuf,
        line: usize,
        message: String,
    },
}
