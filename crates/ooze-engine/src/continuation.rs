//! Partial outputs carried across weight updates. An update pauses the engine and every request
//! ends at once with the tokens it has ([`crate::EngineHandle::begin_weight_update`]); a caller that
//! holds a [`Continuation`] keeps those tokens and submits the rest after the update: prompt and
//! tokens so far as the new prompt, `max_new_tokens` less what was drawn, the same seed and the
//! draw counter where it stopped. Nothing is restarted from scratch, and every token keeps the
//! weight version that drew it ([`Output::token_versions`]).
//!
//! This works the same over every engine, the embedded one and servers behind the router
//! (SGLang's `abort` pause ends requests with their partial outputs too). On the embedded engine
//! and `ooze serve`, draws depend only on the seed and the draw counter, so under unchanged
//! weights a continued request draws exactly the tokens it would have drawn uninterrupted. A stop
//! string that straddles the point where a request was paused is not matched.

use crate::handle::{Output, Request, RequestId};
use ooze_core::FinishReason;

/// One request's output so far, across the updates that paused it.
#[derive(Debug, Clone)]
pub struct Continuation {
    request: Request,
    so_far: Option<Output>,
}

impl Continuation {
    pub fn new(request: Request) -> Continuation {
        Continuation {
            request,
            so_far: None,
        }
    }

    /// The request to submit next: the original one, or, after a pause, the continuation of the
    /// tokens so far.
    pub fn next_request(&self) -> Request {
        let Some(so_far) = &self.so_far else {
            return self.request.clone();
        };
        let n = so_far.tokens.len();
        let mut next = self.request.clone();
        next.input_ids.extend_from_slice(&so_far.tokens);
        next.sampling.max_new_tokens = next.sampling.max_new_tokens.saturating_sub(n);
        next.sampling.min_new_tokens = next.sampling.min_new_tokens.saturating_sub(n);
        next.sampling.seed = Some(so_far.seed);
        next.sampling.first_draw += n as u64;
        next
    }

    /// Whether the tokens so far already fill `max_new_tokens` (nothing is left to continue).
    pub fn exhausted(&self) -> bool {
        self.so_far
            .as_ref()
            .is_some_and(|o| o.tokens.len() >= self.request.sampling.max_new_tokens)
    }

    /// Adds one call's output. `paused` says that it ended because a weight update paused the
    /// engine: then its tokens are kept for the next call and `None` is returned (unless no
    /// tokens are left to draw: the output then ends at its length). Otherwise the whole output,
    /// every call's tokens in order, is returned.
    pub fn absorb(&mut self, output: Output, paused: bool) -> Option<Output> {
        let paused = paused && output.finish == FinishReason::Abort;
        let merged = match self.so_far.take() {
            None => Output {
                token_versions: output.versions(),
                ..output
            },
            Some(mut so_far) => {
                so_far.token_versions.extend(output.versions());
                so_far.tokens.extend_from_slice(&output.tokens);
                so_far.log_probs.extend_from_slice(&output.log_probs);
                so_far.finish = output.finish;
                so_far.weight_version = output.weight_version;
                so_far.cached_tokens += output.cached_tokens;
                so_far
            }
        };
        self.so_far = Some(merged);
        if paused && !self.exhausted() {
            return None;
        }
        let mut done = self.so_far.take().expect("set above");
        if paused {
            done.finish = FinishReason::Length;
        }
        Some(one_version_implicit(done))
    }

    /// The output so far, ended as aborted, for a caller that gives up while an update is in
    /// progress (its deadline passed, or it was cancelled): empty if nothing was drawn yet.
    pub fn give_up(self) -> Output {
        let mut output = self.so_far.unwrap_or_else(|| Output {
            id: RequestId(u64::MAX),
            tokens: Vec::new(),
            log_probs: Vec::new(),
            prompt_log_probs: Vec::new(),
            finish: FinishReason::Abort,
            prompt_tokens: self.request.input_ids.len(),
            cached_tokens: 0,
            weight_version: 0,
            token_versions: Vec::new(),
            seed: self.request.sampling.seed.unwrap_or(0),
        });
        output.finish = FinishReason::Abort;
        one_version_implicit(output)
    }
}

/// `token_versions` left empty when every token has the output's `weight_version`.
fn one_version_implicit(mut output: Output) -> Output {
    if output
        .token_versions
        .iter()
        .all(|&v| v == output.weight_version)
    {
        output.token_versions.clear();
    }
    output
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Sampling;

    fn output(tokens: &[u32], version: u64, finish: FinishReason, seed: u64) -> Output {
        Output {
            id: RequestId(0),
            tokens: tokens.to_vec(),
            log_probs: tokens.iter().map(|&t| -(t as f32)).collect(),
            prompt_log_probs: Vec::new(),
            finish,
            prompt_tokens: 2,
            cached_tokens: 0,
            weight_version: version,
            token_versions: Vec::new(),
            seed,
        }
    }

    fn request(max_new: usize) -> Request {
        Request {
            input_ids: vec![1, 2],
            sampling: Sampling {
                max_new_tokens: max_new,
                min_new_tokens: 3,
                ..Sampling::default()
            },
            session: Some(7),
        }
    }

    #[test]
    fn a_paused_request_continues_where_it_stopped_with_versions_per_token() {
        let mut c = Continuation::new(request(10));
        assert_eq!(c.next_request().input_ids, vec![1, 2]);
        assert!(c
            .absorb(output(&[5, 6, 7], 3, FinishReason::Abort, 99), true)
            .is_none());
        let next = c.next_request();
        assert_eq!(next.input_ids, vec![1, 2, 5, 6, 7]);
        assert_eq!(next.sampling.max_new_tokens, 7);
        assert_eq!(next.sampling.min_new_tokens, 0);
        assert_eq!(next.sampling.seed, Some(99));
        assert_eq!(next.sampling.first_draw, 3);
        assert_eq!(next.session, Some(7));
        assert!(c
            .absorb(output(&[8], 4, FinishReason::Abort, 99), true)
            .is_none());
        assert_eq!(c.next_request().sampling.first_draw, 4);
        let done = c
            .absorb(output(&[9, 2], 5, FinishReason::Length, 99), false)
            .expect("finished");
        assert_eq!(done.tokens, vec![5, 6, 7, 8, 9, 2]);
        assert_eq!(done.log_probs, vec![-5.0, -6.0, -7.0, -8.0, -9.0, -2.0]);
        assert_eq!(done.token_versions, vec![3, 3, 3, 4, 5, 5]);
        assert_eq!(done.versions(), vec![3, 3, 3, 4, 5, 5]);
        assert_eq!(done.weight_version, 5);
        assert_eq!(done.finish, FinishReason::Length);
        assert_eq!(done.prompt_tokens, 2);
    }

    #[test]
    fn an_abort_that_is_not_a_pause_ends_the_output() {
        let mut c = Continuation::new(request(10));
        let done = c
            .absorb(output(&[5], 1, FinishReason::Abort, 4), false)
            .expect("an abort by the caller ends it");
        assert_eq!(done.finish, FinishReason::Abort);
        assert!(done.token_versions.is_empty(), "one version: left implicit");
        assert_eq!(done.versions(), vec![1]);
    }

    #[test]
    fn a_pause_after_the_last_token_ends_at_the_length() {
        let mut c = Continuation::new(request(2));
        let done = c
            .absorb(output(&[5, 6], 1, FinishReason::Abort, 4), true)
            .expect("no tokens left to draw");
        assert_eq!(done.finish, FinishReason::Length);
        assert_eq!(done.tokens, vec![5, 6]);
    }
}
