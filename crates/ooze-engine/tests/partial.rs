//! Partial rollouts on the running engine, on a tiny CPU model: weight updates that pause a
//! request mid-generation change none of its tokens (the weights stay the same here, only the
//! version advances), and its tokens record the version that drew each.

use ooze_engine::{EngineConfig, EngineHandle, Request, SamplingParams};
use std::time::Duration;

mod common;

fn request(seed: u64, max_new: usize) -> Request {
    Request {
        input_ids: (0..12).map(|j| (j * 29 + 5) % 390 + 1).collect(),
        sampling: SamplingParams {
            seed: Some(seed),
            max_new_tokens: Some(max_new),
            ignore_eos: Some(true),
            ..Default::default()
        }
        .validate()
        .unwrap(),
        session: Some(3),
    }
}

fn engine(dir: &std::path::Path) -> EngineHandle {
    // One CPU thread: how libtorch splits a matmul must not enter a comparison of tokens.
    ooze_torch::tch::set_num_threads(1);
    common::start_engine(dir, EngineConfig::new(4, 256, vec![]))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A weight update as an asynchronous run makes one beside an engine sharing the trainer's
/// tensors: pause (requests end with their partial outputs), new version, resume.
async fn update(engine: &EngineHandle) -> u64 {
    engine.begin_weight_update();
    let version = engine.weights_updated_in_place().await.unwrap();
    engine.end_weight_update();
    version
}

#[test]
fn updates_mid_generation_keep_every_token_and_record_its_version() {
    let dir = common::tiny_model(31);
    let rt = runtime();
    let quiet = engine(dir.path());
    let want = rt.block_on(quiet.generate(request(11, 200))).unwrap();
    assert_eq!(want.tokens.len(), 200);
    assert!(want.token_versions.is_empty(), "one version: implicit");

    let paused = engine(dir.path());
    let mut split_seen = 0;
    for delay_ms in [5u64, 15, 30, 60, 120] {
        let before = rt.block_on(paused.stats()).unwrap().weight_version;
        let generating = rt.spawn({
            let e = paused.clone();
            async move { e.generate(request(11, 200)).await }
        });
        // Two updates while it runs.
        let versions = rt.block_on(async {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            let a = update(&paused).await;
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            let b = update(&paused).await;
            (a, b)
        });
        assert_eq!(versions, (before + 1, before + 2));
        let got = rt.block_on(generating).unwrap().unwrap();
        assert_eq!(
            got.tokens, want.tokens,
            "no token changes (delay {delay_ms} ms)"
        );
        assert_eq!(got.log_probs.len(), 200);
        let per_token = got.versions();
        assert_eq!(per_token.len(), 200);
        assert!(
            per_token.windows(2).all(|w| w[0] <= w[1]),
            "versions only grow along the output: {per_token:?}"
        );
        assert!(per_token.iter().all(|&v| v >= before && v <= before + 2));
        assert_eq!(got.weight_version, *per_token.last().unwrap());
        if per_token[0] != per_token[199] {
            split_seen += 1;
            assert_eq!(got.token_versions.len(), 200, "several versions: explicit");
        }
    }
    assert!(
        split_seen > 0,
        "at least one update landed while the request generated"
    );
    let stats = rt.block_on(paused.stats()).unwrap();
    assert!(!stats.paused);
    assert_eq!((stats.running, stats.waiting), (0, 0));
}

#[test]
fn a_request_submitted_during_an_update_waits_for_it() {
    let dir = common::tiny_model(31);
    let rt = runtime();
    let e = engine(dir.path());
    e.begin_weight_update();
    assert!(e.gate().closed);
    let waiting = {
        let e = e.clone();
        async move { e.generate(request(5, 8)).await }
    };
    let out = rt.block_on(async {
        let waiting = tokio::spawn(waiting);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "it waits at the gate");
        let version = e.weights_updated_in_place().await.unwrap();
        e.end_weight_update();
        (waiting.await.unwrap().unwrap(), version)
    });
    assert_eq!(out.0.weight_version, out.1, "drawn under the new weights");
    assert_eq!(out.0.tokens.len(), 8);
    assert!(!e.gate().closed);
}
