//! ooze-engine: the embedded rollout engine.
//!
//! - [`params`]: sampling parameters, wire form and validated form.
//! - [`sampler`]: seeded, batch-independent token selection and the shared log-prob definition.
//! - [`engine`]: the engine thread (continuous batching over paged KV memory).
//! - `decode_step`: a decode step queued while the host handles the one before it.
//! - `admit`: waiting requests given KV blocks and prefilled.
//! - `waiting`: requests waiting to start, and a request planned for the next prefill.
//! - `prompt_scores`: prompt log-probs from a prefill pass.
//! - [`handle`]: settings, requests, outputs, events, errors and the handle callers use.
//! - [`continuation`]: partial outputs carried across weight updates (partial rollouts).
//!
//! KV memory in blocks:
//! - [`block_pool`]: reference counts, the free list, cached blocks.
//! - [`prefix_tree`]: the radix tree of kept token prefixes, LRU eviction.
//! - [`kv_blocks`]: the two together: what a sequence claims, grows and gives back.
//!
//! - [`decode_graph`]: decode steps captured in CUDA graphs and replayed.

mod admit;
pub mod block_pool;
pub mod continuation;
pub mod decode_graph;
mod decode_step;
pub mod engine;
pub mod handle;
pub mod kv_blocks;
pub mod params;
pub mod prefix_tree;
mod prompt_scores;
pub mod sampler;
mod waiting;

pub use continuation::Continuation;
pub use engine::start;
pub use handle::{
    Command, EngineConfig, EngineError, EngineHandle, EngineStats, Event, Output, PauseMode,
    Request, RequestId, UpdateGate, WeightSource,
};
pub use params::{
    ParamError, Sampling, SamplingParams, StopStrings, MAX_NEW_TOKENS, MIN_TEMPERATURE,
};
