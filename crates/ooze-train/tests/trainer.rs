//! The trainer on tiny CPU models: the gradient of the full RL loss with respect to the model's
//! parameters equals finite differences (fp64); SFT lowers the held-out loss; a run resumed from a
//! checkpoint takes exactly the steps of an uninterrupted run; RL steps report what they did.

use ooze_algo::loss::loss;
use ooze_algo::{
    token_weights, Aggregation, ImportanceLevel, ImportanceMode, ImportanceSampling, LossConfig,
    LossInputs, PolicyLoss, StepSample,
};
use ooze_model::init::{init_model, InitOptions, Size};
use ooze_model::{Decoder, Family, Tokenizer};
use ooze_torch::tch::{self, Device, Kind, Tensor};
use ooze_train::forward::{response_log_probs, EntropyUse};
use ooze_train::sft_data::load_chat_jsonl;
use ooze_train::{checkpoint, Decay, Sample, Schedule, Trainer, TrainerConfig};
use std::path::Path;

fn tiny_model(dir: &Path, family: Family, seed: i64) {
    let mut options = InitOptions::new(family, Size::Tiny);
    options.tokenizer_vocab = 300;
    options.seed = seed;
    init_model(dir, &ooze_model::corpus::generate(1, 20_000), &options).unwrap();
}

fn sample(
    tokens: Vec<u32>,
    prompt_len: usize,
    group: u64,
    execution: usize,
    reward: f64,
) -> Sample {
    let n = tokens.len() - prompt_len;
    let mut s = Sample {
        group,
        execution,
        reward: Some(reward),
        ..Sample::with_prompt(tokens[..prompt_len].to_vec())
    };
    for (i, &t) in tokens[prompt_len..].iter().enumerate() {
        if n > 3 && i == n - 2 {
            s.push_observation(&[t]); // a tool token
        } else {
            s.push_generated(&[t], &[-1.0 - 0.1 * i as f32], &[])
                .unwrap();
        }
    }
    s
}

fn rl_samples() -> Vec<Sample> {
    vec![
        sample(vec![5, 17, 33, 60, 71, 9, 14], 3, 1, 1, 1.0),
        sample(vec![5, 17, 33, 2, 8], 3, 1, 2, 0.0),
        sample(vec![40, 41, 90, 91, 92, 93, 94, 95], 2, 2, 3, 0.5),
    ]
}

/// The loss of `samples` under `decoder` with everything but the policy's log-probs and entropies
/// held fixed (`old` is the pre-update log-prob stream).
fn full_loss(decoder: &Decoder, reference: &Tensor, old: &Tensor, samples: &[Sample]) -> Tensor {
    let scores = response_log_probs(decoder, samples, 0.8, EntropyUse::Gradient);
    let steps: Vec<StepSample<'_>> = samples
        .iter()
        .map(|s| StepSample {
            group: s.group,
            rollout: s.execution as u64,
            mask: &s.loss_mask,
        })
        .collect();
    let obs_steps: Vec<StepSample<'_>> = samples
        .iter()
        .map(|s| StepSample {
            group: s.group,
            rollout: s.execution as u64,
            mask: &s.observation_mask,
        })
        .collect();
    let flat = |v: Vec<Vec<f32>>| {
        Tensor::from_slice(&v.concat().iter().map(|&x| x as f64).collect::<Vec<_>>())
    };
    let weights = flat(token_weights(&steps, Aggregation::PerRolloutTokenMean));
    let observation = flat(token_weights(&obs_steps, Aggregation::SeqMeanTokenMean));
    let mask = flat(
        samples
            .iter()
            .map(|s| s.loss_mask.iter().map(|&m| m as f32).collect())
            .collect(),
    );
    let roll = flat(
        samples
            .iter()
            .map(|s| s.rollout_log_probs.clone())
            .collect(),
    );
    let n = mask.size()[0];
    let advantages = Tensor::from_slice(
        &(0..n)
            .map(|i| {
                if i % 3 == 0 {
                    -0.7
                } else {
                    0.4 + 0.1 * i as f64
                }
            })
            .collect::<Vec<_>>(),
    );
    let index: Vec<i64> = samples
        .iter()
        .enumerate()
        .flat_map(|(i, s)| std::iter::repeat_n(i as i64, s.response_length))
        .collect();
    let config = LossConfig {
        policy: PolicyLoss::PpoClip,
        eps_low: 0.2,
        eps_high: Some(0.28),
        dual_clip: Some(3.0),
        importance: Some(ImportanceSampling {
            level: ImportanceLevel::Token,
            mode: ImportanceMode::Truncate,
            low: 0.0,
            high: 2.0,
        }),
        kl_loss_coef: 0.1,
        entropy_coef: 0.01,
        observation_coef: 0.05,
        ..Default::default()
    };
    loss(
        &LossInputs {
            logp: &scores.log_probs,
            logp_old: old,
            advantages: &advantages,
            mask: &mask,
            weights: &weights,
            sample_index: &Tensor::from_slice(&index),
            num_samples: samples.len() as i64,
            logp_roll: Some(&roll),
            logp_ref: Some(reference),
            entropy: scores.entropy.as_ref(),
            values: None,
            observation_weights: Some(&observation),
        },
        &config,
    )
    .total
}

