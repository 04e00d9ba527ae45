//! Cancellation and deadlines for engine requests: a [`CancelToken`] an execution's owner can fire
//! from outside, and [`wait_output`], which runs one request to its end and aborts it in the engine
//! at the deadline, on cancellation, or when the waiter goes away.
//!
//! Shared by the agent API (the policy's turns) and helper models on an engine; it knows neither.

use ooze_engine::{Continuation, EngineError, EngineHandle, Event, Output, Request};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Cancels an execution from outside: generation in flight is aborted in the engine.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<(AtomicBool, Notify)>);

impl CancelToken {
    pub fn cancel(&self) {
        self.0 .0.store(true, Ordering::SeqCst);
        self.0 .1.notify_waiters();
    }

    pub fn is_cancelled(&self) -> bool {
        self.0 .0.load(Ordering::SeqCst)
    }

    /// Resolves once cancelled.
    pub async fn cancelled(&self) {
        loop {
            let notified = self.0 .1.notified();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }
}

/// Why [`wait_output`] returned no output.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    #[error("the engine did not answer an abort within 30 s")]
    AbortUnanswered,
}

/// Runs `request` on `engine` to its end, aborting it at `deadline` or on `cancel` (the engine then
/// answers with the partial output, finish `Abort`). Dropping the future aborts it too. Each token
/// is passed to `on_token` as it comes; false from it aborts the request. A weight update on the
/// way is a pause, not an end: the tokens so far are kept and the request goes on under the new
/// weights once the update is done ([`Continuation`]), within the same deadline.
pub(crate) async fn wait_output(
    engine: &EngineHandle,
    request: Request,
    deadline: Instant,
    cancel: &CancelToken,
    on_token: &mut (dyn FnMut(u32, f32) -> bool + Send),
) -> Result<Output, WaitError> {
    let mut continuation = Continuation::new(request);
    loop {
        let gate = tokio::select! {
            gate = engine.until_open() => gate,
            _ = tokio::time::sleep_until(deadline) => return Ok(continuation.give_up()),
            _ = cancel.cancelled() => return Ok(continuation.give_up()),
        };
        let (output, ended_here) = one_call(
            engine,
            continuation.next_request(),
            deadline,
            cancel,
            on_token,
        )
        .await?;
        let paused = !ended_here && engine.updated_since(gate);
        if let Some(done) = continuation.absorb(output, paused) {
            return Ok(done);
        }
    }
}

/// One engine call of [`wait_output`]; also says whether it was aborted from here (deadline,
/// cancellation, `on_token`) rather than by the engine.
async fn one_call(
    engine: &EngineHandle,
    request: Request,
    deadline: Instant,
    cancel: &CancelToken,
    on_token: &mut (dyn FnMut(u32, f32) -> bool + Send),
) -> Result<(Output, bool), WaitError> {
    let (id, mut events) = engine.submit(request)?;
    let mut guard = AbortOnDrop {
        engine,
        id: Some(id),
    };
    let mut aborted_at: Option<Instant> = None;
    loop {
        // After an abort the engine answers with the partial output; a bounded wait for it.
        let wake = aborted_at.map_or(deadline, |t| t + Duration::from_secs(30));
        tokio::select! {
            event = events.recv() => match event {
                Some(Event::Done(output)) => {
                    guard.id = None;
                    return Ok((output, aborted_at.is_some()));
                }
                Some(Event::Token { token, log_prob }) => {
                    if !on_token(token, log_prob) && aborted_at.is_none() {
                        engine.abort(id);
                        aborted_at = Some(Instant::now());
                    }
                }
                None => return Err(WaitError::Engine(EngineError::Stopped)),
            },
            _ = tokio::time::sleep_until(wake) => {
                if aborted_at.is_some() {
                    return Err(WaitError::AbortUnanswered);
                }
                engine.abort(id);
                aborted_at = Some(Instant::now());
            }
            _ = cancel.cancelled(), if aborted_at.is_none() => {
                engine.abort(id);
                aborted_at = Some(Instant::now());
            }
        }
    }
}

/// Aborts a request that is still running when its waiter goes away.
struct AbortOnDrop<'a> {
    engine: &'a EngineHandle,
    id: Option<ooze_engine::RequestId>,
}

impl Drop for AbortOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.engine.abort(id);
        }
    }
}
