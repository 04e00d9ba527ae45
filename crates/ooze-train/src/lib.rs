//! ooze-train: the trainer.
//!
//! - [`batch`]: training samples and micro-batch packing to a token budget.
//! - [`forward`]: the policy's log-probs and entropies of response tokens, packed.
//! - [`optimizer`]: AdamW with fp32 master weights (libtorch's fused kernel), weight-decay groups,
//!   global-norm clipping.
//! - [`schedule`]: learning-rate schedules (warmup; constant, linear or cosine decay).
//! - [`trainer`]: RL and SFT steps, with step metrics.
//! - [`critic`]: the PPO critic (decoder body + value head).
//! - [`checkpoint`]: atomic checkpoints and exact resume.
//! - [`sft_data`]: chat JSONL → training samples with assistant-only masks.
//! - [`sft`]: the supervised fine-tuning run (`ooze sft`): batches, steps, held-out loss,
//!   checkpoints and resume.

pub mod batch;
pub mod checkpoint;
pub mod critic;
pub mod forward;
pub mod optimizer;
pub mod schedule;
pub mod sft;
pub mod sft_data;
pub mod trainer;

pub use batch::TrainSample;
pub use optimizer::OptimizerConfig;
pub use schedule::{Decay, Schedule};
pub use trainer::{StepMetrics, Trainer, TrainerConfig};

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
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
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
