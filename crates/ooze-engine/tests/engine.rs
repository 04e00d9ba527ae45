//! The engine against the scoring path, on a tiny CPU model: greedy tokens are the full-sequence
//! argmax and engine log-probs equal scoring log-probs; a seeded request draws the same tokens alone
//! or among 64 others; aborts return partial output; stop conditions; KV blocks all come back.

use ooze_core::{FinishReason, StopMatch};
use ooze_engine::{
    EngineConfig, EngineError, EngineHandle, Event, PauseMode, Request, SamplingParams,
};
use ooze_model::{score_sequences, Attention, Decoder, Layout, ScoreOptions, Tokenizer};
use ooze_torch::tch::{Device, Kind, Tensor};
use std::path::Path;

mod common;
use common::{runtime, start_engine};

fn model_with_seed(seed: i64) -> tempfile::TempDir {
    common::tiny_model(seed)
}

fn model_dir() -> tempfile::TempDir {
    common::tiny_model(11)
}

/// Follows every stream to its end; the outputs in stream order.
async fn outputs(
    streams: Vec<tokio::sync::mpsc::UnboundedReceiver<Event>>,
) -> Vec<ooze_engine::Output> {
    let mut outs = Vec::new();
    for mut rx in streams {
        while let Some(event) = rx.recv().await {
            if let Event::Done(out) = event {
                outs.push(out);
            }
        }
    }
    outs
}

fn engine(dir: &Path, slots: i64, eos: Vec<u32>) -> EngineHandle {
    start_engine(dir, EngineConfig::new(slots, 256, eos))
}

fn request(prompt: &[u32], params: SamplingParams) -> Request {
    Request {
        input_ids: prompt.to_vec(),
        sampling: params.validate().unwrap(),
        session: None,
    }
}

fn prompt(i: u32, len: u32) -> Vec<u32> {
    (0..len).map(|j| (i * 37 + j * 11) % 390 + 1).collect()
}

#[test]
fn greedy_equals_scoring_argmax_and_log_probs() {
    let dir = model_dir();
    let handle = engine(dir.path(), 8, vec![]);
    let scorer = Decoder::load(dir.path(), Device::Cpu, Kind::Float).unwrap();
    let prompts: Vec<Vec<u32>> = (0..5).map(|i| prompt(i, 3 + 7 * i)).collect();
    let greedy = SamplingParams {
        temperature: Some(0.0),
        max_new_tokens: Some(20),
        ignore_eos: Some(true),
        ..Default::default()
    };
    let outputs = runtime().block_on(async {
        let futures: Vec<_> = prompts
            .iter()
            .map(|p| handle.generate(request(p, greedy.clone())))
            .collect();
        let mut out = Vec::new();
        for f in futures {
            out.push(f.await.unwrap());
        }
        out
    });
    let _guard = ooze_torch::tch::no_grad_guard();
    for (p, out) in prompts.iter().zip(&outputs) {
        assert_eq!(out.tokens.len(), 20);
        assert_eq!(out.finish, FinishReason::Length);
        let full: Vec<u32> = p.iter().chain(&out.tokens).copied().collect();
        let scores = score_sequences(
            &scorer,
            std::slice::from_ref(&full),
            Layout::Padded,
            &ScoreOptions::default(),
        )
        .unwrap();
        let scored = &scores[0].log_probs[p.len() - 1..];
        let worst = scored
            .iter()
            .zip(&out.log_probs)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst <= 1e-5,
            "engine and scoring log-probs differ by {worst}"
        );
        let ids =
            Tensor::from_slice(&full.iter().map(|&t| t as i64).collect::<Vec<_>>()).unsqueeze(0);
        let positions = Tensor::arange(full.len() as i64, (Kind::Int64, Device::Cpu)).unsqueeze(0);
        let logits = scorer.logits(&scorer.hidden_states(&ids, &positions, Attention::Causal));
        let argmax = Vec::<i64>::try_from(logits.get(0).argmax(-1, false)).unwrap();
        let expected: Vec<u32> = argmax[p.len() - 1..full.len() - 1]
            .iter()
            .map(|&t| t as u32)
            .collect();
        assert_eq!(
            out.tokens, expected,
            "greedy tokens differ from the full-sequence argmax"
        );
    }
}

