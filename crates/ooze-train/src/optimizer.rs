//! AdamW with fp32 master weights. The model computes in its own dtype (bf16 on a GPU); the
//! optimizer keeps an fp32 copy of every trainable tensor and clips the gradients by their global
//! norm. A bf16 model on a GPU steps with ooze's master-weight kernel: one pass per parameter reads
//! the bf16 gradient and writes master, moments and the bf16 weight. Otherwise (and for ranks that
//! sum their gradients first) the gradients are upcast (one multi-tensor copy into one buffer),
//! libtorch's fused AdamW runs (one call per weight-decay group) and the result is written back
//! into the model's tensors (one multi-tensor copy). In fp32 the model's tensors are their own
//! masters. Between steps the gradients are dropped, not zeroed, as PyTorch's `zero_grad()` does by
//! default.
//!
//! Weight decay applies to matrices (≥ 2 dimensions); biases and norm weights are not decayed.

use crate::data_parallel::{dist_error, sum_gradients};
use crate::TrainError;
use ooze_torch::dist::ProcessGroup;
use ooze_torch::optim::{
    clear_grad, foreach_copy, foreach_norm, fused_adamw, fused_adamw_available, master_adamw,
    master_adamw_available, AdamW, MasterSlot,
};
use ooze_torch::tch::{self, Device, Kind, Tensor};
use ooze_torch::transfer::Download;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimizerConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Global gradient-norm clip (0 = off).
    pub clip_grad: f64,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        OptimizerConfig {
            beta1: 0.9,
            beta2: 0.98,
            eps: 1e-8,
            weight_decay: 0.0,
            clip_grad: 1.0,
        }
    }
}

/// Elements per all-reduce of the gradients (256 MiB of fp32).
const GRADIENT_BUCKET: i64 = 64 << 20;

/// One trainable tensor and its optimizer state.
struct Slot {
    name: String,
    /// The model's tensor (compute dtype), with gradients on.
    model: Tensor,
    /// fp32 master copy (`None` when the model tensor is fp32 already).
    master: Option<Tensor>,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    step: Tensor,
    decay: bool,
}

pub struct Optimizer {
    slots: Vec<Slot>,
    config: OptimizerConfig,
}

impl Optimizer {
    /// Takes the model's trainable tensors (`Decoder::trainable_parameters`) and turns their
    /// gradients on.
    pub fn new(params: Vec<(String, Tensor)>, config: OptimizerConfig) -> Optimizer {
        Self::build(params, config, true)
    }

    /// Over this rank's shards of the parameters (sharded training): the gradients come to
    /// [`Optimizer::apply`] from the reduce-scatter, not from the tensors.
    pub(crate) fn for_shards(params: Vec<(String, Tensor)>, config: OptimizerConfig) -> Optimizer {
        Self::build(params, config, false)
    }

    fn build(params: Vec<(String, Tensor)>, config: OptimizerConfig, grads: bool) -> Optimizer {
        let slots = params
            .into_iter()
            .map(|(name, model)| {
                let model = if grads {
                    model.set_requires_grad(true)
                } else {
                    model
                };
                let master = (model.kind() != Kind::Float)
                    .then(|| model.detach().to_kind(Kind::Float).copy());
                let fp32 = (Kind::Float, model.device());
                Slot {
                    decay: model.dim() >= 2,
                    exp_avg: Tensor::zeros(model.size(), fp32),
                    exp_avg_sq: Tensor::zeros(model.size(), fp32),
                    step: Tensor::zeros([], fp32),
                    name,
                    model,
                    master,
                }
            })
            .collect();
        Optimizer { slots, config }
    }

    /// Drops every gradient (PyTorch's `zero_grad(set_to_none=True)`): the next backward pass
    /// writes fresh gradients instead of adding into zeroed ones, which saves a fill and an add
    /// per tensor and gives the memory back between steps.
    pub fn zero_grad(&mut self) {
        for s in &mut self.slots {
            clear_grad(&mut s.model);
        }
    }

    /// Number of trainable values.
    pub fn num_parameters(&self) -> i64 {
        self.slots.iter().map(|s| s.model.numel() as i64).sum()
    }