#[test]
fn gradient_of_the_full_loss_matches_finite_differences() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path(), Family::Qwen3, 3);
    let decoder = Decoder::load(dir.path(), Device::Cpu, Kind::Double).unwrap();
    let samples = rl_samples();
    let (reference, old) = {
        let _guard = tch::no_grad_guard();
        let base = response_log_probs(&decoder, &samples, 0.8, EntropyUse::None).log_probs;
        let n = base.size()[0];
        let wiggle = |scale: f64| {
            Tensor::from_slice(
                &(0..n)
                    .map(|i| scale * ((i * 7 % 5) as f64 - 2.0))
                    .collect::<Vec<_>>(),
            )
        };
        (&base + wiggle(0.05), &base + wiggle(0.04))
    };
    let params: Vec<(String, Tensor)> = decoder
        .trainable_parameters()
        .into_iter()
        .map(|(n, t)| (n, t.set_requires_grad(true)))
        .collect();
    full_loss(&decoder, &reference, &old, &samples).backward();
    let h = 1e-6;
    let mut checked = 0;
    for (name, param) in &params {
        let grad = param.grad();
        let numel = param.numel() as i64;
        for k in [0, numel / 3, numel - 1] {
            let analytic = grad.view([-1]).double_value(&[k]);
            let at = |delta: f64| {
                let _guard = tch::no_grad_guard();
                let flat = param.view([-1]);
                let original = flat.double_value(&[k]);
                let _ = flat.get(k).fill_(original + delta);
                let value = full_loss(&decoder, &reference, &old, &samples).double_value(&[]);
                let _ = flat.get(k).fill_(original);
                value
            };
            let numeric = (at(h) - at(-h)) / (2.0 * h);
            let tolerance = 1e-6 + 1e-5 * numeric.abs();
            assert!(
                (analytic - numeric).abs() <= tolerance,
                "{name}[{k}]: autograd {analytic:e}, finite differences {numeric:e}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 30, "checked {checked} entries");
}

/// Chat lines for a toy task: "a+b" answered with the sum, deterministic from `seed`.
fn chat_lines(seed: u64, n: usize) -> String {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % 10
    };
    (0..n)
        .map(|_| {
            let (a, b) = (next(), next());
            serde_json::json!({"messages": [
                {"role": "system", "content": "Add the numbers."},
                {"role": "user", "content": format!("{a}+{b}")},
                {"role": "assistant", "content": format!("{}", a + b)},
            ]})
            .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn sft_config(lr: f64, total: u64) -> TrainerConfig {
    TrainerConfig {
        schedule: Schedule {
            lr,
            warmup_steps: 2,
            decay: Decay::Cosine,
            total_steps: total,
            min_lr_ratio: 0.1,
        },
        max_tokens_per_micro_batch: 200,
        ..Default::default()
    }
}

#[test]
fn sft_lowers_held_out_loss_and_masks_only_the_assistant() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path(), Family::Qwen2, 5);
    let tokenizer = Tokenizer::load(dir.path()).unwrap();
    let data = dir.path().join("train.jsonl");
    std::fs::write(&data, chat_lines(1, 96)).unwrap();
    let held = dir.path().join("held.jsonl");
    std::fs::write(&held, chat_lines(2, 24)).unwrap();
    let train = load_chat_jsonl(&data, &tokenizer, 512).unwrap().samples;
    let held = load_chat_jsonl(&held, &tokenizer, 512).unwrap().samples;
    // The trained tokens are the answer and the end-of-turn token.
    let first = &train[0];
    let trained: Vec<u32> = first.tokens[first.prompt_length()..]
        .iter()
        .zip(&first.loss_mask)
        .filter(|(_, &m)| m > 0)
        .map(|(&t, _)| t)
        .collect();
    let text = tokenizer.decode(&trained, false).unwrap();
    assert!(text.ends_with("<|im_end|>"), "{text:?}");
    assert!(!text.contains("user"), "{text:?}");

    let decoder = Decoder::load(dir.path(), Device::Cpu, Kind::Float).unwrap();
    let mut trainer = Trainer::new(decoder, None, sft_config(3e-3, 48)).unwrap();
    let before = trainer.eval_loss(&held).unwrap();
    for step in 0..48 {
        let batch: Vec<Sample> = (0..16)
            .map(|i| train[(step * 16 + i) % train.len()].clone())
            .collect();
        let m = trainer.sft_step(&batch).unwrap();
        assert!(m.loss.is_finite() && m.grad_norm > 0.0);
        assert!(m.micro_batches > 1, "the token budget splits the batch");
    }
    let after = trainer.eval_loss(&held).unwrap();
    assert!(
        after < before * 0.8,
        "held-out loss {before:.3} -> {after:.3} did not fall by 20%"
    );
}

#[test]
fn a_resumed_run_takes_the_same_steps() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path(), Family::Qwen2, 8);
    let tokenizer = Tokenizer::load(dir.path()).unwrap();
    let data = dir.path().join("train.jsonl");
    std::fs::write(&data, chat_lines(4, 24)).unwrap();
    let train = load_chat_jsonl(&data, &tokenizer, 512).unwrap().samples;
    let batch = |step: usize| -> Vec<Sample> {
        (0..6)
            .map(|i| train[(step * 6 + i) % train.len()].clone())
            .collect()
    };
    let fresh = || {
        Trainer::new(
            Decoder::load(dir.path(), Device::Cpu, Kind::Float).unwrap(),
            None,
            sft_config(2e-3, 6),
        )
        .unwrap()
    };
    let mut straight = fresh();
    let uninterrupted: Vec<f64> = (0..6)
        .map(|s| straight.sft_step(&batch(s)).unwrap().loss)
        .collect();

    let run = dir.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let mut first = fresh();
    for s in 0..3 {
        first.sft_step(&batch(s)).unwrap();
    }
    checkpoint::save(
        &run,
        dir.path(),
        &first,
        serde_json::json!({"position": 18}),
    )
    .unwrap();
    drop(first);
    let mut resumed = fresh();
    let latest = checkpoint::latest(&run).unwrap().unwrap();
    let extra = checkpoint::load(&latest, &mut resumed).unwrap();
    assert_eq!(extra["position"], 18);
    assert_eq!(resumed.step(), 3);
    let rest: Vec<f64> = (3..6)
        .map(|s| resumed.sft_step(&batch(s)).unwrap().loss)
        .collect();
    assert_eq!(rest, uninterrupted[3..], "resumed losses differ");
    // The checkpoint's model is a complete HF directory.
    assert!(latest.join("model/config.json").exists());
    assert!(!run.join(".checkpoint-000003.partial").exists());
}

