//! Overlapped decode steps (each step queued before the host handles the draws of the one before)
//! give every request what it gets without overlap: the same tokens, finish reasons and
//! log-probs, across stop tokens, EOS under `min_new_tokens`, stop strings, length limits, the
//! context's end, top-k/top-p rows beside plain and greedy ones, more requests than batch rows,
//! and preemption when blocks run out. Tiny CPU model, one libtorch thread.

use ooze_core::FinishReason;
use ooze_engine::{EngineConfig, EngineHandle, Output, Request, SamplingParams, StopStrings};
use ooze_model::Tokenizer;
use std::path::Path;

mod common;
use common::{all, runtime};

fn start_engine(dir: &Path, config: EngineConfig) -> EngineHandle {
    ooze_torch::tch::set_num_threads(1);
    common::start_engine(dir, config)
}

/// Requests whose ends differ in kind and in step, so that a request ends while the step after
/// its last token is already queued, and others end exactly when known in advance.
fn workload(tokenizer: &Tokenizer) -> Vec<Request> {
    let text = tokenizer
        .decode(&(40..90).collect::<Vec<u32>>(), false)
        .unwrap();
    let stop: String = text.chars().skip(7).take(2).collect();
    (0..24u32)
        .map(|i| {
            let prompt: Vec<u32> = (0..5 + i % 7)
                .map(|j| (i * 37 + j * 11) % 390 + 1)
                .collect();
            let mut p = SamplingParams {
                seed: Some(500 + u64::from(i)),
                max_new_tokens: Some(6 + (i as usize * 5) % 40),
                ..Default::default()
            };
            match i % 6 {
                // Stop tokens: about one token in 25 ends the request.
                0 => p.stop_token_ids = Some((0..16).map(|t| t * 25 + i % 25).collect()),
                // EOS (the engine's), not before 8 tokens: banned until then.
                1 => p.min_new_tokens = Some(8),
                2 => {
                    p.top_p = Some(0.8);
                    p.stop_token_ids = Some((0..10).map(|t| t * 40 + 3).collect());
                }
                3 => {
                    p.temperature = Some(0.0);
                    p.stop = Some(StopStrings::One(stop.clone()));
                }
                4 => {
                    p.top_k = Some(20);
                    p.ignore_eos = Some(true);
                }
                // Up to the context's end (64 tokens).
                _ => {
                    p.ignore_eos = Some(true);
                    p.max_new_tokens = Some(64 - prompt.len());
                }
            }
            Request {
                input_ids: prompt,
                sampling: p.validate().unwrap(),
                session: None,
            }
        })
        .collect()
}

fn config(max_running: i64, kv_tokens: Option<i64>, overlap: bool) -> EngineConfig {
    let mut c = EngineConfig::new(max_running, 64, vec![7, 19, 101, 230, 333])
        .with_kv(Some(16), kv_tokens)
        .unwrap();
    c.overlap_steps = Some(overlap);
    c
}

fn assert_same(got: &[Output], want: &[Output]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.tokens, w.tokens, "request {i}");
        assert_eq!(g.finish, w.finish, "request {i}");
        let worst = (g.log_probs.iter().zip(&w.log_probs))
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        // Bitwise where both ran the same batches; a row computed for nothing in a step (overlap)
        // changes the CPU matmul's row count, which may round the last bit differently.
        assert!(worst < 1e-5, "request {i}: log-probs differ by {worst}");
    }
}

#[test]
fn overlapped_steps_give_what_sequential_steps_give() {
    let dir = common::tiny_model(31);
    let tokenizer = Tokenizer::load(dir.path()).unwrap();
    let rt = runtime();
    // The outputs, and how many steps were queued while the one before was in flight.
    let run = |c: EngineConfig| {
        let handle = start_engine(dir.path(), c);
        let outs = rt.block_on(all(&handle, workload(&tokenizer)));
        (outs, rt.block_on(handle.stats()).unwrap().overlapped_steps)
    };
    let (sequential, none) = run(config(32, None, false));
    assert_eq!(none, 0);
    let finishes: Vec<&FinishReason> = sequential.iter().map(|o| &o.finish).collect();
    let stopped = finishes
        .iter()
        .filter(|f| matches!(f, FinishReason::Stop { .. }))
        .count();
    let lengths = finishes.len() - stopped;
    assert!(
        stopped >= 6 && lengths >= 6,
        "the workload ends requests both ways: {finishes:?}"
    );
    assert!(
        sequential
            .iter()
            .any(|o| o.tokens.len() + o.prompt_tokens == 64),
        "some request reaches the context's end"
    );
    // Every request in one batch; then 5 rows for 24 requests (they join as others end); then
    // memory for 10 blocks of 16, so running requests are preempted and recomputed.
    let (overlapped, steps) = run(config(32, None, true));
    assert_same(&overlapped, &sequential);
    assert!(steps > 30, "steps were queued ahead: {steps}");
    assert_same(
        &run(config(5, None, true)).0,
        &run(config(5, None, false)).0,
    );
    let tight = start_engine(dir.path(), config(8, Some(10 * 16), true));
    assert_same(&rt.block_on(all(&tight, workload(&tokenizer))), &sequential);
    let stats = rt.block_on(tight.stats()).unwrap();
    assert!(stats.preempted > 0, "blocks ran out: {stats:?}");
    assert_eq!((stats.kv_blocks_free, stats.running), (10, 0), "{stats:?}");
}

