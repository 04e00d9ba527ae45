//! Deterministic numerics on a GPU (`rollout.deterministic`, `--deterministic`), ignored by default
//! (CI has no GPU): `cargo test -p ooze --test gpu_deterministic -- --ignored`. A test binary of
//! its own, because the setting is process-wide.

use ooze_engine::{start, EngineConfig, Output, SamplingParams};
use ooze_model::init::Size;
use ooze_model::{score_sequences, Decoder, Family, Layout, ScoreOptions};
use ooze_torch::tch::{Device, Kind};

mod common;
use common::{generate_all, random_model};

fn generate(
    runtime: &tokio::runtime::Runtime,
    engine: &ooze_engine::EngineHandle,
    prompts: &[Vec<u32>],
    seed: u64,
) -> Vec<Output> {
    let sampling = SamplingParams {
        seed: Some(seed),
        max_new_tokens: Some(300),
        ignore_eos: Some(true),
        temperature: Some(1.0),
        ..Default::default()
    }
    .validate()
    .unwrap();
    generate_all(runtime, engine, prompts, &sampling)
}

/// Engine log-probs equal the trainer's bitwise: for Qwen2 (q/k/v bias) and Qwen3 (q/k norms),
/// prompts of many lengths (past several 256-key splits) decoded together, scored padded and
/// packed; and the same prompt decoded alone gives the same tokens and log-probs.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn engine_log_probs_equal_the_trainers_bitwise() {
    assert!(ooze_torch::tch::Cuda::is_available(), "needs CUDA");
    ooze_torch::kernels::set_deterministic(true).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for family in [Family::Qwen2, Family::Qwen3] {
        let dir = random_model(family, Size::Medium, 9);
        let load = || Decoder::load(dir.path(), Device::Cuda(0), Kind::BFloat16).unwrap();
        let vocab = load().config.vocab_size;
        let prompts: Vec<Vec<u32>> = (0..8)
            .map(|i| {
                (0..(30 + 97 * i))
                    .map(|j| ((j * 31 + i * 7) % vocab) as u32)
                    .collect()
            })
            .collect();
        let engine = start(load(), None, EngineConfig::new(8, 1400, vec![]));
        let together = generate(&runtime, &engine, &prompts, 4);
        let alone = generate(&runtime, &engine, &prompts[5..6], 4);
        assert_eq!(
            alone[0].tokens, together[5].tokens,
            "{family:?}: tokens alone"
        );
        assert_eq!(
            alone[0].log_probs, together[5].log_probs,
            "{family:?}: log-probs alone"
        );
        let scorer = load();
        let full: Vec<Vec<u32>> = prompts
            .iter()
            .zip(&together)
            .map(|(p, o)| p.iter().chain(&o.tokens).copied().collect())
            .collect();
        for layout in [Layout::Padded, Layout::Packed] {
            let scored = score_sequences(&scorer, &full, layout, &ScoreOptions::default()).unwrap();
            for (i, (s, out)) in scored.iter().zip(&together).enumerate() {
                let trained = &s.log_probs[prompts[i].len() - 1..];
                let differ = trained
                    .iter()
                    .zip(&out.log_probs)
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                assert_eq!(
                    differ,
                    0,
                    "{family:?} {layout:?} sequence {i}: {differ} of {} log-probs differ",
                    out.log_probs.len()
                );
            }
        }
    }
}
