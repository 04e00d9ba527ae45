//! One decode step for every running request, overlapped with the host's handling of the step
//! before it: the engine queues step n + 1 on the GPU before it reads step n's tokens, so
//! streaming them, checking stops and the bookkeeping of a step happen while the GPU computes the
//! next one instead of between the two.
//!
//! Step n + 1 takes step n's tokens as its input straight from the GPU ([`Feed`]). A request that
//! step n's token ends (a stop token or stop string) has one row computed in step n + 1 for
//! nothing; that draw is dropped. Requests that step n ends for certain (`max_new_tokens`, or the
//! context's end) are left out of step n + 1. What changes the batch otherwise (preemption when
//! blocks run out, pausing, weight updates, releasing memory) first finishes the step in flight
//! ([`EngineLoop::drain`]). Draws depend only on each request's seed, step and logits, so a
//! request's tokens are the same with and without overlap. On a CPU, or with
//! `OOZE_ENGINE_OVERLAP=0` ([`crate::EngineConfig::overlap_steps`]), every step's tokens are read
//! before the next is queued.

use crate::admit::paged_hidden;
use crate::engine::{kv_memory, EngineLoop, Running};
use crate::handle::{EngineConfig, Event, RequestId};
use crate::sampler::{draw_async, Draw, PendingDraws, RowSampling};
use ooze_core::{FinishReason, StopMatch};
use ooze_model::Tokenizer;
use ooze_torch::tch::{Device, Tensor};
use ooze_torch::transfer::upload;
use std::collections::HashMap;
use std::time::Instant;

/// A decode step queued on the device whose draws the host has not handled yet.
pub(crate) struct InFlight {
    /// The requests of the step's rows, in row order.
    ids: Vec<RequestId>,
    draws: PendingDraws,
    /// Graph replay or eager launches, and (with `profile_steps`) the forward's time.
    graphed: bool,
    forward_ms: Option<f64>,
    /// Whether the step was queued right behind another decode step (see [`DecodeClock`]), and
    /// the key positions its rows attend.
    follows_decode: bool,
    positions: u64,
}

/// Draws queued on the device outside a decode step (a prefill pass's first tokens) whose tokens
/// the host has not taken yet ([`EngineLoop::accept_queued`]).
pub(crate) struct QueuedDraws {
    /// The requests of the draws' rows, in row order.
    ids: Vec<RequestId>,
    draws: PendingDraws,
}

/// Steady decode: the time from one decode step's draws to the next's, counted for steps queued
/// right behind another decode step — no prefill, idle wait or command between them — so that
/// each interval is what one decode step costs (with overlap, the device's time for it). Totals
/// since the engine started, in [`crate::EngineStats`].
#[derive(Debug, Default)]
pub(crate) struct DecodeClock {
    /// Whether the next step queued follows a decode step directly.
    follows_decode: bool,
    last_ready: Option<Instant>,
    pub(crate) steps: u64,
    pub(crate) seconds: f64,
    pub(crate) rows: u64,
    pub(crate) positions: u64,
}

impl DecodeClock {
    /// Something other than a decode step ran, or the engine waited: the next step's interval
    /// would include it, and so would that of a step in flight meanwhile (its draws are taken
    /// after the prefill that the host waited for), so neither counts.
    pub(crate) fn interrupt(&mut self) {
        self.follows_decode = false;
        self.last_ready = None;
    }

    fn queued(&mut self) -> bool {
        std::mem::replace(&mut self.follows_decode, true)
    }

    /// A step's draws are ready: one that `follows_decode` counts the time since the draws
    /// before, with its `rows` and the key `positions` they attended.
    fn ready(&mut self, follows_decode: bool, rows: usize, positions: u64) {
        let now = Instant::now();
        if let (true, Some(before)) = (follows_decode, self.last_ready) {
            self.steps += 1;
            self.seconds += now.duration_since(before).as_secs_f64();
            self.rows += rows as u64;
            self.positions += positions;
        }
        self.last_ready = Some(now);
    }
}

