//! The engine thread: it owns the model and the KV slots and runs continuous batching; callers
//! talk to it through a cloneable [`EngineHandle`] ([`crate::handle`]) over channels (async-friendly,
//! no locks held across the model).
//!
//! Each loop iteration: take new commands (submit, abort); admit waiting requests while a slot is
//! free, prefilling each and drawing its first token; then one decode step for every running
//! request together. Requests join and leave between steps. A request that cannot fit a slot
//! (prompt + max_new_tokens > slot length) is refused at submission; one that finds no free slot
//! waits — admission control, so memory never runs out.
//!
//! Preemption: a retracting pause or a memory release takes running requests out of their slots
//! and puts them back at the head of the queue with what they have drawn so far; when admitted
//! again they prefill prompt + output (from the kept prefix where it survived) and go on drawing
//! at the step they had reached.
//!
//! A request with `max_new_tokens` 0 is prefilled and finishes there, drawing nothing. One
//! submitted with prompt log-probs has them computed in its prefill pass from the same hidden
//! states ([`crate::prompt_scores`]); its prompt is then computed from the requested start even
//! where a longer cached prefix exists.

use crate::decode_graph::DecodeGraphs;
use crate::handle::{
    Command, EngineConfig, EngineHandle, EngineStats, Event, Output, PauseMode, Request, RequestId,
    WeightSource,
};
use crate::params::Sampling;
use crate::prefix_cache::{common_prefix, PrefixCache};
use crate::prompt_scores;
use crate::sampler::{draw, RowSampling};
use crate::waiting::{Planned, Progress, Reuse, Waiting};
use ooze_core::{FinishReason, StopMatch};
use ooze_model::{Attention, Decoder, SlotCache, Tokenizer};
use ooze_torch::tch::{self, Tensor};
use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::{mpsc, Arc};
use tokio::sync::{mpsc as async_mpsc, oneshot};

struct Running {
    id: RequestId,
    events: async_mpsc::UnboundedSender<Event>,
    sampling: Sampling,
    seed: u64,
    slot: i64,
    input_ids: Vec<u32>,
    prompt_len: usize,
    /// Prompt tokens whose keys/values were reused instead of computed.
    reused: usize,
    /// Tokens whose keys/values are in the slot.
    cached: i64,
    output: Vec<u32>,
    log_probs: Vec<f32>,
    prompt_log_probs: Vec<f32>,
}

/// Token budget of one prefill pass (rows × longest new prompt, padding included).
const PREFILL_TOKENS: i64 = 16_384;

/// The engine thread's state.
struct EngineLoop {
    decoder: Decoder,
    tokenizer: Option<Arc<Tokenizer>>,
    config: EngineConfig,
    /// `None` while released (see [`EngineHandle::release_memory`]); allocated again on demand.
    cache: Option<SlotCache>,
    /// Lowest slot first, so running requests stay packed into a consecutive run of slots (read
    /// as one view instead of gathered).
    free_slots: BinaryHeap<Reverse<i64>>,
    waiting: VecDeque<Waiting>,
    running: Vec<Running>,
    weight_version: u64,
    seed_counter: u64,
    paused: bool,
    preempted: u64,
    prefix_cache: PrefixCache,
    /// Captured decode steps (GPU only; `None` on CPU, when turned off, or after a capture failed).
    graphs: Option<DecodeGraphs>,
    /// Events drawn but not yet sent. A decode step sends them once the next forward pass is
    /// launched, so waking the callers overlaps with the GPU instead of delaying it.
    outbox: Vec<(async_mpsc::UnboundedSender<Event>, Event)>,
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
    let handle = EngineHandle::new(tx, config.slot_len, decoder.config.vocab_size);
    // Slot `slots` (one past the last) is the scratch slot padded graph rows write into.
    let graphs = if config.cuda_graphs {
        DecodeGraphs::new(decoder.device(), config.slots, config.slots)
    } else {
        None
    };
    let weight_version = config.initial_weight_version;
    let state = EngineLoop {
        decoder,
        tokenizer,
        free_slots: (0..config.slots).map(Reverse).collect(),
        config,
        cache,
        waiting: VecDeque::new(),
        running: Vec::new(),
        weight_version,
        seed_counter: 0,
        paused: false,
        preempted: 0,
        prefix_cache: PrefixCache::default(),
        graphs,
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

    fn send_outbox(&mut self) {
        for (events, event) in self.outbox.drain(..) {
            let _ = events.send(event);
        }
    }

    fn handle(&mut self, command: Command) {
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
                    free_slots: (self.free_slots.len() + self.prefix_cache.len()) as i64,
                    cached_slots: self.prefix_cache.len() as i64,
                    total_slots: self.config.slots,
                    running: self.running.len(),
                    waiting: self.waiting.len(),
                    weight_version: self.weight_version,
                    paused: self.paused,
                    kv_allocated: self.cache.is_some(),
                    preempted: self.preempted,
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

    /// Forgets every kept sequence (after a weight update, or on request).
    fn flush_prefixes(&mut self) {
        for slot in self.prefix_cache.clear() {
            self.free_slots.push(Reverse(slot));
        }
    }

    fn abort_everything(&mut self) {
        while let Some(w) = self.waiting.pop_front() {
            self.finish_waiting(w, FinishReason::Abort);
        }
        while let Some(r) = self.running.pop() {
            self.finish(r, FinishReason::Abort);
        }
    }

    /// Ends a request that holds no slot (never started, or preempted) with what it has.
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
            seed: progress.seed,
        };
        self.outbox.push((w.events, Event::Done(output)));
    }