/// The steady-decode counters (`decode_steps` and the rest) count the decode steps queued right
/// behind another decode step, with and without overlap: not the first one after a prefill, and
/// not across the idle time between two requests.
#[test]
fn steady_decode_counts_only_steps_behind_decode_steps() {
    let dir = common::tiny_model(37);
    let rt = runtime();
    for overlap in [false, true] {
        let handle = start_engine(dir.path(), config(4, None, overlap));
        let request = || Request {
            input_ids: vec![11, 12, 13, 14, 15, 16],
            sampling: SamplingParams {
                seed: Some(3),
                max_new_tokens: Some(10),
                ignore_eos: Some(true),
                ..Default::default()
            }
            .validate()
            .unwrap(),
            session: None,
        };
        let mut seen = Vec::new();
        for _ in 0..2 {
            let out = rt.block_on(all(&handle, vec![request()]));
            assert_eq!(out[0].tokens.len(), 10);
            let s = rt.block_on(handle.stats()).unwrap();
            seen.push((s.decode_steps, s.decode_rows, s.decode_positions));
            assert!(s.decode_seconds > 0.0, "{s:?}");
        }
        // The prefill draws token 1; decode steps 1..=9 draw the rest, step k attending 6 + k
        // positions. Step 1 follows the prefill, so steps 2..=9 count: 8 steps, 92 positions.
        assert_eq!(seen[0], (8, 8, 92), "overlap {overlap}");
        // The second request adds the same: the first step after the idle wait does not count.
        assert_eq!(seen[1], (16, 16, 184), "overlap {overlap}");
    }
}

/// With overlap, a prefill pass's first tokens are taken once the next pass is queued; without,
/// at once. One admission of many passes (requests sharing a prompt prefix wait for the pass
/// after the one that holds it, to reuse its blocks) gives the same tokens, finishes and
/// log-probs either way, with scoring-only requests and requests that stop at their first token
/// among them.
#[test]
fn first_tokens_taken_a_pass_later_are_the_same() {
    let dir = common::tiny_model(41);
    let rt = runtime();
    let shared: Vec<u32> = (0..24u32).map(|j| (j * 13) % 390 + 1).collect();
    let requests = || -> Vec<Request> {
        (0..12u32)
            .map(|i| {
                let mut prompt = shared.clone();
                prompt.extend((0..1 + i % 5).map(|j| (i * 31 + j * 7) % 390 + 1));
                let mut p = SamplingParams {
                    seed: Some(900 + u64::from(i)),
                    max_new_tokens: Some(match i % 4 {
                        0 => 0,
                        1 => 1,
                        _ => 6 + i as usize,
                    }),
                    ignore_eos: Some(true),
                    ..Default::default()
                };
                if i % 4 == 3 {
                    // Every token stops it: it ends at its first.
                    p.stop_token_ids = Some((0..400).collect());
                }
                Request {
                    input_ids: prompt,
                    sampling: p.validate().unwrap(),
                    session: None,
                }
            })
            .collect()
    };
    let run = |overlap: bool| {
        let handle = start_engine(dir.path(), config(32, None, overlap));
        let outs = rt.block_on(all(&handle, requests()));
        let stats = rt.block_on(handle.stats()).unwrap();
        assert_eq!(stats.running, 0, "{stats:?}");
        outs
    };
    let sequential = run(false);
    for (i, out) in sequential.iter().enumerate() {
        let want = match i % 4 {
            0 => 0,
            1 | 3 => 1,
            _ => 6 + i,
        };
        assert_eq!(out.tokens.len(), want, "request {i}: {out:?}");
    }
    assert!(sequential
        .iter()
        .skip(3)
        .step_by(4)
        .all(|o| matches!(o.finish, FinishReason::Stop { .. })));
    assert_same(&run(true), &sequential);
}
