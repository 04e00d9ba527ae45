//! The engine thread: it owns the model and the paged KV memory and runs continuous batching;
//! callers talk to it through a cloneable [`EngineHandle`] ([`crate::handle`]) over channels
//! (async-friendly, no locks held across the model).
//!
//! Each loop iteration: take new commands (submit, abort); admit waiting requests while blocks
//! and batch rows allow ([`crate::admit`]), prefilling each and drawing its first token; then one
//! decode step for every running request together. Requests join and leave between steps. A
//! request longer than the context length (prompt + max_new_tokens) is refused at submission.
//!
//! KV memory is blocks ([`crate::kv_blocks`]): a sequence holds the blocks its length needs, so
//! memory follows actual lengths, and a new request shares the blocks the prefix tree keeps of
//! its tokens (another sample's prompt, an agent's earlier turn).
//!
//! Preemption: a retracting pause, a memory release, or running out of blocks for the next
//! decode step (the most recently admitted requests go first) takes running requests out of
//! memory and puts them back at the head of the queue with what they have drawn so far; when
//! admitted again they prefill prompt + output (from the kept prefix where it survived) and go on
//! drawing at the step they had reached.
//!
//! A request with `max_new_tokens` 0 is prefilled and finishes there, drawing nothing. One
//! submitted with prompt log-probs has them computed in its prefill pass from the same hidden
//! states ([`crate::prompt_scores`]); its prompt is then computed from the requested start even
//! where a longer cached prefix exists.

use crate::decode_graph::DecodeGraphs;
use crate::decode_step::{DecodeClock, InFlight};
use crate::handle::{
    Command, EngineConfig, EngineHandle, EngineStats, Event, Output, PauseMode, Request, RequestId,
    WeightSource,
};
use crate::kv_blocks::KvBlocks;
use crate::params::Sampling;
use crate::waiting::{Progress, Waiting};
use ooze_core::FinishReason;
use ooze_model::{Decoder, PagedKv, Tokenizer};
use ooze_torch::tch;
use std::collections::VecDeque;
use std::sync::{mpsc, Arc};
use tokio::sync::{mpsc as async_mpsc, oneshot};

pub(crate) struct Running {
    pub(crate) id: RequestId,
    pub(crate) events: async_mpsc::UnboundedSender<Event>,
    pub(crate) sampling: Sampling,
    pub(crate) seed: u64,
    /// The KV blocks holding this sequence, in position order.
    pub(crate) table: Vec<i64>,
    /// The KV memory's flush count when the request started: keys/values from before a flush
    /// are not kept for later requests.
    pub(crate) epoch: u64,
    /// Admission order: when blocks run out, the latest admitted are preempted first.
    pub(crate) admitted: u64,
    pub(crate) input_ids: Vec<u32>,
    pub(crate) prompt_len: usize,
    /// Prompt tokens whose keys/values were reused instead of computed.
    pub(crate) reused: usize,
    /// Tokens whose keys/values are in the blocks.
    pub(crate) cached: i64,
    pub(crate) output: Vec<u32>,
    pub(crate) log_probs: Vec<f32>,
    pub(crate) prompt_log_probs: Vec<f32>,
    /// Draws queued on the device whose tokens the host has not taken yet
    /// ([`crate::decode_step`]): the next token's input is then on the device.
    pub(crate) pending: u8,
}

impl Running {
    /// The tokens whose keys/values the blocks hold.
    pub(crate) fn held_tokens(&self) -> Vec<u32> {
        let in_memory = (self.cached as usize).saturating_sub(self.prompt_len);
        [&self.input_ids[..], &self.output[..in_memory]].concat()
    }
}

