//! One optimizer step of the trainer: per-token aggregation weights over the whole step, then
//! micro-batches packed to the token budget (each a forward, the loss terms and a backward,
//! gradients accumulating), then the optimizer steps of the policy and the critic. The step's
//! loss is the sum of its micro-batches' (`ooze_algo::aggregate`), however the step is split.

use crate::data_parallel::{micro_batches, most_micro_batches, sum_over_ranks};
use crate::forward::{
    response_log_probs, response_log_probs_recomputed, EntropyUse, Recomputed, ResponseScores,
};
use crate::sharded_forward;
use crate::sharding::{Pass, ShardedModel};
use crate::trainer::{float_kind, CriticTargets, Phases, StepMetrics, Trainer};
use crate::TrainError;
use ooze_algo::loss::loss;
use ooze_algo::{token_weights, Aggregation, LossConfig, LossInputs, PolicyLoss, StepSample};
use ooze_core::Sample;
use ooze_torch::dist::ReduceOp;
use ooze_torch::tch::{Kind, Tensor};
use ooze_torch::transfer::{upload, Download};
use std::ops::Range;
use std::time::Instant;

/// What every micro-batch of a step takes its slice of.
pub(crate) struct StepInputs<'a> {
    /// Per-token advantages of every sample of the step.
    pub advantages: &'a [Vec<f64>],
    /// `logp_old` (RL; SFT: none, the ratio is 1).
    pub old: Option<&'a [Vec<f64>]>,
    pub reference: Option<&'a [Vec<f64>]>,
    /// The critic's old values and its targets.
    pub critic_targets: Option<CriticTargets<'a>>,
    pub loss_config: &'a LossConfig,
    pub aggregation: Aggregation,
}

/// Step-wide sums of the terms only some steps have.
#[derive(Default)]
struct OptionalSums {
    kl: Option<f64>,
    observation: Option<f64>,
    importance_weight: Option<f64>,
    value: Option<f64>,
    value_clipped: Option<f64>,
}

/// The numbers a micro-batch adds to its step's.
#[derive(Clone, Copy)]
enum Sum {
    Loss,
    PolicyLoss,
    Clipfrac,
    ApproxKl,
    Entropy,
    Kl,
    Observation,
    ImportanceWeight,
    Value,
    ValueClipped,
    RolloutDiff,
}

const SUMS: usize = Sum::RolloutDiff as usize + 1;

/// A step's numbers as fp64 scalars on the device, summed over its micro-batches and read back
/// once: reading them per micro-batch would hold the host until the GPU had drained, before each
/// next micro-batch could be prepared and queued.
#[derive(Default)]
struct DeviceSums {
    sums: [Option<Tensor>; SUMS],
    /// The largest |trainer − rollout| log-prob difference.
    rollout_diff_max: Option<Tensor>,
}

impl DeviceSums {
    fn add(&mut self, which: Sum, value: &Tensor) {
        let value = value.detach().to_kind(Kind::Double).reshape([1]);
        let slot = &mut self.sums[which as usize];
        *slot = Some(match slot.take() {
            Some(sum) => sum + value,
            None => value,
        });
    }

    fn add_max(&mut self, value: &Tensor) {
        let value = value.detach().to_kind(Kind::Double).reshape([1]);
        self.rollout_diff_max = Some(match self.rollout_diff_max.take() {
            Some(max) => max.maximum(&value),
            None => value,
        });
    }

    /// Starts the copy of the sums to the host (one copy, queued behind the work that computes
    /// them, without waiting): [`CopyingSums::read`] takes the values.
    fn start_read(self) -> CopyingSums {
        let present: Vec<Tensor> = self
            .sums
            .iter()
            .chain([&self.rollout_diff_max])
            .flatten()
            .map(|t| t.shallow_clone())
            .collect();
        let copy = (!present.is_empty())
            .then(|| Download::start(&Tensor::cat(&present, 0).to_kind(Kind::Double)));
        CopyingSums { sums: self, copy }
    }

