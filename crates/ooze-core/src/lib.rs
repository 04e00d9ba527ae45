//! ooze-core: the vocabulary every other ooze crate speaks.
//!
//! A [`Sample`] is one trajectory (prompt tokens + response tokens) with everything the trainer
//! needs to use it and everything a person needs to audit it, from rollout to loss. This crate knows nothing of
//! tensors or async runtimes, so data tools, servers and the trainer can all depend on it.

pub mod atomic_file;
pub mod ids;
pub mod order;
pub mod rng;
pub mod sample;

pub use ids::SessionId;
pub use rng::SplitMix64;
pub use sample::{FinishReason, Sample, SampleError, Status, StopMatch};

/// `e` and its causes as one line, `outer: cause: root cause` (for errors that must travel as
/// text, such as an engine reply or a warning, without losing the OS error underneath).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}
