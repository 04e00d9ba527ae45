//! The engine's public face: settings, requests, outputs, events, errors, and the cloneable
//! [`EngineHandle`] callers use. Every call is a message to the engine thread ([`crate::engine`]);
//! replies come back over oneshot channels, tokens over a per-request stream.

use crate::continuation::Continuation;
use crate::params::Sampling;
use ooze_core::FinishReason;
use ooze_torch::tch::Tensor;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use tokio::sync::{mpsc as async_mpsc, oneshot, watch};

/// Engine-wide settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Sequences generated at once (the decode batch's limit).
    pub max_running: i64,
    /// Longest sequence (prompt + output) the engine takes.
    pub context_len: i64,
    /// Tokens per KV block: a multiple of [`ooze_model::decoder::KEY_ALIGN`], at most
    /// `context_len`. `context_len` itself is the fixed-slot layout (one block per sequence).
    pub kv_block_size: i64,
    /// Tokens of KV memory in all (rounded down to whole blocks): sequences draw blocks from it as
    /// they grow, and kept prefixes live in what they leave. At least `context_len`.
    pub kv_tokens: i64,
    /// Tokens that end a sequence unless `ignore_eos` (generation_config's `eos_token_id`).
    pub eos_token_ids: Vec<u32>,
    /// Shortest kept prefix worth copying out of a shared block instead of recomputing (whole
    /// blocks are shared without copying, and a kept tail nobody else uses is taken over).
    pub min_prefix_reuse: usize,
    /// Replay decode steps from CUDA graphs on a GPU (set `OOZE_CUDA_GRAPHS=0` to turn off).
    pub cuda_graphs: bool,
    /// Queue each decode step before handling the draws of the one before, so the host's work
    /// overlaps the device's. `None`: on a GPU only (on a CPU a step has run by the time it is
    /// queued, so queuing ahead would only deliver each token a step later).
    /// `OOZE_ENGINE_OVERLAP=0` or `1` sets it.
    pub overlap_steps: Option<bool>,
    /// Print the forward and sampling time of every decode step (synchronises the GPU; set
    /// `OOZE_ENGINE_PROFILE=1`).
    pub profile_steps: bool,
    /// The weight version the engine starts at (outputs report it until the first update, which
    /// makes it one more). A resumed run passes the version its restored weights had, so samples
    /// after a resume do not reuse the numbers of earlier weights. 0 for a fresh run.
    pub initial_weight_version: u64,
}

/// Tokens per KV block unless set otherwise.
pub const DEFAULT_KV_BLOCK_SIZE: i64 = 16;

impl EngineConfig {
    /// The context length the engine uses for `tokens`: rounded up to the attention kernels' key
    /// alignment.
    pub fn aligned_context_len(tokens: i64) -> i64 {
        let align = ooze_model::decoder::KEY_ALIGN;
        (tokens.max(1) + align - 1) / align * align
    }

    /// `max_running` sequences of up to `context_len` tokens (rounded up to a multiple of
    /// [`ooze_model::decoder::KEY_ALIGN`]), with KV memory for all of them at full length in blocks
    /// of [`DEFAULT_KV_BLOCK_SIZE`] tokens.
    pub fn new(max_running: i64, context_len: i64, eos_token_ids: Vec<u32>) -> EngineConfig {
        let context_len = EngineConfig::aligned_context_len(context_len);
        EngineConfig {
            max_running,
            context_len,
            kv_block_size: DEFAULT_KV_BLOCK_SIZE.min(context_len),
            kv_tokens: max_running.max(1) * context_len,
            eos_token_ids,
            min_prefix_reuse: 16,
            cuda_graphs: std::env::var("OOZE_CUDA_GRAPHS").as_deref() != Ok("0"),
            overlap_steps: match std::env::var("OOZE_ENGINE_OVERLAP").as_deref() {
                Ok("0") => Some(false),
                Ok("1") => Some(true),
                _ => None,
            },
            profile_steps: std::env::var_os("OOZE_ENGINE_PROFILE").is_some(),
            initial_weight_version: 0,
        }
    }

    /// This config with the engine starting at weight version `version`.
    pub fn with_initial_weight_version(self, version: u64) -> EngineConfig {
        EngineConfig {
            initial_weight_version: version,
            ..self
        }
    }

