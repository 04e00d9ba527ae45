//! Prompt scoring and zero-token requests on a tiny CPU model: prompt log-probs from the engine's
//! prefill equal full-sequence scoring (`ooze_model::score_sequences`) at the request's
//! temperature, from any start, with or without new tokens and with a cached prefix around;
//! `max_new_tokens` 0 draws nothing; lengths that would overflow are refused, not wrapped.

use ooze_core::FinishReason;
use ooze_engine::{EngineConfig, EngineError, EngineHandle, Request, Sampling, SamplingParams};
use ooze_model::{score_sequences, Decoder, Layout, ScoreOptions};
use ooze_torch::tch::{Device, Kind};

mod common;
use common::runtime;

fn model() -> tempfile::TempDir {
    common::tiny_model(5)
}

fn engine(dir: &std::path::Path, slots: i64) -> EngineHandle {
    common::start_engine(dir, EngineConfig::new(slots, 256, vec![]))
}

fn prompt(i: u32, len: u32) -> Vec<u32> {
    (0..len).map(|j| (i * 31 + j * 13) % 390 + 1).collect()
}

fn request(ids: &[u32], temperature: f64, max_new_tokens: usize) -> Request {
    Request {
        input_ids: ids.to_vec(),
        sampling: SamplingParams {
            temperature: Some(temperature),
            max_new_tokens: Some(max_new_tokens),
            ignore_eos: Some(true),
            seed: Some(1),
            ..Default::default()
        }
        .validate()
        .unwrap(),
        session: None,
    }
}

async fn scored(handle: &EngineHandle, request: Request, from: usize) -> ooze_engine::Output {
    let (_, mut events) = handle.submit_with_prompt_log_probs(request, from).unwrap();
    while let Some(event) = events.recv().await {
        if let ooze_engine::Event::Done(out) = event {
            return out;
        }
    }
    panic!("the engine stopped")
}

/// `log_softmax(logits / T)` of `ids[from + 1 ..]`, by the trainer's scoring path.
fn reference(scorer: &Decoder, ids: &[u32], from: usize, temperature: f64) -> Vec<f32> {
    let options = ScoreOptions {
        temperature,
        ..ScoreOptions::default()
    };
    let scores = score_sequences(scorer, &[ids.to_vec()], Layout::Padded, &options).unwrap();
    scores[0].log_probs[from..].to_vec()
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst <= 1e-4, "{what}: prompt log-probs differ by {worst}");
    assert!(got.iter().all(|lp| lp.is_finite() && *lp <= 0.0), "{what}");
}

#[test]
fn prompt_log_probs_equal_full_sequence_scoring() {
    let dir = model();
    let handle = engine(dir.path(), 4);
    let scorer = Decoder::load(dir.path(), Device::Cpu, Kind::Float).unwrap();
    let _guard = ooze_torch::tch::no_grad_guard();
    let rt = runtime();
    let long = prompt(1, 60);
    // The same prompt generated first: its prefix is kept in a slot, and must not be reused past
    // the scored start.
    let plain = rt
        .block_on(handle.generate(request(&long, 1.0, 3)))
        .unwrap();
    assert!(plain.prompt_log_probs.is_empty(), "only when asked for");
    for (temperature, scale) in [(1.0, 1.0), (0.7, 0.7), (0.0, 1.0)] {
        for from in [0, 1, 25, 59] {
            for max_new in [0, 4] {
                let out = rt.block_on(scored(&handle, request(&long, temperature, max_new), from));
                let what = format!("T {temperature}, from {from}, {max_new} new tokens");
                assert_close(
                    &out.prompt_log_probs,
                    &reference(&scorer, &long, from, scale),
                    &what,
                );
                assert_eq!(out.tokens.len(), max_new, "{what}");
                // A kept prefix is reused up to the start (not past it), from 16 tokens on.
                let reused = if from >= 16 { from } else { 0 };
                assert_eq!(out.cached_tokens, reused, "{what}");
                assert_eq!(out.finish, FinishReason::Length, "{what}");
            }
        }
    }
    // Several scoring requests in one prefill pass, of different lengths and starts.
    let prompts: Vec<Vec<u32>> = (2..6).map(|i| prompt(i, 5 + 9 * i)).collect();
    let outs = rt.block_on(async {
        let mut streams = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            streams.push(scored(&handle, request(p, 1.0, 0), i));
        }
        let mut outs = Vec::new();
        for s in streams {
            outs.push(s.await);
        }
        outs
    });
    for (i, (p, out)) in prompts.iter().zip(&outs).enumerate() {
        assert_close(
            &out.prompt_log_probs,
            &reference(&scorer, p, i, 1.0),
            &format!("batched prompt {i}"),
        );
    }
    let stats = rt.block_on(handle.stats()).unwrap();
    assert_eq!(
        (stats.kv_blocks_free, stats.running),
        (stats.kv_blocks_total, 0),
        "{stats:?}"
    );
}

#[test]
fn zero_new_tokens_draw_nothing_and_bad_lengths_are_refused() {
    let dir = model();
    let handle = engine(dir.path(), 2);
    let rt = runtime();
    let ids = prompt(7, 12);
    let out = rt.block_on(handle.generate(request(&ids, 1.0, 0))).unwrap();
    assert_eq!(
        (out.tokens.len(), out.log_probs.len(), out.finish),
        (0, 0, FinishReason::Length)
    );
    // A prompt that fills the whole sequence can still be scored.
    let full = prompt(8, 256);
    let out = rt.block_on(scored(&handle, request(&full, 1.0, 0), 0));
    assert_eq!(out.prompt_log_probs.len(), 255);

    // Hand-built sampling skips validation: the engine's own check must not wrap.
    for max_new_tokens in [usize::MAX, 1 << 63, usize::MAX - 5] {
        let request = Request {
            input_ids: ids.clone(),
            sampling: Sampling {
                max_new_tokens,
                ..Sampling::default()
            },
            session: None,
        };
        let err = handle.submit(request).err().unwrap();
        assert!(matches!(err, EngineError::TooLong { .. }), "{err}");
        assert!(
            err.to_string()
                .ends_with("max_new_tokens must be in [0, 244] for this prompt"),
            "{err}"
        );
    }
    let err = handle
        .submit_with_prompt_log_probs(request(&ids, 1.0, 0), 12)
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "logprob_start_len 12 must be below the prompt length 12"
    );
    let stats = rt.block_on(handle.stats()).unwrap();
    assert_eq!(
        (stats.kv_blocks_free, stats.running),
        (stats.kv_blocks_total, 0),
        "{stats:?}"
    );
}