#[test]
fn same_seed_same_tokens_alone_or_in_a_batch_of_64() {
    let dir = model_dir();
    let handle = engine(dir.path(), 80, vec![]);
    let sampled = |seed| SamplingParams {
        seed: Some(seed),
        top_p: Some(0.95),
        max_new_tokens: Some(24),
        ignore_eos: Some(true),
        ..Default::default()
    };
    let target = prompt(99, 9);
    let rt = runtime();
    let alone = rt
        .block_on(handle.generate(request(&target, sampled(42))))
        .unwrap();
    // Plain sampling (no truncation) alone, for the same check among truncating neighbours.
    let plain = |seed| SamplingParams {
        top_p: None,
        ..sampled(seed)
    };
    let plain_alone = rt
        .block_on(handle.generate(request(&target, plain(7))))
        .unwrap();
    let crowd = rt.block_on(async {
        let mut requests = Vec::new();
        for i in 0..64u32 {
            if i == 31 {
                requests.push(request(&target, sampled(42)));
                requests.push(request(&target, plain(7)));
            }
            // Neighbours with every kind of setting: top-p, plain, top-k, greedy, min-p.
            let params = match i % 5 {
                0 => sampled(i as u64),
                1 => plain(i as u64),
                2 => SamplingParams {
                    top_k: Some(5),
                    ..sampled(i as u64)
                },
                3 => SamplingParams {
                    temperature: Some(0.0),
                    ..sampled(i as u64)
                },
                _ => SamplingParams {
                    min_p: Some(0.1),
                    ..plain(i as u64)
                },
            };
            requests.push(request(&prompt(i, 2 + i % 13), params));
        }
        all(&handle, requests).await
    });
    assert_eq!(crowd.len(), 66);
    let in_batch = &crowd[31];
    assert_eq!(
        in_batch.tokens, alone.tokens,
        "a seeded request must not depend on its batch"
    );
    assert_eq!(in_batch.seed, 42);
    assert_eq!(
        crowd[32].tokens, plain_alone.tokens,
        "nor on its neighbours' sampling settings"
    );
    let different = crowd.iter().filter(|o| o.tokens != alone.tokens).count();
    assert!(
        different >= 60,
        "other seeds and prompts should give other tokens"
    );
}

#[test]
fn abort_returns_partial_output_and_frees_the_slot() {
    let dir = model_dir();
    let handle = engine(dir.path(), 2, vec![]);
    let rt = runtime();
    rt.block_on(async {
        let long = SamplingParams {
            max_new_tokens: Some(200),
            ignore_eos: Some(true),
            ..Default::default()
        };
        let (id, mut rx) = handle.submit(request(&prompt(1, 5), long.clone())).unwrap();
        let (waiting_id, mut waiting_rx) = {
            // Fill the other slot, then queue one more that never starts.
            let _busy = handle.submit(request(&prompt(2, 5), long.clone())).unwrap();
            handle.submit(request(&prompt(3, 5), long)).unwrap()
        };
        let mut seen = 0;
        while let Some(Event::Token { .. }) = rx.recv().await {
            seen += 1;
            if seen == 3 {
                handle.abort(id);
                break;
            }
        }
        let mut done = None;
        while let Some(event) = rx.recv().await {
            if let Event::Done(out) = event {
                done = Some(out);
            }
        }
        let out = done.expect("aborted requests still report");
        assert_eq!(out.finish, FinishReason::Abort);
        assert!(
            out.tokens.len() >= 3 && out.tokens.len() < 200,
            "{}",
            out.tokens.len()
        );
        assert_eq!(out.tokens.len(), out.log_probs.len());
        handle.abort(waiting_id);
        handle.abort_all();
        let mut last = None;
        while let Some(event) = waiting_rx.recv().await {
            last = Some(event);
        }
        assert!(matches!(last, Some(Event::Done(ref o)) if o.finish == FinishReason::Abort));
        let stats = handle.stats().await.unwrap();
        assert_eq!(
            (stats.kv_blocks_free, stats.running, stats.waiting),
            (stats.kv_blocks_total, 0, 0),
            "{stats:?}"
        );
    });
}