    /// The sums (None: no micro-batch had that number) and the maximum, in one copy to the host.
    fn read(self) -> Result<([Option<f64>; SUMS], Option<f64>), TrainError> {
        self.start_read().read()
    }
}

/// [`DeviceSums`] on their way to the host.
struct CopyingSums {
    sums: DeviceSums,
    copy: Option<Download>,
}

impl CopyingSums {
    /// The sums (None: no micro-batch had that number) and the maximum, once their copy is done
    /// (work queued after it, such as the optimizer's kernels, may still be running).
    fn read(self) -> Result<([Option<f64>; SUMS], Option<f64>), TrainError> {
        let mut values = match self.copy {
            Some(copy) => {
                Vec::<f64>::try_from(copy.wait()).map_err(ooze_model::ModelError::from)?
            }
            None => Vec::new(),
        }
        .into_iter();
        let sums = self
            .sums
            .sums
            .map(|t| t.map(|_| values.next().expect("one value per sum")));
        let max = self
            .sums
            .rollout_diff_max
            .map(|_| values.next().expect("one value for the maximum"));
        Ok((sums, max))
    }
}

/// A step's sums once its micro-batches have run: still on the device (or on their way to the
/// host), or read (and combined over the ranks).
enum StepSums {
    OnDevice(DeviceSums),
    Copying(CopyingSums),
    Read(OptionalSums),
}

impl OptionalSums {
    /// The step's numbers from the device sums.
    fn from_device(
        sums: DeviceSums,
        metrics: &mut StepMetrics,
    ) -> Result<OptionalSums, TrainError> {
        Self::from_values(sums.read()?, metrics)
    }

    /// The step's numbers from the sums' values.
    fn from_values(
        (sums, max): ([Option<f64>; SUMS], Option<f64>),
        metrics: &mut StepMetrics,
    ) -> Result<OptionalSums, TrainError> {
        let get = |which: Sum| sums[which as usize];
        metrics.loss = get(Sum::Loss).unwrap_or(0.0);
        metrics.policy_loss = get(Sum::PolicyLoss).unwrap_or(0.0);
        metrics.clipfrac = get(Sum::Clipfrac).unwrap_or(0.0);
        metrics.approx_kl = get(Sum::ApproxKl).unwrap_or(0.0);
        metrics.entropy = get(Sum::Entropy).unwrap_or(0.0);
        metrics.rollout_logp_diff_mean = get(Sum::RolloutDiff);
        metrics.rollout_logp_diff_max = max;
        Ok(OptionalSums {
            kl: get(Sum::Kl),
            observation: get(Sum::Observation),
            importance_weight: get(Sum::ImportanceWeight),
            value: get(Sum::Value),
            value_clipped: get(Sum::ValueClipped),
        })
    }
}

/// Aggregation weights of every sample's tokens under `mode`, over the mask `mask` picks.
fn step_weights(
    samples: &[Sample],
    mode: Aggregation,
    mask: impl Fn(&Sample) -> &[u8],
) -> Vec<Vec<f32>> {
    let views: Vec<StepSample<'_>> = samples
        .iter()
        .map(|s| StepSample {
            group: s.group,
            rollout: s.execution as u64,
            mask: mask(s),
        })
        .collect();
    token_weights(&views, mode)
}

