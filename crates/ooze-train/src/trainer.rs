//! The trainer: one optimizer step over a batch of samples.
//!
//! An RL step: pack the samples into micro-batches by token budget; recompute the policy's
//! log-probs before the update (`logp_old`) and the frozen reference's, without gradients; turn
//! rewards into advantages (`ooze_algo::advantage`); weight every token for the step's aggregation;
//! then forward and backward each micro-batch (gradients accumulate), clip, and take one AdamW
//! step. An SFT step is the same with the masked negative log-likelihood and no recomputation.
//! Every term's micro-batch value is already weighted for the whole step, so the step's numbers do
//! not depend on the micro-batch split.

use crate::batch::check_trainable;
use crate::critic::{explained_variance, Critic, CriticConfig};
use crate::data_parallel::{complete_per_sample, dist_error, micro_batches, most_micro_batches};
use crate::forward::{response_log_probs, EntropyUse};
use crate::optimizer::{Optimizer, OptimizerConfig};
use crate::schedule::Schedule;
use crate::sharded_checkpoint::PendingWrite;
use crate::sharded_forward;
use crate::sharding::ShardedModel;
use crate::step::StepInputs;
use crate::teacher::{check_shape, distillation_gap, Teacher};
use crate::TrainError;
use ooze_algo::{
    compute_advantages, AdvantageConfig, Aggregation, Estimator, LossConfig, PolicyLoss,
    SampleInput,
};
use ooze_core::Sample;
use ooze_model::{Arithmetic, Decoder};
use ooze_torch::dist::ProcessGroup;
use ooze_torch::tch::{self, Device, Kind, Tensor};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainerConfig {
    pub optimizer: OptimizerConfig,
    pub schedule: Schedule,
    /// Token budget of one micro-batch (prompt + response tokens of its samples).
    pub max_tokens_per_micro_batch: usize,
    /// The rollout temperature: log-probs are `log_softmax(logits / T)` on both sides.
    pub temperature: f64,
    pub advantage: AdvantageConfig,
    pub loss: LossConfig,
    pub aggregation: Aggregation,
    /// Keep only each block's input during the forward pass and recompute the blocks in the
    /// backward pass (less memory, one more forward).
    pub recompute_activations: bool,
    /// The arithmetic of supervised steps ([`Trainer::sft_step`]), which have no engine's
    /// log-probs to agree with: the fastest by default (cuDNN's fused attention on Hopper where it
    /// pays, bf16 logits). RL steps always take the engine's arithmetic (FlashAttention-2 and fp32
    /// logits, bitwise the engine's log-probs): with cuDNN's attention in the trainer, the mean
    /// |trainer − engine| log-prob was 9.5e-3 and the max 0.064 (0.5B, ~2,000-token samples,
    /// H200; docs/benchmarks.md).
    pub sft_arithmetic: Arithmetic,
}

impl Default for TrainerConfig {
    fn default() -> Self {
        TrainerConfig {
            optimizer: OptimizerConfig::default(),
            schedule: Schedule::default(),
            max_tokens_per_micro_batch: 16_384,
            temperature: 1.0,
            advantage: AdvantageConfig::default(),
            loss: LossConfig::default(),
            aggregation: Aggregation::default(),
            recompute_activations: false,
            sft_arithmetic: Arithmetic::Fastest,
        }
    }
}

/// How the ranks of a run hold the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sharding {
    /// Sharded when a whole copy per GPU would not fit (the memory plan decides); replicated
    /// on CPUs and with one rank.
    #[default]
    Auto,
    /// Every rank holds the whole model and optimizer state (plain data parallelism: fastest
    /// for models that fit).
    Replicated,
    /// ZeRO-3: parameters, gradients, fp32 masters and moments split over the ranks.
    Sharded,
}

impl std::str::FromStr for Sharding {
    type Err = String;

    fn from_str(s: &str) -> Result<Sharding, String> {
        match s {
            "auto" => Ok(Sharding::Auto),
            "replicated" => Ok(Sharding::Replicated),
            "sharded" => Ok(Sharding::Sharded),
            _ => Err(format!(
                "unknown sharding `{s}`; expected auto, replicated or sharded"
            )),
        }
    }
}