    /// Preempts every running request: each gives up its slot (left as a kept prefix, so that it
    /// can continue in place if nothing takes the slot meanwhile) and waits at the head of the
    /// queue, in its running order, with its output so far. Returns how many were preempted.
    fn retract_all(&mut self) -> usize {
        let n = self.running.len();
        self.running.sort_by_key(|r| r.slot);
        while let Some(r) = self.running.pop() {
            self.keep_prefix(&r);
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
        }
        self.preempted += n as u64;
        n
    }

    /// Leaves a request's slot keeping what it holds, for a later request that starts the same way.
    fn keep_prefix(&mut self, r: &Running) {
        let in_slot = (r.cached as usize).saturating_sub(r.prompt_len);
        let mut kept = r.input_ids.clone();
        kept.extend_from_slice(&r.output[..in_slot]);
        self.prefix_cache.retain(r.slot, kept);
    }

    fn finish(&mut self, r: Running, finish: FinishReason) {
        self.keep_prefix(&r);
        let output = Output {
            id: r.id,
            tokens: r.output,
            log_probs: r.log_probs,
            prompt_log_probs: r.prompt_log_probs,
            finish,
            prompt_tokens: r.prompt_len,
            cached_tokens: r.reused,
            weight_version: self.weight_version,
            seed: r.seed,
        };
        self.outbox.push((r.events, Event::Done(output)));
    }

    /// Prefills waiting requests into free slots and draws their first tokens, several requests per
    /// forward pass. A request that shares a prefix with a running or kept sequence starts after
    /// it: in the kept sequence's own slot when that is free to take, otherwise in a new slot with
    /// the prefix copied over.
    fn admit(&mut self) {
        loop {
            let batch = self.plan_prefill();
            if batch.is_empty() {
                return;
            }
            self.prefill(batch);
            // First tokens go out at once: the next prefill pass may take a while.
            self.send_outbox();
        }
    }