#[test]
fn stop_tokens_strings_and_min_new_tokens() {
    let dir = model_dir();
    let tokenizer = Tokenizer::load(dir.path()).unwrap();
    let rt = runtime();
    let p = prompt(5, 6);
    let greedy = |extra: SamplingParams| SamplingParams {
        temperature: Some(0.0),
        max_new_tokens: Some(30),
        ..extra
    };
    let free = rt
        .block_on(
            engine(dir.path(), 4, vec![]).generate(request(&p, greedy(SamplingParams::default()))),
        )
        .unwrap();
    let stop_at = free.tokens[6];
    let first = free.tokens.iter().position(|&t| t == stop_at).unwrap();

    let handle = engine(dir.path(), 4, vec![]);
    let out = rt
        .block_on(handle.generate(request(
            &p,
            greedy(SamplingParams {
                stop_token_ids: Some(vec![stop_at]),
                ..Default::default()
            }),
        )))
        .unwrap();
    assert_eq!(
        out.finish,
        FinishReason::Stop {
            matched: StopMatch::Token(stop_at)
        }
    );
    assert_eq!(out.tokens, free.tokens[..=first]);

    // The same token as EOS, but not before 10 tokens: greedy then avoids it until then.
    let eos_engine = engine(dir.path(), 4, vec![stop_at]);
    let out = rt
        .block_on(eos_engine.generate(request(
            &p,
            greedy(SamplingParams {
                min_new_tokens: Some(10),
                ..Default::default()
            }),
        )))
        .unwrap();
    assert!(out.tokens.len() >= 10, "{:?}", out.tokens);
    assert!(!out.tokens[..10].contains(&stop_at));
    let ignored = rt
        .block_on(eos_engine.generate(request(
            &p,
            greedy(SamplingParams {
                ignore_eos: Some(true),
                ..Default::default()
            }),
        )))
        .unwrap();
    assert_eq!(
        (ignored.tokens.len(), ignored.finish.clone()),
        (30, FinishReason::Length)
    );

    let text = tokenizer.decode(&free.tokens, false).unwrap();
    let stop: String = text
        .chars()
        .skip(text.chars().count() / 2)
        .take(3)
        .collect();
    let out = rt
        .block_on(handle.generate(request(
            &p,
            greedy(SamplingParams {
                stop: Some(ooze_engine::StopStrings::One(stop.clone())),
                ..Default::default()
            }),
        )))
        .unwrap();
    assert_eq!(
        out.finish,
        FinishReason::Stop {
            matched: StopMatch::Text(stop.clone())
        }
    );
    let got = tokenizer.decode(&out.tokens, false).unwrap();
    assert!(
        got.contains(&stop),
        "stop text stays in the output: {got:?}"
    );
    assert!(out.tokens.len() < free.tokens.len());
}

#[test]
fn refuses_what_cannot_run() {
    let dir = model_dir();
    let handle = engine(dir.path(), 1, vec![]);
    let err = |r| handle.submit(r).err().unwrap();
    assert_eq!(
        err(request(&[], SamplingParams::default())),
        EngineError::EmptyInput
    );
    assert_eq!(
        err(request(&[1, 999_999], SamplingParams::default())),
        EngineError::TokenOutOfVocab(999_999, 400)
    );
    let long = SamplingParams {
        max_new_tokens: Some(250),
        ..Default::default()
    };
    assert_eq!(
        err(request(&prompt(0, 10), long)).to_string(),
        "prompt (10 tokens) + max_new_tokens (250) exceeds the engine's sequence length 256: \
         max_new_tokens must be in [0, 246] for this prompt"
    );
}

#[test]
fn pause_holds_requests_until_resumed() {
    let dir = model_dir();
    let handle = engine(dir.path(), 4, vec![]);
    let rt = runtime();
    rt.block_on(async {
        handle.pause(PauseMode::InPlace);
        let params = SamplingParams {
            max_new_tokens: Some(5),
            ignore_eos: Some(true),
            ..Default::default()
        };
        let (_, mut rx) = handle.submit(request(&prompt(1, 4), params)).unwrap();
        let stats = handle.stats().await.unwrap();
        assert!(stats.paused);
        assert_eq!(
            (stats.waiting, stats.running),
            (1, 0),
            "nothing runs while paused"
        );
        assert!(rx.try_recv().is_err(), "no token while paused");
        handle.resume();
        let mut n = 0;
        while let Some(event) = rx.recv().await {
            if let Event::Done(out) = event {
                n = out.tokens.len();
            }
        }
        assert_eq!(n, 5);
    });
}