    /// Clips, steps with learning rate `lr` and writes the weights back; returns the gradient norm
    /// before clipping. Parameters without a gradient (unused in this step) keep their values.
    /// With `group`, the ranks' gradients are summed first, so every rank takes the same step.
    pub fn step(&mut self, lr: f64, group: Option<&ProcessGroup>) -> Result<f64, TrainError> {
        let _guard = tch::no_grad_guard();
        if group.is_none() {
            if let Some(norm) = self.master_step(lr)? {
                return Ok(norm);
            }
        }
        let (mut grads, flat) = self.fp32_gradients()?;
        if let Some(group) = group {
            let shapes: Vec<Vec<i64>> = self.slots.iter().map(|s| s.model.size()).collect();
            let device = self.slots.first().map_or(Device::Cpu, |s| s.model.device());
            sum_gradients(group, &mut grads, &shapes, device, GRADIENT_BUCKET)?;
            // The summed gradients live in the all-reduce's buckets now.
            return self.apply_with_norm(&grads, lr, None, None);
        }
        self.apply_with_norm(&grads, lr, None, flat.as_ref())
    }

    /// Each slot's gradient, `None` where its tensor has none (unused in this step).
    fn gradients(&self) -> Vec<Option<Tensor>> {
        self.slots
            .iter()
            .map(|s| {
                let g = s.model.grad();
                g.defined().then_some(g)
            })
            .collect()
    }

    /// The step through ooze's master-weight kernel, when it applies: every gradient bf16 with an
    /// fp32 master on a GPU. `None`: it does not, and nothing was changed.
    fn master_step(&mut self, lr: f64) -> Result<Option<f64>, TrainError> {
        if !master_adamw_available() {
            return Ok(None);
        }
        let grads = self.gradients();
        let fits = |s: &Slot, g: &Tensor| {
            g.kind() == Kind::BFloat16
                && s.model.kind() == Kind::BFloat16
                && s.master.is_some()
                && g.device().is_cuda()
                && g.is_contiguous()
                && s.model.is_contiguous()
        };
        let present: Vec<Tensor> = grads.iter().flatten().map(|g| g.shallow_clone()).collect();
        if present.is_empty()
            || !self
                .slots
                .iter()
                .zip(&grads)
                .all(|(s, g)| g.as_ref().is_none_or(|g| fits(s, g)))
        {
            return Ok(None);
        }
        let norms = foreach_norm(&present).map_err(|e| TrainError::Optimizer(e.to_string()))?;
        let total = norms.square().sum(Kind::Float).sqrt();
        // The kernel skips the step when the divisor is not finite, so the norm is read (and a
        // non-finite one reported) after the step is queued, and only the norm is waited for:
        // the step's kernels run on while the host goes on.
        let divisor = self.divisor_of(&total);
        let norm = Download::start(&total);
        let slots: Vec<MasterSlot<'_>> = self
            .slots
            .iter()
            .zip(&grads)
            .filter_map(|(s, g)| {
                Some(MasterSlot {
                    grad: g.as_ref()?,
                    model: &s.model,
                    master: s.master.as_ref()?,
                    exp_avg: &s.exp_avg,
                    exp_avg_sq: &s.exp_avg_sq,
                    step: &s.step,
                    weight_decay: if s.decay {
                        self.config.weight_decay
                    } else {
                        0.0
                    },
                })
            })
            .collect();
        let hyper = AdamW {
            lr,
            beta1: self.config.beta1,
            beta2: self.config.beta2,
            weight_decay: self.config.weight_decay,
            eps: self.config.eps,
        };
        master_adamw(&slots, hyper, &divisor).map_err(|e| TrainError::Optimizer(e.to_string()))?;
        finite_norm(&norm.wait()).map(Some)
    }

    /// The divisor that clips the gradients by their global norm `total` (an fp32 scalar on their
    /// device): max(norm / clip, 1), or 1 without clipping; not finite where the norm is not.
    fn divisor_of(&self, total: &Tensor) -> Tensor {
        let clip = self.config.clip_grad;
        if clip > 0.0 {
            (total / clip).clamp_min(1.0)
        } else {
            total * 0.0 + 1.0
        }
    }

    /// [`Optimizer::divisor_of`] and the norm itself; an error, and no step, when the norm is not
    /// finite.
    fn clip_divisor(&self, total: &Tensor) -> Result<(Tensor, f64), TrainError> {
        let norm = finite_norm(total)?;
        Ok((self.divisor_of(total), norm))
    }

