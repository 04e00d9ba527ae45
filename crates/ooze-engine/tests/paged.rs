//! Paged KV memory in the running engine, on a tiny CPU model: blocks of 16 give exactly what
//! one fixed slot per sequence gives; running out of blocks preempts and recomputes without
//! changing a token; 1,000 random aborts, pauses and flushes leave every block free.

use ooze_engine::{EngineConfig, EngineHandle, Event, PauseMode, Request, SamplingParams};
use std::path::Path;
use tokio::sync::mpsc::UnboundedReceiver;

mod common;
use common::{all, runtime};

fn model_dir() -> tempfile::TempDir {
    common::tiny_model(23)
}

fn start_engine(dir: &Path, config: EngineConfig) -> EngineHandle {
    // One CPU thread: how libtorch splits a matmul across threads (which other tests in this
    // process load) must not enter a comparison of bits.
    ooze_torch::tch::set_num_threads(1);
    common::start_engine(dir, config)
}

/// `max_running` sequences of up to 256 tokens, in blocks of `block_size` (`None`: one fixed slot
/// each), with `kv_tokens` of memory (`None`: all of them at full length).
fn config(max_running: i64, block_size: Option<i64>, kv_tokens: Option<i64>) -> EngineConfig {
    let fixed = Some(256);
    EngineConfig::new(max_running, 256, vec![])
        .with_kv(block_size.or(fixed), kv_tokens)
        .unwrap()
}

fn request(prompt: Vec<u32>, seed: u64, max_new: usize) -> Request {
    Request {
        input_ids: prompt,
        sampling: SamplingParams {
            seed: Some(seed),
            max_new_tokens: Some(max_new),
            ignore_eos: Some(true),
            ..Default::default()
        }
        .validate()
        .unwrap(),
        session: None,
    }
}

/// Prompts that share prefixes: a few system prompts, each with several different tails, and each
/// of those asked twice (two samples).
fn workload() -> Vec<Request> {
    let system =
        |s: u32, len: u32| -> Vec<u32> { (0..len).map(|j| (s * 53 + j * 7) % 390 + 1).collect() };
    let mut requests = Vec::new();
    for s in 0..3u32 {
        for tail in 0..3u32 {
            let mut prompt = system(s, 21 + 9 * s);
            prompt.extend((0..5 + 4 * tail).map(|j| (tail * 31 + j * 13) % 390 + 1));
            for sample in 0..2u64 {
                let seed = 1000 + u64::from(s * 10 + tail) * 2 + sample;
                requests.push(request(prompt.clone(), seed, 10 + 7 * tail as usize));
            }
        }
    }
    requests
}

fn worst(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn blocks_of_16_decode_exactly_as_fixed_slots() {
    let dir = model_dir();
    let rt = runtime();
    // Without prefix reuse both compute every token in the same passes: bitwise equal.
    let no_reuse = |block_size| {
        let mut c = config(6, block_size, None);
        c.min_prefix_reuse = usize::MAX;
        start_engine(dir.path(), c)
    };
    let paged = rt.block_on(all(&no_reuse(Some(16)), workload()));
    let fixed = rt.block_on(all(&no_reuse(None), workload()));
    for (p, f) in paged.iter().zip(&fixed) {
        assert_eq!(p.tokens, f.tokens);
        assert_eq!(p.log_probs, f.log_probs, "bitwise equal log-probs");
        assert_eq!(p.cached_tokens, 0);
    }
    // With reuse, paged memory shares whole blocks of the prompts; the tokens do not change.
    let shared = rt.block_on(all(
        &start_engine(dir.path(), config(6, Some(16), None)),
        workload(),
    ));
    let reused: usize = shared.iter().map(|o| o.cached_tokens).sum();
    assert!(
        reused >= 16 * 9,
        "samples and tails share blocks: {reused} tokens reused"
    );
    for (s, f) in shared.iter().zip(&fixed) {
        assert_eq!(s.tokens, f.tokens);
        assert!(worst(&s.log_probs, &f.log_probs) < 1e-5);
    }
}

#[test]
fn running_out_of_blocks_preempts_and_recomputes_the_same_tokens() {
    let dir = model_dir();
    let rt = runtime();
    // Eight sequences of 30 + 120 tokens want 80 blocks of 16; the memory has 18.
    let requests: Vec<Request> = (0..8u32)
        .map(|i| {
            request(
                (0..30).map(|j| (i * 41 + j * 3) % 390 + 1).collect(),
                77 + u64::from(i),
                120,
            )
        })
        .collect();
    let roomy = start_engine(dir.path(), config(8, Some(16), None));
    let tight = start_engine(dir.path(), config(8, Some(16), Some(18 * 16)));
    let want = rt.block_on(all(&roomy, requests.clone()));
    let got = rt.block_on(all(&tight, requests));
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.tokens, w.tokens, "recomputation changes no token");
        assert!(worst(&g.log_probs, &w.log_probs) < 1e-5);
    }
    let stats = rt.block_on(tight.stats()).unwrap();
    assert!(stats.preempted > 0, "blocks ran out: {stats:?}");
    assert_eq!(stats.kv_blocks_total, 18);
    assert_eq!((stats.kv_blocks_free, stats.running), (18, 0), "{stats:?}");
    assert_eq!(rt.block_on(roomy.stats()).unwrap().preempted, 0);
}