    /// This config with `block_size` tokens per KV block (`None`: keep it; a size at least the
    /// context length gives fixed slots) and `tokens` of KV memory (`None`: keep it).
    pub fn with_kv(
        self,
        block_size: Option<i64>,
        tokens: Option<i64>,
    ) -> Result<EngineConfig, String> {
        let align = ooze_model::decoder::KEY_ALIGN;
        let block_size = block_size.unwrap_or(self.kv_block_size);
        if block_size < align || block_size % align != 0 {
            return Err(format!(
                "the KV block size must be a positive multiple of {align} tokens, got {block_size}"
            ));
        }
        let block_size = block_size.min(self.context_len);
        let tokens = tokens.unwrap_or(self.kv_tokens);
        if tokens < self.context_len {
            return Err(format!(
                "KV memory of {tokens} tokens cannot hold one sequence of the context length \
                 ({} tokens)",
                self.context_len
            ));
        }
        Ok(EngineConfig {
            kv_block_size: block_size,
            kv_tokens: tokens,
            ..self
        })
    }

    /// Blocks of KV memory.
    pub fn kv_blocks(&self) -> i64 {
        self.kv_tokens / self.kv_block_size
    }
}

/// Identifies one submitted request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct RequestId(pub u64);

/// What to generate.
#[derive(Debug, Clone)]
pub struct Request {
    pub input_ids: Vec<u32>,
    pub sampling: Sampling,
    /// The conversation this request continues (an agent's session), when it has one: a router
    /// over several engines sends a session's requests to one engine, where its prefix is
    /// cached. `None`: any engine (the least loaded).
    pub session: Option<u64>,
}

/// A finished (or aborted) generation.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Output {
    pub id: RequestId,
    pub tokens: Vec<u32>,
    /// `log_softmax(logits / T)` of each output token (T = 1 for greedy).
    pub log_probs: Vec<f32>,
    /// For a request submitted with [`EngineHandle::submit_with_prompt_log_probs`] from position
    /// `s`: the log-prob of each prompt token `s + 1 ..` given the tokens before it, by the same
    /// definition as `log_probs` (its temperature, fp32). Empty otherwise, and for a request
    /// aborted before its prefill.
    pub prompt_log_probs: Vec<f32>,
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt tokens served from cache instead of recomputed.
    pub cached_tokens: usize,
    pub weight_version: u64,
    /// The weight version each of `tokens` was drawn under, where they span several (a partial
    /// output continued after weight updates: [`crate::continuation`]); empty when every token
    /// was drawn under `weight_version`. See [`Output::versions`].
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub token_versions: Vec<u64>,
    /// The seed the tokens were drawn with (given or drawn by the engine).
    pub seed: u64,
}

impl Output {
    /// The weight version of every token, one per token.
    pub fn versions(&self) -> Vec<u64> {
        if self.token_versions.is_empty() {
            vec![self.weight_version; self.tokens.len()]
        } else {
            self.token_versions.clone()
        }
    }
}

/// Streamed to the submitter: each token as it is drawn, then the output.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Token { token: u32, log_prob: f32 },
    Done(Output),
}

/// A request the engine refuses.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    #[error("input_ids is empty")]
    EmptyInput,
    #[error("input_ids has token id {0}, outside the vocabulary of {1}")]
    TokenOutOfVocab(u32, i64),
    #[error("prompt ({prompt} tokens) + max_new_tokens ({max_new}) exceeds the engine's sequence length {limit}: {}", room(*prompt, *limit, "max_new_tokens", 0))]
    TooLong {
        prompt: usize,
        max_new: usize,
        limit: i64,
    },
    #[error("logprob_start_len {start} must be below the prompt length {prompt}")]
    PromptLogProbStart { start: usize, prompt: usize },
    #[error("the engine has stopped")]
    Stopped,
    #[error("weight update failed: {0}")]
    WeightUpdate(String),
}