    /// The slots' gradients in fp32 (`None` where a tensor has none). Gradients of a lower
    /// precision are upcast into one flat buffer by one multi-tensor copy, which is returned too
    /// (their global norm is then one reduction over it); fp32 gradients are used as they are.
    fn fp32_gradients(&self) -> Result<(Vec<Option<Tensor>>, Option<Tensor>), TrainError> {
        let grads = self.gradients();
        let low: Vec<&Tensor> = grads
            .iter()
            .flatten()
            .filter(|g| g.kind() != Kind::Float)
            .collect();
        if low.is_empty() {
            return Ok((grads, None));
        }
        let total: i64 = grads.iter().flatten().map(|g| g.numel() as i64).sum();
        let device = low[0].device();
        let flat = Tensor::empty([total], (Kind::Float, device));
        let mut offset = 0;
        let mut views = Vec::with_capacity(grads.len());
        let mut sources = Vec::with_capacity(grads.len());
        let upcast = grads
            .iter()
            .map(|g| {
                g.as_ref().map(|g| {
                    let n = g.numel() as i64;
                    let view = flat.narrow(0, offset, n).view(g.size().as_slice());
                    offset += n;
                    views.push(view.shallow_clone());
                    sources.push(g.shallow_clone());
                    view
                })
            })
            .collect();
        foreach_copy(&mut views, &sources).map_err(|e| TrainError::Optimizer(e.to_string()))?;
        Ok((upcast, Some(flat)))
    }

    /// Clips `grads` (one per slot; `None` leaves that tensor as it is) by their global norm and
    /// steps. `norm_over`: the gradients are this rank's shards, so the norm sums over its ranks.
    pub(crate) fn apply(
        &mut self,
        grads: &[Option<Tensor>],
        lr: f64,
        norm_over: Option<&ProcessGroup>,
    ) -> Result<f64, TrainError> {
        self.apply_with_norm(grads, lr, norm_over, None)
    }

    /// [`Optimizer::apply`]; `flat` (when given) holds every gradient of `grads` back to back, so
    /// their global norm is one reduction over it.
    fn apply_with_norm(
        &mut self,
        grads: &[Option<Tensor>],
        lr: f64,
        norm_over: Option<&ProcessGroup>,
        flat: Option<&Tensor>,
    ) -> Result<f64, TrainError> {
        let _guard = tch::no_grad_guard();
        let present: Vec<Tensor> = grads.iter().flatten().map(|g| g.shallow_clone()).collect();
        if present.is_empty() {
            return Ok(0.0);
        }
        let total = match (flat, norm_over) {
            (Some(flat), None) => flat.norm(),
            _ => {
                let norms =
                    foreach_norm(&present).map_err(|e| TrainError::Optimizer(e.to_string()))?;
                let mut squares = norms.square().sum(Kind::Float);
                if let Some(group) = norm_over {
                    group
                        .all_reduce(&mut squares, ooze_torch::dist::ReduceOp::Sum)
                        .map_err(dist_error)?;
                }
                squares.sqrt()
            }
        };
        // Clipping divides the gradients inside the AdamW kernel: max(norm / clip, 1).
        let (divisor, norm) = self.clip_divisor(&total)?;
        for decay in [true, false] {
            let mut params = Vec::new();
            let (mut g, mut m, mut v, mut st) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for (s, grad) in self.slots.iter().zip(grads) {
                let Some(grad) = grad else { continue };
                if s.decay != decay {
                    continue;
                }
                params.push(s.master.as_ref().unwrap_or(&s.model).shallow_clone());
                g.push(grad.shallow_clone());
                m.push(s.exp_avg.shallow_clone());
                v.push(s.exp_avg_sq.shallow_clone());
                st.push(s.step.shallow_clone());
            }
            if params.is_empty() {
                continue;
            }
            let hyper = AdamW {
                lr,
                beta1: self.config.beta1,
                beta2: self.config.beta2,
                weight_decay: if decay { self.config.weight_decay } else { 0.0 },
                eps: self.config.eps,
            };
            if fused_adamw_available() {
                fused_adamw(
                    &mut params,
                    &g,
                    &mut m,
                    &mut v,
                    &mut st,
                    hyper,
                    Some(&divisor),
                )
                .map_err(|e| TrainError::Optimizer(e.to_string()))?;
            } else {
                let g: Vec<Tensor> = g.iter().map(|g| g / &divisor).collect();
                adamw_unfused(&mut params, &g, &mut m, &mut v, &mut st, hyper);
            }
        }
        let (mut models, masters): (Vec<Tensor>, Vec<Tensor>) = self
            .slots
            .iter()
            .filter_map(|s| {
                s.master
                    .as_ref()
                    .map(|m| (s.model.shallow_clone(), m.shallow_clone()))
            })
            .unzip();
        if !models.is_empty() {
            foreach_copy(&mut models, &masters)
                .map_err(|e| TrainError::Optimizer(e.to_string()))?;
        }
        Ok(norm)
    }