/// Where a step's input tokens come from on the device: row `rows[k].0` of the step takes the
/// token drawn in row `rows[k].1` of the step before, `from`.
pub(crate) struct Feed<'a> {
    pub from: &'a Tensor,
    pub rows: &'a [(i64, i64)],
}

impl Feed<'_> {
    /// Writes the fed tokens into `tokens` (`[B]` int64 on the device, the other rows as
    /// uploaded).
    pub(crate) fn apply(&self, tokens: &Tensor) {
        let n = self.rows.len() as i64;
        if n == 0 {
            return;
        }
        let in_order = self
            .rows
            .iter()
            .enumerate()
            .all(|(k, &(to, from))| to == k as i64 && from == k as i64);
        if in_order {
            // The common case: the same requests go on in the same order.
            tokens
                .narrow(0, 0, n)
                .shallow_clone()
                .copy_(&self.from.narrow(0, 0, n));
            return;
        }
        let flat: Vec<i64> = (self.rows.iter().map(|r| r.0))
            .chain(self.rows.iter().map(|r| r.1))
            .collect();
        let index = upload(&flat, tokens.device());
        let _ = tokens.shallow_clone().index_copy_(
            0,
            &index.narrow(0, 0, n),
            &self.from.index_select(0, &index.narrow(0, n, n)),
        );
    }
}

impl EngineLoop {
    /// Queues one decode step for the running requests, then handles the draws of the step
    /// before it (or of this one, without overlap).
    pub(crate) fn decode_step(&mut self) {
        let mut rows = self.next_step_rows();
        if !self.reserve_without_preempting(&rows) {
            self.drain();
            self.reserve_next_positions();
            rows = (0..self.running.len()).collect();
        }
        if rows.is_empty() {
            self.drain();
            return;
        }
        let step = self.launch(&rows);
        let previous = self.in_flight.replace(step);
        // The step is queued: deliver what was drawn before while the device computes.
        self.send_outbox();
        if let Some(previous) = previous {
            self.overlapped_steps += 1;
            self.process(previous);
            self.send_outbox();
        }
        if !self.overlap {
            self.drain();
        }
    }

    /// Waits for the step in flight, if any, and handles its draws.
    pub(crate) fn drain(&mut self) {
        if let Some(step) = self.in_flight.take() {
            self.process(step);
        }
    }

    /// The running requests the next step computes: all but those whose draw in flight is
    /// certainly their last (`max_new_tokens` reached, or the context's end).
    fn next_step_rows(&self) -> Vec<usize> {
        let context_len = self.config.context_len;
        (0..self.running.len())
            .filter(|&i| {
                let r = &self.running[i];
                r.pending == 0
                    || (r.output.len() + (r.pending as usize) < r.sampling.max_new_tokens
                        && r.cached + 1 < context_len)
            })
            .collect()
    }

    /// Gives each of `rows` the block its next token goes into; false when blocks ran out (the
    /// tables keep what they got).
    fn reserve_without_preempting(&mut self, rows: &[usize]) -> bool {
        rows.iter().all(|&i| {
            let r = &mut self.running[i];
            self.kv.grow(&mut r.table, r.cached as usize + 1)
        })
    }

    /// Gives every running request the block its next token goes into. When blocks run out, the
    /// most recently admitted requests are preempted until the others fit (one alone always fits:
    /// the memory holds a whole context). Nothing may be in flight.
    fn reserve_next_positions(&mut self) {
        debug_assert!(self.in_flight.is_none());
        self.running.sort_by_key(|r| r.admitted);
        let mut i = 0;
        while i < self.running.len() {
            let r = &mut self.running[i];
            if self.kv.grow(&mut r.table, r.cached as usize + 1) {
                i += 1;
            } else {
                let newest = self.running.pop().expect("invariant: i < len");
                self.preempt(newest);
            }
        }
    }