impl Trainer {
    pub(crate) fn run_step(
        &mut self,
        samples: &[Sample],
        inputs: StepInputs<'_>,
    ) -> Result<StepMetrics, TrainError> {
        let started = Instant::now();
        let weights = step_weights(samples, inputs.aggregation, |s| &s.loss_mask);
        let observation_weights = (inputs.loss_config.observation_coef != 0.0).then(|| {
            step_weights(samples, Aggregation::SeqMeanTokenMean, |s| {
                &s.observation_mask
            })
        });
        let mut metrics = StepMetrics {
            step: self.step,
            lr: self.config.schedule.lr_at(self.step),
            samples: samples.len(),
            ..Default::default()
        };
        let ranges = micro_batches(
            samples,
            self.config.max_tokens_per_micro_batch,
            self.group.as_deref(),
        );
        metrics.micro_batches = ranges.len();
        if let Some(model) = &mut self.shards {
            model.zero_grad();
        }
        if let Some(model) = &mut self.critic_shards {
            model.zero_grad();
        }
        if let Some(model) = &self.shards {
            // Every rank joins every sharded pass: one short of micro-batches runs empty ones
            // (the others' gradients still reach its shards), the critic's interleaved with the
            // policy's as in a micro-batch.
            let critic = self
                .critic_shards
                .as_ref()
                .filter(|_| inputs.critic_targets.is_some());
            let most = most_micro_batches(model.group(), ranges.len(), self.policy.device())?;
            for _ in ranges.len()..most {
                match critic {
                    None => sharded_forward::idle_training(model)?,
                    Some(critic) => idle_with_critic(model, critic)?,
                }
            }
        }
        self.optimizer.zero_grad();
        if let Some((_, o)) = self.critic.as_mut() {
            o.zero_grad();
        }
        let mut device_sums = DeviceSums::default();
        for range in ranges {
            self.micro_batch(
                samples,
                range,
                &inputs,
                (&weights, observation_weights.as_deref()),
                &mut device_sums,
            )?;
        }
        // With ranks the sums are combined now; alone they are read after the optimizer step is
        // queued, so its host work overlaps the backward pass still running on the GPU.
        let sums = if self.group.is_some() {
            let mut sums = OptionalSums::from_device(device_sums, &mut metrics)?;
            self.sum_over_ranks(&mut metrics, &mut sums)?;
            StepSums::Read(sums)
        } else {
            StepSums::OnDevice(device_sums)
        };
        self.finish_step(samples, &inputs, metrics, sums, started)
    }

    /// The step's sums over the ranks' micro-batches (each rank has its own part of them).
    fn sum_over_ranks(
        &self,
        metrics: &mut StepMetrics,
        sums: &mut OptionalSums,
    ) -> Result<(), TrainError> {
        let group = self.group.as_deref().expect("invariant: called with ranks");
        let device = self.policy.device();
        let mut optional = [
            &mut sums.kl,
            &mut sums.observation,
            &mut sums.importance_weight,
            &mut sums.value,
            &mut sums.value_clipped,
            &mut metrics.rollout_logp_diff_mean,
        ];
        // The five sums, then a count of the ranks that had each optional sum, then those sums.
        let mut values = vec![
            metrics.loss,
            metrics.policy_loss,
            metrics.clipfrac,
            metrics.approx_kl,
            metrics.entropy,
            metrics.micro_batches as f64,
        ];
        values.extend(optional.iter().map(|o| o.is_some() as u8 as f64));
        values.extend(optional.iter().map(|o| o.unwrap_or(0.0)));
        let total = sum_over_ranks(group, &values, ReduceOp::Sum, device)?;
        [
            metrics.loss,
            metrics.policy_loss,
            metrics.clipfrac,
            metrics.approx_kl,
            metrics.entropy,
        ] = [total[0], total[1], total[2], total[3], total[4]];
        metrics.micro_batches = total[5] as usize;
        let n = optional.len();
        for (k, o) in optional.iter_mut().enumerate() {
            **o = (total[6 + k] > 0.0).then_some(total[6 + n + k]);
        }
        // Every rank joins the maximum when any rank compared with the rollout's log-probs.
        if total[6 + n - 1] > 0.0 {
            let local = metrics.rollout_logp_diff_max.unwrap_or(0.0);
            metrics.rollout_logp_diff_max =
                Some(sum_over_ranks(group, &[local], ReduceOp::Max, device)?[0]);
        }
        Ok(())
    }

