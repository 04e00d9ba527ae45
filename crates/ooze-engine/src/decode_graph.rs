//! Decode steps replayed from CUDA graphs. A decode step is ~25 small kernels per layer; launched
//! one by one from the host, the GPU waits on the launches. Captured once per (batch bucket, key
//! length bucket), a step is one launch.
//!
//! Inputs live in one static tensor refilled before each replay: token, position and the cell its
//! key and value go to per row, and each row's block table. Batches are padded up to the bucket
//! size with rows whose tables name only the scratch block; key lengths are rounded up to a
//! multiple of 256 (at most the context length), tables to the blocks that many keys take; ooze's
//! decode kernels read each row's own keys, and otherwise a mask hides the padding. A step's
//! rotary rows are gathered from tables of every position, made once. All graphs share one
//! memory pool (they never run concurrently).

use crate::decode_step::Feed;
use ooze_model::{Attention, Decoder, PagedKv, RopeTables};
use ooze_torch::cuda_graph::{CudaGraph, GraphError};
use ooze_torch::tch::{Device, Kind, Tensor};
use ooze_torch::transfer::upload;
use std::collections::HashMap;

struct Captured {
    /// `[rows · (3 + width)]`: each row's token, then each row's position, then the cell of its
    /// new token, then the block tables `[rows, width]`, refilled with one copy per step.
    inputs: Tensor,
    width: i64,
    logits: Tensor,
    graph: CudaGraph,
}

/// Captured decode steps for one engine.
pub struct DecodeGraphs {
    device: usize,
    max_batch: i64,
    max_len: i64,
    /// Keyed by (rows, key length).
    graphs: HashMap<(i64, i64), Captured>,
    /// The rotary tables of positions `0..max_len`, made with the first graph.
    rope: Option<RopeTables>,
}

/// Key lengths are rounded up to a multiple of this: fewer wasted keys than powers of two, few
/// enough graphs (one per multiple in use).
const KEY_BUCKET: i64 = 256;

/// With ooze's decode attention kernel, positions past a row's own keys cost almost nothing (their
/// blocks return at once), so buckets are coarser: fewer graphs to capture.
const FUSED_KEY_BUCKET: i64 = 1024;

/// The key length a step with `needed` keys is captured for.
fn key_bucket(needed: i64, fused: bool, max_len: i64) -> i64 {
    let unit = if fused { FUSED_KEY_BUCKET } else { KEY_BUCKET };
    ((needed.max(1) + unit - 1) / unit * unit).min(max_len)
}

fn bucket(n: i64, min: i64) -> i64 {
    (n.max(min) as u64).next_power_of_two() as i64
}

impl DecodeGraphs {
    /// Graphs for batches up to `max_batch` rows of sequences up to `max_len` tokens.
    pub fn new(device: Device, max_batch: i64, max_len: i64) -> Option<DecodeGraphs> {
        match device {
            Device::Cuda(index) if CudaGraph::available() => Some(DecodeGraphs {
                device: index,
                max_batch: bucket(max_batch, 1),
                max_len,
                graphs: HashMap::new(),
                rope: None,
            }),
            _ => None,
        }
    }

    /// Captures the steps of every batch bucket for the shortest key bucket up front (as a server
    /// does at start-up), so the first requests do not wait for captures.
    pub fn capture_common(
        &mut self,
        decoder: &Decoder,
        cache: &mut PagedKv,
    ) -> Result<(), GraphError> {
        let fused = decoder.decode_attention_fused();
        let len = key_bucket(1, fused, self.max_len);
        let mut rows = 1;
        while rows <= self.max_batch {
            let key = (rows, len);
            self.ensure(decoder, cache, key)?;
            rows *= 2;
        }
        Ok(())
    }

    /// Forgets every graph (they point at KV memory that is being freed).
    pub fn clear(&mut self) {
        self.graphs.clear();
    }

