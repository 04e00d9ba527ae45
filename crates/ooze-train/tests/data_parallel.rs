//! Plain data parallelism on Gloo: ranks (threads of this test, each with its own trainer, model
//! and process group) take the one-process steps: the same losses within 1e-5 over 5 steps and
//! the same final weights, for GRPO, PPO with a critic, and SFT, also with more ranks than a step
//! has samples; every rank ends with identical weights.

use ooze_algo::Estimator;
use ooze_model::init::{init_model, InitOptions, Size};
use ooze_model::{Decoder, Family};
use ooze_torch::dist::{Backend, ProcessGroup, Rendezvous};
use ooze_torch::tch::{Device, Kind, Tensor};
use ooze_train::critic::Critic;
use ooze_train::{CriticConfig, Sample, Trainer, TrainerConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

fn tiny_model(dir: &Path) {
    let mut options = InitOptions::new(Family::Qwen2, Size::Tiny);
    options.tokenizer_vocab = 300;
    options.seed = 21;
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
                    s.push_generated(&[t], &[-1.0 - 0.05 * k as f32]).unwrap();
                }
            }
            s
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq)]
enum Kind2 {
    Grpo,
    Ppo,
    Sft,
}

struct Run {
    losses: Vec<f64>,
    extra: Vec<f64>,
    weights: Vec<f64>,
}

fn flat_weights(t: &Trainer) -> Vec<f64> {
    let parts: Vec<Tensor> = t
        .policy
        .trainable_parameters()
        .into_iter()
        .map(|(_, p)| p.detach().to_kind(Kind::Double).reshape([-1]))
        .collect();
    Vec::<f64>::try_from(Tensor::cat(&parts, 0)).unwrap()
}

/// One rank's 5 steps; `rendezvous` is None for the one-process run.
fn rank_run(dir: PathBuf, what: Kind2, n: usize, rendezvous: Option<Rendezvous>) -> Run {
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
    let mut t = Trainer::new(policy, None, config).unwrap();
    if let Some(r) = rendezvous {
        let group = ProcessGroup::connect(&r, Backend::Gloo, Duration::from_secs(60)).unwrap();
        t.set_process_group(Arc::new(group)).unwrap();
    }
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
        extra.push(m.entropy);
        extra.push(m.clipfrac);
    }
    Run {
        losses,
        extra,
        weights: flat_weights(&t),
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn ranks(dir: &Path, what: Kind2, n: usize, world: usize) -> Vec<Run> {
    let port = free_port();
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
            std::thread::spawn(move || rank_run(dir, what, n, Some(r)))
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

fn check(what: Kind2, n: usize, world: usize) {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let one = rank_run(dir.path().to_path_buf(), what, n, None);
    let many = ranks(dir.path(), what, n, world);
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
    let dir2 = tempfile::tempdir().unwrap();
    tiny_model(dir2.path());
    let start = flat_weights(
        &Trainer::new(
            Decoder::load(dir2.path(), Device::Cpu, Kind::Float).unwrap(),
            None,
            TrainerConfig::default(),
        )
        .unwrap(),
    );
    assert!(max_diff(&start, &one.weights) > 1e-4);
}

#[test]
fn grpo_on_two_ranks_takes_the_one_process_steps() {
    check(Kind2::Grpo, 8, 2);
}

#[test]
fn ppo_with_a_critic_on_two_ranks_takes_the_one_process_steps() {
    check(Kind2::Ppo, 8, 2);
}

#[test]
fn sft_on_three_ranks_with_two_samples_takes_the_one_process_steps() {
    check(Kind2::Sft, 2, 3);
}