/// What a prompt of `prompt` tokens leaves for `field` (max_new_tokens, or an API's name for it,
/// whose smallest value is `lowest`) within a sequence of `limit` tokens, as an error message.
pub fn room(prompt: usize, limit: i64, field: &str, lowest: usize) -> String {
    let fits = |p: i64| {
        i64::try_from(lowest)
            .ok()
            .and_then(|l| p.checked_add(l))
            .is_some_and(|n| n <= limit)
    };
    match i64::try_from(prompt) {
        Ok(p) if fits(p) => {
            format!(
                "{field} must be in [{lowest}, {}] for this prompt",
                limit - p
            )
        }
        _ => format!("the prompt leaves no room: at most {limit} tokens in all"),
    }
}

/// What [`EngineHandle::pause`] does with running requests (SGLang's `pause_generation` modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseMode {
    /// Every waiting and running request finishes with `FinishReason::Abort` and its partial output.
    Abort,
    /// Running requests are preempted: their KV blocks are given up (kept as reusable prefixes
    /// while nothing else needs them) and they wait, ahead of new requests, to be recomputed and
    /// continued after [`EngineHandle::resume`]. Their tokens are the ones they would have drawn
    /// uninterrupted: sampling depends only on the seed and the token's position.
    Retract,
    /// Running requests keep their KV blocks and stop between two steps.
    InPlace,
}

/// Live counters.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EngineStats {
    /// Blocks of KV memory in all, and tokens per block.
    pub kv_blocks_total: i64,
    pub kv_block_size: i64,
    /// Blocks a sequence can get: free ones plus those only keeping a prefix (evicted on demand).
    pub kv_blocks_free: i64,
    /// Of those, blocks keeping a prefix for reuse.
    pub kv_blocks_cached: i64,
    pub max_running: i64,
    pub running: usize,
    pub waiting: usize,
    pub weight_version: u64,
    pub paused: bool,
    /// Whether the KV memory is allocated (false after a release, until the next request).
    pub kv_allocated: bool,
    /// Requests preempted so far (each time counts): by a retracting pause, a memory release, or
    /// running out of KV blocks.
    pub preempted: u64,
    /// Decode steps queued while the step before was still in flight (see
    /// [`EngineConfig::overlap_steps`]).
    pub overlapped_steps: u64,
    /// Steady decode steps so far (queued right behind another decode step, so no prefill, wait
    /// or command in their interval), their total seconds from one step's draws to the next's,
    /// the rows they computed and the key positions those rows attended. `ooze bench generate`
    /// puts these against the memory roofline.
    pub decode_steps: u64,
    pub decode_seconds: f64,
    pub decode_rows: u64,
    pub decode_positions: u64,
}

/// The messages an engine worker serves: the embedded engine thread ([`crate::engine`]), or a
/// router over external servers (the `ooze-router` crate), each behind an [`EngineHandle`].
pub enum Command {
    Submit {
        id: RequestId,
        request: Request,
        /// Score the prompt from this position on (see [`Output::prompt_log_probs`]).
        prompt_log_probs_from: Option<usize>,
        events: async_mpsc::UnboundedSender<Event>,
    },
    Abort(RequestId),
    AbortAll,
    Stats(oneshot::Sender<EngineStats>),
    FlushCache(oneshot::Sender<()>),
    ReleaseMemory(oneshot::Sender<usize>),
    Pause(PauseMode),
    Continue,
    Shutdown(oneshot::Sender<()>),
    UpdateWeights {
        source: WeightSource,
        reply: oneshot::Sender<Result<u64, String>>,
    },
}

/// Where weight updates stand, as the requests around them see them (shared by every clone of a
/// handle).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UpdateGate {
    /// Weight updates begun so far ([`EngineHandle::begin_weight_update`]).
    pub updates: u64,
    /// Whether one is in progress: requests that continue partial outputs wait for it to end.
    pub closed: bool,
}

/// Cloneable handle to a running engine. Dropping every handle stops the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::Sender<Command>,
    next_id: Arc<AtomicU64>,
    context_len: i64,
    vocab: i64,
    gate: Arc<watch::Sender<UpdateGate>>,
}

