//! GPU checks, ignored by default (CI has no GPU). On a CUDA machine:
//! `cargo test -p ooze --test gpu -- --ignored` (or the built test binary with `--ignored`).
//! They live in this crate because its link settings pull in libtorch_cuda. `engine`: decoding
//! end to end against scoring and against itself; `kernels`: the engine's kernels against the
//! operations they replace; `training`: the trainer's kernels, fused nodes and optimizer.

use ooze_model::init::Size;
use ooze_model::{score_sequences, Decoder, Family, Layout, ScoreOptions};
use ooze_torch::tch::{Device, Kind};

#[path = "../common/mod.rs"]
mod common;
use common::{generate_all, random_model};

mod engine;
mod kernels;
mod training;

fn require_gpu() {
    assert!(
        ooze_torch::tch::Cuda::is_available(),
        "these tests need CUDA; this process sees none"
    );
}

/// Plain sampling settings for `n` rows, cycling through greedy and temperatures 0.7, 1 and 1.3.
fn temperature_settings(n: usize) -> Vec<ooze_engine::Sampling> {
    (0..n)
        .map(|i| {
            ooze_engine::SamplingParams {
                temperature: Some([0.0, 0.7, 1.0, 1.3][i % 4]),
                ..Default::default()
            }
            .validate()
            .unwrap()
        })
        .collect()
}

/// One row per setting, seeded `seed + i`, at decode step `step`, nothing banned.
fn seeded_rows(
    settings: &[ooze_engine::Sampling],
    seed: u64,
    step: u64,
) -> Vec<ooze_engine::sampler::RowSampling<'_>> {
    settings
        .iter()
        .enumerate()
        .map(|(i, params)| ooze_engine::sampler::RowSampling {
            params,
            seed: seed + i as u64,
            step,
            banned: &[],
        })
        .collect()
}

fn sequences(vocab: i64) -> Vec<Vec<u32>> {
    (0..6)
        .map(|i| {
            (0..(40 + 37 * i))
                .map(|j| ((j * 31 + i * 7) % vocab) as u32)
                .collect()
        })
        .collect()
}

/// The largest |log-prob difference| between two runs' outputs, after asserting that each pair
/// drew the same tokens (`what`: the two runs, for the message).
fn same_tokens_log_prob_gap(
    a: &[ooze_engine::Output],
    b: &[ooze_engine::Output],
    what: &str,
) -> f32 {
    let mut worst = 0.0f32;
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.tokens, y.tokens, "{what} drew different tokens");
        for (p, q) in x.log_probs.iter().zip(&y.log_probs) {
            worst = worst.max((p - q).abs());
        }
    }
    worst
}