#[test]
fn rl_steps_report_and_refuse_bad_samples() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path(), Family::Qwen2, 9);
    let reference = Decoder::load(dir.path(), Device::Cpu, Kind::Float).unwrap();
    let mut config = TrainerConfig::default();
    config.schedule.lr = 1e-3;
    config.loss.kl_loss_coef = 0.01;
    let mut trainer = Trainer::new(
        Decoder::load(dir.path(), Device::Cpu, Kind::Float).unwrap(),
        Some(reference),
        config,
    )
    .unwrap();
    let m = trainer.rl_step(&rl_samples()).unwrap();
    assert_eq!((m.step, m.samples), (0, 3));
    assert_eq!(
        m.kl,
        Some(0.0),
        "policy equals the reference before the first update"
    );
    assert_eq!(m.clipfrac, 0.0, "ratio 1 before the update");
    assert!(m.rollout_logp_diff_mean.unwrap() > 0.0);
    assert!(m.entropy > 0.0 && m.grad_norm > 0.0 && m.flops > 0.0);
    let m2 = trainer.rl_step(&rl_samples()).unwrap();
    assert!(
        m2.kl.unwrap() > 0.0,
        "the policy moved away from the reference"
    );
    let mut bad = rl_samples();
    bad[1].loss_mask.push(1);
    let err = trainer.rl_step(&bad).unwrap_err();
    assert_eq!(
        err.to_string(),
        "sample 1: `loss_mask` has 3 entries but response_length is 2"
    );
    let mut unscored = rl_samples();
    unscored[2].reward = None;
    let err = trainer.rl_step(&unscored).unwrap_err();
    assert_eq!(
        err.to_string(),
        "sample 2: has no reward (an RL step trains scored samples)"
    );
}