    /// Queues the forward pass and the draws of `rows` (indices into `running`, blocks reserved).
    fn launch(&mut self, rows: &[usize]) -> InFlight {
        let t0 = Instant::now();
        // Rows whose input is still on the device: the step in flight drew it.
        let previous: HashMap<RequestId, i64> = self
            .in_flight
            .as_ref()
            .map(|f| (f.ids.iter().enumerate()).map(|(j, &id)| (id, j as i64)))
            .into_iter()
            .flatten()
            .collect();
        let mut tokens = Vec::with_capacity(rows.len());
        let mut fed = Vec::new();
        for (k, &i) in rows.iter().enumerate() {
            let r = &self.running[i];
            if r.pending > 0 {
                let from = previous
                    .get(&r.id)
                    .expect("invariant: a pending draw belongs to the step in flight");
                fed.push((k as i64, *from));
                tokens.push(0);
            } else {
                let last = r.output.last();
                tokens.push(*last.expect("invariant: running requests have a token") as i64);
            }
        }
        let past: Vec<i64> = rows.iter().map(|&i| self.running[i].cached).collect();
        let positions = past.iter().map(|&p| p as u64 + 1).sum();
        let tables: Vec<&[i64]> = rows.iter().map(|&i| &self.running[i].table[..]).collect();
        let feed = self.in_flight.as_ref().map(|f| Feed {
            from: &f.draws.tokens,
            rows: &fed,
        });
        let cache = kv_memory(&mut self.cache, &self.decoder, &self.config);
        let graphed = match self.graphs.as_mut() {
            Some(graphs) => {
                match graphs.step(&self.decoder, cache, &tokens, feed.as_ref(), &tables, &past) {
                    Ok(logits) => Some(logits),
                    Err(err) => {
                        eprintln!("ooze-engine: CUDA graphs turned off: {err}");
                        self.graphs = None;
                        None
                    }
                }
            }
            None => None,
        };
        let is_graphed = graphed.is_some();
        let logits = match graphed {
            Some(logits) => logits,
            None => {
                let device = self.decoder.device();
                let ids = upload(&tokens, device);
                if let Some(feed) = &feed {
                    feed.apply(&ids);
                }
                let cache = kv_memory(&mut self.cache, &self.decoder, &self.config);
                let b = rows.len() as i64;
                let hidden = paged_hidden(
                    &self.decoder,
                    cache,
                    &ids.view([b, 1]),
                    &past,
                    1,
                    &tables,
                    &past,
                );
                self.decoder.logits_f32(&hidden.select(1, 0))
            }
        };
        let forward_ms = match (self.config.profile_steps, self.decoder.device()) {
            (true, Device::Cuda(i)) => {
                ooze_torch::cuda_graph::synchronize(i);
                Some(t0.elapsed().as_secs_f64() * 1e3)
            }
            (true, _) => Some(t0.elapsed().as_secs_f64() * 1e3),
            _ => None,
        };
        let banned: Vec<Vec<u32>> = rows.iter().map(|&i| self.banned(i)).collect();
        let specs = self.row_sampling(rows, &banned);
        let draws = draw_async(&logits, &specs);
        drop(specs);
        for &i in rows {
            let r = &mut self.running[i];
            r.cached += 1;
            r.pending += 1;
        }
        InFlight {
            ids: rows.iter().map(|&i| self.running[i].id).collect(),
            draws,
            graphed: is_graphed,
            forward_ms,
            follows_decode: self.decode_clock.queued(),
            positions,
        }
    }

    /// The sampling state of `rows` for their next draw (after the ones pending), `banned[k]`
    /// being what `rows[k]` must not draw.
    fn row_sampling<'a>(&'a self, rows: &[usize], banned: &'a [Vec<u32>]) -> Vec<RowSampling<'a>> {
        (rows.iter().zip(banned))
            .map(|(&i, banned)| {
                let r = &self.running[i];
                RowSampling {
                    params: &r.sampling,
                    seed: r.seed,
                    step: r.sampling.first_draw + (r.output.len() + r.pending as usize) as u64,
                    banned,
                }
            })
            .collect()
    }