    /// One decode step: `tokens[i]` (or, for the rows `feed` names, a token the step before drew
    /// on the device) appended after `past[i]` tokens to the sequence in blocks `tables[i]`.
    /// Returns fp32 logits `[B, vocab]` (a view of the graph's output, valid until the next
    /// step). Nothing here waits for the device.
    pub(crate) fn step(
        &mut self,
        decoder: &Decoder,
        cache: &mut PagedKv,
        tokens: &[i64],
        feed: Option<&Feed<'_>>,
        tables: &[&[i64]],
        past: &[i64],
    ) -> Result<Tensor, GraphError> {
        let b = tokens.len() as i64;
        let needed = past.iter().max().copied().unwrap_or(0) + 1;
        let fused = decoder.decode_attention_fused();
        let len = key_bucket(needed, fused, self.max_len);
        let rows = bucket(b, 1).min(self.max_batch);
        let key = (rows, len);
        self.ensure(decoder, cache, key)?;
        let g = &self.graphs[&key];
        let (rows, width) = (rows as usize, g.width as usize);
        let mut host = Vec::with_capacity(rows * (3 + width));
        for values in [tokens, past] {
            host.extend_from_slice(values);
            host.resize(host.len() + rows - values.len(), 0);
        }
        // Where each row's new key and value go, as `ooze_model::attention`'s `cells` computes
        // them on the device for eager steps (padding rows: the scratch block).
        let bs = cache.block_size();
        for r in 0..rows {
            let (table, p) = (
                tables.get(r).copied().unwrap_or(&[]),
                past.get(r).copied().unwrap_or(0),
            );
            let block = table
                .get((p / bs) as usize)
                .copied()
                .unwrap_or(cache.scratch());
            host.push(block * bs + p % bs);
        }
        for table in tables {
            let start = host.len();
            host.extend_from_slice(&table[..table.len().min(width)]);
            host.resize(start + width, cache.scratch());
        }
        host.resize(rows * (3 + width), cache.scratch());
        let device = g.inputs.device();
        g.inputs.shallow_clone().copy_(&upload(&host, device));
        if let Some(feed) = feed {
            feed.apply(&g.inputs.narrow(0, 0, rows as i64));
        }
        g.graph.replay()?;
        Ok(g.logits.narrow(0, 0, b))
    }

    /// Captures the graph for `key` unless it exists.
    fn ensure(
        &mut self,
        decoder: &Decoder,
        cache: &mut PagedKv,
        key: (i64, i64),
    ) -> Result<(), GraphError> {
        if !self.graphs.contains_key(&key) {
            if self.rope.is_none() {
                self.rope = Some(decoder.rope_tables(self.max_len));
            }
            let captured = self.capture(decoder, cache, key)?;
            self.graphs.insert(key, captured);
        }
        Ok(())
    }

    fn capture(
        &self,
        decoder: &Decoder,
        cache: &mut PagedKv,
        (rows, len): (i64, i64),
    ) -> Result<Captured, GraphError> {
        let device = Device::Cuda(self.device);
        let width = (len + cache.block_size() - 1) / cache.block_size();
        let inputs = Tensor::zeros([rows * (3 + width)], (Kind::Int64, device));
        let _ = inputs
            .narrow(0, 3 * rows, rows * width)
            .fill_(cache.scratch());
        let _ = inputs
            .narrow(0, 2 * rows, rows)
            .fill_(cache.scratch() * cache.block_size());
        let tokens = inputs.narrow(0, 0, rows).unsqueeze(1);
        let past = inputs.narrow(0, rows, rows);
        let write_cells = inputs.narrow(0, 2 * rows, rows);
        let tables = inputs.narrow(0, 3 * rows, rows * width).view([rows, width]);
        let rope = self
            .rope
            .as_ref()
            .expect("invariant: ensure makes the rotary tables before the first capture");
        let run = |cache: &mut PagedKv| {
            let positions = past.unsqueeze(1);
            let hidden = decoder.hidden_states(
                &tokens,
                &positions,
                Attention::PagedDecode {
                    cache,
                    tables: &tables,
                    past: &past,
                    read_len: len,
                    write_cells: &write_cells,
                    rope,
                },
            );
            decoder.logits_f32(&hidden.select(1, 0))
        };
        // Warm-up outside the capture: cuBLAS handles, workspaces and kernels get created here.
        let _ = run(cache);
        ooze_torch::cuda_graph::synchronize(self.device);
        let share = self.graphs.values().next().map(|c| &c.graph);
        let (graph, logits) = CudaGraph::capture(self.device, share, || run(cache))?;
        Ok(Captured {
            inputs,
            width,
            logits,
            graph,
        })
    }
}