fn assert_close(a: &[f32], b: &[f32], tolerance: f32) {
    assert_eq!(a.len(), b.len());
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(worst < tolerance, "log-probs differ by {worst}");
}

/// Submits `requests` while paused, resumes, and returns the streams once each has drawn at least
/// `tokens` tokens.
async fn running_streams(
    handle: &EngineHandle,
    requests: &[Request],
    tokens: usize,
) -> Vec<tokio::sync::mpsc::UnboundedReceiver<Event>> {
    handle.pause(PauseMode::InPlace);
    let mut streams: Vec<_> = requests
        .iter()
        .map(|r| handle.submit(r.clone()).unwrap().1)
        .collect();
    handle.resume();
    for rx in &mut streams {
        for _ in 0..tokens {
            assert!(matches!(rx.recv().await, Some(Event::Token { .. })));
        }
    }
    streams
}

/// Preempted requests (retracting pause) resume where they were: same tokens as uninterrupted runs,
/// whether their kept prefix survived (continued in place) or was flushed (recomputed).
#[test]
fn retracted_requests_continue_with_the_same_tokens() {
    let dir = model_dir();
    let rt = runtime();
    let requests: Vec<Request> = (0..4)
        .map(|i| {
            let params = SamplingParams {
                temperature: Some(if i == 0 { 0.0 } else { 0.9 }),
                top_p: Some(if i == 2 { 0.8 } else { 1.0 }),
                // Long enough that none can finish before the pause reaches the engine.
                max_new_tokens: Some(400),
                ignore_eos: Some(true),
                seed: Some(100 + i as u64),
                ..Default::default()
            };
            request(&prompt(40 + i, 6 + 5 * i), params)
        })
        .collect();
    let engine = || start_engine(dir.path(), EngineConfig::new(4, 512, vec![]));
    let reference = rt.block_on(all(&engine(), requests.clone()));
    for flush in [false, true] {
        let handle = engine();
        let resumed = rt.block_on(async {
            let streams = running_streams(&handle, &requests, 10).await;
            handle.pause(PauseMode::Retract);
            let stats = handle.stats().await.unwrap();
            assert_eq!((stats.running, stats.waiting, stats.preempted), (0, 4, 4));
            assert!(
                stats.kv_blocks_cached >= 4,
                "their blocks are kept for them: {stats:?}"
            );
            if flush {
                handle.flush_cache().await.unwrap();
            }
            handle.resume();
            let outs = outputs(streams).await;
            let stats = handle.stats().await.unwrap();
            assert_eq!(
                (stats.kv_blocks_free, stats.running),
                (stats.kv_blocks_total, 0)
            );
            outs
        });
        for (got, want) in resumed.iter().zip(&reference) {
            assert_eq!(got.tokens, want.tokens, "flush {flush}");
            assert_eq!(got.seed, want.seed);
            assert_eq!(got.finish, FinishReason::Length);
            assert_close(&got.log_probs, &want.log_probs, 1e-5);
        }
    }
}

/// SGLang's default pause mode: everything in flight ends as aborted, with its partial output.
#[test]
fn aborting_pause_ends_running_and_waiting_requests() {
    let dir = model_dir();
    let handle = start_engine(dir.path(), EngineConfig::new(1, 512, vec![]));
    let rt = runtime();
    let params = SamplingParams {
        max_new_tokens: Some(400),
        ignore_eos: Some(true),
        ..Default::default()
    };
    let requests = [
        request(&prompt(1, 5), params.clone()),
        request(&prompt(2, 5), params),
    ];
    let outs = rt.block_on(async {
        let mut streams = running_streams(&handle, &requests[..1], 3).await;
        streams.push(handle.submit(requests[1].clone()).unwrap().1);
        handle.pause(PauseMode::Abort);
        let outs = outputs(streams).await;
        let stats = handle.stats().await.unwrap();
        assert!(stats.paused);
        assert_eq!(
            (stats.running, stats.waiting, stats.kv_blocks_free),
            (0, 0, stats.kv_blocks_total)
        );
        outs
    });
    assert!(outs.iter().all(|o| o.finish == FinishReason::Abort));
    assert!((3..400).contains(&outs[0].tokens.len()), "partial output");
    assert_eq!(outs[0].tokens.len(), outs[0].log_probs.len());
    assert!(outs[1].tokens.is_empty(), "never started");
}