    /// The forward, loss and backward of `samples[range]`; adds its numbers to the step's.
    fn micro_batch(
        &mut self,
        samples: &[Sample],
        range: Range<usize>,
        inputs: &StepInputs<'_>,
        (weights, observation_weights): (&[Vec<f32>], Option<&[Vec<f32>]>),
        sums: &mut DeviceSums,
    ) -> Result<(), TrainError> {
        let kind = float_kind(&self.policy);
        let device = self.policy.device();
        // Queued uploads (a plain `to_device` would wait here for the forward pass just queued).
        let t = |v: Vec<f64>| upload(&v, device).to_kind(kind);
        let chosen = &samples[range.clone()];
        let gather = |all: &[Vec<f64>]| t(all[range.clone()].concat());
        let gather32 = |all: &[Vec<f32>]| {
            t(all[range.clone()]
                .iter()
                .flatten()
                .map(|&x| x as f64)
                .collect())
        };
        // Entropy: a loss term, an RL metric, or (SFT) nothing.
        let want_entropy = if inputs.loss_config.policy == PolicyLoss::Sft {
            EntropyUse::None
        } else if inputs.loss_config.entropy_coef != 0.0 {
            EntropyUse::Gradient
        } else {
            EntropyUse::Value
        };
        let phase = Phases::start(device);
        let mut pass = self.shards.as_ref().map(|m| m.pass(m.training_order()));
        let (scores, recomputed) = self.policy_forward(chosen, want_entropy, pass.as_mut())?;
        let logp = scores.log_probs;
        let logp_old = match inputs.old {
            Some(old) => gather(old),
            None => logp.detach(),
        };
        let mask = t(chosen
            .iter()
            .flat_map(|s| s.loss_mask.iter().map(|&m| m as f64))
            .collect());
        let index: Vec<i64> = chosen
            .iter()
            .enumerate()
            .flat_map(|(i, s)| std::iter::repeat_n(i as i64, s.response_length))
            .collect();
        let rollout = chosen
            .iter()
            .all(|s| !s.rollout_log_probs.is_empty())
            .then(|| {
                t(chosen
                    .iter()
                    .flat_map(|s| s.rollout_log_probs.iter().map(|&x| x as f64))
                    .collect())
            });
        let (advantages, weights_t) = (gather(inputs.advantages), gather32(weights));
        let reference_t = inputs.reference.map(&gather);
        let observation_t = observation_weights.map(gather32);
        let sample_index = upload(&index, device);
        let mut critic_backward = None;
        let critic_inputs = match inputs.critic_targets {
            Some((old_values, returns)) if self.critic.is_some() => {
                let (values, backward) = self.critic_forward(chosen)?;
                critic_backward = backward;
                Some((values, gather(old_values), gather(returns)))
            }
            _ => None,
        };
        let terms = loss(
            &LossInputs {
                logp: &logp,
                logp_old: &logp_old,
                advantages: &advantages,
                mask: &mask,
                weights: &weights_t,
                sample_index: &sample_index,
                num_samples: chosen.len() as i64,
                logp_roll: rollout.as_ref(),
                logp_ref: reference_t.as_ref(),
                entropy: scores.entropy.as_ref(),
                values: critic_inputs.as_ref().map(|(v, o, r)| (v, o, r)),
                observation_weights: observation_t.as_ref(),
            },
            inputs.loss_config,
        );
        let forward_done = phase.mark();
        terms.total.backward();
        self.policy_backward(recomputed, pass)?;
        if let (Some((r, mut pass)), Some(model), Some((critic, _))) =
            (critic_backward, &self.critic_shards, &self.critic)
        {
            sharded_forward::backward(r, &critic.body, model, &mut pass)?;
            pass.finish()?;
        }
        phase.report(forward_done, "micro-batch forward", "backward");
        sums.add(Sum::Loss, &terms.total);
        sums.add(Sum::PolicyLoss, &terms.policy);
        sums.add(Sum::Clipfrac, &terms.clipfrac);
        sums.add(Sum::ApproxKl, &terms.approx_kl);
        if let Some(e) = &scores.entropy {
            sums.add(Sum::Entropy, &(e.detach() * &weights_t).sum(kind));
        }
        for (which, term) in [
            (Sum::Kl, &terms.kl),
            (Sum::Observation, &terms.observation),
            (Sum::ImportanceWeight, &terms.importance_weight),
            (Sum::Value, &terms.value),
        ] {
            if let Some(term) = term {
                sums.add(which, term);
            }
        }
        if let Some((v, v_old, _)) = &critic_inputs {
            let moved = (v.detach() - v_old)
                .abs()
                .gt(inputs.loss_config.value_clip)
                .to_kind(weights_t.kind());
            sums.add(Sum::ValueClipped, &(moved * &weights_t).sum(kind));
        }
        if let Some(roll) = &rollout {
            let diff = (&logp_old - roll).abs() * &mask;
            sums.add(Sum::RolloutDiff, &diff.sum(kind));
            sums.add_max(&diff.max());
        }
        Ok(())
    }