/// What one step did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct StepMetrics {
    pub step: u64,
    pub lr: f64,
    pub loss: f64,
    pub policy_loss: f64,
    pub kl: Option<f64>,
    pub entropy: f64,
    pub observation_loss: Option<f64>,
    /// The critic's clipped value loss (ppo).
    pub value_loss: Option<f64>,
    pub critic_grad_norm: Option<f64>,
    /// The critic's learning rate this step.
    pub critic_lr: Option<f64>,
    /// `1 − Var(G − V) / Var(G)` of the values before the update over trained tokens.
    pub explained_variance: Option<f64>,
    /// Share of trained tokens (aggregation-weighted) whose value moved past the value clip.
    pub value_clipfrac: Option<f64>,
    /// A critic warm-up step: the critic learned, the policy's weights were left as they were.
    #[serde(default)]
    pub policy_frozen: bool,
    /// On-policy distillation: mean student − teacher log-prob over trained tokens, and the k3
    /// estimate of KL(student ‖ teacher).
    pub teacher_logp_gap: Option<f64>,
    pub teacher_kl: Option<f64>,
    pub clipfrac: f64,
    pub approx_kl: f64,
    pub importance_weight: Option<f64>,
    pub grad_norm: f64,
    pub samples: usize,
    pub micro_batches: usize,
    /// Tokens through the forward and backward passes.
    pub tokens: usize,
    pub response_tokens: usize,
    pub seconds: f64,
    pub tokens_per_second: f64,
    /// Model FLOPs of the step over all ranks (forward 2N, backward 4N per token, attention
    /// included; recomputation not counted).
    pub flops: f64,
    /// Model FLOPs per second over the dense bf16 peak of all the step's GPUs, on GPUs ooze knows.
    pub mfu: Option<f64>,
    /// |trainer − rollout engine| log-prob over trained tokens (RL steps with rollout log-probs).
    pub rollout_logp_diff_mean: Option<f64>,
    pub rollout_logp_diff_max: Option<f64>,
}