    /// Makes every rank's weights, masters and moments rank `root`'s (ranks that loaded the same
    /// checkpoint agree already; this makes sure of it).
    pub fn broadcast(&mut self, group: &ProcessGroup, root: usize) -> Result<(), TrainError> {
        let _guard = tch::no_grad_guard();
        for s in &mut self.slots {
            let mut tensors = vec![s.model.shallow_clone(), s.exp_avg.shallow_clone()];
            tensors.push(s.exp_avg_sq.shallow_clone());
            tensors.push(s.step.shallow_clone());
            tensors.extend(s.master.as_ref().map(|m| m.shallow_clone()));
            for t in &mut tensors {
                group.broadcast(t, root).map_err(dist_error)?;
            }
        }
        Ok(())
    }

    /// The optimizer state as named fp32 tensors (for checkpoints).
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for s in &self.slots {
            out.push((format!("exp_avg.{}", s.name), s.exp_avg.shallow_clone()));
            out.push((
                format!("exp_avg_sq.{}", s.name),
                s.exp_avg_sq.shallow_clone(),
            ));
            out.push((format!("step.{}", s.name), s.step.reshape([1])));
            if let Some(master) = &s.master {
                out.push((format!("master.{}", s.name), master.shallow_clone()));
            }
        }
        out
    }

    /// The keys of [`Optimizer::state`], each with the name of its tensor.
    pub(crate) fn state_names(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for s in &self.slots {
            let mut prefixes = vec!["exp_avg", "exp_avg_sq", "step"];
            if s.master.is_some() {
                prefixes.push("master");
            }
            out.extend(
                prefixes
                    .into_iter()
                    .map(|p| (format!("{p}.{}", s.name), s.name.clone())),
            );
        }
        out
    }

    /// Restores [`Optimizer::state`]; every tensor must be there with its shape.
    pub fn load_state(
        &mut self,
        mut state: ooze_model::checkpoint::WeightSet,
    ) -> Result<(), TrainError> {
        let _guard = tch::no_grad_guard();
        for s in &mut self.slots {
            let take =
                |state: &mut ooze_model::checkpoint::WeightSet, key: String, shape: &[i64]| {
                    state.take(&key, shape).map_err(TrainError::from)
                };
            let shape = s.model.size();
            s.exp_avg
                .copy_(&take(&mut state, format!("exp_avg.{}", s.name), &shape)?);
            s.exp_avg_sq
                .copy_(&take(&mut state, format!("exp_avg_sq.{}", s.name), &shape)?);
            s.step
                .copy_(&take(&mut state, format!("step.{}", s.name), &[1])?.reshape([]));
            if let Some(master) = &mut s.master {
                master.copy_(&take(&mut state, format!("master.{}", s.name), &shape)?);
            }
        }
        state.finish().map_err(TrainError::from)
    }
}

/// The same update as the fused kernel, as separate operations (builds without the shim).
fn adamw_unfused(
    params: &mut [Tensor],
    grads: &[Tensor],
    exp_avgs: &mut [Tensor],
    exp_avg_sqs: &mut [Tensor],
    steps: &mut [Tensor],
    h: AdamW,
) {
    for ((((p, g), m), v), s) in params
        .iter_mut()
        .zip(grads)
        .zip(exp_avgs.iter_mut())
        .zip(exp_avg_sqs.iter_mut())
        .zip(steps.iter_mut())
    {
        let _ = s.g_add_scalar_(1.0);
        let t = s.double_value(&[]) as i32;
        let _ = p.g_mul_scalar_(1.0 - h.lr * h.weight_decay);
        let _ = m.g_mul_scalar_(h.beta1);
        let _ = m.g_add_(&(g * (1.0 - h.beta1)));
        let _ = v.g_mul_scalar_(h.beta2);
        let _ = v.g_add_(&(g.square() * (1.0 - h.beta2)));
        let step_size = h.lr / (1.0 - h.beta1.powi(t));
        let denom = (&*v / (1.0 - h.beta2.powi(t))).sqrt() + h.eps;
        let _ = p.g_sub_(&(&*m / denom * step_size));
    }
}

/// The gradient norm `total` (an fp32 scalar) read back; an error when it is not finite (the step
/// was, or will be, skipped).
fn finite_norm(total: &Tensor) -> Result<f64, TrainError> {
    let norm = total.double_value(&[]);
    if !norm.is_finite() {
        return Err(TrainError::NonFinite(format!(
            "gradient norm is {norm}; the step was skipped"
        )));
    }
    Ok(norm)
}
