//! Sharded training (ZeRO-3, as PyTorch's FSDP does it): every rank keeps only its `1/world`
//! share of each parameter, of its fp32 master, of its AdamW moments and of its gradient.
//!
//! The parameters are grouped in units ([`Decoder::num_units`]: the embeddings, each block, the
//! final norm with the LM head). A unit's tensors are laid out rank-major: each tensor is
//! flattened and padded to a multiple of the world size, and rank `r`'s shard of the unit is the
//! `r`-th slice of every tensor, one after another. So one all-gather brings a whole unit in
//! (each tensor is then a column block of the `[world, shard]` result), and one reduce-scatter of
//! the unit's gradients laid out the same way leaves each rank the sum over ranks of its own
//! slices. The optimizer works on the slices as ordinary tensors, so the AdamW arithmetic per
//! element is the one-process step's.
//!
//! While a unit is not in use its tensors in the decoder hold no memory (an empty placeholder);
//! a [`Pass`] gathers them into place for one use, prefetching the next unit of the pass while
//! this one computes, and releases them after. Gradients leave the tensors right after each
//! unit's backward (reduce-scattered, then dropped), so no full-size gradient outlives a unit.

use crate::data_parallel::dist_error;
use crate::TrainError;
use ooze_model::Decoder;
use ooze_torch::dist::{Pending, ProcessGroup};
use ooze_torch::optim::clear_grad;
use ooze_torch::tch::{self, Device, Kind, Tensor};
use std::collections::VecDeque;
use std::sync::Arc;

/// One unit: the decoder's tensors and this rank's shard of them.
struct Unit {
    /// The decoder's own tensors (shallow clones: `set_data` on them reaches the decoder).
    params: Vec<Tensor>,
    names: Vec<String>,
    shapes: Vec<Vec<i64>>,
    /// Elements of each tensor in one rank's slice (its padded size over the world size).
    slices: Vec<i64>,
    /// This rank's slices of every tensor, one after another, in the model's dtype.
    shard: Tensor,
    /// The gradients of `shard` summed over ranks and micro-batches (fp32; fp64 models: fp64).
    grad: Tensor,
}

impl Unit {
    fn numel(shape: &[i64]) -> i64 {
        shape.iter().product()
    }

    fn shard_len(&self) -> i64 {
        self.slices.iter().sum()
    }
}

/// A decoder's parameters sharded over a process group.
pub(crate) struct ShardedModel {
    group: Arc<ProcessGroup>,
    units: Vec<Unit>,
    /// The LM head is the embedding matrix (unit 0).
    tied: bool,
    kind: Kind,
    device: Device,
}

impl ShardedModel {
    /// Shards `decoder`'s trainable parameters (rank 0's values: every rank loaded the same
    /// model; this makes sure of it) and frees their full copies. Returns the model and the
    /// tensors the optimizer steps: this rank's slice of every parameter, named as it is.
    pub(crate) fn new(
        decoder: &Decoder,
        group: Arc<ProcessGroup>,
        grad_kind: Kind,
    ) -> Result<(ShardedModel, Vec<(String, Tensor)>), TrainError> {
        Self::shard(decoder, Vec::new(), group, Some(grad_kind))
    }

    /// [`ShardedModel::new`] with `extra` tensors beside the decoder's (a critic's value head),
    /// sharded as part of the head unit: gathered with it, their gradients scattered with it.
    pub(crate) fn with_extra(
        decoder: &Decoder,
        extra: Vec<(String, Tensor)>,
        group: Arc<ProcessGroup>,
        grad_kind: Kind,
    ) -> Result<(ShardedModel, Vec<(String, Tensor)>), TrainError> {
        Self::shard(decoder, extra, group, Some(grad_kind))
    }

    /// Shards a frozen `decoder` (a reference model: scored, never trained): no gradients.
    pub(crate) fn frozen(
        decoder: &Decoder,
        group: Arc<ProcessGroup>,
    ) -> Result<ShardedModel, TrainError> {
        Ok(Self::shard(decoder, Vec::new(), group, None)?.0)
    }