/// The engine thread's state.
pub(crate) struct EngineLoop {
    pub(crate) decoder: Decoder,
    pub(crate) tokenizer: Option<Arc<Tokenizer>>,
    pub(crate) config: EngineConfig,
    /// `None` while released (see [`EngineHandle::release_memory`]); allocated again on demand.
    pub(crate) cache: Option<PagedKv>,
    /// Which blocks each sequence uses, and the kept prefixes.
    pub(crate) kv: KvBlocks,
    pub(crate) waiting: VecDeque<Waiting>,
    pub(crate) running: Vec<Running>,
    weight_version: u64,
    pub(crate) seed_counter: u64,
    pub(crate) admissions: u64,
    paused: bool,
    preempted: u64,
    /// Whether decode steps are queued ahead ([`EngineConfig::overlap_steps`], resolved for the
    /// device), and how many were.
    pub(crate) overlap: bool,
    pub(crate) overlapped_steps: u64,
    /// Captured decode steps (GPU only; `None` on CPU, when turned off, or after a capture failed).
    pub(crate) graphs: Option<DecodeGraphs>,
    /// The decode step queued on the device whose draws are not handled yet.
    pub(crate) in_flight: Option<InFlight>,
    /// Steady decode steps: how many, and their time.
    pub(crate) decode_clock: DecodeClock,
    /// Events drawn but not yet sent. A decode step sends them once the next forward pass is
    /// launched, so waking the callers overlaps with the GPU instead of delaying it.
    pub(crate) outbox: Vec<(async_mpsc::UnboundedSender<Event>, Event)>,
}

/// Starts an engine on its own thread. `tokenizer` is needed for stop strings.
pub fn start(
    decoder: Decoder,
    tokenizer: Option<Arc<Tokenizer>>,
    config: EngineConfig,
) -> EngineHandle {
    let (tx, rx) = mpsc::channel();
    let mut cache = None;
    kv_memory(&mut cache, &decoder, &config);
    let handle = EngineHandle::new(tx, config.context_len, decoder.config.vocab_size);
    let graphs = if config.cuda_graphs {
        DecodeGraphs::new(decoder.device(), config.max_running, config.context_len)
    } else {
        None
    };
    let weight_version = config.initial_weight_version;
    let overlap = config.overlap_steps.unwrap_or(decoder.device().is_cuda());
    let state = EngineLoop {
        decoder,
        tokenizer,
        kv: KvBlocks::new(config.kv_blocks(), config.kv_block_size),
        config,
        cache,
        waiting: VecDeque::new(),
        running: Vec::new(),
        weight_version,
        seed_counter: 0,
        admissions: 0,
        paused: false,
        preempted: 0,
        overlap,
        overlapped_steps: 0,
        graphs,
        in_flight: None,
        decode_clock: DecodeClock::default(),
        outbox: Vec::new(),
    };
    std::thread::Builder::new()
        .name("ooze-engine".into())
        .spawn(move || state.run(rx))
        .expect("invariant: the OS can start a thread");
    handle
}