    /// Takes waiting requests for one prefill pass, giving each a slot and its reusable prefix. Stops
    /// at the token budget, when slots run out, or before a request that shares a prefix with one
    /// already planned (it reuses that one's keys/values in the next pass instead).
    fn plan_prefill(&mut self) -> Vec<Planned> {
        let mut planned: Vec<Planned> = Vec::new();
        let (mut rows, mut longest) = (0i64, 0i64);
        while let Some(front) = self.waiting.front() {
            if front.events.is_closed() {
                self.waiting.pop_front();
                continue;
            }
            if self.free_slots.is_empty() && self.prefix_cache.is_empty() {
                break;
            }
            let sequence = front.sequence();
            let prompt: &[u32] = &sequence;
            let min = self.config.min_prefix_reuse;
            if planned
                .iter()
                .any(|p| common_prefix(&p.waiting.sequence(), prompt) >= min)
            {
                break;
            }
            // At least the last prompt token is computed: its logits start the output. Scored
            // prompt positions are computed too.
            let scored_from = match (&front.progress, front.prompt_log_probs_from) {
                (None, Some(from)) => from,
                _ => usize::MAX,
            };
            let usable = |n: usize| n.min(prompt.len() - 1).min(scored_from);
            let from_running = self
                .running
                .iter()
                .map(|r| {
                    let in_slot = r.cached as usize - r.prompt_len;
                    let n = common_prefix(&r.input_ids, prompt);
                    let n = if n == r.prompt_len {
                        n + common_prefix(&r.output[..in_slot], &prompt[n..])
                    } else {
                        n
                    };
                    (r.slot, usable(n))
                })
                .max_by_key(|&(_, n)| n);
            let from_kept = self
                .prefix_cache
                .best_match(prompt)
                .map(|(slot, n)| (slot, usable(n)));
            let reuse = match (from_kept, from_running) {
                // Continue in the kept slot itself: nothing to copy.
                (Some((slot, len)), other) if len >= min && len >= other.map_or(0, |o| o.1) => {
                    Reuse::InPlace { slot, len }
                }
                (_, Some((from, len))) if len >= min => Reuse::Copy { from, len },
                _ => Reuse::Nothing,
            };
            let reused = reuse.len();
            let new_tokens = (prompt.len() - reused) as i64;
            drop(sequence);
            let (next_rows, next_longest) = (rows + 1, longest.max(new_tokens));
            if !planned.is_empty() && next_rows * next_longest > PREFILL_TOKENS {
                break;
            }
            let slot = match reuse {
                Reuse::InPlace { slot, .. } => {
                    self.prefix_cache.take(slot);
                    slot
                }
                Reuse::Copy { from, len } => {
                    let Some(slot) = self.take_slot(Some(from)) else {
                        break;
                    };
                    self.cache
                        .as_mut()
                        .expect("invariant: a running request implies allocated memory")
                        .copy_prefix(from, slot, len as i64);
                    slot
                }
                Reuse::Nothing => match self.take_slot(None) {
                    Some(slot) => slot,
                    None => break,
                },
            };
            let waiting = self.waiting.pop_front().expect("invariant: front exists");
            let seed = match (&waiting.progress, waiting.request.sampling.seed) {
                (Some(progress), _) => progress.seed,
                (None, Some(seed)) => seed,
                (None, None) => {
                    self.seed_counter += 1;
                    crate::sampler::uniform(0x00e0_0ae0, self.seed_counter).to_bits()
                }
            };
            (rows, longest) = (next_rows, next_longest);
            planned.push(Planned {
                waiting,
                slot,
                reused,
                seed,
            });
        }
        planned
    }

    /// One forward pass over the planned prompts (right-padded to the longest), then each one's
    /// first token.
    fn prefill(&mut self, planned: Vec<Planned>) {
        let sequences: Vec<Cow<'_, [u32]>> = planned.iter().map(|p| p.waiting.sequence()).collect();
        let width = planned
            .iter()
            .zip(&sequences)
            .map(|(p, s)| s.len() - p.reused)
            .max()
            .expect("invariant: non-empty plan");
        let mut ids = Vec::with_capacity(planned.len() * width);
        let mut positions = Vec::with_capacity(planned.len() * width);
        let mut last = Vec::with_capacity(planned.len());
        for (p, sequence) in planned.iter().zip(&sequences) {
            let new = &sequence[p.reused..];
            ids.extend(new.iter().map(|&t| t as i64));
            ids.extend(std::iter::repeat_n(0, width - new.len()));
            positions.extend((0..width).map(|i| (p.reused + i) as i64));
            last.push((new.len() - 1) as i64);
        }
        let cached: Vec<i64> = sequences.iter().map(|s| s.len() as i64).collect();
        drop(sequences);
        let slots: Vec<i64> = planned.iter().map(|p| p.slot).collect();
        let past: Vec<i64> = planned.iter().map(|p| p.reused as i64).collect();
        let hidden = self.slot_hidden(&ids, &positions, width as i64, &slots, &past);
        let logits = self.last_logits(&hidden, &last);
        let first = self.running.len();
        // Rows of `logits` whose request draws a token now.
        let mut drawing = Vec::with_capacity(planned.len());
        for (b, (p, cached)) in planned.into_iter().zip(cached).enumerate() {
            let prompt_len = p.waiting.request.input_ids.len();
            let (output, log_probs, prompt_log_probs, reused) = match p.waiting.progress {
                Some(progress) => (
                    progress.output,
                    progress.log_probs,
                    progress.prompt_log_probs,
                    progress.reused,
                ),
                None => {
                    let scores = p.waiting.prompt_log_probs_from.map(|from| {
                        prompt_scores::prompt_log_probs(
                            &self.decoder,
                            &hidden.get(b as i64),
                            p.reused,
                            from,
                            &p.waiting.request.input_ids,
                            p.waiting.request.sampling.log_prob_temperature(),
                        )
                    });
                    (Vec::new(), Vec::new(), scores.unwrap_or_default(), p.reused)
                }
            };
            let r = Running {
                id: p.waiting.id,
                events: p.waiting.events,
                sampling: p.waiting.request.sampling,
                seed: p.seed,
                slot: p.slot,
                input_ids: p.waiting.request.input_ids,
                prompt_len,
                reused,
                cached,
                output,
                log_probs,
                prompt_log_probs,
            };
            if r.output.len() >= r.sampling.max_new_tokens {
                // max_new_tokens 0: prefilled (and scored), nothing to draw.
                self.finish(r, FinishReason::Length);
            } else {
                self.running.push(r);
                drawing.push(b as i64);
            }
        }
        if drawing.is_empty() {
            return;
        }
        let logits = if drawing.len() == slots.len() {
            logits
        } else {
            logits.index_select(0, &Tensor::from_slice(&drawing).to_device(logits.device()))
        };
        let rows: Vec<usize> = (first..self.running.len()).collect();
        self.draw_and_check(&logits, &rows);
    }