    fn shard(
        decoder: &Decoder,
        mut extra: Vec<(String, Tensor)>,
        group: Arc<ProcessGroup>,
        grad_kind: Option<Kind>,
    ) -> Result<(ShardedModel, Vec<(String, Tensor)>), TrainError> {
        let _guard = tch::no_grad_guard();
        let world = group.world_size() as i64;
        let (kind, device) = (decoder.kind(), decoder.device());
        let mut units = Vec::with_capacity(decoder.num_units());
        let last = decoder.num_units() - 1;
        for u in 0..decoder.num_units() {
            let mut tensors = decoder.unit_parameters(u);
            if u == last {
                tensors.append(&mut extra);
            }
            let (names, params): (Vec<String>, Vec<Tensor>) = tensors
                .into_iter()
                .map(|(name, p)| (name, p.set_requires_grad(grad_kind.is_some())))
                .unzip();
            let shapes: Vec<Vec<i64>> = params.iter().map(|p| p.size()).collect();
            let slices: Vec<i64> = shapes
                .iter()
                .map(|s| (Unit::numel(s) + world - 1) / world)
                .collect();
            let len: i64 = slices.iter().sum();
            let unit = Unit {
                params,
                names,
                shapes,
                slices,
                shard: Tensor::zeros([len], (kind, device)),
                grad: match grad_kind {
                    Some(k) => Tensor::zeros([len], (k, device)),
                    None => Tensor::zeros([0], (kind, device)),
                },
            };
            units.push(unit);
        }
        let mut model = ShardedModel {
            group,
            units,
            tied: decoder.config.tie_word_embeddings,
            kind,
            device,
        };
        for u in 0..model.units.len() {
            for p in &model.units[u].params {
                model
                    .group
                    .broadcast(&mut p.shallow_clone(), 0)
                    .map_err(dist_error)?;
            }
            model.take_shard(u);
            model.release(u);
        }
        let slots = model.slot_views(|unit| &unit.shard);
        let named = model
            .units
            .iter()
            .flat_map(|u| u.names.iter().cloned())
            .zip(slots.into_iter().map(|t| t.expect("invariant: every slot")))
            .collect();
        Ok((model, named))
    }

    pub(crate) fn group(&self) -> &ProcessGroup {
        &self.group
    }

    pub(crate) fn device(&self) -> Device {
        self.device
    }

    pub(crate) fn tied(&self) -> bool {
        self.tied
    }

    /// The head unit (final norm, and the LM head when untied).
    pub(crate) fn head_unit(&self) -> usize {
        self.units.len() - 1
    }

    /// Parameters of the whole model (padding not counted).
    pub(crate) fn num_parameters(&self) -> i64 {
        self.units
            .iter()
            .flat_map(|u| u.shapes.iter().map(|s| Unit::numel(s)))
            .sum()
    }

    /// Per optimizer slot (every unit's tensors in order), a view of `of(unit)` at its slice.
    fn slot_views(&self, of: impl Fn(&Unit) -> &Tensor) -> Vec<Option<Tensor>> {
        let mut out = Vec::new();
        for unit in &self.units {
            let mut offset = 0;
            for &n in &unit.slices {
                out.push(Some(of(unit).narrow(0, offset, n)));
                offset += n;
            }
        }
        out
    }

    /// Per optimizer slot: the tensor's name, its whole shape and the elements of one rank's slice.
    pub(crate) fn slot_layout(&self) -> Vec<(String, Vec<i64>, i64)> {
        self.units
            .iter()
            .flat_map(|u| {
                u.names
                    .iter()
                    .zip(&u.shapes)
                    .zip(&u.slices)
                    .map(|((n, s), &k)| (n.clone(), s.clone(), k))
            })
            .collect()
    }

    /// This rank's summed gradient slices, in optimizer slot order.
    pub(crate) fn gradients(&self) -> Vec<Option<Tensor>> {
        self.slot_views(|u| &u.grad)
    }

    pub(crate) fn zero_grad(&mut self) {
        for u in &mut self.units {
            let _ = u.grad.zero_();
        }
    }

    /// Copies this rank's slices of unit `u`'s (gathered) tensors into its shard.
    fn take_shard(&mut self, u: usize) {
        let _guard = tch::no_grad_guard();
        let rank = self.group.rank() as i64;
        let unit = &mut self.units[u];
        let mut offset = 0;
        for (p, &n) in unit.params.iter().zip(&unit.slices) {
            let flat = padded(p, n * self.group.world_size() as i64);
            unit.shard
                .narrow(0, offset, n)
                .copy_(&flat.narrow(0, rank * n, n));
            offset += n;
        }
    }

