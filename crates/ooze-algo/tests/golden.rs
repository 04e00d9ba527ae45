//! ooze's RL math against the independent PyTorch reference (`scripts/reference/rl_golden.py`,
//! written by `scripts/test.sh` into target/reference): every advantage estimator, every
//! aggregation mode and every loss term with its gradients, within 1e-6. Also: the loss summed over
//! micro-batches equals the loss of the whole step, for every aggregation mode.

use ooze_algo::{
    compute_advantages, loss::loss, token_weights, AdvantageConfig, Aggregation, LossConfig,
    LossInputs, SampleInput, StepSample,
};
use ooze_torch::tch::{Kind, Tensor};
use serde::Deserialize;
use std::path::PathBuf;

#[derive(Deserialize)]
struct Golden {
    samples: Vec<Sample>,
    advantages: Vec<AdvantageCase>,
    weights: std::collections::HashMap<String, Vec<Vec<f64>>>,
    losses: Vec<LossCase>,
}

#[derive(Deserialize)]
struct Sample {
    group: u64,
    rollout: u64,
    reward: f64,
    #[serde(deserialize_with = "zero_one")]
    mask: Vec<u8>,
    logp_old: Vec<f64>,
    logp_ref: Vec<f64>,
    logp_roll: Vec<f64>,
    logp_teacher: Vec<f64>,
    logp: Vec<f64>,
    values: Vec<f64>,
    values_old: Vec<f64>,
    entropy: Vec<f64>,
    #[serde(deserialize_with = "zero_one")]
    observation_mask: Vec<u8>,
}

/// A 0/1 mask the reference writes as floats.
fn zero_one<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let floats = Vec::<f32>::deserialize(d)?;
    floats
        .into_iter()
        .map(|m| match m {
            0.0 => Ok(0),
            1.0 => Ok(1),
            other => Err(serde::de::Error::custom(format!("mask entry {other}"))),
        })
        .collect()
}

#[derive(Deserialize)]
struct AdvantageCase {
    config: AdvantageConfig,
    advantages: Vec<Vec<f64>>,
    returns: Option<Vec<Vec<f64>>>,
}

#[derive(Deserialize)]
struct LossCase {
    config: LossConfig,
    aggregation: Aggregation,
    total: f64,
    policy: f64,
    clipfrac: f64,
    approx_kl: f64,
    kl: Option<f64>,
    entropy: Option<f64>,
    value: Option<f64>,
    observation: Option<f64>,
    importance_weight: Option<f64>,
    grad_logp: Vec<f64>,
    grad_entropy: Vec<f64>,
    grad_values: Vec<f64>,
}

fn golden() -> Golden {
    let dir = std::env::var_os("OOZE_REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/reference")
        });
    let path = dir.join("rl_golden.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run scripts/test.sh or `.venv/bin/python scripts/reference/rl_golden.py {}`",
            path.display(),
            path.display()
        )
    });
    serde_json::from_str(&text).unwrap()
}

fn inputs(samples: &[Sample]) -> Vec<SampleInput<'_>> {
    samples
        .iter()
        .map(|s| SampleInput {
            group: s.group,
            rollout: s.rollout,
            reward: s.reward,
            mask: &s.mask,
            logp_old: Some(&s.logp_old),
            logp_ref: Some(&s.logp_ref),
            values: Some(&s.values),
            logp_teacher: Some(&s.logp_teacher),
        })
        .collect()
}

fn assert_close(what: &str, got: f64, want: f64) {
    let tolerance = 1e-6 * want.abs().max(1.0);
    assert!(
        (got - want).abs() <= tolerance,
        "{what}: {got} vs reference {want}"
    );
}

fn assert_all_close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_close(&format!("{what}[{i}]"), *g, *w);
    }
}

#[test]
fn advantages_match_the_reference() {
    let g = golden();
    let samples = inputs(&g.samples);
    for case in &g.advantages {
        let name = format!("{:?}", case.config);
        let got = compute_advantages(&samples, &case.config, None).unwrap();
        for (i, (a, want)) in got.advantages.iter().zip(&case.advantages).enumerate() {
            assert_all_close(&format!("{name} sample {i}"), a, want);
        }
        match (&got.returns, &case.returns) {
            (Some(got), Some(want)) => {
                for (i, (r, w)) in got.iter().zip(want).enumerate() {
                    assert_all_close(&format!("{name} returns {i}"), r, w);
                }
            }
            (None, None) => {}
            _ => panic!("{name}: returns present on one side only"),
        }
    }
}