    /// An eager forward over slot rows: `ids` and `positions` are `[B, width]`, row-major, on the
    /// host; row `b` goes into slot `slots[b]` after `past[b]` tokens. Returns the hidden states
    /// `[B, width, hidden]` (prefill and, without CUDA graphs, decode).
    fn slot_hidden(
        &mut self,
        ids: &[i64],
        positions: &[i64],
        width: i64,
        slots: &[i64],
        past: &[i64],
    ) -> Tensor {
        let device = self.decoder.device();
        let b = slots.len() as i64;
        let tokens = Tensor::from_slice(ids).view([b, width]).to_device(device);
        let positions = Tensor::from_slice(positions)
            .view([b, width])
            .to_device(device);
        let cache = kv_memory(&mut self.cache, &self.decoder, &self.config);
        self.decoder
            .hidden_states(&tokens, &positions, Attention::Slots { cache, slots, past })
    }

    /// fp32 logits `[B, vocab]` at each row's position `last[b]` of `hidden [B, width, hidden]`.
    fn last_logits(&self, hidden: &Tensor, last: &[i64]) -> Tensor {
        let (b, h) = (hidden.size()[0], hidden.size()[2]);
        let index = Tensor::from_slice(last)
            .to_device(hidden.device())
            .view([b, 1, 1])
            .expand([b, 1, h], false);
        self.decoder
            .logits_f32(&hidden.gather(1, &index, false).squeeze_dim(1))
    }

    /// A free slot, evicting the least recently used kept sequence (other than `keep`) if needed.
    fn take_slot(&mut self, keep: Option<i64>) -> Option<i64> {
        match self.free_slots.pop() {
            Some(Reverse(slot)) => Some(slot),
            None => self.prefix_cache.evict(keep),
        }
    }

    /// One decode step for every running request.
    fn decode_step(&mut self) {
        if self.running.is_empty() {
            return;
        }
        // Slot order: consecutive slots are read as one view.
        self.running.sort_by_key(|r| r.slot);
        let profile = self.config.profile_steps;
        let t0 = std::time::Instant::now();
        let last: Vec<i64> = self
            .running
            .iter()
            .map(|r| {
                *r.output
                    .last()
                    .expect("invariant: running requests have a token") as i64
            })
            .collect();
        let slots: Vec<i64> = self.running.iter().map(|r| r.slot).collect();
        let past: Vec<i64> = self.running.iter().map(|r| r.cached).collect();
        let cache = kv_memory(&mut self.cache, &self.decoder, &self.config);
        let graphed = match self.graphs.as_mut() {
            Some(graphs) => match graphs.step(&self.decoder, cache, &last, &slots, &past) {
                Ok(logits) => Some(logits),
                Err(err) => {
                    eprintln!("ooze-engine: CUDA graphs turned off: {err}");
                    self.graphs = None;
                    None
                }
            },
            None => None,
        };
        let logits = match graphed {
            Some(logits) => logits,
            None => {
                let hidden = self.slot_hidden(&last, &past, 1, &slots, &past);
                self.last_logits(&hidden, &vec![0; slots.len()])
            }
        };
        // The forward pass is queued on the GPU: deliver the previous step's tokens meanwhile.
        self.send_outbox();
        if let (true, ooze_torch::tch::Device::Cuda(i)) = (profile, self.decoder.device()) {
            ooze_torch::cuda_graph::synchronize(i);
        }
        let t1 = std::time::Instant::now();
        for r in &mut self.running {
            r.cached += 1;
        }
        let rows: Vec<usize> = (0..self.running.len()).collect();
        self.draw_and_check(&logits, &rows);
        if profile {
            eprintln!(
                "engine step: batch {} forward {:.2} ms ({}), sample+host {:.2} ms",
                slots.len(),
                (t1 - t0).as_secs_f64() * 1e3,
                if self.graphs.is_some() {
                    "graph"
                } else {
                    "eager"
                },
                t1.elapsed().as_secs_f64() * 1e3
            );
        }
    }

