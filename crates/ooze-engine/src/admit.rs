//! Admission: waiting requests join the running batch. Each gets the KV blocks the prefix tree
//! keeps of its tokens and new blocks for the rest ([`crate::kv_blocks`]), then one prefill pass
//! computes the new tokens of several requests together and draws their first tokens.
//!
//! A request waits while its blocks (beyond what the running requests need for their next token)
//! or a batch row are not to be had; a request that starts like one already planned waits for the
//! next pass, where it shares that one's blocks.

use crate::decode_step::QueuedDraws;
use crate::engine::{kv_memory, EngineLoop, Running};
use crate::prefix_tree::common_prefix;
use crate::prompt_scores;
use crate::waiting::Planned;
use ooze_core::FinishReason;
use ooze_model::{Attention, Decoder, PagedKv};
use ooze_torch::tch::Tensor;
use ooze_torch::transfer::upload;
use std::borrow::Cow;

/// Token budget of one prefill pass (rows × longest new prompt, padding included).
const PREFILL_TOKENS: i64 = 16_384;

impl EngineLoop {
    /// Prefills waiting requests and draws their first tokens, several requests per forward pass.
    ///
    /// With overlap ([`EngineLoop::overlap`]), a pass's first tokens are taken once the next pass
    /// is queued: the host plans and launches pass n + 1 while the device computes pass n, instead
    /// of waiting for pass n's tokens and leaving the device idle while it plans (draws depend only
    /// on each request's seed, step and logits, so the tokens are the same; a request that stops
    /// at its first token frees its row a pass later). The last pass's are taken before returning,
    /// so nothing drawn in a prefill is pending outside this function.
    pub(crate) fn admit(&mut self) {
        let mut previous: Option<QueuedDraws> = None;
        loop {
            let batch = self.plan_prefill();
            if batch.is_empty() {
                break;
            }
            let queued = self.prefill(batch);
            self.decode_clock.interrupt();
            let ready = if self.overlap {
                std::mem::replace(&mut previous, queued)
            } else {
                queued
            };
            if let Some(done) = ready {
                self.accept_queued(done);
            }
            // What is ready goes out at once (first tokens, finished scoring-only requests): the
            // next prefill pass may take a while.
            self.send_outbox();
        }
        if let Some(done) = previous {
            self.accept_queued(done);
            self.send_outbox();
        }
    }