#[test]
fn aggregation_weights_match_the_reference() {
    let g = golden();
    let steps: Vec<StepSample<'_>> = g
        .samples
        .iter()
        .map(|s| StepSample {
            group: s.group,
            rollout: s.rollout,
            mask: &s.mask,
        })
        .collect();
    for (name, want) in &g.weights {
        let mode: Aggregation = serde_json::from_value(serde_json::json!(name)).unwrap();
        for (i, (w, want)) in token_weights(&steps, mode).iter().zip(want).enumerate() {
            let w: Vec<f64> = w.iter().map(|&x| x as f64).collect();
            assert_all_close(&format!("{name} sample {i}"), &w, want);
        }
    }
}

/// The tensors of the loss for samples `range` of the step, with the step's weights.
struct Batch {
    logp: Tensor,
    entropy: Tensor,
    values: Tensor,
    fixed: Vec<Tensor>,
    sample_index: Tensor,
    n: i64,
}

fn batch(
    samples: &[Sample],
    range: std::ops::Range<usize>,
    advantages: &[Vec<f64>],
    returns: &[Vec<f64>],
    weights: &[Vec<f32>],
    observation_weights: &[Vec<f32>],
) -> Batch {
    let chosen = &samples[range.clone()];
    let flat = |f: &dyn Fn(&Sample) -> Vec<f64>| {
        let v: Vec<f32> = chosen.iter().flat_map(f).map(|x| x as f32).collect();
        Tensor::from_slice(&v)
    };
    let from = |all: &[Vec<f64>]| {
        let v: Vec<f32> = all[range.clone()]
            .iter()
            .flatten()
            .map(|&x| x as f32)
            .collect();
        Tensor::from_slice(&v)
    };
    let from32 = |all: &[Vec<f32>]| {
        let v: Vec<f32> = all[range.clone()].iter().flatten().copied().collect();
        Tensor::from_slice(&v)
    };
    let index: Vec<i64> = chosen
        .iter()
        .enumerate()
        .flat_map(|(i, s)| std::iter::repeat_n(i as i64, s.mask.len()))
        .collect();
    Batch {
        logp: flat(&|s| s.logp.clone()).set_requires_grad(true),
        entropy: flat(&|s| s.entropy.clone()).set_requires_grad(true),
        values: flat(&|s| s.values.clone()).set_requires_grad(true),
        fixed: vec![
            flat(&|s| s.logp_old.clone()),
            from(advantages),
            flat(&|s| s.mask.iter().map(|&m| m as f64).collect()),
            from32(weights),
            flat(&|s| s.logp_roll.clone()),
            flat(&|s| s.logp_ref.clone()),
            flat(&|s| s.values_old.clone()),
            from(returns),
            from32(observation_weights),
        ],
        sample_index: Tensor::from_slice(&index),
        n: chosen.len() as i64,
    }
}

fn run(b: &Batch, config: &LossConfig) -> ooze_algo::LossTerms {
    let f = &b.fixed;
    loss(
        &LossInputs {
            logp: &b.logp,
            logp_old: &f[0],
            advantages: &f[1],
            mask: &f[2],
            weights: &f[3],
            sample_index: &b.sample_index,
            num_samples: b.n,
            logp_roll: Some(&f[4]),
            logp_ref: Some(&f[5]),
            entropy: Some(&b.entropy),
            values: Some((&b.values, &f[6], &f[7])),
            observation_weights: Some(&f[8]),
        },
        config,
    )
}

fn scalar(t: &Tensor) -> f64 {
    t.double_value(&[])
}

fn grad(t: &Tensor) -> Vec<f64> {
    let g = t.grad();
    if !g.defined() {
        return vec![0.0; t.size()[0] as usize];
    }
    Vec::<f32>::try_from(g)
        .unwrap()
        .into_iter()
        .map(f64::from)
        .collect()
}

/// grpo advantages and ppo returns (γ 0.99, λ 0.95), as the reference uses for every loss case.
fn loss_streams(g: &Golden) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let samples = inputs(&g.samples);
    let grpo = compute_advantages(&samples, &AdvantageConfig::default(), None).unwrap();
    let ppo = compute_advantages(
        &samples,
        &AdvantageConfig {
            estimator: ooze_algo::Estimator::Ppo,
            gamma: 0.99,
            lambda: 0.95,
            ..Default::default()
        },
        None,
    )
    .unwrap();
    (grpo.advantages, ppo.returns.unwrap())
}

