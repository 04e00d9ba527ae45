//! Ranks on Gloo (threads of this test, each with its own trainer, model and process group) take
//! the one-process steps: the same losses within 1e-5 over 5 steps and the same final weights,
//! for GRPO, PPO with a critic, and SFT, also with more ranks than a step has samples; every rank
//! ends with identical weights. Both plain data parallelism (every rank holds the whole model) and
//! sharded training (ZeRO-3: each rank a third or a half of every tensor, the blocks gathered one
//! at a time), with tied and untied LM heads.

use ooze_algo::Estimator;
use ooze_model::init::{init_model, InitOptions, Size};
use ooze_model::{Decoder, Family};
use ooze_torch::dist::{free_port, Backend, ProcessGroup, Rendezvous};
use ooze_torch::tch::{Device, Kind, Tensor};
use ooze_train::critic::Critic;
use ooze_train::{checkpoint, CriticConfig, Sample, Trainer, TrainerConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

fn tiny_model(dir: &Path, tied: bool) {
    let mut options = InitOptions::new(Family::Qwen2, Size::Tiny);
    options.tokenizer_vocab = 300;
    options.seed = 21;
    options.tie_word_embeddings = tied;
    init_model(dir, &ooze_model::corpus::generate(1, 20_000), &options).unwrap();
}

/// `n` samples in groups of two, of varied lengths, with a tool token in the longer ones.
fn samples(n: usize) -> Vec<Sample> {
    (0..n)
        .map(|i| {
            let prompt: Vec<u32> = (0..2 + i % 3)
                .map(|k| (7 + 13 * i + k) as u32 % 290)
                .collect();
            let mut s = Sample {
                group: (i / 2) as u64,
                execution: i,
                reward: Some(((i * 7) % 5) as f64 / 4.0),
                ..Sample::with_prompt(prompt)
            };
            let len = 3 + (i * 5) % 9;
            for k in 0..len {
                let t = (11 + 31 * i + 17 * k) as u32 % 290;
                if len > 6 && k == len - 2 {
                    s.push_observation(&[t]);
                } else {
                    s.push_generated(&[t], &[-1.0 - 0.05 * k as f32], &[])
                        .unwrap();
                }
            }
            s
        })
        .collect()
}

/// How the ranks hold the model.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Replicated,
    Sharded,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind2 {
    Grpo,
    /// GRPO with a KL loss against a frozen reference (sharded beside a sharded policy).
    GrpoKl,
    Ppo,
    Sft,
}

struct Run {
    losses: Vec<f64>,
    extra: Vec<f64>,
    weights: Vec<f64>,
}

/// The policy's whole weights (a sharded one's gathered into a copy, as a rollout engine's are).
fn flat_weights(t: &Trainer, dir: &Path) -> Vec<f64> {
    if t.is_sharded() {
        let copy = Decoder::load(dir, Device::Cpu, Kind::Float).unwrap();
        t.sync_weights_into(&copy).unwrap();
        return decoder_weights(&copy);
    }
    decoder_weights(&t.policy)
}

fn decoder_weights(d: &Decoder) -> Vec<f64> {
    let parts: Vec<Tensor> = d
        .trainable_parameters()
        .into_iter()
        .map(|(_, p)| p.detach().to_kind(Kind::Double).reshape([-1]))
        .collect();
    Vec::<f64>::try_from(Tensor::cat(&parts, 0)).unwrap()
}

/// One rank's 5 steps; `rendezvous` is None for the one-process run.
fn rank_run(dir: PathBuf, what: Kind2, n: usize, rendezvous: Option<(Rendezvous, Mode)>) -> Run {
    let mut config = TrainerConfig::default();
    // Adam's update is about lr·sign(g) where a gradient is near zero, so the last-bit noise of
    // another summation order moves such weights by a good part of lr: one process with
    // another micro-batch split differs from this one by 3.4e-5 at lr 3e-3. At 3e-4 the
    // comparison of final weights within 1e-5 has room, and the steps still move them.
    config.schedule.lr = 3e-4;
    // Several micro-batches per rank, so the split differs from the one-process run's.
    config.max_tokens_per_micro_batch = 24;
    if what == Kind2::Ppo {
        config.advantage.estimator = Estimator::Ppo;
        config.advantage.lambda = 0.95;
    }
    let policy = Decoder::load(&dir, Device::Cpu, Kind::Float).unwrap();
    let reference = (what == Kind2::GrpoKl).then(|| {
        config.loss.kl_loss_coef = 0.5;
        Decoder::load(&dir, Device::Cpu, Kind::Float).unwrap()
    });
    let mut t = match rendezvous {
        None => Trainer::new(policy, reference, config).unwrap(),
        Some((r, mode)) => {
            let group = ProcessGroup::connect(&r, Backend::Gloo, Duration::from_secs(60)).unwrap();
            let group = Arc::new(group);
            if mode == Mode::Sharded {
                Trainer::sharded(policy, reference, config, group).unwrap()
            } else {
                let mut t = Trainer::new(policy, reference, config).unwrap();
                t.set_process_group(group).unwrap();
                t
            }
        }
    };
    if what == Kind2::Ppo {
        let critic = Critic::load(&dir, Device::Cpu, Kind::Float).unwrap();
        let schedule = t.config.schedule.clone();
        t.set_critic(
            critic,
            CriticConfig {
                schedule,
                warmup_steps: 1,
            },
        )
        .unwrap();
    }
    let data = samples(n);
    let (mut losses, mut extra) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let m = match what {
            Kind2::Sft => t.sft_step(&data).unwrap(),
            _ => t.rl_step(&data).unwrap(),
        };
        losses.push(m.loss);
        extra.push(m.grad_norm);
        extra.extend(m.value_loss);
        extra.extend(m.kl);
        extra.push(m.entropy);
        extra.push(m.clipfrac);
    }
    if t.is_sharded() {
        // Between passes a sharded policy (and reference, and critic) holds no full tensor.
        for (name, p) in t.policy.trainable_parameters() {
            assert_eq!(p.numel(), 0, "{name} is still whole after the steps");
        }
        let critic = t.critic().map(|c| c.body.trainable_parameters());
        for (name, p) in critic.unwrap_or_default() {
            assert_eq!(p.numel(), 0, "the critic's {name} is whole");
        }
        for (name, p) in t
            .reference()
            .map(|r| r.trainable_parameters())
            .unwrap_or_default()
        {
            assert_eq!(p.numel(), 0, "the reference's {name} is whole");
        }
    }
    if what == Kind2::GrpoKl {
        let last_kl = extra[extra.len() - 3];
        assert!(
            last_kl > 1e-7,
            "the policy moved away from the reference: kl {last_kl}"
        );
    }
    Run {
        losses,
        extra,
        weights: flat_weights(&t, &dir),
    }
}