#[test]
fn a_resumed_engine_starts_at_its_weight_version() {
    let dir = model_dir();
    let greedy = SamplingParams {
        temperature: Some(0.0),
        max_new_tokens: Some(4),
        ..Default::default()
    };
    let p = prompt(3, 6);
    let rt = runtime();
    let handle = start_engine(
        dir.path(),
        EngineConfig::new(2, 256, vec![]).with_initial_weight_version(7),
    );
    let out = rt
        .block_on(handle.generate(request(&p, greedy.clone())))
        .unwrap();
    assert_eq!(out.weight_version, 7);
    assert_eq!(rt.block_on(handle.stats()).unwrap().weight_version, 7);
    assert_eq!(rt.block_on(handle.weights_updated_in_place()).unwrap(), 8);
    let out = rt.block_on(handle.generate(request(&p, greedy))).unwrap();
    assert_eq!(out.weight_version, 8);
}

#[test]
fn weights_update_in_place_with_a_version() {
    let dir = model_dir();
    let other = model_with_seed(12);
    let greedy = SamplingParams {
        temperature: Some(0.0),
        max_new_tokens: Some(12),
        ignore_eos: Some(true),
        ..Default::default()
    };
    let p = prompt(4, 7);
    let rt = runtime();
    let handle = engine(dir.path(), 2, vec![]);
    let before = rt
        .block_on(handle.generate(request(&p, greedy.clone())))
        .unwrap();
    assert_eq!(before.weight_version, 0);
    let err = rt
        .block_on(handle.update_weights_from_disk(dir.path().join("missing")))
        .unwrap_err();
    assert!(err.to_string().contains("no weights found"), "{err}");
    let version = rt
        .block_on(handle.update_weights_from_disk(other.path().to_owned()))
        .unwrap();
    assert_eq!(version, 1);
    let after = rt
        .block_on(handle.generate(request(&p, greedy.clone())))
        .unwrap();
    let fresh = rt
        .block_on(engine(other.path(), 2, vec![]).generate(request(&p, greedy)))
        .unwrap();
    assert_eq!(after.weight_version, 1);
    assert_eq!(
        after.tokens, fresh.tokens,
        "updated weights behave like a fresh load"
    );
    assert_eq!(after.log_probs, fresh.log_probs);
    assert_ne!(
        after.log_probs, before.log_probs,
        "new weights, new distribution"
    );
}

fn engine_with(dir: &Path, slots: i64, min_prefix_reuse: usize) -> EngineHandle {
    let mut config = EngineConfig::new(slots, 256, vec![]);
    config.min_prefix_reuse = min_prefix_reuse;
    start_engine(dir, config)
}

async fn all(handle: &EngineHandle, requests: Vec<Request>) -> Vec<ooze_engine::Output> {
    outputs(
        requests
            .into_iter()
            .map(|r| handle.submit(r).unwrap().1)
            .collect(),
    )
    .await
}

#[test]
fn samples_of_one_prompt_share_its_prefill_exactly() {
    let dir = model_dir();
    let reuse = engine_with(dir.path(), 8, 16);
    let fresh = engine_with(dir.path(), 8, usize::MAX);
    let p = prompt(8, 40);
    let requests = || {
        (0..4u64)
            .map(|s| {
                request(
                    &p,
                    SamplingParams {
                        seed: Some(s),
                        max_new_tokens: Some(12),
                        ignore_eos: Some(true),
                        ..Default::default()
                    },
                )
            })
            .collect::<Vec<_>>()
    };
    let rt = runtime();
    let shared = rt.block_on(all(&reuse, requests()));
    let alone = rt.block_on(all(&fresh, requests()));
    let cached: Vec<usize> = shared.iter().map(|o| o.cached_tokens).collect();
    assert_eq!(
        cached.iter().filter(|&&c| c == 32).count(),
        3,
        "three samples share the first one's two whole blocks of 16: {cached:?}"
    );
    assert!(alone.iter().all(|o| o.cached_tokens == 0));
    for (a, b) in shared.iter().zip(&alone) {
        assert_eq!(a.tokens, b.tokens, "reused keys/values change nothing");
        let worst = a
            .log_probs
            .iter()
            .zip(&b.log_probs)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "{worst}");
    }
}