fn step_weights(samples: &[Sample], mode: Aggregation, observation: bool) -> Vec<Vec<f32>> {
    let steps: Vec<StepSample<'_>> = samples
        .iter()
        .map(|s| StepSample {
            group: s.group,
            rollout: s.rollout,
            mask: if observation {
                &s.observation_mask
            } else {
                &s.mask
            },
        })
        .collect();
    token_weights(&steps, mode)
}

#[test]
fn losses_and_gradients_match_the_reference() {
    let g = golden();
    let (advantages, returns) = loss_streams(&g);
    let observation = step_weights(&g.samples, Aggregation::SeqMeanTokenMean, true);
    for case in &g.losses {
        let name = format!("{:?} / {:?}", case.config, case.aggregation);
        let weights = step_weights(&g.samples, case.aggregation, false);
        let b = batch(
            &g.samples,
            0..g.samples.len(),
            &advantages,
            &returns,
            &weights,
            &observation,
        );
        let terms = run(&b, &case.config);
        terms.total.backward();
        assert_close(&format!("{name}: total"), scalar(&terms.total), case.total);
        assert_close(
            &format!("{name}: policy"),
            scalar(&terms.policy),
            case.policy,
        );
        assert_close(
            &format!("{name}: clipfrac"),
            scalar(&terms.clipfrac),
            case.clipfrac,
        );
        assert_close(
            &format!("{name}: approx_kl"),
            scalar(&terms.approx_kl),
            case.approx_kl,
        );
        let optional = [
            ("kl", &terms.kl, case.kl),
            ("entropy", &terms.entropy, case.entropy),
            ("value", &terms.value, case.value),
            ("observation", &terms.observation, case.observation),
            (
                "importance_weight",
                &terms.importance_weight,
                case.importance_weight,
            ),
        ];
        for (what, got, want) in optional {
            match (got, want) {
                (Some(got), Some(want)) => {
                    assert_close(&format!("{name}: {what}"), scalar(got), want)
                }
                (None, None) => {}
                _ => panic!("{name}: {what} present on one side only"),
            }
        }
        assert_all_close(&format!("{name}: d/dlogp"), &grad(&b.logp), &case.grad_logp);
        assert_all_close(
            &format!("{name}: d/dentropy"),
            &grad(&b.entropy),
            &case.grad_entropy,
        );
        assert_all_close(
            &format!("{name}: d/dvalues"),
            &grad(&b.values),
            &case.grad_values,
        );
    }
}

#[test]
fn micro_batches_add_up_to_the_step() {
    let g = golden();
    let (advantages, returns) = loss_streams(&g);
    let observation = step_weights(&g.samples, Aggregation::SeqMeanTokenMean, true);
    let n = g.samples.len();
    for case in &g.losses {
        let weights = step_weights(&g.samples, case.aggregation, false);
        let whole = run(
            &batch(
                &g.samples,
                0..n,
                &advantages,
                &returns,
                &weights,
                &observation,
            ),
            &case.config,
        );
        for splits in [
            vec![0, 3, n],
            vec![0, 1, 2, 7, n],
            (0..=n).collect::<Vec<_>>(),
        ] {
            let parts: f64 = splits
                .windows(2)
                .map(|w| {
                    let b = batch(
                        &g.samples,
                        w[0]..w[1],
                        &advantages,
                        &returns,
                        &weights,
                        &observation,
                    );
                    scalar(&run(&b, &case.config).total)
                })
                .sum();
            assert_close(
                &format!("{:?} split {splits:?}", case.config),
                parts,
                scalar(&whole.total),
            );
        }
    }
}

#[test]
fn kinds_stay_fp32() {
    let g = golden();
    let (advantages, returns) = loss_streams(&g);
    let weights = step_weights(&g.samples, Aggregation::default(), false);
    let observation = step_weights(&g.samples, Aggregation::SeqMeanTokenMean, true);
    let b = batch(
        &g.samples,
        0..2,
        &advantages,
        &returns,
        &weights,
        &observation,
    );
    assert_eq!(run(&b, &LossConfig::default()).total.kind(), Kind::Float);
}