fn ranks(dir: &Path, what: Kind2, n: usize, world: usize, mode: Mode) -> Vec<Run> {
    let port = free_port("127.0.0.1").unwrap();
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let dir = dir.to_path_buf();
            let r = Rendezvous {
                rank,
                world_size: world,
                local_rank: rank,
                master_addr: "127.0.0.1".into(),
                master_port: port,
                agent_store: false,
            };
            std::thread::spawn(move || rank_run(dir, what, n, Some((r, mode))))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn check(what: Kind2, n: usize, world: usize, mode: Mode, tied: bool) {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path(), tied);
    let one = rank_run(dir.path().to_path_buf(), what, n, None);
    let many = ranks(dir.path(), what, n, world, mode);
    for (rank, run) in many.iter().enumerate() {
        let d = max_diff(&one.losses, &run.losses);
        assert!(
            d < 1e-5,
            "rank {rank} of {world}: losses {:?} against one process's {:?}",
            run.losses,
            one.losses
        );
        let d = max_diff(&one.extra, &run.extra);
        assert!(
            d < 1e-4,
            "rank {rank} of {world}: step metrics differ by {d}"
        );
        let d = max_diff(&one.weights, &run.weights);
        assert!(
            d < 1e-5,
            "rank {rank} of {world}: final weights differ by {d}"
        );
        assert_eq!(
            run.weights, many[0].weights,
            "rank {rank}'s weights are rank 0's"
        );
    }
    // The steps changed the model: equal weights are not both untouched.
    let start = decoder_weights(&Decoder::load(dir.path(), Device::Cpu, Kind::Float).unwrap());
    assert!(max_diff(&start, &one.weights) > 1e-4);
}

#[test]
fn grpo_on_two_ranks_takes_the_one_process_steps() {
    check(Kind2::Grpo, 8, 2, Mode::Replicated, true);
}

#[test]
fn grpo_sharded_over_two_ranks_takes_the_one_process_steps() {
    check(Kind2::Grpo, 8, 2, Mode::Sharded, true);
}

#[test]
fn grpo_sharded_with_an_untied_head_takes_the_one_process_steps() {
    check(Kind2::Grpo, 8, 2, Mode::Sharded, false);
}

#[test]
fn grpo_with_a_kl_loss_and_a_sharded_reference_takes_the_one_process_steps() {
    check(Kind2::GrpoKl, 8, 2, Mode::Sharded, false);
}

#[test]
fn ppo_with_a_sharded_critic_and_a_sharded_policy_takes_the_one_process_steps() {
    check(Kind2::Ppo, 8, 2, Mode::Sharded, true);
}

#[test]
fn sft_sharded_over_three_ranks_with_two_samples_takes_the_one_process_steps() {
    check(Kind2::Sft, 2, 3, Mode::Sharded, false);
}