/// A reward post-processing function: the step's samples and their raw rewards in, the rewards
/// the estimator uses out.
pub type RewardHookFn = dyn Fn(&[SampleInput<'_>], &mut [f64]) + Send;

/// Per-sample values before the update and the targets the critic fits.
pub(crate) type CriticTargets<'a> = (&'a [Vec<f64>], &'a [Vec<f64>]);

pub struct Trainer {
    pub policy: Decoder,
    reference: Option<Decoder>,
    pub(crate) optimizer: Optimizer,
    /// The PPO critic, its own optimizer (the policy's settings) and its schedule and warm-up.
    pub(crate) critic: Option<(Critic, Optimizer)>,
    pub(crate) critic_config: CriticConfig,
    /// A teacher for on-policy distillation (`advantage.opd_coef`).
    teacher: Option<Teacher>,
    /// Replaces the built-in group normalisation of the rewards.
    reward_hook: Option<Box<RewardHookFn>>,
    /// The GPU's bf16 peak, for MFU.
    pub(crate) peak_flops: Option<f64>,
    pub config: TrainerConfig,
    pub(crate) step: u64,
    /// The ranks sharing each step, when there are several (or the policy is sharded).
    pub(crate) group: Option<Arc<ProcessGroup>>,
    /// The policy's parameters sharded over `group` (ZeRO-3); `None`: every rank holds them whole.
    pub(crate) shards: Option<ShardedModel>,
    /// The frozen reference's parameters, sharded beside a sharded policy.
    reference_shards: Option<ShardedModel>,
    /// The critic's parameters (its value head with the head unit), sharded beside a sharded
    /// policy; its optimizer then steps their slices.
    pub(crate) critic_shards: Option<ShardedModel>,
    /// A sharded checkpoint still being written.
    pending_write: std::sync::Mutex<Option<PendingWrite>>,
}

/// fp32 or, for an fp64 model, fp64 (gradient checks).
pub(crate) fn float_kind(decoder: &Decoder) -> Kind {
    if decoder.kind() == Kind::Double {
        Kind::Double
    } else {
        Kind::Float
    }
}

fn to_host(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(Kind::Double).to_device(Device::Cpu))
        .expect("invariant: a 1-D float tensor converts")
}

impl Trainer {
    pub fn new(
        policy: Decoder,
        reference: Option<Decoder>,
        config: TrainerConfig,
    ) -> Result<Trainer, TrainError> {
        Self::check_config(&config)?;
        let optimizer = Optimizer::new(policy.trainable_parameters(), config.optimizer.clone());
        Ok(Self::assemble(policy, reference, config, optimizer, None))
    }

    /// A trainer whose policy is sharded over the ranks of `group` (ZeRO-3; see
    /// [`crate::sharding`]): each rank keeps `1/world` of every parameter, gradient, fp32 master
    /// and AdamW moment, and gathers one unit of the policy at a time while it runs. The full
    /// copies `policy` was loaded with are freed (rank 0's values are taken). A frozen
    /// `reference` is sharded the same way (scored one gathered unit at a time). Activations are
    /// always recomputed. Every rank must call the same steps with the same samples.
    pub fn sharded(
        policy: Decoder,
        reference: Option<Decoder>,
        config: TrainerConfig,
        group: Arc<ProcessGroup>,
    ) -> Result<Trainer, TrainError> {
        Self::check_config(&config)?;
        let (model, slots) = ShardedModel::new(&policy, group.clone(), float_kind(&policy))?;
        let reference_shards = match &reference {
            Some(r) => Some(ShardedModel::frozen(r, group.clone())?),
            None => None,
        };
        let optimizer = Optimizer::for_shards(slots, config.optimizer.clone());
        let mut trainer = Self::assemble(policy, reference, config, optimizer, Some(model));
        trainer.reference_shards = reference_shards;
        group.barrier().map_err(dist_error)?;
        trainer.group = Some(group);
        Ok(trainer)
    }

    fn check_config(config: &TrainerConfig) -> Result<(), TrainError> {
        config.schedule.check().map_err(TrainError::Config)?;
        if config.max_tokens_per_micro_batch == 0 {
            return Err(TrainError::Config(
                "max_tokens_per_micro_batch must be positive".into(),
            ));
        }
        if config.advantage.kl_coef != 0.0 && config.loss.kl_loss_coef != 0.0 {
            return Err(TrainError::Config(
                "advantage.kl_coef (KL in the reward) and loss.kl_loss_coef (KL as a loss term) \
                 are mutually exclusive"
                    .into(),
            ));
        }
        Ok(())
    }

    fn assemble(
        policy: Decoder,
        reference: Option<Decoder>,
        config: TrainerConfig,
        optimizer: Optimizer,
        shards: Option<ShardedModel>,
    ) -> Trainer {
        let peak_flops = match policy.device() {
            Device::Cuda(i) => ooze_torch::cuda_driver::device_bf16_peak(i),
            _ => None,
        };
        Trainer {
            policy,
            reference,
            optimizer,
            critic: None,
            critic_config: CriticConfig::default(),
            teacher: None,
            reward_hook: None,
            peak_flops,
            config,
            step: 0,
            group: None,
            shards,
            reference_shards: None,
            critic_shards: None,
            pending_write: std::sync::Mutex::new(None),
        }
    }

    pub(crate) fn pending_write(&self) -> std::sync::MutexGuard<'_, Option<PendingWrite>> {
        self.pending_write
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The policy's whole weights under their HF names (for external engines): a sharded
    /// policy's are gathered and copied (every rank calls it); otherwise the policy's own tensors.
    pub fn whole_weights(&self) -> Result<Vec<(String, Tensor)>, TrainError> {
        let Some(model) = &self.shards else {
            return Ok(self.policy.named_parameters());
        };
        model.gather_all()?;
        let weights = self
            .policy
            .named_parameters()
            .into_iter()
            .map(|(name, t)| (name, t.detach().copy()))
            .collect();
        model.release_all();
        Ok(weights)
    }

    /// The frozen reference model, if any (beside a sharded policy its tensors are empty
    /// between passes: it is sharded too).
    pub fn reference(&self) -> Option<&Decoder> {
        self.reference.as_ref()
    }

    /// Whether the policy is sharded over ranks ([`Trainer::sharded`]).
    pub fn is_sharded(&self) -> bool {
        self.shards.is_some()
    }

    /// Copies the policy's current weights into `engine`, a decoder of the same shape with its
    /// own storage (a colocated rollout engine beside a sharded trainer): one all-gather per unit.
    /// Every rank must call it. Without sharding the engine shares the policy's storage already
    /// and this does nothing.
    pub fn sync_weights_into(&self, engine: &Decoder) -> Result<(), TrainError> {
        match &self.shards {
            Some(model) => model.copy_into(engine),
            None => Ok(()),
        }
    }

    /// Shares every later step with the ranks of `group` (plain data parallelism: each rank
    /// holds the whole model; each runs its span of a step's samples; gradients are summed). Makes
    /// the policy's and the critic's weights and optimizer state rank 0's first. Every rank must
    /// then call the same steps with the same samples.
    pub fn set_process_group(&mut self, group: Arc<ProcessGroup>) -> Result<(), TrainError> {
        if self.shards.is_some() {
            return Err(TrainError::Config(
                "this trainer is sharded over its ranks already (Trainer::sharded)".into(),
            ));
        }
        self.optimizer.broadcast(&group, 0)?;
        if let Some((_, optimizer)) = &mut self.critic {
            optimizer.broadcast(&group, 0)?;
        }
        group.barrier().map_err(dist_error)?;
        self.group = (group.world_size() > 1).then_some(group);
        Ok(())
    }

    /// Returns once every rank has called it (at once without ranks).
    pub fn barrier(&self) -> Result<(), TrainError> {
        match &self.group {
            Some(g) => g.barrier().map_err(dist_error),
            None => Ok(()),
        }
    }

    /// This process's rank and the number of ranks (0 and 1 without a group).
    pub fn rank(&self) -> (usize, usize) {
        self.group
            .as_ref()
            .map_or((0, 1), |g| (g.rank(), g.world_size()))
    }

    /// Adds a critic (needed by ppo); it trains on the value loss with its own AdamW state, its
    /// own learning-rate schedule, and alone for `config.warmup_steps` steps.
    pub fn set_critic(&mut self, critic: Critic, config: CriticConfig) -> Result<(), TrainError> {
        config
            .schedule
            .check()
            .map_err(|e| TrainError::Config(format!("critic {e}")))?;
        let optimizer = match (&self.shards, &self.group) {
            // Beside a sharded policy the critic is sharded too (rank 0's values are taken).
            (Some(_), Some(group)) => {
                let (model, slots) = ShardedModel::with_extra(
                    &critic.body,
                    vec![critic.named_head()],
                    group.clone(),
                    float_kind(&critic.body),
                )?;
                self.critic_shards = Some(model);
                Optimizer::for_shards(slots, self.config.optimizer.clone())
            }
            (_, group) => {
                let mut optimizer =
                    Optimizer::new(critic.trainable_parameters(), self.config.optimizer.clone());
                if let Some(group) = group {
                    optimizer.broadcast(group, 0)?;
                }
                optimizer
            }
        };
        self.critic = Some((critic, optimizer));
        self.critic_config = config;
        Ok(())
    }

    /// Adds a frozen teacher: its log-probs of the responses enter the advantages as
    /// `−opd_coef·(logp_old − logp_teacher)` (on-policy distillation).
    pub fn set_teacher(&mut self, teacher: Teacher) {
        self.teacher = Some(teacher);
    }

    /// The teacher's log-probs of the samples' responses.
    fn teacher_log_probs(&self, samples: &[Sample]) -> Result<Option<Vec<Vec<f64>>>, TrainError> {
        let Some(teacher) = &self.teacher else {
            return Ok(None);
        };
        let scores = match teacher {
            Teacher::Model(decoder) => self.score(decoder, samples)?,
            Teacher::Remote(scorer) => {
                let scores = scorer.response_log_probs(samples, self.config.temperature)?;
                check_shape(samples, &scores, "the remote teacher")?;
                scores
            }
        };
        Ok(Some(scores))
    }

    /// Replaces the built-in group normalisation of rewards with `hook` (slime's custom reward
    /// post-processing).
    pub fn set_reward_hook(&mut self, hook: Box<RewardHookFn>) {
        self.reward_hook = Some(hook);
    }

    pub fn critic(&self) -> Option<&Critic> {
        self.critic.as_ref().map(|(c, _)| c)
    }

    pub(crate) fn critic_optimizer_state(&self) -> Option<Vec<(String, Tensor)>> {
        self.critic.as_ref().map(|(_, o)| o.state())
    }

    pub(crate) fn critic_parts_mut(&mut self) -> Option<(&mut Critic, &mut Optimizer)> {
        self.critic.as_mut().map(|(c, o)| (c, o))
    }

    /// Optimizer steps taken.
    pub fn step(&self) -> u64 {
        self.step
    }

    pub(crate) fn set_step(&mut self, step: u64) {
        self.step = step;
    }

    pub(crate) fn optimizer(&self) -> &Optimizer {
        &self.optimizer
    }

    pub(crate) fn optimizer_mut(&mut self) -> &mut Optimizer {
        &mut self.optimizer
    }

    /// Checks that every sample can be trained (`rl`: and has a reward).
    fn check(&self, samples: &[Sample], rl: bool) -> Result<(), TrainError> {
        if samples.is_empty() {
            return Err(TrainError::Config(
                "a step needs at least one sample".into(),
            ));
        }
        let vocab = self.policy.config.vocab_size;
        samples
            .iter()
            .enumerate()
            .try_for_each(|(i, s)| check_trainable(s, i, vocab, rl))
    }

    /// Log-probs of every sample's response under `decoder`, without gradients.
    fn score(&self, decoder: &Decoder, samples: &[Sample]) -> Result<Vec<Vec<f64>>, TrainError> {
        self.per_sample(
            samples,
            |chosen| {
                Ok(
                    response_log_probs(decoder, chosen, self.config.temperature, self.head_mode())
                        .log_probs,
                )
            },
            None,
        )
    }

    /// [`Trainer::score`] under the policy, sharded or not.
    fn score_policy(&self, samples: &[Sample]) -> Result<Vec<Vec<f64>>, TrainError> {
        match &self.shards {
            Some(model) => self.score_sharded(&self.policy, model, samples),
            None => self.score(&self.policy, samples),
        }
    }

    /// [`Trainer::score`] under `decoder` sharded as `model` (the policy, or the reference).
    fn score_sharded(
        &self,
        decoder: &Decoder,
        model: &ShardedModel,
        samples: &[Sample],
    ) -> Result<Vec<Vec<f64>>, TrainError> {
        self.per_sample(
            samples,
            |chosen| {
                sharded_forward::score(
                    decoder,
                    model,
                    chosen,
                    self.config.temperature,
                    self.head_mode(),
                )
            },
            Some(&|| sharded_forward::idle_scoring(model)),
        )
    }

    /// How scoring passes run the head: the same arithmetic as the training forward (an entropy
    /// bonus needs the libtorch head), so that ratios start at exactly 1.
    fn head_mode(&self) -> EntropyUse {
        if self.config.loss.entropy_coef != 0.0 {
            EntropyUse::Gradient
        } else {
            EntropyUse::None
        }
    }

    /// `f` over each micro-batch without gradients, split back into per-sample host vectors.
    /// With ranks, each runs its own micro-batches and the ranks exchange the results. `idle`:
    /// `f`'s collectives without samples, run as often as this rank has fewer micro-batches than
    /// the rank with the most (sharded passes).
    fn per_sample(
        &self,
        samples: &[Sample],
        f: impl Fn(&[Sample]) -> Result<Tensor, TrainError>,
        idle: Option<&dyn Fn() -> Result<(), TrainError>>,
    ) -> Result<Vec<Vec<f64>>, TrainError> {
        let _guard = tch::no_grad_guard();
        let group = self.group.as_deref();
        let mut out: Vec<Option<Vec<f64>>> = vec![None; samples.len()];
        let ranges = micro_batches(samples, self.config.max_tokens_per_micro_batch, group);
        if let (Some(idle), Some(g)) = (idle, group) {
            for _ in ranges.len()..most_micro_batches(g, ranges.len(), self.policy.device())? {
                idle()?;
            }
        }
        for range in ranges {
            let flat = to_host(&f(&samples[range.clone()])?);
            let mut offset = 0;
            for i in range {
                let n = samples[i].response_length;
                out[i] = Some(flat[offset..offset + n].to_vec());
                offset += n;
            }
        }
        match group {
            Some(g) => complete_per_sample(g, samples, out, self.policy.device()),
            None => Ok(out
                .into_iter()
                .map(|v| v.expect("invariant: one process scores every sample"))
                .collect()),
        }
    }

    /// Mean negative log-likelihood per trained token (held-out loss of SFT), without gradients.
    pub fn eval_loss(&self, samples: &[Sample]) -> Result<f64, TrainError> {
        self.check(samples, false)?;
        let scores = self.score_policy(samples)?;
        let (mut sum, mut count) = (0.0, 0.0);
        for (s, lp) in samples.iter().zip(&scores) {
            for (l, &m) in lp.iter().zip(&s.loss_mask) {
                sum -= l * m as f64;
                count += m as f64;
            }
        }
        Ok(sum / count.max(1.0))
    }

    /// One supervised step: masked mean negative log-likelihood over the trained tokens.
    pub fn sft_step(&mut self, samples: &[Sample]) -> Result<StepMetrics, TrainError> {
        self.check(samples, false)?;
        let zeros: Vec<Vec<f64>> = samples
            .iter()
            .map(|s| vec![0.0; s.response_length])
            .collect();
        let loss_config = LossConfig {
            policy: PolicyLoss::Sft,
            importance: None,
            kl_loss_coef: 0.0,
            entropy_coef: 0.0,
            observation_coef: 0.0,
            ..self.config.loss.clone()
        };
        self.policy.set_arithmetic(self.config.sft_arithmetic);
        let metrics = self.run_step(
            samples,
            StepInputs {
                advantages: &zeros,
                old: None,
                reference: None,
                critic_targets: None,
                loss_config: &loss_config,
                aggregation: Aggregation::GlobalTokenMean,
            },
        );
        // Every other pass of the policy (RL steps, scoring) keeps the engine's arithmetic.
        self.policy.set_arithmetic(Arithmetic::Engine);
        metrics
    }

    /// One RL step over all of `samples` (see the module docs).
    pub fn rl_step(&mut self, samples: &[Sample]) -> Result<StepMetrics, TrainError> {
        let mut steps = self.rl_steps(samples, &[samples.len()])?;
        Ok(steps.pop().expect("invariant: one chunk gives one step"))
    }

    /// The optimizer steps of one rollout: `samples` in consecutive chunks of `step_sizes[k]`
    /// samples (the global batch; the caller keeps a prompt's samples, siblings included, in one
    /// chunk), one step each. The
    /// log-probs before the update (`logp_old`), the reference's and the advantages are computed
    /// once for the whole rollout, under the weights that generated it, so later chunks are
    /// importance-weighted against the rollout policy rather than the already-updated one.
    pub fn rl_steps(
        &mut self,
        samples: &[Sample],
        step_sizes: &[usize],
    ) -> Result<Vec<StepMetrics>, TrainError> {
        self.check(samples, true)?;
        if step_sizes.contains(&0) || step_sizes.iter().sum::<usize>() != samples.len() {
            return Err(TrainError::Config(format!(
                "steps of {step_sizes:?} samples do not cover the {} samples, each step at least one",
                samples.len()
            )));
        }
        if self.config.advantage.estimator == Estimator::Ppo && self.critic.is_none() {
            return Err(TrainError::Config(
                "the ppo estimator needs a critic (Trainer::set_critic)".into(),
            ));
        }
        let old = self.score_policy(samples)?;
        let reference = match (&self.reference, &self.reference_shards) {
            (Some(r), Some(model)) => Some(self.score_sharded(r, model, samples)?),
            (Some(r), None) => Some(self.score(r, samples)?),
            (None, _) => None,
        };
        let teacher = self.teacher_log_probs(samples)?;
        let old_values = match (&self.critic, &self.critic_shards) {
            (Some((c, _)), Some(model)) => Some(self.per_sample(
                samples,
                |chosen| {
                    sharded_forward::score_with(&c.body, model, chosen, |hidden, _| {
                        c.values_of(hidden)
                    })
                },
                Some(&|| sharded_forward::idle_scoring(model)),
            )?),
            (Some((c, _)), None) => {
                Some(self.per_sample(samples, |chosen| Ok(c.values(chosen)), None)?)
            }
            (None, _) => None,
        };
        let inputs: Vec<SampleInput<'_>> = samples
            .iter()
            .enumerate()
            .map(|(i, s)| SampleInput {
                group: s.group,
                rollout: s.execution as u64,
                reward: s
                    .reward
                    .expect("invariant: checked (an RL sample has a reward)"),
                mask: &s.loss_mask,
                logp_old: Some(&old[i]),
                logp_ref: reference.as_ref().map(|r| r[i].as_slice()),
                values: old_values.as_ref().map(|v| v[i].as_slice()),
                logp_teacher: teacher.as_ref().map(|t| t[i].as_slice()),
            })
            .collect();
        let hook = self
            .reward_hook
            .as_deref()
            .map(|h| h as &dyn Fn(&[SampleInput<'_>], &mut [f64]));
        let advantages = compute_advantages(&inputs, &self.config.advantage, hook)?;
        // The critic fits the returns (ppo) or, for the other estimators, the advantages.
        let returns = advantages
            .returns
            .as_ref()
            .unwrap_or(&advantages.advantages);
        let loss_config = self.config.loss.clone();
        let aggregation = self.config.aggregation;
        let mut steps = Vec::new();
        let mut start = 0;
        for &size in step_sizes {
            let r = start..start + size;
            start += size;
            let chunk = &samples[r.clone()];
            let mut metrics = self.run_step(
                chunk,
                StepInputs {
                    advantages: &advantages.advantages[r.clone()],
                    old: Some(&old[r.clone()]),
                    reference: reference.as_ref().map(|x| &x[r.clone()]),
                    critic_targets: old_values
                        .as_ref()
                        .map(|v| (&v[r.clone()], &returns[r.clone()])),
                    loss_config: &loss_config,
                    aggregation,
                },
            )?;
            if let Some(values) = &old_values {
                let masks: Vec<&[u8]> = chunk.iter().map(|s| s.loss_mask.as_slice()).collect();
                metrics.explained_variance =
                    explained_variance(&masks, &values[r.clone()], &returns[r.clone()]);
            }
            if let Some(teacher) = &teacher {
                let (gap, kl) = distillation_gap(chunk, &old[r.clone()], &teacher[r.clone()]);
                (metrics.teacher_logp_gap, metrics.teacher_kl) = (Some(gap), Some(kl));
            }
            steps.push(metrics);
        }
        Ok(steps)
    }

    /// Model FLOPs of a step over `samples` (all ranks' together): `2N` per token for the
    /// forward plus `4N` for the backward, with causal attention `2·layers·(q heads·head_dim)·n²`
    /// per sequence for the forward and twice that for the backward.
    pub(crate) fn flops(&self, samples: &[Sample]) -> f64 {
        let c = &self.policy.config;
        let n = match &self.shards {
            Some(model) => model.num_parameters(),
            None => self.optimizer.num_parameters(),
        } as f64;
        let tokens: f64 = samples.iter().map(|s| s.tokens.len() as f64).sum();
        let attention: f64 = samples
            .iter()
            .map(|s| {
                let len = s.tokens.len() as f64;
                2.0 * c.num_layers as f64 * (c.num_heads * c.head_dim) as f64 * len * len
            })
            .sum();
        (2.0 * n * tokens + attention) * 3.0
    }
}

/// Per-phase timings of a step on stderr when `OOZE_TRAIN_PROFILE` is set (synchronises the GPU,
/// so only for looking).
pub(crate) struct Phases {
    device: Device,
    started: Option<Instant>,
}

impl Phases {
    pub(crate) fn start(device: Device) -> Phases {
        let on = std::env::var_os("OOZE_TRAIN_PROFILE").is_some();
        let p = Phases {
            device,
            started: on.then(Instant::now),
        };
        if on {
            p.sync();
        }
        p
    }

    fn sync(&self) {
        if let Device::Cuda(i) = self.device {
            ooze_torch::cuda_graph::synchronize(i);
        }
    }

    pub(crate) fn mark(&self) -> Option<Instant> {
        self.started.map(|_| {
            self.sync();
            Instant::now()
        })
    }

    pub(crate) fn report(&self, middle: Option<Instant>, first: &str, second: &str) {
        if let (Some(start), Some(middle)) = (self.started, middle) {
            self.sync();
            eprintln!(
                "train profile: {first} {:.1} ms, {second} {:.1} ms",
                (middle - start).as_secs_f64() * 1e3,
                middle.elapsed().as_secs_f64() * 1e3
            );
        }
    }
}
