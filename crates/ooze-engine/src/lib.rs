//! ooze-engine: the embedded rollout engine.
//!
//! - [`params`]: sampling parameters, wire form and validated form.
//! - [`sampler`]: seeded, batch-independent token selection and the shared log-prob definition.
//! - [`engine`]: the engine thread (continuous batching over slot KV memory) and its handle.
//!
//! Not here yet (issue 3 continues): prefix reuse across samples and sessions, preemption, pause and
//! weight updates, batched prefill, memory sizing from free GPU memory, CUDA graphs and varlen
//! flash attention.

pub mod engine;
pub mod params;
pub mod sampler;

pub use engine::{
    start, EngineConfig, EngineError, EngineHandle, EngineStats, Event, Output, Request, RequestId,
};
pub use params::{ParamError, Sampling, SamplingParams, StopStrings};