impl EngineHandle {
    /// A handle sending to `commands` (a worker serving [`Command`]s); requests are checked
    /// against the context length and vocabulary.
    pub fn new(commands: mpsc::Sender<Command>, context_len: i64, vocab: i64) -> EngineHandle {
        EngineHandle {
            commands,
            next_id: Arc::new(AtomicU64::new(0)),
            context_len,
            vocab,
            gate: Arc::new(watch::Sender::new(UpdateGate::default())),
        }
    }

    /// Starts a weight update that nothing in flight holds up: the gate closes, and the engine
    /// pauses with every request ending at once with its partial output (finish `Abort`).
    /// Callers that continue partial outputs ([`crate::continuation`]) keep those tokens, wait
    /// for [`EngineHandle::end_weight_update`] and go on under the new weights. Load the weights
    /// in between.
    pub fn begin_weight_update(&self) {
        self.gate.send_modify(|g| {
            g.updates += 1;
            g.closed = true;
        });
        self.pause(PauseMode::Abort);
    }

    /// Ends the update [`EngineHandle::begin_weight_update`] began: the engine resumes and the
    /// gate opens.
    pub fn end_weight_update(&self) {
        self.resume();
        self.gate.send_modify(|g| g.closed = false);
    }

    /// Where weight updates stand now.
    pub fn gate(&self) -> UpdateGate {
        *self.gate.borrow()
    }

    /// Whether a weight update has begun since `gate` was read (a request submitted then may
    /// have been paused by it).
    pub fn updated_since(&self, gate: UpdateGate) -> bool {
        self.gate().updates != gate.updates
    }

    /// Waits while a weight update is in progress; returns the gate once open.
    pub async fn until_open(&self) -> UpdateGate {
        let mut watcher = self.gate.subscribe();
        let gate = *watcher
            .wait_for(|g| !g.closed)
            .await
            .expect("invariant: the handle holds the sender");
        gate
    }

    /// Queues a request; its events arrive on the returned receiver.
    pub fn submit(
        &self,
        request: Request,
    ) -> Result<(RequestId, async_mpsc::UnboundedReceiver<Event>), EngineError> {
        self.send(request, None)
    }

    /// [`EngineHandle::submit`], also scoring the prompt: the output's `prompt_log_probs` hold the
    /// log-probs of prompt tokens `from + 1 ..` (SGLang's `logprob_start_len = from`: the token at
    /// `from` itself has none). With `max_new_tokens` 0 the prompt is only scored. The prompt is
    /// computed from `from` on even where a cached prefix could have been reused.
    pub fn submit_with_prompt_log_probs(
        &self,
        request: Request,
        from: usize,
    ) -> Result<(RequestId, async_mpsc::UnboundedReceiver<Event>), EngineError> {
        let prompt = request.input_ids.len();
        if prompt > 0 && from >= prompt {
            return Err(EngineError::PromptLogProbStart {
                start: from,
                prompt,
            });
        }
        self.send(request, Some(from))
    }

    fn send(
        &self,
        request: Request,
        prompt_log_probs_from: Option<usize>,
    ) -> Result<(RequestId, async_mpsc::UnboundedReceiver<Event>), EngineError> {
        if request.input_ids.is_empty() {
            return Err(EngineError::EmptyInput);
        }
        if let Some(&bad) = request.input_ids.iter().find(|&&t| t as i64 >= self.vocab) {
            return Err(EngineError::TokenOutOfVocab(bad, self.vocab));
        }
        let (prompt, max_new) = (request.input_ids.len(), request.sampling.max_new_tokens);
        // Checked: a `max_new_tokens` near usize::MAX must not wrap past the limit.
        let fits = prompt
            .checked_add(max_new)
            .and_then(|n| i64::try_from(n).ok())
            .is_some_and(|n| n <= self.context_len);
        if !fits {
            return Err(EngineError::TooLong {
                prompt,
                max_new,
                limit: self.context_len,
            });
        }
        let id = RequestId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = async_mpsc::unbounded_channel();
        self.commands
            .send(Command::Submit {
                id,
                request,
                prompt_log_probs_from,
                events: tx,
            })
            .map_err(|_| EngineError::Stopped)?;
        Ok((id, rx))
    }