impl EngineLoop {
    fn run(mut self, commands: mpsc::Receiver<Command>) {
        let _guard = tch::no_grad_guard();
        if let Some(graphs) = self.graphs.as_mut() {
            let cache = kv_memory(&mut self.cache, &self.decoder, &self.config);
            if let Err(err) = graphs.capture_common(&self.decoder, cache) {
                eprintln!("ooze-engine: CUDA graphs turned off: {err}");
                self.graphs = None;
            }
        }
        loop {
            if self.paused || (self.running.is_empty() && self.waiting.is_empty()) {
                // Nothing to queue: finish the step in flight before waiting for a command.
                self.drain();
                self.decode_clock.interrupt();
                self.send_outbox();
                match commands.recv() {
                    Ok(Command::Shutdown(reply)) => return self.shut_down(reply),
                    Ok(command) => self.handle(command),
                    Err(_) => return,
                }
            }
            loop {
                match commands.try_recv() {
                    Ok(Command::Shutdown(reply)) => return self.shut_down(reply),
                    Ok(command) => self.handle(command),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        self.abort_everything();
                        self.send_outbox();
                        return;
                    }
                }
            }
            if !self.paused {
                self.admit();
                self.decode_step();
            }
            if self.running.is_empty() || self.paused {
                self.send_outbox();
            }
        }
    }

    /// Ends everything in flight, frees the GPU state while the driver is certainly up, then
    /// answers.
    fn shut_down(mut self, reply: oneshot::Sender<()>) {
        self.abort_everything();
        self.send_outbox();
        self.graphs = None;
        self.cache = None;
        if let ooze_torch::tch::Device::Cuda(i) = self.decoder.device() {
            ooze_torch::cuda_graph::synchronize(i);
        }
        let _ = reply.send(());
    }

    pub(crate) fn send_outbox(&mut self) {
        for (events, event) in self.outbox.drain(..) {
            let _ = events.send(event);
        }
    }

    fn handle(&mut self, command: Command) {
        // Submitting, aborting and asking for stats work beside a step in flight; everything
        // else changes what it computes with, so it waits for its draws first.
        if !matches!(
            command,
            Command::Submit { .. } | Command::Abort(_) | Command::Stats(_)
        ) {
            self.drain();
            self.decode_clock.interrupt();
        }
        match command {
            Command::Submit {
                id,
                request,
                prompt_log_probs_from,
                events,
            } => self.waiting.push_back(Waiting {
                id,
                request,
                prompt_log_probs_from,
                events,
                progress: None,
            }),
            Command::Abort(id) => {
                if let Some(pos) = self.waiting.iter().position(|w| w.id == id) {
                    let w = self
                        .waiting
                        .remove(pos)
                        .expect("invariant: position is valid");
                    self.finish_waiting(w, FinishReason::Abort);
                } else if let Some(pos) = self.running.iter().position(|r| r.id == id) {
                    let r = self.running.swap_remove(pos);
                    self.finish(r, FinishReason::Abort);
                }
            }
            Command::AbortAll => self.abort_everything(),
            Command::Stats(reply) => {
                let _ = reply.send(EngineStats {
                    kv_blocks_total: self.kv.total() as i64,
                    kv_block_size: self.kv.block_size() as i64,
                    kv_blocks_free: self.kv.available() as i64,
                    kv_blocks_cached: self.kv.cached() as i64,
                    max_running: self.config.max_running,
                    running: self.running.len(),
                    waiting: self.waiting.len(),
                    weight_version: self.weight_version,
                    paused: self.paused,
                    kv_allocated: self.cache.is_some(),
                    preempted: self.preempted,
                    overlapped_steps: self.overlapped_steps,
                    decode_steps: self.decode_clock.steps,
                    decode_seconds: self.decode_clock.seconds,
                    decode_rows: self.decode_clock.rows,
                    decode_positions: self.decode_clock.positions,
                });
            }
            Command::FlushCache(reply) => {
                self.flush_prefixes();
                let _ = reply.send(());
            }
            Command::Pause(mode) => {
                match mode {
                    PauseMode::Abort => self.abort_everything(),
                    PauseMode::Retract => {
                        self.retract_all();
                    }
                    PauseMode::InPlace => {}
                }
                self.paused = true;
            }
            Command::Continue => self.paused = false,
            Command::Shutdown(_) => unreachable!("the run loop handles shutdown"),
            Command::ReleaseMemory(reply) => {
                let preempted = self.retract_all();
                self.flush_prefixes();
                self.cache = None;
                if let Some(graphs) = self.graphs.as_mut() {
                    graphs.clear();
                }
                let _ = reply.send(preempted);
            }
            Command::UpdateWeights { source, reply } => {
                let device = self.decoder.device();
                let kind = self.decoder.kind();
                let result = match source {
                    WeightSource::Dir(dir) => {
                        ooze_model::checkpoint::WeightSet::load(&dir, device, kind)
                            .and_then(|w| self.decoder.update_weights(w))
                    }
                    WeightSource::Tensors(tensors) => {
                        ooze_model::checkpoint::WeightSet::from_tensors(tensors, device, kind)
                            .and_then(|w| self.decoder.update_weights(w))
                    }
                    WeightSource::InPlace => Ok(()),
                };
                let result = result
                    .map(|()| {
                        self.flush_prefixes();
                        self.weight_version += 1;
                        self.weight_version
                    })
                    .map_err(|e| ooze_core::error_chain(&e));
                let _ = reply.send(result);
            }
        }
    }

    /// Forgets every kept prefix (after a weight update, or on request).
    fn flush_prefixes(&mut self) {
        self.kv.flush();
    }

    fn abort_everything(&mut self) {
        self.drain();
        while let Some(w) = self.waiting.pop_front() {
            self.finish_waiting(w, FinishReason::Abort);
        }
        while let Some(r) = self.running.pop() {
            self.finish(r, FinishReason::Abort);
        }
    }

    /// Ends a request that holds no KV blocks (never started, or preempted) with what it has.
    fn finish_waiting(&mut self, w: Waiting, finish: FinishReason) {
        let progress = w.progress.unwrap_or(Progress {
            seed: w.request.sampling.seed.unwrap_or(0),
            output: Vec::new(),
            log_probs: Vec::new(),
            prompt_log_probs: Vec::new(),
            reused: 0,
        });
        let output = Output {
            id: w.id,
            tokens: progress.output,
            log_probs: progress.log_probs,
            prompt_log_probs: progress.prompt_log_probs,
            finish,
            prompt_tokens: w.request.input_ids.len(),
            cached_tokens: progress.reused,
            weight_version: self.weight_version,
            token_versions: Vec::new(),
            seed: progress.seed,
        };
        self.outbox.push((w.events, Event::Done(output)));
    }

    /// Preempts every running request (see [`EngineLoop::preempt`]), keeping their order at the
    /// head of the queue. Returns how many were preempted.
    fn retract_all(&mut self) -> usize {
        self.drain();
        let n = self.running.len();
        self.running.sort_by_key(|r| r.admitted);
        while let Some(r) = self.running.pop() {
            self.preempt(r);
        }
        n
    }

    /// Takes a running request out of memory (nothing of it may be in flight): its blocks are kept as a prefix (so that it goes on
    /// from there when nothing evicted them meanwhile) and it waits at the head of the queue with
    /// its output so far.
    pub(crate) fn preempt(&mut self, mut r: Running) {
        self.release_blocks(&mut r);
        self.waiting.push_front(Waiting {
            id: r.id,
            request: Request {
                input_ids: r.input_ids,
                sampling: r.sampling,
                session: None,
            },
            prompt_log_probs_from: None,
            events: r.events,
            progress: Some(Progress {
                seed: r.seed,
                output: r.output,
                log_probs: r.log_probs,
                prompt_log_probs: r.prompt_log_probs,
                reused: r.reused,
            }),
        });
        self.preempted += 1;
    }

    /// Gives a request's blocks back, the prefix tree keeping what they hold for later requests
    /// that start the same way.
    fn release_blocks(&mut self, r: &mut Running) {
        let table = std::mem::take(&mut r.table);
        self.kv.release(table, &r.held_tokens(), r.epoch);
    }

    pub(crate) fn finish(&mut self, mut r: Running, finish: FinishReason) {
        self.release_blocks(&mut r);
        let output = Output {
            id: r.id,
            tokens: r.output,
            log_probs: r.log_probs,
            prompt_log_probs: r.prompt_log_probs,
            finish,
            prompt_tokens: r.prompt_len,
            cached_tokens: r.reused,
            weight_version: self.weight_version,
            token_versions: Vec::new(),
            seed: r.seed,
        };
        self.outbox.push((r.events, Event::Done(output)));
    }
}

/// The KV memory, allocated again if it was released.
pub(crate) fn kv_memory<'a>(
    cache: &'a mut Option<PagedKv>,
    decoder: &Decoder,
    config: &EngineConfig,
) -> &'a mut PagedKv {
    cache.get_or_insert_with(|| {
        PagedKv::new(
            &decoder.config,
            config.kv_blocks(),
            config.kv_block_size,
            decoder.device(),
            decoder.kind(),
        )
    })
}