    /// Frees unit `u`'s full tensors.
    fn release(&self, u: usize) {
        for p in &self.units[u].params {
            p.shallow_clone()
                .set_data(&Tensor::empty([0], (self.kind, self.device)));
        }
    }

    /// Unit `u`'s full tensors from the all-gathered shards `gathered` (`[world × shard]`).
    fn place(&self, u: usize, gathered: &Tensor) {
        let unit = &self.units[u];
        let world = self.group.world_size() as i64;
        let rows = gathered.view([world, unit.shard_len()]);
        let mut offset = 0;
        for ((p, shape), &n) in unit.params.iter().zip(&unit.shapes).zip(&unit.slices) {
            let full = rows
                .narrow(1, offset, n)
                .reshape([-1])
                .narrow(0, 0, Unit::numel(shape))
                .view(shape.as_slice());
            p.shallow_clone().set_data(&full);
            offset += n;
        }
    }

    /// Starts gathering unit `u` (see [`Pass`]).
    fn start_gather(&self, u: usize) -> Result<Pending<'_>, TrainError> {
        let unit = &self.units[u];
        let world = self.group.world_size() as i64;
        let out = Tensor::empty([world * unit.shard_len()], (self.kind, self.device));
        self.group
            .start_all_gather(out, unit.shard.shallow_clone())
            .map_err(dist_error)
    }

    /// Unit `u`'s gradients laid out as its gathered tensors (`[world × shard]`), zeros where a
    /// tensor has none; the tensors' own gradients are dropped.
    fn take_gradients(&self, u: usize) -> Tensor {
        let unit = &self.units[u];
        let world = self.group.world_size() as i64;
        let kind = unit.grad.kind();
        let columns: Vec<Tensor> = unit
            .params
            .iter()
            .zip(&unit.slices)
            .map(|(p, &n)| {
                let g = p.grad();
                let flat = if g.defined() {
                    padded(&g.to_kind(kind), n * world)
                } else {
                    Tensor::zeros([n * world], (kind, self.device))
                };
                clear_grad(&mut p.shallow_clone());
                flat.view([world, n])
            })
            .collect();
        Tensor::cat(&columns, 1).reshape([-1])
    }

    /// Gathers every unit into the decoder (for saving it whole); [`ShardedModel::release_all`]
    /// frees them again. Every rank must call it.
    pub(crate) fn gather_all(&self) -> Result<(), TrainError> {
        let _guard = tch::no_grad_guard();
        for u in 0..self.units.len() {
            let gathered = self.start_gather(u)?.wait().map_err(dist_error)?;
            self.place(u, &gathered);
        }
        Ok(())
    }

    pub(crate) fn release_all(&self) {
        for u in 0..self.units.len() {
            self.release(u);
        }
    }

    /// After a checkpoint's weights were written into the gathered decoder: every rank's shards
    /// from them. Call between [`ShardedModel::gather_all`] and [`ShardedModel::release_all`].
    pub(crate) fn reshard_gathered(&mut self) {
        for u in 0..self.units.len() {
            self.take_shard(u);
        }
    }

    /// Copies the whole current weights into `target`, a decoder of the same shape with its own
    /// storage (a colocated rollout engine's copy), one gathered unit at a time.
    pub(crate) fn copy_into(&self, target: &Decoder) -> Result<(), TrainError> {
        let _guard = tch::no_grad_guard();
        let mut next = Some(self.start_gather(0)?);
        for u in 0..self.units.len() {
            let gathered = next.take().expect("started").wait().map_err(dist_error)?;
            if u + 1 < self.units.len() {
                next = Some(self.start_gather(u + 1)?);
            }
            let unit = &self.units[u];
            let world = self.group.world_size() as i64;
            let rows = gathered.view([world, unit.shard_len()]);
            let mut offset = 0;
            for ((_, mut dst), (shape, &n)) in target
                .unit_parameters(u)
                .into_iter()
                .zip(unit.shapes.iter().zip(&unit.slices))
            {
                let full = rows
                    .narrow(1, offset, n)
                    .reshape([-1])
                    .narrow(0, 0, Unit::numel(shape))
                    .view(shape.as_slice());
                dst.f_copy_(&full)
                    .map_err(|e| TrainError::Dist(format!("weight sync into the engine: {e}")))?;
                offset += n;
            }
        }
        Ok(())
    }

    /// A pass that gathers the units in `order` (each gather prefetches the next).
    pub(crate) fn pass(&self, order: Vec<usize>) -> Pass<'_> {
        Pass {
            model: self,
            order: order.into(),
            prefetched: None,
            scatters: VecDeque::new(),
        }
    }

    /// The units a scoring (forward-only) pass gathers, in order.
    pub(crate) fn scoring_order(&self) -> Vec<usize> {
        (0..self.units.len()).collect()
    }

    /// The units a training pass gathers, in order: forward, the head, then the blocks again in
    /// reverse for their recomputation and backward, then (untied) the embeddings.
    pub(crate) fn training_order(&self) -> Vec<usize> {
        let head = self.head_unit();
        let mut order: Vec<usize> = (0..=head).collect();
        order.extend((1..head).rev());
        if !self.tied {
            order.push(0);
        }
        order
    }
}