    /// The critic's values of a micro-batch. A sharded critic runs a pass of its own beside the
    /// policy's; what its backward needs (after the loss's) comes back with them.
    fn critic_forward(
        &self,
        chosen: &[Sample],
    ) -> Result<(Tensor, Option<(Recomputed, Pass<'_>)>), TrainError> {
        let (critic, _) = self
            .critic
            .as_ref()
            .expect("invariant: called with a critic");
        let Some(model) = &self.critic_shards else {
            return Ok((critic.values(chosen), None));
        };
        let mut pass = model.pass(model.training_order());
        let (values, recomputed) =
            sharded_forward::forward_with(&critic.body, model, &mut pass, chosen, |hidden, _| {
                critic.values_of(hidden)
            })?;
        Ok((values, Some((recomputed, pass))))
    }

    /// The policy's forward of a micro-batch: sharded (units gathered in `pass`), with
    /// recomputation, or plain. With a [`Recomputed`], call [`Trainer::policy_backward`] after the
    /// loss's backward pass.
    fn policy_forward(
        &self,
        chosen: &[Sample],
        entropy: EntropyUse,
        pass: Option<&mut Pass<'_>>,
    ) -> Result<(ResponseScores, Option<Recomputed>), TrainError> {
        let temperature = self.config.temperature;
        Ok(match (&self.shards, pass) {
            (Some(model), Some(pass)) => {
                let (scores, r) = sharded_forward::forward(
                    &self.policy,
                    model,
                    pass,
                    chosen,
                    temperature,
                    entropy,
                )?;
                (scores, Some(r))
            }
            _ if self.config.recompute_activations => {
                let (scores, r) =
                    response_log_probs_recomputed(&self.policy, chosen, temperature, entropy);
                (scores, Some(r))
            }
            _ => (
                response_log_probs(&self.policy, chosen, temperature, entropy),
                None,
            ),
        })
    }

    /// The blocks' backward of a recomputed (or sharded) forward, after the loss's own; a
    /// sharded pass ends with its gradients reduce-scattered.
    fn policy_backward(
        &self,
        recomputed: Option<Recomputed>,
        pass: Option<Pass<'_>>,
    ) -> Result<(), TrainError> {
        match (recomputed, &self.shards, pass) {
            (Some(r), Some(model), Some(mut pass)) => {
                sharded_forward::backward(r, &self.policy, model, &mut pass)?;
                pass.finish()
            }
            (Some(r), _, _) => {
                r.backward(&self.policy);
                Ok(())
            }
            (None, _, pass) => pass.map_or(Ok(()), Pass::finish),
        }
    }

    /// The step's numbers from its sums, then the optimizer steps (the policy's skipped during the
    /// critic's warm-up).
    fn finish_step(
        &mut self,
        samples: &[Sample],
        inputs: &StepInputs<'_>,
        mut metrics: StepMetrics,
        sums: StepSums,
        started: Instant,
    ) -> Result<StepMetrics, TrainError> {
        let device = self.policy.device();
        // The sums go to the host ahead of the optimizer's kernels, and the step returns once they
        // and the gradient norm are read: the optimizer's kernels may still be running, so the
        // host prepares the next step meanwhile (work queued later on the stream follows them).
        let sums = match sums {
            StepSums::OnDevice(s) => StepSums::Copying(s.start_read()),
            other => other,
        };
        let phase = Phases::start(device);
        // A critic warm-up step leaves the policy as it is (its gradients are dropped).
        metrics.policy_frozen = inputs.critic_targets.is_some()
            && self.critic.is_some()
            && self.step < self.critic_config.warmup_steps;
        if !metrics.policy_frozen {
            metrics.grad_norm = match &self.shards {
                Some(model) => {
                    self.optimizer
                        .apply(&model.gradients(), metrics.lr, Some(model.group()))?
                }
                None => self.optimizer.step(metrics.lr, self.group.as_deref())?,
            };
        }
        let optimizer_done = phase.mark();
        phase.report(optimizer_done, "optimizer", "-");
        self.optimizer.zero_grad();
        if let (Some((_, optimizer)), Some(_)) = (self.critic.as_mut(), inputs.critic_targets) {
            let lr = self.critic_config.schedule.lr_at(self.step);
            metrics.critic_lr = Some(lr);
            metrics.critic_grad_norm = Some(match &self.critic_shards {
                Some(model) => optimizer.apply(&model.gradients(), lr, Some(model.group()))?,
                None => optimizer.step(lr, self.group.as_deref())?,
            });
            optimizer.zero_grad();
        }
        self.step += 1;
        let sums = match sums {
            StepSums::Read(sums) => sums,
            StepSums::OnDevice(sums) => OptionalSums::from_device(sums, &mut metrics)?,
            StepSums::Copying(sums) => OptionalSums::from_values(sums.read()?, &mut metrics)?,
        };
        let trained: f64 = samples
            .iter()
            .map(|s| s.loss_mask.iter().map(|&m| m as f64).sum::<f64>())
            .sum();
        if let Some(sum) = metrics.rollout_logp_diff_mean {
            metrics.rollout_logp_diff_mean = Some(sum / trained.max(1.0));
        }
        metrics.kl = sums.kl;
        metrics.observation_loss = sums.observation;
        metrics.importance_weight = sums.importance_weight;
        metrics.value_loss = sums.value;
        metrics.value_clipfrac = sums.value_clipped;
        metrics.tokens = samples.iter().map(|s| s.tokens.len()).sum();
        metrics.response_tokens = samples.iter().map(|s| s.response_length).sum();
        // The step's own passes: one forward and its backward over every sample. `logp_old` and
        // the reference's log-probs were computed before the step, outside its time, and
        // activation recomputation is not counted (model FLOPs, not hardware FLOPs).
        metrics.flops = self.flops(samples);
        // Host time from the call to the return: with steps back to back, one step's period on
        // the GPU (the last step's optimizer kernels finish after it returns).
        metrics.seconds = started.elapsed().as_secs_f64();
        metrics.tokens_per_second = metrics.tokens as f64 / metrics.seconds;
        // The ranks share the step's samples, so its FLOPs are over all their GPUs.
        let gpus = self.group.as_ref().map_or(1, |g| g.world_size()) as f64;
        metrics.mfu = self
            .peak_flops
            .map(|peak| metrics.flops / metrics.seconds / (peak * gpus));
        Ok(metrics)
    }
}

/// An empty micro-batch of a sharded policy and a sharded critic: their collectives in a
/// micro-batch's order (both forwards, then the policy's backward, then the critic's).
fn idle_with_critic(policy: &ShardedModel, critic: &ShardedModel) -> Result<(), TrainError> {
    let mut p = policy.pass(policy.training_order());
    let mut c = critic.pass(critic.training_order());
    sharded_forward::idle_forward(policy, &mut p)?;
    sharded_forward::idle_forward(critic, &mut c)?;
    sharded_forward::idle_backward(policy, &mut p)?;
    p.finish()?;
    sharded_forward::idle_backward(critic, &mut c)?;
    c.finish()
}