    /// Takes waiting requests for one prefill pass, giving each its blocks. Stops at the token
    /// budget, when blocks or batch rows run out, or before a request that shares a prefix with
    /// one already planned (it reuses that one's keys/values in the next pass instead).
    fn plan_prefill(&mut self) -> Vec<Planned> {
        let mut planned: Vec<Planned> = Vec::new();
        let (mut rows, mut longest) = (0i64, 0i64);
        // Blocks the running requests need for their next token come first, and (when sequences
        // grow into new blocks at all) 1% of the memory stays free for their growth after that,
        // so that a request admitted at the edge is not preempted again at once. With nothing
        // running the whole memory is there: one context always fits.
        let bs = self.kv.block_size();
        let next_step = self
            .running
            .iter()
            .filter(|r| r.cached as usize + 1 > r.table.len() * bs)
            .count();
        let watermark = if (bs as i64) < self.config.context_len && !self.running.is_empty() {
            self.kv.total() / 100
        } else {
            0
        };
        let headroom = next_step + watermark;
        while let Some(front) = self.waiting.front() {
            if front.events.is_closed() {
                self.waiting.pop_front();
                continue;
            }
            if (self.running.len() + planned.len()) as i64 >= self.config.max_running {
                break;
            }
            let sequence = front.sequence();
            let tokens: &[u32] = &sequence;
            let min = self.config.min_prefix_reuse;
            // At least the last token is computed: its logits start the output. Scored prompt
            // positions are computed too.
            let scored_from = match (&front.progress, front.prompt_log_probs_from) {
                (None, Some(from)) => from,
                _ => usize::MAX,
            };
            let usable = (tokens.len() - 1).min(scored_from);
            let plan = self.kv.plan(tokens, usable, min);
            // Wait for the next pass only where a planned request computes enough of this one's
            // prefix beyond what is kept already: requests that share only a kept prefix (an
            // agent's system prompt) go in the same pass, not one per pass.
            if planned.iter().any(|p| {
                common_prefix(&p.waiting.sequence(), tokens) >= plan.reused().saturating_add(min)
            }) {
                break;
            }
            let new_tokens = (tokens.len() - plan.reused()) as i64;
            let (next_rows, next_longest) = (rows + 1, longest.max(new_tokens));
            if !planned.is_empty() && next_rows * next_longest > PREFILL_TOKENS {
                break;
            }
            // Room for the whole sequence so far and the first drawn token.
            if self.kv.needed(&plan, tokens.len() + 1) + headroom > self.kv.available() {
                break;
            }
            let claim = self.kv.claim(plan);
            if let Some(copy) = claim.copy {
                kv_memory(&mut self.cache, &self.decoder, &self.config)
                    .copy_block(copy.from, copy.to, copy.len);
            }
            let mut table = claim.table;
            if !self.kv.grow(&mut table, tokens.len() + 1) {
                // Not expected after the check above; the blocks go back and the request waits.
                let held = tokens[..claim.reused].to_vec();
                let epoch = self.kv.epoch();
                self.kv.release(table, &held, epoch);
                break;
            }
            drop(sequence);
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
                table,
                reused: claim.reused,
                seed,
            });
        }
        planned
    }

    /// One forward pass over the planned sequences (right-padded to the longest), then each one's
    /// first token, queued on the device (`None` when none of them draws). Their whole blocks go to
    /// the prefix tree at once, for the other samples of their prompts.
    fn prefill(&mut self, planned: Vec<Planned>) -> Option<QueuedDraws> {
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
        let past: Vec<i64> = planned.iter().map(|p| p.reused as i64).collect();
        let rows = planned.len();
        let tables: Vec<&[i64]> = planned.iter().map(|p| &p.table[..]).collect();
        let cache = kv_memory(&mut self.cache, &self.decoder, &self.config);
        let ids = upload(&ids, self.decoder.device()).view([rows as i64, width as i64]);
        let hidden = paged_hidden(
            &self.decoder,
            cache,
            &ids,
            &positions,
            width as i64,
            &tables,
            &past,
        );
        let logits = self.last_logits(&hidden, &last);
        let first = self.running.len();
        let epoch = self.kv.epoch();
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
            self.admissions += 1;
            let r = Running {
                id: p.waiting.id,
                events: p.waiting.events,
                sampling: p.waiting.request.sampling,
                seed: p.seed,
                table: p.table,
                epoch,
                admitted: self.admissions,
                input_ids: p.waiting.request.input_ids,
                prompt_len,
                reused,
                cached,
                output,
                log_probs,
                prompt_log_probs,
                pending: 0,
            };
            self.kv.publish(&r.held_tokens(), &r.table, epoch);
            if r.output.len() >= r.sampling.max_new_tokens {
                // max_new_tokens 0: prefilled (and scored), nothing to draw.
                self.finish(r, FinishReason::Length);
            } else {
                self.running.push(r);
                drawing.push(b as i64);
            }
        }
        if drawing.is_empty() {
            return None;
        }
        let logits = if drawing.len() == rows {
            logits
        } else {
            logits.index_select(0, &upload(&drawing, logits.device()))
        };
        let rows: Vec<usize> = (first..self.running.len()).collect();
        Some(self.queue_draws(&logits, &rows))
    }

    /// fp32 logits `[B, vocab]` at each row's position `last[b]` of `hidden [B, width, hidden]`.
    pub(crate) fn last_logits(&self, hidden: &Tensor, last: &[i64]) -> Tensor {
        let (b, h) = (hidden.size()[0], hidden.size()[2]);
        let index = upload(last, hidden.device())
            .view([b, 1, 1])
            .expand([b, 1, h], false);
        self.decoder
            .logits_f32(&hidden.gather(1, &index, false).squeeze_dim(1))
    }
}

/// An eager forward over paged rows: `ids` `[B, width]` on the model's device, `positions` the same
/// shape row-major on the host; row `b` goes into the blocks `tables[b]` after `past[b]` tokens.
/// Returns the hidden states `[B, width, hidden]` (prefill and, without CUDA graphs, decode).
pub(crate) fn paged_hidden(
    decoder: &Decoder,
    cache: &mut PagedKv,
    ids: &Tensor,
    positions: &[i64],
    width: i64,
    tables: &[&[i64]],
    past: &[i64],
) -> Tensor {
    let b = tables.len() as i64;
    let positions = upload(positions, decoder.device()).view([b, width]);
    decoder.hidden_states(
        ids,
        &positions,
        Attention::Paged {
            cache,
            tables,
            past,
        },
    )
}