    /// Tokens running request `i` must not draw next: its stop tokens (and EOS) before
    /// `min_new_tokens`.
    fn banned(&self, i: usize) -> Vec<u32> {
        let r = &self.running[i];
        if r.output.len() + r.pending as usize >= r.sampling.min_new_tokens {
            return Vec::new();
        }
        let mut b = r.sampling.stop_token_ids.clone();
        if !r.sampling.ignore_eos {
            b.extend(&self.config.eos_token_ids);
        }
        b
    }

    /// Handles a step's draws: each row's token goes to its request (unless it ended while the
    /// step was in flight), is streamed, and ends the request when it stops.
    fn process(&mut self, step: InFlight) {
        let t0 = Instant::now();
        let draws = step.draws.wait();
        self.decode_clock
            .ready(step.follows_decode, step.ids.len(), step.positions);
        self.accept_by_id(&step.ids, draws);
        if let Some(forward_ms) = step.forward_ms {
            eprintln!(
                "engine step: batch {} forward {forward_ms:.2} ms ({}), sample+host {:.2} ms",
                step.ids.len(),
                if step.graphed { "graph" } else { "eager" },
                t0.elapsed().as_secs_f64() * 1e3
            );
        }
    }

    /// Queues one draw for each listed running request with no draw pending (row `i` of
    /// `logits` belongs to `rows[i]`) without waiting for the device; [`EngineLoop::accept_queued`]
    /// hands the tokens out.
    pub(crate) fn queue_draws(&mut self, logits: &Tensor, rows: &[usize]) -> QueuedDraws {
        let banned: Vec<Vec<u32>> = rows.iter().map(|&i| self.banned(i)).collect();
        let specs = self.row_sampling(rows, &banned);
        let draws = draw_async(logits, &specs);
        drop(specs);
        for &i in rows {
            self.running[i].pending += 1;
        }
        QueuedDraws {
            ids: rows.iter().map(|&i| self.running[i].id).collect(),
            draws,
        }
    }

    /// Waits for queued draws, streams each token to its request, and finishes the requests that
    /// stop.
    pub(crate) fn accept_queued(&mut self, queued: QueuedDraws) {
        let draws = queued.draws.wait();
        self.accept_by_id(&queued.ids, draws);
    }

    /// [`EngineLoop::accept`] for draws listed by request (`ids[k]` drew `draws[k]`): `running`
    /// may have been reordered since they were queued, and a request that ended meanwhile is
    /// skipped.
    fn accept_by_id(&mut self, ids: &[RequestId], draws: Vec<Draw>) {
        let index: HashMap<RequestId, usize> = (self.running.iter().enumerate())
            .map(|(i, r)| (r.id, i))
            .collect();
        let accepted: Vec<(usize, Draw)> = (ids.iter().zip(draws))
            .filter_map(|(id, d)| index.get(id).map(|&i| (i, d)))
            .collect();
        self.accept(accepted);
    }

    /// Gives each running request `i` its drawn token (the oldest of its pending draws), streams
    /// it, and finishes the requests that stop.
    fn accept(&mut self, draws: Vec<(usize, Draw)>) {
        let mut done = Vec::new();
        for (i, d) in draws {
            let r = &mut self.running[i];
            r.pending -= 1;
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
            // The cached length when this token was drawn: later steps in flight added theirs.
            let cached = r.cached - r.pending as i64;
            if let Some(reason) = stop_reason(r, cached, &self.config, self.tokenizer.as_deref()) {
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

/// Why `r` stops after its last token, drawn with `cached` tokens in its blocks, if it does.
fn stop_reason(
    r: &Running,
    cached: i64,
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
    if r.output.len() >= s.max_new_tokens || cached + 1 >= config.context_len {
        return Some(FinishReason::Length);
    }
    None
}