#[test]
fn the_next_turn_continues_from_the_kept_sequence() {
    let dir = model_dir();
    let reuse = engine_with(dir.path(), 2, 16);
    let fresh = engine_with(dir.path(), 2, usize::MAX);
    let greedy = SamplingParams {
        temperature: Some(0.0),
        max_new_tokens: Some(10),
        ignore_eos: Some(true),
        ..Default::default()
    };
    let rt = runtime();
    let turn1 = rt
        .block_on(reuse.generate(request(&prompt(3, 30), greedy.clone())))
        .unwrap();
    // The agent appends the generated turn and a tool result, then asks again.
    let mut next: Vec<u32> = prompt(3, 30);
    next.extend(&turn1.tokens);
    next.extend([7, 8, 9, 10, 11]);
    let turn2 = rt
        .block_on(reuse.generate(request(&next, greedy.clone())))
        .unwrap();
    assert_eq!(
        turn2.cached_tokens,
        30 + 9,
        "the prompt and all but the last generated token were kept"
    );
    let recomputed = rt.block_on(fresh.generate(request(&next, greedy))).unwrap();
    assert_eq!(turn2.tokens, recomputed.tokens);
    rt.block_on(async {
        // Kept: the two turns' three whole blocks and the second turn's last, partial one.
        let stats = reuse.stats().await.unwrap();
        assert_eq!(
            (stats.kv_blocks_free, stats.kv_blocks_cached),
            (stats.kv_blocks_total, 4)
        );
        reuse.flush_cache().await.unwrap();
        let stats = reuse.stats().await.unwrap();
        assert_eq!(
            (stats.kv_blocks_free, stats.kv_blocks_cached),
            (stats.kv_blocks_total, 0)
        );
    });
}

#[test]
fn kv_memory_is_released_between_rollouts_and_comes_back_on_demand() {
    let dir = model_dir();
    let handle = engine(dir.path(), 2, vec![]);
    let greedy = SamplingParams {
        temperature: Some(0.0),
        max_new_tokens: Some(6),
        ignore_eos: Some(true),
        ..Default::default()
    };
    let rt = runtime();
    rt.block_on(async {
        let before = handle
            .generate(request(&prompt(2, 5), greedy.clone()))
            .await
            .unwrap();
        // Released while a request runs: it is preempted and finishes after the memory is back,
        // with the tokens it would have drawn anyway.
        let sampled = SamplingParams {
            max_new_tokens: Some(60),
            ignore_eos: Some(true),
            seed: Some(5),
            ..Default::default()
        };
        let uninterrupted = handle
            .generate(request(&prompt(3, 7), sampled.clone()))
            .await
            .unwrap();
        handle.flush_cache().await.unwrap();
        handle.pause(PauseMode::InPlace);
        let (_, mut busy) = handle.submit(request(&prompt(3, 7), sampled)).unwrap();
        handle.resume();
        assert!(
            matches!(busy.recv().await, Some(Event::Token { .. })),
            "it is running"
        );
        handle.pause(PauseMode::InPlace);
        assert_eq!(handle.release_memory().await.unwrap(), 1, "one preempted");
        let stats = handle.stats().await.unwrap();
        assert!(!stats.kv_allocated);
        assert_eq!(
            (stats.kv_blocks_cached, stats.running, stats.waiting),
            (0, 0, 1)
        );
        handle.resume();
        let resumed = outputs(vec![busy]).await.remove(0);
        assert_eq!(resumed.tokens, uninterrupted.tokens);
        assert_eq!(resumed.finish, FinishReason::Length);
        assert_close(&resumed.log_probs, &uninterrupted.log_probs, 1e-5);
        handle.release_memory().await.unwrap();
        let stats = handle.stats().await.unwrap();
        assert!(!stats.kv_allocated);
        assert_eq!(stats.kv_blocks_cached, 0);
        let after = handle
            .generate(request(&prompt(2, 5), greedy))
            .await
            .unwrap();
        assert!(handle.stats().await.unwrap().kv_allocated);
        assert_eq!(
            after.tokens, before.tokens,
            "the same answer after re-allocation"
        );
    });
}

