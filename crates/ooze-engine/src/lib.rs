//! ooze-engine: the embedded rollout engine.
//!
//! - [`params`]: sampling parameters, wire form and validated form.
//! - [`sampler`]: seeded, batch-independent token selection and the shared log-prob definition.
//! - [`engine`]: the engine thread (continuous batching over slot KV memory).
//! - `waiting`: requests waiting for a slot, and the prefix a planned prefill reuses.
//! - `prompt_scores`: prompt log-probs from a prefill pass.
//! - [`handle`]: settings, requests, outputs, events, errors and the handle callers use.
//!
//! - [`prefix_cache`]: finished sequences kept in their slots for prefix reuse.
//!
//! - [`decode_graph`]: decode steps captured in CUDA graphs and replayed.

pub mod decode_graph;
pub mod engine;
pub mod handle;
pub mod params;
pub mod prefix_cache;
mod prompt_scores;
pub mod sampler;
mod waiting;

pub use engine::start;
pub use handle::{
    Command, EngineConfig, EngineError, EngineHandle, EngineStats, Event, Output, PauseMode,
    Request, RequestId, WeightSource,
};
pub use params::{
    ParamError, Sampling, SamplingParams, StopStrings, MAX_NEW_TOKENS, MIN_TEMPERATURE,
};