#[test]
fn ppo_trains_a_critic_and_resumes_it() {
    use ooze_algo::Estimator;
    use ooze_train::critic::Critic;
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path(), Family::Qwen2, 10);
    let mut config = TrainerConfig::default();
    config.schedule.lr = 3e-3;
    config.advantage.estimator = Estimator::Ppo;
    config.advantage.lambda = 0.95;
    let trainer = |config: &TrainerConfig| {
        Trainer::new(
            Decoder::load(dir.path(), Device::Cpu, Kind::Float).unwrap(),
            None,
            config.clone(),
        )
        .unwrap()
    };
    let mut without = trainer(&config);
    let err = without.rl_step(&rl_samples()).unwrap_err();
    assert!(err.to_string().contains("needs a critic"), "{err}");

    let with_critic = |config: &TrainerConfig| {
        let mut t = trainer(config);
        t.set_critic(
            Critic::load(dir.path(), Device::Cpu, Kind::Float).unwrap(),
            ooze_train::CriticConfig {
                schedule: t.config.schedule.clone(),
                warmup_steps: 0,
            },
        )
        .unwrap();
        t
    };
    let mut t = with_critic(&config);
    let losses: Vec<f64> = (0..8)
        .map(|_| {
            let m = t.rl_step(&rl_samples()).unwrap();
            assert!(m.critic_grad_norm.unwrap() > 0.0);
            m.value_loss.unwrap()
        })
        .collect();
    assert!(
        losses[7] < losses[0] * 0.5,
        "the critic does not fit the returns: {losses:?}"
    );

    let run = dir.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    checkpoint::save(&run, dir.path(), &t, serde_json::json!({})).unwrap();
    let next = t.rl_step(&rl_samples()).unwrap();
    let mut resumed = with_critic(&config);
    checkpoint::load(&checkpoint::latest(&run).unwrap().unwrap(), &mut resumed).unwrap();
    let again = resumed.rl_step(&rl_samples()).unwrap();
    assert_eq!((again.loss, again.value_loss), (next.loss, next.value_loss));
    assert!(run.join("checkpoint-000008/critic/config.json").exists());
}

#[test]
fn activation_recomputation_takes_the_same_steps() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path(), Family::Qwen3, 14);
    let run = |recompute: bool| -> Vec<(f64, f64)> {
        let mut config = TrainerConfig::default();
        config.schedule.lr = 2e-3;
        config.loss.entropy_coef = 0.01;
        config.recompute_activations = recompute;
        config.max_tokens_per_micro_batch = 12;
        let mut trainer = Trainer::new(
            Decoder::load(dir.path(), Device::Cpu, Kind::Float).unwrap(),
            None,
            config,
        )
        .unwrap();
        (0..4)
            .map(|_| {
                let m = trainer.rl_step(&rl_samples()).unwrap();
                (m.loss, m.grad_norm)
            })
            .collect()
    };
    let (plain, recomputed) = (run(false), run(true));
    for ((l1, g1), (l2, g2)) in plain.iter().zip(&recomputed) {
        assert!((l1 - l2).abs() < 1e-5, "loss {l1} vs {l2}");
        assert!(
            (g1 - g2).abs() < 1e-4 * g1.max(1.0),
            "grad norm {g1} vs {g2}"
        );
    }
}

#[test]
fn teacher_and_reward_hook_reach_the_advantages() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path(), Family::Qwen2, 15);
    let teacher_dir = tempfile::tempdir().unwrap();
    tiny_model(teacher_dir.path(), Family::Qwen2, 16);
    let load = |d: &Path| Decoder::load(d, Device::Cpu, Kind::Float).unwrap();
    let mut config = TrainerConfig::default();
    config.schedule.lr = 1e-3;

    // A hook that gives every sample the same reward: grpo advantages vanish.
    let mut flat = Trainer::new(load(dir.path()), None, config.clone()).unwrap();
    flat.set_reward_hook(Box::new(|_, rewards| {
        rewards.iter_mut().for_each(|r| *r = 0.0)
    }));
    assert_eq!(flat.rl_step(&rl_samples()).unwrap().policy_loss, 0.0);

    config.advantage.opd_coef = 0.5;
    let mut missing = Trainer::new(load(dir.path()), None, config.clone()).unwrap();
    let err = missing.rl_step(&rl_samples()).unwrap_err();
    assert!(err.to_string().contains("logp_teacher"), "{err}");
    let mut distilled = Trainer::new(load(dir.path()), None, config).unwrap();
    distilled.set_teacher(ooze_train::Teacher::Model(Box::new(load(
        teacher_dir.path(),
    ))));
    distilled.set_reward_hook(Box::new(|_, rewards| {
        rewards.iter_mut().for_each(|r| *r = 0.0)
    }));
    let m = distilled.rl_step(&rl_samples()).unwrap();
    assert!(
        m.policy_loss != 0.0,
        "the teacher's log-probs moved the advantages"
    );
}