    /// Draws one token for each listed running request (row `i` of `logits` belongs to `rows[i]`),
    /// streams it, and finishes the requests that stop.
    fn draw_and_check(&mut self, logits: &Tensor, rows: &[usize]) {
        let banned: Vec<Vec<u32>> = rows
            .iter()
            .map(|&i| {
                let r = &self.running[i];
                if r.output.len() >= r.sampling.min_new_tokens {
                    return Vec::new();
                }
                let mut b = r.sampling.stop_token_ids.clone();
                if !r.sampling.ignore_eos {
                    b.extend(&self.config.eos_token_ids);
                }
                b
            })
            .collect();
        let specs: Vec<RowSampling<'_>> = rows
            .iter()
            .zip(&banned)
            .map(|(&i, banned)| {
                let r = &self.running[i];
                RowSampling {
                    params: &r.sampling,
                    seed: r.seed,
                    step: r.output.len() as u64,
                    banned,
                }
            })
            .collect();
        let draws = draw(logits, &specs);
        let mut done = Vec::new();
        for (&i, d) in rows.iter().zip(draws) {
            let r = &mut self.running[i];
            r.output.push(d.token);
            r.log_probs.push(d.log_prob);
            if r.events.is_closed() {
                done.push((i, FinishReason::Abort));
                continue;
            }
            self.outbox.push((
                r.events.clone(),
                Event::Token {
                    token: d.token,
                    log_prob: d.log_prob,
                },
            ));
            if let Some(reason) = stop_reason(r, &self.config, self.tokenizer.as_deref()) {
                done.push((i, reason));
            }
        }
        // Remove from the back so earlier indices stay valid.
        done.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
        for (i, reason) in done {
            let r = self.running.swap_remove(i);
            self.finish(r, reason);
        }
    }
}

/// The KV slots, allocated again if they were released.
fn kv_memory<'a>(
    cache: &'a mut Option<SlotCache>,
    decoder: &Decoder,
    config: &EngineConfig,
) -> &'a mut SlotCache {
    // One slot more than requests can take: the scratch slot of padded CUDA-graph rows.
    cache.get_or_insert_with(|| {
        SlotCache::new(
            &decoder.config,
            config.slots + 1,
            config.slot_len,
            decoder.device(),
            decoder.kind(),
        )
    })
}

fn stop_reason(
    r: &Running,
    config: &EngineConfig,
    tokenizer: Option<&Tokenizer>,
) -> Option<FinishReason> {
    let token = *r.output.last()?;
    let s = &r.sampling;
    if r.output.len() >= s.min_new_tokens {
        if (!s.ignore_eos && config.eos_token_ids.contains(&token))
            || s.stop_token_ids.contains(&token)
        {
            return Some(FinishReason::Stop {
                matched: StopMatch::Token(token),
            });
        }
        if let (false, Some(tok)) = (s.stop.is_empty(), tokenizer) {
            // Only the tail can hold a new match: the last token's text plus the longest stop string.
            let window = s.stop.iter().map(|x| x.len()).max().unwrap_or(0) + 16;
            let from = r.output.len().saturating_sub(window);
            if let Ok(text) = tok.decode(&r.output[from..], false) {
                if let Some(hit) = s.stop.iter().find(|x| text.contains(x.as_str())) {
                    return Some(FinishReason::Stop {
                        matched: StopMatch::Text(hit.clone()),
                    });
                }
            }
        }
    }
    if r.output.len() >= s.max_new_tokens || r.cached + 1 >= config.slot_len {
        return Some(FinishReason::Length);
    }
    None
}
