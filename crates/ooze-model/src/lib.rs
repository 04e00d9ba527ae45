//! ooze-model: the models RL users train, loaded from and saved to the Hugging Face format.
//!
//! - [`config`]: `config.json` → [`ModelConfig`] (Qwen2/2.5, Qwen3, Llama 3.x as data).
//! - [`checkpoint`]: safetensors weights, single-file or sharded with an index, in and out.
//! - [`decoder`]: the one decoder implementation; full-sequence and incremental forward.
//! - [`attention`]: KV memory (per batch and in engine slots), attention layouts and masks.
//! - [`scoring`]: per-token log-probs and entropies without materialising full-vocab fp32 logits.
//! - [`tokenizer`], [`chat_template`]: HF tokenizers and transformers-identical chat templates.
//! - [`tool_calls`]: the templates' `<tool_call>{json}</tool_call>` calls read back from text.
//! - [`init`], [`corpus`]: new random-weight models with trained tokenizers, for tests and demos.

pub mod attention;
pub mod chat_template;
pub mod checkpoint;
pub mod config;
pub mod corpus;
pub mod decoder;
pub mod error;
pub mod init;
pub mod rope;
pub mod scoring;
pub mod tokenizer;
pub mod tool_calls;

pub use attention::Arithmetic;
pub use chat_template::{AssistantSpan, ChatTemplate, RenderOptions};
pub use config::{Family, ModelConfig};
pub use decoder::{enable_deterministic, Attention, Decoder, KvCache, PagedKv};
pub use error::{ModelError, Result};
pub use rope::RopeTables;
pub use scoring::{score_sequences, Layout, ScoreOptions, SequenceScores};
pub use tokenizer::Tokenizer;
