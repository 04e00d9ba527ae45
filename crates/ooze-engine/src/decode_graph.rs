//! Decode steps replayed from CUDA graphs. A decode step is ~25 small kernels per layer; launched
//! one by one from the host, the GPU waits on the launches. Captured once per (batch bucket, key
//! length bucket), a step is one launch.
//!
//! Inputs live in static tensors refilled before each replay: token, slot and position per row.
//! Batches are padded up to the bucket size with rows that write to a scratch slot no request
//! uses; key lengths are rounded up to a multiple of 256 (at most the slot length), and
//! the mask hides the padding. All graphs share one memory pool (they never run concurrently).

use ooze_model::{Attention, Decoder, SlotCache};
use ooze_torch::cuda_graph::{CudaGraph, GraphError};
use ooze_torch::tch::{Device, Kind, Tensor};
use std::collections::HashMap;

struct Captured {
    /// `[3, rows]`: token, slot and position of each row, refilled with one copy per step.
    inputs: Tensor,
    logits: Tensor,
    graph: CudaGraph,
}

/// Captured decode steps for one engine.
pub struct DecodeGraphs {
    device: usize,
    scratch_slot: i64,
    max_batch: i64,
    /// Keyed by (rows, key length, rows read their own slot index).
    graphs: HashMap<(i64, i64, bool), Captured>,
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
    /// Graphs for batches up to `max_batch` rows; `scratch_slot` absorbs the padding rows' writes.
    pub fn new(device: Device, scratch_slot: i64, max_batch: i64) -> Option<DecodeGraphs> {
        match device {
            Device::Cuda(index) if CudaGraph::available() => Some(DecodeGraphs {
                device: index,
                scratch_slot,
                max_batch: bucket(max_batch, 1),
                graphs: HashMap::new(),
            }),
            _ => None,
        }
    }

    /// Captures the steps of every batch bucket for the shortest key bucket up front (as a server
    /// does at start-up), so the first requests do not wait for captures.
    pub fn capture_common(
        &mut self,
        decoder: &Decoder,
        cache: &mut SlotCache,
    ) -> Result<(), GraphError> {
        let fused = decoder.decode_attention_fused();
        let len = key_bucket(1, fused, cache.max_len());
        let mut rows = 1;
        while rows <= self.max_batch {
            let key = (rows, len, false);
            self.ensure(decoder, cache, key)?;
            rows *= 2;
        }
        Ok(())
    }

    /// Forgets every graph (they point at KV memory that is being freed).
    pub fn clear(&mut self) {
        self.graphs.clear();
    }

    /// One decode step: `tokens[i]` appended to slot `slots[i]` after `past[i]` tokens. Returns fp32
    /// logits `[B, vocab]` (a view of the graph's output, valid until the next step).
    pub fn step(
        &mut self,
        decoder: &Decoder,
        cache: &mut SlotCache,
        tokens: &[i64],
        slots: &[i64],
        past: &[i64],
    ) -> Result<Tensor, GraphError> {
        let b = tokens.len() as i64;
        let needed = past.iter().max().copied().unwrap_or(0) + 1;
        let fused = decoder.decode_attention_fused();
        let len = key_bucket(needed, fused, cache.max_len());
        // A batch sitting in slots 0..B in order reads the slots as a view instead of gathering.
        // (Padding rows then read slots B..rows, so those must exist.) The fused kernel reads
        // slots by index either way.
        let rows = bucket(b, 1).min(self.max_batch);
        let in_order = !fused
            && rows <= cache.slots()
            && slots.iter().enumerate().all(|(i, &s)| s == i as i64);
        let key = (rows, len, in_order);
        self.ensure(decoder, cache, key)?;
        let g = &self.graphs[&key];
        let rows = key.0 as usize;
        let mut host = Vec::with_capacity(3 * rows);
        for (values, fill) in [(tokens, 0), (slots, self.scratch_slot), (past, 0)] {
            host.extend_from_slice(values);
            host.resize(host.len() + rows - values.len(), fill);
        }
        g.inputs
            .shallow_clone()
            .copy_(&Tensor::from_slice(&host).view([3, key.0]));
        g.graph.replay()?;
        Ok(g.logits.narrow(0, 0, b))
    }

    /// Captures the graph for `key` unless it exists.
    fn ensure(
        &mut self,
        decoder: &Decoder,
        cache: &mut SlotCache,
        key: (i64, i64, bool),
    ) -> Result<(), GraphError> {
        if !self.graphs.contains_key(&key) {
            let captured = self.capture(decoder, cache, key)?;
            self.graphs.insert(key, captured);
        }
        Ok(())
    }

    fn capture(
        &self,
        decoder: &Decoder,
        cache: &mut SlotCache,
        (rows, len, rows_are_slots): (i64, i64, bool),
    ) -> Result<Captured, GraphError> {
        let device = Device::Cuda(self.device);
        let inputs = Tensor::zeros([3, rows], (Kind::Int64, device));
        let _ = inputs.get(1).fill_(self.scratch_slot);
        let (tokens, slots, past) = (inputs.get(0).unsqueeze(1), inputs.get(1), inputs.get(2));
        let run = |cache: &mut SlotCache| {
            let positions = past.unsqueeze(1);
            let hidden = decoder.hidden_states(
                &tokens,
                &positions,
                Attention::SlotDecode {
                    cache,
                    slots: &slots,
                    past: &past,
                    read_len: len,
                    rows_are_slots,
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
            logits,
            graph,
        })
    }
}