/// `t` flattened and zero-padded to `len` elements.
fn padded(t: &Tensor, len: i64) -> Tensor {
    let flat = t.reshape([-1]);
    let n = flat.size()[0];
    if n == len {
        flat
    } else {
        Tensor::cat(&[flat, Tensor::zeros([len - n], (t.kind(), t.device()))], 0)
    }
}

/// Reduce-scatters kept in flight at once (each holds its unit's full-size gradients).
const SCATTERS_IN_FLIGHT: usize = 2;

/// One pass over the units: gathers them in the order given, one ahead, and reduce-scatters
/// gradients in the background. Every rank must make the same calls in the same order (a rank
/// without samples for it runs the same pass without compute).
pub(crate) struct Pass<'a> {
    model: &'a ShardedModel,
    order: VecDeque<usize>,
    prefetched: Option<(usize, Pending<'a>)>,
    scatters: VecDeque<(usize, Pending<'a>)>,
}

impl<'a> Pass<'a> {
    /// Puts unit `u` (the next in the pass's order) in place in the decoder, and starts
    /// gathering the one after it.
    pub(crate) fn gather(&mut self, u: usize) -> Result<(), TrainError> {
        let expected = self.order.pop_front();
        assert_eq!(
            expected,
            Some(u),
            "invariant: units are gathered in the pass's order"
        );
        let pending = match self.prefetched.take() {
            Some((v, p)) if v == u => p,
            _ => self.model.start_gather(u)?,
        };
        let gathered = pending.wait().map_err(dist_error)?;
        if let Some(&next) = self.order.front() {
            self.prefetched = Some((next, self.model.start_gather(next)?));
        }
        let _guard = tch::no_grad_guard();
        self.model.place(u, &gathered);
        Ok(())
    }

    /// Frees unit `u`'s full tensors.
    pub(crate) fn release(&mut self, u: usize) {
        self.model.release(u);
    }

    /// Starts summing unit `u`'s gradients over ranks into each rank's shard gradient.
    pub(crate) fn scatter_gradients(&mut self, u: usize) -> Result<(), TrainError> {
        let _guard = tch::no_grad_guard();
        let flat = self.model.take_gradients(u);
        let unit = &self.model.units[u];
        let out = Tensor::empty([unit.shard_len()], (unit.grad.kind(), self.model.device));
        let pending = self
            .model
            .group
            .start_reduce_scatter(out, flat)
            .map_err(dist_error)?;
        self.scatters.push_back((u, pending));
        while self.scatters.len() > SCATTERS_IN_FLIGHT {
            self.finish_one()?;
        }
        Ok(())
    }

    fn finish_one(&mut self) -> Result<(), TrainError> {
        if let Some((u, pending)) = self.scatters.pop_front() {
            let summed = pending.wait().map_err(dist_error)?;
            let _ = self.model.units[u].grad.shallow_clone().g_add_(&summed);
        }
        Ok(())
    }

    /// Waits for the gradients still in flight.
    pub(crate) fn finish(mut self) -> Result<(), TrainError> {
        while !self.scatters.is_empty() {
            self.finish_one()?;
        }
        assert!(
            self.order.is_empty() && self.prefetched.is_none(),
            "invariant: a pass gathers every unit of its order"
        );
        Ok(())
    }
}
