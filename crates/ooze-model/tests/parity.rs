//! Numerical parity with transformers: random-weight checkpoints that transformers wrote, scored by
//! ooze on CPU in fp32, against transformers' own log-probs and entropies (max abs error ≤ 1e-4);
//! then ooze saves the model and transformers must load it and reproduce the same values.

mod common;

use common::*;
use ooze_model::checkpoint::SaveOptions;
use ooze_model::{score_sequences, Decoder, KvCache, Layout, ScoreOptions};
use ooze_torch::tch::{Device, Kind, Tensor};

const TOLERANCE: f64 = 1e-4;
const CASES: [&str; 3] = ["qwen2", "qwen3", "llama"];

fn sequences(expected: &serde_json::Value) -> Vec<Vec<u32>> {
    expected["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| u32s(&s["tokens"]))
        .collect()
}

#[test]
fn log_probs_and_entropy_match_transformers_in_both_layouts() {
    for case in CASES {
        let dir = reference_dir().join("models").join(case);
        let expected = read_json(&dir.join("expected.json"));
        let decoder = Decoder::load(&dir, Device::Cpu, Kind::Float).unwrap();
        let seqs = sequences(&expected);
        for layout in [Layout::Padded, Layout::Packed] {
            let opts = ScoreOptions {
                entropy: true,
                chunk_tokens: 7,
                ..Default::default()
            };
            let got = score_sequences(&decoder, &seqs, layout, &opts).unwrap();
            let hot = score_sequences(
                &decoder,
                &seqs,
                layout,
                &ScoreOptions {
                    temperature: 0.7,
                    ..Default::default()
                },
            )
            .unwrap();
            for (i, want) in expected["sequences"].as_array().unwrap().iter().enumerate() {
                let lp = max_abs_diff(&got[i].log_probs, &f64s(&want["log_probs"]));
                let ent = max_abs_diff(got[i].entropy.as_ref().unwrap(), &f64s(&want["entropy"]));
                let t07 = max_abs_diff(&hot[i].log_probs, &f64s(&want["log_probs_t07"]));
                assert!(lp <= TOLERANCE && ent <= TOLERANCE && t07 <= TOLERANCE, "{case} {layout:?} sequence {i}: log-prob error {lp:e}, entropy error {ent:e}, T=0.7 error {t07:e}");
            }
        }
    }
}

#[test]
fn incremental_decoding_matches_the_full_sequence() {
    for case in CASES {
        let dir = reference_dir().join("models").join(case);
        let expected = read_json(&dir.join("expected.json"));
        let decoder = Decoder::load(&dir, Device::Cpu, Kind::Float).unwrap();
        let want = &expected["sequences"][0];
        let tokens: Vec<i64> = u32s(&want["tokens"]).into_iter().map(i64::from).collect();
        let want_lp = f64s(&want["log_probs"]);
        let _guard = ooze_torch::tch::no_grad_guard();
        let mut cache = KvCache::new(decoder.config.num_layers as usize);
        // Prefill 10 tokens at once, then one token per step.
        let prefill = 10;
        let mut logits = decoder.decode_step(
            &Tensor::from_slice(&tokens[..prefill]).unsqueeze(0),
            &mut cache,
        );
        let mut got = Vec::new();
        for &token in &tokens[prefill..] {
            let logp = logits.get(0).log_softmax(-1, Kind::Float);
            got.push(logp.double_value(&[token]) as f32);
            logits = decoder.decode_step(&Tensor::from_slice(&[token]).unsqueeze(0), &mut cache);
        }
        assert_eq!(cache.len(), tokens.len() as i64);
        let err = max_abs_diff(&got, &want_lp[prefill - 1..]);
        assert!(
            err <= TOLERANCE,
            "{case}: cached decoding differs from transformers by {err:e}"
        );
    }
}

#[test]
fn ooze_saved_checkpoints_load_in_transformers_with_the_same_outputs() {
    for case in CASES {
        let dir = reference_dir().join("models").join(case);
        let decoder = Decoder::load(&dir, Device::Cpu, Kind::Float).unwrap();
        let out = tempfile::tempdir().unwrap();
        // Small shards, so the index path is exercised.
        let options = SaveOptions {
            max_shard_bytes: 100_000,
            kind: Kind::Float,
        };
        decoder.save(&dir, out.path(), options).unwrap();
        assert!(
            out.path().join("model.safetensors.index.json").exists(),
            "{case}: expected a sharded checkpoint"
        );
        // ooze reloads its own output identically.
        let again = Decoder::load(out.path(), Device::Cpu, Kind::Float).unwrap();
        let expected = read_json(&dir.join("expected.json"));
        let seqs = sequences(&expected);
        let a = score_sequences(&decoder, &seqs, Layout::Padded, &ScoreOptions::default()).unwrap();
        let b = score_sequences(&again, &seqs, Layout::Padded, &ScoreOptions::default()).unwrap();
        assert_eq!(a, b, "{case}: reloaded weights differ");
        // transformers loads it and reproduces the reference values.
        run_python(
            "check_checkpoint.py",
            &[out.path(), &dir.join("expected.json")],
        );
    }
}

#[test]
fn bf16_scoring_stays_close_to_fp32() {
    let dir = reference_dir().join("models").join("qwen2");
    let expected = read_json(&dir.join("expected.json"));
    let decoder = Decoder::load(&dir, Device::Cpu, Kind::BFloat16).unwrap();
    let got = score_sequences(
        &decoder,
        &sequences(&expected),
        Layout::Padded,
        &ScoreOptions::default(),
    )
    .unwrap();
    for (i, want) in expected["sequences"].as_array().unwrap().iter().enumerate() {
        let err = max_abs_diff(&got[i].log_probs, &f64s(&want["log_probs"]));
        assert!(err < 0.1, "bf16 sequence {i} is {err} away from fp32");
    }
}