/// Seeded xorshift.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

#[test]
fn a_thousand_random_aborts_leak_no_block() {
    let dir = model_dir();
    let rt = runtime();
    // Tight memory, so preemption and eviction happen too.
    let handle = start_engine(dir.path(), config(8, Some(16), Some(40 * 16)));
    let mut rng = Rng(0x5eed_1234);
    let bases: Vec<Vec<u32>> = (0..4u32)
        .map(|b| (0..40).map(|j| (b * 97 + j * 5) % 390 + 1).collect())
        .collect();
    rt.block_on(async {
        let mut live: Vec<(ooze_engine::RequestId, UnboundedReceiver<Event>, u64)> = Vec::new();
        let (mut submitted, mut aborted) = (0u64, 0);
        while aborted < 1000 || !live.is_empty() {
            if aborted + (live.len() as u64) < 1000 && live.len() < 24 {
                let base = &bases[rng.below(4) as usize];
                let mut prompt = base[..1 + rng.below(40) as usize].to_vec();
                prompt.extend((0..rng.below(20)).map(|j| (j * 17 + submitted) as u32 % 390 + 1));
                let max_new = 1 + rng.below(40);
                let r = request(prompt, submitted, max_new as usize);
                let (id, rx) = handle.submit(r).unwrap();
                // Aborted after this many of its tokens: waiting, running, or just finished.
                live.push((id, rx, rng.below(max_new + 1)));
                submitted += 1;
            }
            match rng.below(40) {
                0 => {
                    handle.pause(PauseMode::Retract);
                    handle.resume();
                }
                1 => handle.flush_cache().await.unwrap(),
                2 => {
                    handle.pause(PauseMode::InPlace);
                    handle.resume();
                }
                _ => {}
            }
            let i = rng.below(live.len() as u64) as usize;
            let (id, rx, left) = &mut live[i];
            if *left == 0 {
                handle.abort(*id);
                aborted += 1;
                let (_, rx, _) = live.swap_remove(i);
                common::done(rx).await;
                continue;
            }
            *left -= 1;
            match rx.recv().await {
                Some(Event::Token { .. }) => {}
                // Preempted and recomputed requests can end before the planned abort only by
                // finishing; every request is aborted otherwise.
                Some(Event::Done(_)) | None => {
                    live.swap_remove(i);
                    aborted += 1;
                }
            }
        }
        let stats = handle.stats().await.unwrap();
        assert_eq!((stats.running, stats.waiting), (0, 0), "{stats:?}");
        assert_eq!(
            stats.kv_blocks_free, stats.kv_blocks_total,
            "blocks leaked: {stats:?}"
        );
        handle.flush_cache().await.unwrap();
        let stats = handle.stats().await.unwrap();
        assert_eq!(stats.kv_blocks_cached, 0, "{stats:?}");
    });
}