#[test]
fn ppo_sharded_over_three_ranks_with_uneven_micro_batches_takes_the_one_process_steps() {
    // Some ranks join the policy's and the critic's passes without samples, interleaved.
    check(Kind2::Ppo, 8, 3, Mode::Sharded, false);
}

#[test]
fn ppo_with_a_critic_on_two_ranks_takes_the_one_process_steps() {
    check(Kind2::Ppo, 8, 2, Mode::Replicated, true);
}

#[test]
fn sft_on_three_ranks_with_two_samples_takes_the_one_process_steps() {
    check(Kind2::Sft, 2, 3, Mode::Replicated, true);
}

#[test]
fn sft_sharded_over_three_ranks_with_uneven_micro_batches_takes_the_one_process_steps() {
    // Eight samples of varied lengths over three ranks: the ranks have different numbers of
    // micro-batches, so some join passes without samples.
    check(Kind2::Sft, 8, 3, Mode::Sharded, false);
}

/// A sharded run over `world` ranks (threads) from `model` in `run_dir`: resumes from its newest
/// checkpoint when `resume`, takes GRPO steps up to `until`, checkpointing after each step in
/// `save_after`; returns every rank's losses and its whole final weights.
fn checkpointed(
    model: &Path,
    run_dir: &Path,
    (world, mode): (usize, Mode),
    what: Kind2,
    until: u64,
    save_after: &'static [u64],
    resume: bool,
) -> Vec<Run> {
    let port = free_port("127.0.0.1").unwrap();
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let (model, run_dir) = (model.to_path_buf(), run_dir.to_path_buf());
            std::thread::spawn(move || {
                let r = Rendezvous {
                    rank,
                    world_size: world,
                    local_rank: rank,
                    master_addr: "127.0.0.1".into(),
                    master_port: port,
                    agent_store: false,
                };
                let group = Arc::new(
                    ProcessGroup::connect(&r, Backend::Gloo, Duration::from_secs(60)).unwrap(),
                );
                let mut config = TrainerConfig::default();
                config.schedule.lr = 3e-4;
                config.max_tokens_per_micro_batch = 24;
                if what == Kind2::Ppo {
                    config.advantage.estimator = Estimator::Ppo;
                    config.advantage.lambda = 0.95;
                }
                let policy = Decoder::load(&model, Device::Cpu, Kind::Float).unwrap();
                let with_critic = |t: &mut Trainer| {
                    if what == Kind2::Ppo {
                        let critic = Critic::load(&model, Device::Cpu, Kind::Float).unwrap();
                        let schedule = t.config.schedule.clone();
                        let warmup_steps = 1;
                        t.set_critic(
                            critic,
                            CriticConfig {
                                schedule,
                                warmup_steps,
                            },
                        )
                        .unwrap();
                    }
                };
                let mut t = if mode == Mode::Sharded {
                    let mut t = Trainer::sharded(policy, None, config, group).unwrap();
                    with_critic(&mut t);
                    t
                } else {
                    let mut t = Trainer::new(policy, None, config).unwrap();
                    with_critic(&mut t);
                    if resume {
                        checkpoint::load_newest(&run_dir, &mut t).unwrap().unwrap();
                    }
                    t.set_process_group(group).unwrap();
                    t
                };
                if resume && mode == Mode::Sharded {
                    checkpoint::load_newest(&run_dir, &mut t).unwrap().unwrap();
                }
                let data = samples(8);
                let mut losses = Vec::new();
                while t.step() < until {
                    let m = t.rl_step(&data).unwrap();
                    losses.push(m.loss);
                    losses.extend(m.value_loss);
                    if save_after.contains(&t.step()) {
                        checkpoint::save(&run_dir, &model, &t, serde_json::json!({})).unwrap();
                    }
                }
                checkpoint::finish_pending(&t).unwrap();
                Run {
                    losses,
                    extra: Vec::new(),
                    weights: flat_weights(&t, &model),
                }
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn a_sharded_run_resumes_exactly_and_its_checkpoint_holds_the_whole_model() {
    let model = tempfile::tempdir().unwrap();
    tiny_model(model.path(), false);
    let (whole, cut) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let straight = checkpointed(
        model.path(),
        whole.path(),
        (2, Mode::Sharded),
        Kind2::Grpo,
        5,
        &[],
        false,
    );
    // Stopped after step 2 (the checkpoint after step 3 was still being written: it is finished
    // before the run returns), then resumed from the newest.
    checkpointed(
        model.path(),
        cut.path(),
        (2, Mode::Sharded),
        Kind2::Grpo,
        3,
        &[2, 3],
        false,
    );
    assert_eq!(
        checkpoint::latest(cut.path()).unwrap().unwrap(),
        cut.path().join("checkpoint-000003")
    );
    let dir = cut.path().join("checkpoint-000003");
    for part in [
        "model/config.json",
        "trainer_state.json",
        "optimizer-rank-00000-of-00002",
        "optimizer-rank-00001-of-00002",
    ] {
        assert!(dir.join(part).exists(), "{part} in the checkpoint");
    }
    // model/ is the whole model: it loads on its own.
    let saved = Decoder::load(&dir.join("model"), Device::Cpu, Kind::Float).unwrap();
    assert_eq!(
        saved.trainable_parameters().len(),
        Decoder::load(model.path(), Device::Cpu, Kind::Float)
            .unwrap()
            .trainable_parameters()
            .len()
    );
    let resumed = checkpointed(
        model.path(),
        cut.path(),
        (2, Mode::Sharded),
        Kind2::Grpo,
        5,
        &[],
        true,
    );
    for (rank, run) in resumed.iter().enumerate() {
        assert_eq!(
            run.losses,
            straight[rank].losses[3..],
            "rank {rank}'s resumed losses"
        );
        assert_eq!(
            run.weights, straight[rank].weights,
            "rank {rank}'s final weights"
        );
    }
}

#[test]
fn a_checkpoint_resumes_on_another_number_of_ranks_and_across_sharding() {
    let model = tempfile::tempdir().unwrap();
    tiny_model(model.path(), true);
    let straight = checkpointed(
        model.path(),
        tempfile::tempdir().unwrap().path(),
        (2, Mode::Sharded),
        Kind2::Grpo,
        4,
        &[],
        false,
    );
    // Sharded over 2, resumed sharded over 3.
    let a = tempfile::tempdir().unwrap();
    checkpointed(
        model.path(),
        a.path(),
        (2, Mode::Sharded),
        Kind2::Grpo,
        2,
        &[2],
        false,
    );
    let three = checkpointed(
        model.path(),
        a.path(),
        (3, Mode::Sharded),
        Kind2::Grpo,
        4,
        &[],
        true,
    );
    // Replicated over 2, resumed sharded over 2.
    let b = tempfile::tempdir().unwrap();
    checkpointed(
        model.path(),
        b.path(),
        (2, Mode::Replicated),
        Kind2::Grpo,
        2,
        &[2],
        false,
    );
    let across = checkpointed(
        model.path(),
        b.path(),
        (2, Mode::Sharded),
        Kind2::Grpo,
        4,
        &[],
        true,
    );
    for run in three.iter().chain(&across) {
        assert!(
            max_diff(&run.losses, &straight[0].losses[2..]) < 1e-5,
            "{:?} against {:?}",
            run.losses,
            &straight[0].losses[2..]
        );
        assert!(max_diff(&run.weights, &straight[0].weights) < 1e-5);
    }
}

#[test]
fn a_sharded_ppo_run_resumes_exactly_also_on_another_number_of_ranks() {
    let model = tempfile::tempdir().unwrap();
    tiny_model(model.path(), false);
    let sharded = (2, Mode::Sharded);
    let straight = checkpointed(
        model.path(),
        tempfile::tempdir().unwrap().path(),
        sharded,
        Kind2::Ppo,
        4,
        &[],
        false,
    );
    let cut = tempfile::tempdir().unwrap();
    checkpointed(
        model.path(),
        cut.path(),
        sharded,
        Kind2::Ppo,
        2,
        &[2],
        false,
    );
    let dir = cut.path().join("checkpoint-000002");
    for part in [
        "critic/config.json",
        "critic_optimizer-rank-00000-of-00002",
        "critic_optimizer-rank-00001-of-00002",
    ] {
        assert!(dir.join(part).exists(), "{part} in the checkpoint");
    }
    // critic/ is the whole critic: it loads on its own.
    Critic::load(&dir.join("critic"), Device::Cpu, Kind::Float).unwrap();
    let resumed = checkpointed(model.path(), cut.path(), sharded, Kind2::Ppo, 4, &[], true);
    for (rank, run) in resumed.iter().enumerate() {
        // Policy and value losses of steps 3 and 4.
        assert_eq!(
            run.losses,
            straight[rank].losses[4..],
            "rank {rank}'s losses"
        );
        assert_eq!(run.weights, straight[rank].weights, "rank {rank}'s weights");
    }
    // The same checkpoint resumed over three ranks: the critic's state is resharded too.
    let three = checkpointed(
        model.path(),
        cut.path(),
        (3, Mode::Sharded),
        Kind2::Ppo,
        4,
        &[],
        true,
    );
    for run in &three {
        let d = max_diff(&run.losses, &straight[0].losses[4..]);
        assert!(d < 1e-5, "losses over three ranks differ by {d}");
        let d = max_diff(&run.weights, &straight[0].weights);
        assert!(d < 1e-5, "weights over three ranks differ by {d}");
    }
}