    /// Submits and waits for the output. A weight update on the way pauses it and it goes on
    /// under the new weights ([`crate::continuation`]); its tokens say which version drew them.
    pub async fn generate(&self, request: Request) -> Result<Output, EngineError> {
        let mut continuation = Continuation::new(request);
        loop {
            let gate = self.until_open().await;
            let (_, mut events) = self.submit(continuation.next_request())?;
            let output = loop {
                match events.recv().await {
                    Some(Event::Done(output)) => break output,
                    Some(Event::Token { .. }) => {}
                    None => return Err(EngineError::Stopped),
                }
            };
            if let Some(done) = continuation.absorb(output, self.updated_since(gate)) {
                return Ok(done);
            }
        }
    }

    /// Aborts one request: it finishes with `FinishReason::Abort` and its partial output.
    pub fn abort(&self, id: RequestId) {
        let _ = self.commands.send(Command::Abort(id));
    }

    /// Aborts every waiting and running request.
    pub fn abort_all(&self) {
        let _ = self.commands.send(Command::AbortAll);
    }

    /// Forgets every kept prefix (their blocks become free).
    pub async fn flush_cache(&self) -> Result<(), EngineError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Command::FlushCache(tx))
            .map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)
    }

    /// Replaces the weights with tensors from this process (a colocated trainer's parameters,
    /// named as in the HF state dict); returns the new weight version.
    pub async fn update_weights_from_tensors(
        &self,
        tensors: Vec<(String, Tensor)>,
    ) -> Result<u64, EngineError> {
        self.update_weights(WeightSource::Tensors(tensors)).await
    }

    /// Tells the engine that its parameters were changed in place by a colocated trainer sharing
    /// them ([`ooze_model::Decoder::share`]): no copy; kept prefixes are dropped (their KV belongs to
    /// the old weights) and the weight version advances, which it returns. Call it between
    /// rollouts, while no request runs.
    pub async fn weights_updated_in_place(&self) -> Result<u64, EngineError> {
        self.update_weights(WeightSource::InPlace).await
    }

    /// Frees the KV memory so that a trainer in the same process can use it. Running requests are
    /// preempted first (as by [`PauseMode::Retract`]) and recomputed when they run again; returns
    /// how many were. The memory is allocated again when a request next needs it, so pause the
    /// engine first to keep it free while training.
    pub async fn release_memory(&self) -> Result<usize, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Command::ReleaseMemory(tx))
            .map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)
    }

    /// Stops scheduling until [`EngineHandle::resume`]; `mode` says what happens to the requests
    /// running now. Requests submitted meanwhile wait.
    pub fn pause(&self, mode: PauseMode) {
        let _ = self.commands.send(Command::Pause(mode));
    }

    pub fn resume(&self) {
        let _ = self.commands.send(Command::Continue);
    }

    /// Loads new weights from an HF model directory between two steps; returns the new weight
    /// version. Requests in flight continue under the new weights.
    pub async fn update_weights_from_disk(&self, dir: PathBuf) -> Result<u64, EngineError> {
        self.update_weights(WeightSource::Dir(dir)).await
    }

    /// Sends a weight update and waits for the new version.
    pub async fn update_weights(&self, source: WeightSource) -> Result<u64, EngineError> {
        let (reply, rx) = oneshot::channel();
        self.commands
            .send(Command::UpdateWeights { source, reply })
            .map_err(|_| EngineError::Stopped)?;
        rx.await
            .map_err(|_| EngineError::Stopped)?
            .map_err(EngineError::WeightUpdate)
    }

    /// Stops the engine: requests in flight end as aborted, the CUDA graphs and KV memory are
    /// freed, and the engine thread exits before this returns (so a process can end cleanly right
    /// after). Later calls on any handle get [`EngineError::Stopped`].
    pub async fn shutdown(&self) {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(Command::Shutdown(tx)).is_ok() {
            let _ = rx.await;
        }
    }

    pub async fn stats(&self) -> Result<EngineStats, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Command::Stats(tx))
            .map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)
    }
}

/// Where new weights come from.
pub enum WeightSource {
    Dir(PathBuf),
    Tensors(Vec<(String, Tensor)>),
    /// The engine's parameters were written in place by their other owner (a colocated trainer
    /// holding a [`ooze_model::Decoder::share`] of them): nothing to copy.
    InPlace,
}
