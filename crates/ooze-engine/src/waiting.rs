//! Requests waiting to start: a new one, or one preempted with what it had drawn; and a waiting
//! request given its KV blocks for the next prefill pass.

use crate::handle::{Event, Request, RequestId};
use std::borrow::Cow;
use tokio::sync::mpsc as async_mpsc;

/// A waiting request given its KV blocks for the next prefill pass.
pub(crate) struct Planned {
    pub(crate) waiting: Waiting,
    pub(crate) table: Vec<i64>,
    /// Tokens whose keys/values are already in the blocks.
    pub(crate) reused: usize,
    pub(crate) seed: u64,
}

/// A request not running: new, or preempted.
pub(crate) struct Waiting {
    pub(crate) id: RequestId,
    pub(crate) request: Request,
    /// Score the prompt from this position on (cleared once scored: the scores are in `progress`).
    pub(crate) prompt_log_probs_from: Option<usize>,
    pub(crate) events: async_mpsc::UnboundedSender<Event>,
    /// Set when the request was preempted after it started.
    pub(crate) progress: Option<Progress>,
}

/// What a preempted request had when it gave up its KV blocks.
pub(crate) struct Progress {
    pub(crate) seed: u64,
    pub(crate) output: Vec<u32>,
    pub(crate) log_probs: Vec<f32>,
    pub(crate) prompt_log_probs: Vec<f32>,
    /// Prompt tokens reused when it was first admitted (reported as cached tokens).
    pub(crate) reused: usize,
}

impl Waiting {
    /// The tokens a prefill must cover: the prompt, and the output of a preempted request.
    pub(crate) fn sequence(&self) -> Cow<'_, [u32]> {
        match &self.progress {
            Some(p) if !p.output.is_empty() => {
                Cow::Owned([&self.request.input_ids[..], &p.output[..]].concat())
            }
            _ => Cow::Borrowed(&self.request.input_ids),
        }
    }
}