#[test]
fn batched_prefill_of_uneven_prompts_equals_one_at_a_time() {
    let dir = model_dir();
    let batched = engine(dir.path(), 8, vec![]);
    let single = engine(dir.path(), 8, vec![]);
    let greedy = SamplingParams {
        temperature: Some(0.0),
        max_new_tokens: Some(8),
        ignore_eos: Some(true),
        ..Default::default()
    };
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| prompt(20 + i, 3 + 7 * i)).collect();
    let rt = runtime();
    // Paused while they queue, so one prefill pass takes them all (right-padded to the longest).
    batched.pause(PauseMode::InPlace);
    let together = rt.block_on(async {
        let streams: Vec<_> = prompts
            .iter()
            .map(|p| batched.submit(request(p, greedy.clone())).unwrap().1)
            .collect();
        batched.resume();
        outputs(streams).await
    });
    for (p, out) in prompts.iter().zip(&together) {
        let alone = rt
            .block_on(single.generate(request(p, greedy.clone())))
            .unwrap();
        assert_eq!(out.tokens, alone.tokens);
        let worst = out
            .log_probs
            .iter()
            .zip(&alone.log_probs)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "batched prefill changed log-probs by {worst}");
    }
}

#[test]
fn weights_update_from_in_process_tensors() {
    let dir = model_dir();
    let other = model_with_seed(13);
    let trainer = Decoder::load(other.path(), Device::Cpu, Kind::Float).unwrap();
    let greedy = SamplingParams {
        temperature: Some(0.0),
        max_new_tokens: Some(8),
        ignore_eos: Some(true),
        ..Default::default()
    };
    let p = prompt(6, 9);
    let rt = runtime();
    let handle = engine(dir.path(), 2, vec![]);
    let mut partial = trainer.named_parameters();
    partial.retain(|(name, _)| name != "model.norm.weight");
    let err = rt
        .block_on(handle.update_weights_from_tensors(partial))
        .unwrap_err();
    assert!(err.to_string().contains("model.norm.weight"), "{err}");
    assert_eq!(
        rt.block_on(handle.stats()).unwrap().weight_version,
        0,
        "a rejected update changes nothing"
    );
    let version = rt
        .block_on(handle.update_weights_from_tensors(trainer.named_parameters()))
        .unwrap();
    assert_eq!(version, 1);
    let updated = rt
        .block_on(handle.generate(request(&p, greedy.clone())))
        .unwrap();
    let fresh = rt
        .block_on(engine(other.path(), 2, vec![]).generate(request(&p, greedy)))
        .unwrap();
    assert_eq!(
        (updated.tokens, updated.log_probs),
        (fresh.tokens, fresh.log_probs)
    );
}

#[test]
fn shutdown_aborts_what_runs_and_stops_the_engine() {
    let dir = model_dir();
    let handle = start_engine(dir.path(), EngineConfig::new(2, 512, vec![]));
    let rt = runtime();
    let params = SamplingParams {
        max_new_tokens: Some(400),
        ignore_eos: Some(true),
        ..Default::default()
    };
    rt.block_on(async {
        let streams = running_streams(&handle, &[request(&prompt(4, 6), params)], 2).await;
        handle.shutdown().await;
        let out = outputs(streams).await.remove(0);
        assert_eq!(out.finish, FinishReason::Abort);
        assert!(out.tokens.len() >= 2 && out.tokens.len() < 400);
        assert_eq!(handle.stats().await.unwrap_err(), EngineError::Stopped);
        assert!(handle
            .submit(request(&prompt(1, 3), SamplingParams::default()))
            .is_err());
    });
}

/// The fused GPU attention kernels need key lengths (and so blocks) aligned to 16 positions.
#[test]
fn context_lengths_are_aligned_for_the_attention_kernels() {
    assert_eq!(EngineConfig::new(1, 700, vec![]).context_len, 704);
    assert_eq!(EngineConfig::new(1, 512, vec![]).context_len, 512);
    assert_eq!(EngineConfig::new(1, 1, vec![]).context_len, 16);
}
