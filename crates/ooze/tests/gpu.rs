//! GPU checks, ignored by default (CI has no GPU). On a CUDA machine:
//! `cargo test -p ooze --test gpu -- --ignored` (or the built test binary with `--ignored`).
//! They live in this crate because its link settings pull in libtorch_cuda.

use ooze_model::init::{init_model, InitOptions, Size};
use ooze_model::{score_sequences, Decoder, Family, Layout, ScoreOptions};
use ooze_torch::tch::{Device, Kind};

mod common;
use common::generate_all;

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

#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_is_reported() {
    require_gpu();
    let info = ooze_torch::runtime_info();
    assert!(info.cuda_available);
    assert!(
        !info.gpus.is_empty(),
        "no GPU details: {:?}",
        info.gpu_query_error
    );
    assert!(info.gpus[0].total_memory_bytes > 1 << 30);
}

#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_scores_match_cpu() {
    require_gpu();
    let dir = tempfile::tempdir().unwrap();
    let mut options = InitOptions::new(Family::Qwen2, Size::Small);
    options.seed = 3;
    init_model(
        dir.path(),
        &ooze_model::corpus::generate(0, 50_000),
        &options,
    )
    .unwrap();
    let cpu = Decoder::load(dir.path(), Device::Cpu, Kind::Float).unwrap();
    let gpu = Decoder::load(dir.path(), Device::Cuda(0), Kind::Float).unwrap();
    let gpu_bf16 = Decoder::load(dir.path(), Device::Cuda(0), Kind::BFloat16).unwrap();
    let seqs = sequences(cpu.config.vocab_size);
    let opts = ScoreOptions {
        entropy: true,
        chunk_tokens: 100,
        ..Default::default()
    };
    let reference = score_sequences(&cpu, &seqs, Layout::Padded, &opts).unwrap();
    for layout in [Layout::Padded, Layout::Packed] {
        let fp32 = score_sequences(&gpu, &seqs, layout, &opts).unwrap();
        let bf16 = score_sequences(&gpu_bf16, &seqs, layout, &opts).unwrap();
        for (i, want) in reference.iter().enumerate() {
            let diff = |got: &[f32], want: &[f32]| {
                got.iter()
                    .zip(want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0f32, f32::max)
            };
            let e32 = diff(&fp32[i].log_probs, &want.log_probs);
            assert!(
                e32 < 1e-3,
                "{layout:?} seq {i}: fp32 GPU vs CPU log-prob error {e32}"
            );
            let ent = diff(
                fp32[i].entropy.as_ref().unwrap(),
                want.entropy.as_ref().unwrap(),
            );
            assert!(
                ent < 1e-3,
                "{layout:?} seq {i}: fp32 GPU vs CPU entropy error {ent}"
            );
            let e16 = diff(&bf16[i].log_probs, &want.log_probs);
            assert!(
                e16 < 0.1,
                "{layout:?} seq {i}: bf16 GPU vs fp32 CPU log-prob error {e16}"
            );
            let ent16 = diff(
                bf16[i].entropy.as_ref().unwrap(),
                want.entropy.as_ref().unwrap(),
            );
            assert!(
                ent16 < 0.1,
                "{layout:?} seq {i}: bf16 GPU vs fp32 CPU entropy error {ent16}"
            );
        }
    }
}

#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_engine_greedy_matches_scoring() {
    require_gpu();
    use ooze_engine::{start, EngineConfig, SamplingParams};
    let dir = tempfile::tempdir().unwrap();
    let mut options = InitOptions::new(Family::Qwen2, Size::Small);
    options.seed = 5;
    init_model(
        dir.path(),
        &ooze_model::corpus::generate(0, 50_000),
        &options,
    )
    .unwrap();
    for kind in [Kind::Float, Kind::BFloat16] {
        let engine = start(
            Decoder::load(dir.path(), Device::Cuda(0), kind).unwrap(),
            None,
            EngineConfig::new(16, 320, vec![]),
        );
        let scorer = Decoder::load(dir.path(), Device::Cuda(0), kind).unwrap();
        let greedy = SamplingParams {
            temperature: Some(0.0),
            max_new_tokens: Some(40),
            ignore_eos: Some(true),
            ..Default::default()
        }
        .validate()
        .unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let prompts = sequences(scorer.config.vocab_size);
        let outputs: Vec<_> = generate_all(&runtime, &engine, &prompts, &greedy);
        let tolerance = if kind == Kind::Float { 1e-3 } else { 0.15 };
        let mut worst = 0.0f32;
        for (p, out) in prompts.iter().zip(&outputs) {
            let full: Vec<u32> = p.iter().chain(&out.tokens).copied().collect();
            let scored =
                score_sequences(&scorer, &[full], Layout::Padded, &ScoreOptions::default())
                    .unwrap();
            for (a, b) in scored[0].log_probs[p.len() - 1..]
                .iter()
                .zip(&out.log_probs)
            {
                worst = worst.max((a - b).abs());
            }
        }
        assert!(
            worst < tolerance,
            "{kind:?}: engine vs scoring log-prob error {worst}"
        );
        eprintln!("{kind:?}: max |engine - scoring| log-prob {worst:.2e}");
    }
}

#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_cuda_graph_decode_matches_eager() {
    require_gpu();
    use ooze_engine::{start, EngineConfig, SamplingParams};
    assert!(
        ooze_torch::cuda_graph::CudaGraph::available(),
        "this build has no CUDA-graph shim"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut options = InitOptions::new(Family::Qwen3, Size::Small);
    options.seed = 9;
    init_model(
        dir.path(),
        &ooze_model::corpus::generate(0, 50_000),
        &options,
    )
    .unwrap();
    let params = SamplingParams {
        seed: Some(4),
        max_new_tokens: Some(48),
        ignore_eos: Some(true),
        ..Default::default()
    }
    .validate()
    .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut results = Vec::new();
    for graphs in [true, false] {
        let mut config = EngineConfig::new(16, 400, vec![]);
        config.cuda_graphs = graphs;
        let engine = start(
            Decoder::load(dir.path(), Device::Cuda(0), Kind::Float).unwrap(),
            None,
            config,
        );
        let prompts = sequences(600);
        let outs: Vec<_> = generate_all(&runtime, &engine, &prompts, &params);
        results.push(outs);
    }
    let mut worst = 0.0f32;
    for (g, e) in results[0].iter().zip(&results[1]) {
        assert_eq!(
            g.tokens, e.tokens,
            "graph and eager decoding drew different tokens"
        );
        for (a, b) in g.log_probs.iter().zip(&e.log_probs) {
            worst = worst.max((a - b).abs());
        }
    }
    assert!(worst < 1e-4, "graph vs eager log-prob error {worst}");
    eprintln!("graph vs eager: max |log-prob diff| {worst:.2e}");
}

/// Overlapped decode steps on a GPU (CUDA graphs, ooze's kernels): inputs uploaded from pinned
/// memory without waiting, the previous step's tokens fed on the device (in order, then through an
/// index copy once requests end), draws read back behind an event. In bf16 with requests that end
/// at known lengths both modes run the same batches, so tokens and log-probs are bitwise those of
/// sequential steps (`overlap_steps` off). In fp32 requests also end on stop tokens while the step
/// after their last token is in flight (a row computed for nothing, blocks given back while the
/// device still writes them): the same tokens, log-probs within 1e-4 (a step's row count differs).
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_overlapped_decode_matches_sequential() {
    require_gpu();
    use ooze_core::FinishReason;
    use ooze_engine::{start, EngineConfig, Event, Output, PauseMode, Request, SamplingParams};
    let dir = tempfile::tempdir().unwrap();
    let mut options = InitOptions::new(Family::Qwen3, Size::Small);
    options.seed = 13;
    init_model(
        dir.path(),
        &ooze_model::corpus::generate(0, 50_000),
        &options,
    )
    .unwrap();
    // `stops[i]`: request i's stop tokens (none: it runs to its length).
    let requests = |stops: &[Vec<u32>]| -> Vec<Request> {
        (sequences(600).into_iter().enumerate())
            .map(|(i, prompt)| Request {
                input_ids: prompt,
                sampling: SamplingParams {
                    seed: Some(40 + i as u64),
                    max_new_tokens: Some(20 + 17 * i),
                    ignore_eos: Some(true),
                    temperature: Some(if i % 2 == 0 { 1.0 } else { 0.0 }),
                    stop_token_ids: stops.get(i).cloned(),
                    ..Default::default()
                }
                .validate()
                .unwrap(),
                session: None,
            })
            .collect()
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let run = |kind: Kind, requests: &[Request], overlap: bool| -> (Vec<Output>, u64) {
        let mut config = EngineConfig::new(16, 512, vec![]);
        config.overlap_steps = Some(overlap);
        let engine = start(
            Decoder::load(dir.path(), Device::Cuda(0), kind).unwrap(),
            None,
            config,
        );
        runtime.block_on(async {
            engine.pause(PauseMode::InPlace);
            let streams: Vec<_> = (requests.iter())
                .map(|r| engine.submit(r.clone()).unwrap().1)
                .collect();
            engine.resume();
            let mut outs = Vec::new();
            for mut rx in streams {
                let mut streamed = Vec::new();
                while let Some(event) = rx.recv().await {
                    match event {
                        Event::Token { token, .. } => streamed.push(token),
                        Event::Done(out) => {
                            assert_eq!(out.tokens, streamed);
                            outs.push(out);
                        }
                    }
                }
            }
            (outs, engine.stats().await.unwrap().overlapped_steps)
        })
    };
    let fixed = requests(&[]);
    let (overlapped, steps) = run(Kind::BFloat16, &fixed, true);
    let (sequential, none) = run(Kind::BFloat16, &fixed, false);
    assert!(
        steps > 50 && none == 0,
        "{steps} and {none} steps queued ahead"
    );
    for (i, (o, s)) in overlapped.iter().zip(&sequential).enumerate() {
        assert_eq!(o.tokens.len(), 20 + 17 * i);
        assert_eq!(
            o.tokens, s.tokens,
            "request {i}: overlap changed the tokens"
        );
        assert_eq!(
            o.log_probs, s.log_probs,
            "request {i}: bitwise equal log-probs"
        );
    }
    // Each request stops at a token it draws a few steps in (taken from a run without stops,
    // so every request ends early whatever the random model draws, greedy ones included).
    let (free, _) = run(Kind::Float, &fixed, false);
    let stops: Vec<Vec<u32>> = (free.iter().enumerate())
        .map(|(i, o)| vec![o.tokens[3 + i % 5]])
        .collect();
    let stopping = requests(&stops);
    let (overlapped, _) = run(Kind::Float, &stopping, true);
    let (sequential, _) = run(Kind::Float, &stopping, false);
    for (i, o) in sequential.iter().enumerate() {
        assert!(
            matches!(o.finish, FinishReason::Stop { .. }) && o.tokens.len() <= 4 + i % 5,
            "request {i} ends on its stop token: {:?} after {} tokens",
            o.finish,
            o.tokens.len()
        );
    }
    for (i, (o, s)) in overlapped.iter().zip(&sequential).enumerate() {
        assert_eq!(
            (&o.tokens, &o.finish),
            (&s.tokens, &s.finish),
            "request {i}"
        );
        let worst = (o.log_probs.iter().zip(&s.log_probs))
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(worst < 1e-4, "request {i}: log-probs differ by {worst}");
    }
}

/// Engines of one process sharing a GPU (a policy and its helper models) start together and
/// decode together, each capturing CUDA graphs (up front, and lazily as sequences grow into longer
/// key buckets) while the others run: every one finishes and draws the tokens the same engine
/// draws alone (graph against eager decoding is the test above's).
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_engines_sharing_a_gpu_capture_while_others_decode() {
    require_gpu();
    use ooze_engine::{start, EngineConfig, SamplingParams};
    let dir = tempfile::tempdir().unwrap();
    init_model(
        dir.path(),
        &ooze_model::corpus::generate(0, 50_000),
        &InitOptions::new(Family::Qwen2, Size::Small),
    )
    .unwrap();
    let params = SamplingParams {
        seed: Some(11),
        max_new_tokens: Some(300),
        ignore_eos: Some(true),
        ..Default::default()
    }
    .validate()
    .unwrap();
    let prompts = sequences(600);
    let engine = || {
        let mut config = EngineConfig::new(16, 1024, vec![]);
        config.cuda_graphs = true;
        start(
            Decoder::load(dir.path(), Device::Cuda(0), Kind::Float).unwrap(),
            None,
            config,
        )
    };
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    };
    let alone = generate_all(&runtime(), &engine(), &prompts, &params);
    let engines: Vec<_> = (0..3).map(|_| engine()).collect();
    let together: Vec<Vec<ooze_engine::Output>> = std::thread::scope(|scope| {
        let running: Vec<_> = engines
            .iter()
            .map(|e| scope.spawn(|| generate_all(&runtime(), e, &prompts, &params)))
            .collect();
        running.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for outs in &together {
        assert_eq!(outs.len(), prompts.len());
        for (shared, solo) in outs.iter().zip(&alone) {
            assert_eq!(shared.tokens.len(), 300);
            assert_eq!(
                shared.tokens, solo.tokens,
                "an engine sharing the GPU drew other tokens"
            );
        }
    }
}

/// ooze's CUDA kernels against the libtorch operations they replace: a Qwen3 model (q/k norms in
/// the rotary kernel) decoding in fp32 draws the same seeded tokens with the kernels on and off;
/// the sampling kernel on random bf16-model-sized logits gives the same greedy tokens and the same
/// sampled tokens (up to rare ties at a CDF boundary) with the same log-probs; silu·mul is exact.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_kernels_match_libtorch_ops() {
    require_gpu();
    use ooze_engine::sampler::draw;
    use ooze_engine::{start, EngineConfig, SamplingParams};
    use ooze_torch::kernels;
    use ooze_torch::tch::Tensor;
    assert!(kernels::available(), "this build has no CUDA kernels");

    let gate_up = Tensor::randn([33, 2 * 4864], (Kind::BFloat16, Device::Cuda(0)));
    let fused = kernels::silu_mul(&gate_up).unwrap();
    let reference = gate_up.narrow(1, 0, 4864).silu() * gate_up.narrow(1, 4864, 4864);
    assert!(fused.equal(&reference), "silu_mul differs from silu * mul");

    let logits = Tensor::randn([64, 151_936], (Kind::Float, Device::Cuda(0))) * 3.0;
    let settings = temperature_settings(64);
    let rows = seeded_rows(&settings, 17, 3);
    let with = draw(&logits, &rows);
    kernels::set_enabled(false);
    let without = draw(&logits, &rows);
    kernels::set_enabled(true);
    let mut same = 0;
    for (i, (a, b)) in with.iter().zip(&without).enumerate() {
        if i % 4 == 0 {
            assert_eq!(a.token, b.token, "greedy row {i}");
        }
        if a.token == b.token {
            same += 1;
            assert!(
                (a.log_prob - b.log_prob).abs() < 1e-4,
                "row {i}: {} vs {}",
                a.log_prob,
                b.log_prob
            );
        }
    }
    assert!(same >= 62, "only {same} of 64 rows drew the same token");

    let dir = tempfile::tempdir().unwrap();
    let mut options = InitOptions::new(Family::Qwen3, Size::Small);
    options.seed = 21;
    init_model(
        dir.path(),
        &ooze_model::corpus::generate(0, 50_000),
        &options,
    )
    .unwrap();
    let params = SamplingParams {
        seed: Some(8),
        max_new_tokens: Some(48),
        ignore_eos: Some(true),
        ..Default::default()
    }
    .validate()
    .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut results = Vec::new();
    for on in [true, false] {
        kernels::set_enabled(on);
        let engine = start(
            Decoder::load(dir.path(), Device::Cuda(0), Kind::Float).unwrap(),
            None,
            EngineConfig::new(16, 400, vec![]),
        );
        results.push(generate_all(&runtime, &engine, &sequences(600), &params));
    }
    kernels::set_enabled(true);
    let mut worst = 0.0f32;
    for (a, b) in results[0].iter().zip(&results[1]) {
        assert_eq!(
            a.tokens, b.tokens,
            "kernels on and off drew different tokens"
        );
        for (x, y) in a.log_probs.iter().zip(&b.log_probs) {
            worst = worst.max((x - y).abs());
        }
    }
    assert!(worst < 1e-4, "kernels on vs off log-prob error {worst}");
    eprintln!("kernels on vs off: max |log-prob diff| {worst:.2e}");
}

/// What the engine's decode relies on for its projections: with GEMMs that do not split K (set
/// when a decoder loads on a GPU), a product of 2–256 rows gives each row the bits it gets in a
/// batch of 4,096 (the trainer's products), with and without a bias; a single row does so when
/// it goes through as two (one row alone takes cuBLAS's one-row path, which sums differently for
/// some shapes).
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_projection_rows_equal_batch_rows() {
    require_gpu();
    use ooze_torch::cuda_graph::{set_gemm_reduction, GemmReduction};
    use ooze_torch::tch::Tensor;
    set_gemm_reduction(GemmReduction::NoSplit).unwrap();
    let dev = Device::Cuda(0);
    let shapes = [
        (1152i64, 896i64, true),
        (896, 896, false),
        (9728, 896, false),
        (896, 4864, false),
        (6144, 2560, false),
        (2560, 4096, false),
        (2560, 9728, false),
        (4608, 3584, true),
    ];
    let mut alone_differs = Vec::new();
    for (n, k, with_bias) in shapes {
        let w = Tensor::randn([n, k], (Kind::BFloat16, dev)) * 0.05;
        let bias = with_bias.then(|| Tensor::randn([n], (Kind::BFloat16, dev)));
        let batch = Tensor::randn([4096, k], (Kind::BFloat16, dev));
        let trained = batch.linear(&w, bias.as_ref());
        for m in [2i64, 3, 5, 64, 128, 256] {
            let y = batch.narrow(0, 0, m).contiguous().linear(&w, bias.as_ref());
            assert!(
                y.equal(&trained.narrow(0, 0, m)),
                "{m} x {k} -> {n} (bias {with_bias}) differs from the rows in a batch"
            );
        }
        let row = batch.narrow(0, 0, 1);
        let twice = row.expand([2, k], false).contiguous();
        let y = twice.linear(&w, bias.as_ref()).narrow(0, 0, 1);
        assert!(
            y.equal(&trained.narrow(0, 0, 1)),
            "one row as two, {k} -> {n}: differs from the row in a batch"
        );
        if !row
            .contiguous()
            .linear(&w, bias.as_ref())
            .equal(&trained.narrow(0, 0, 1))
        {
            alone_differs.push(format!("{k} -> {n}"));
        }
    }
    eprintln!("one row alone differs from its batch row for: {alone_differs:?}");
}

/// The sampling kernel's log-probs are the trainer's log-prob kernel's, bitwise, for the same fp32
/// logits: greedy and sampled rows, temperatures other than 1, a vocabulary that is not a multiple
/// of 4, and rows that do not start 16-byte aligned.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_sampler_log_probs_equal_trainer_kernel() {
    require_gpu();
    use ooze_engine::sampler::draw;
    use ooze_torch::kernels;
    use ooze_torch::tch::Tensor;
    for (vocab, offset) in [(151_936i64, 0i64), (32_001, 0), (151_936, 1)] {
        let wide = Tensor::randn([64, vocab + 1], (Kind::Float, Device::Cuda(0))) * 3.0;
        let logits = wide.narrow(1, offset, vocab);
        let settings = temperature_settings(64);
        let rows = seeded_rows(&settings, 5, 11);
        let draws = draw(&logits, &rows);
        for (i, (d, row)) in draws.iter().zip(&rows).enumerate() {
            assert!(
                i64::from(d.token) < vocab,
                "vocab {vocab}, offset {offset}, row {i}: token {}",
                d.token
            );
            let one = logits.narrow(0, i as i64, 1).contiguous();
            let token = Tensor::from_slice(&[d.token as i64]).to_device(Device::Cuda(0));
            let want = kernels::log_probs(&one, &token, row.params.log_prob_temperature()).unwrap();
            let want = f32::try_from(want.squeeze()).unwrap();
            assert_eq!(
                d.log_prob.to_bits(),
                want.to_bits(),
                "vocab {vocab}, offset {offset}, row {i}: sampler {} vs trainer kernel {want}",
                d.log_prob
            );
        }
    }
}

/// The residual add with its RMSNorm (`add_rms_norm`) and rope_store's Qwen3 q/k norms give
/// ATen's bits: `x + delta` then `at::rms_norm`, the trainer's forward, for the real models' row
/// sizes and odd ones, bf16 and fp32.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_fused_norms_equal_aten() {
    require_gpu();
    use ooze_torch::kernels::{self, RopeStore};
    use ooze_torch::tch::Tensor;
    let dev = Device::Cuda(0);
    let eps = 1e-6;
    let differing =
        |a: &Tensor, b: &Tensor| i64::try_from(a.ne_tensor(b).sum(Kind::Int64)).unwrap();
    for kind in [Kind::BFloat16, Kind::Float] {
        for n in [12i64, 64, 128, 896, 1536, 2560, 3584, 4096, 5120, 8192] {
            for rows in [1i64, 7, 256] {
                let x = Tensor::randn([rows, n], (kind, dev)) * 4.0;
                let delta = Tensor::randn([rows, n], (kind, dev)) * 0.5;
                let w = Tensor::randn([n], (kind, dev)) * 0.2 + 1.0;
                let (sum, out) = kernels::add_rms_norm(&x, &delta, &w, eps).unwrap();
                let want_sum = &x + &delta;
                let want = want_sum.rms_norm([n].as_slice(), Some(&w), eps);
                assert_eq!(differing(&sum, &want_sum), 0, "{kind:?} {rows}x{n}: sum");
                assert_eq!(differing(&out, &want), 0, "{kind:?} {rows}x{n}: add + norm");
                // A zero delta: the norm of x itself.
                let (_, alone) = kernels::add_rms_norm(&x, &x.zeros_like(), &w, eps).unwrap();
                let want = x.rms_norm([n].as_slice(), Some(&w), eps);
                assert_eq!(
                    differing(&alone, &want),
                    0,
                    "{kind:?} {rows}x{n}: norm alone"
                );
            }
        }
    }
    let x = Tensor::randn([3, 10], (Kind::BFloat16, dev));
    let w = Tensor::ones([10], (Kind::BFloat16, dev));
    let refused = kernels::add_rms_norm(&x, &x, &w, eps)
        .unwrap_err()
        .to_string();
    assert!(refused.contains("multiple of 4"), "{refused}");

    for (kind, heads, kv_heads, dim) in [
        (Kind::BFloat16, 32, 8, 128),
        (Kind::BFloat16, 14, 2, 64),
        (Kind::BFloat16, 8, 2, 256),
        (Kind::BFloat16, 4, 2, 32),
        (Kind::Float, 16, 8, 128),
    ] {
        let rows = 37i64;
        let qkv = Tensor::randn([rows, (heads + 2 * kv_heads) * dim], (kind, dev)) * 3.0;
        let q_norm = Tensor::randn([dim], (kind, dev)) * 0.3 + 1.0;
        let k_norm = Tensor::randn([dim], (kind, dev)) * 0.3 + 1.0;
        let cos = Tensor::randn([rows, dim], (kind, dev));
        let sin = Tensor::randn([rows, dim], (kind, dev));
        let cells = Tensor::arange(rows, (Kind::Int64, dev)) * 3;
        let cache = || Tensor::zeros([rows * 3 / 16 + 1, 16, kv_heads, dim], (kind, dev));
        let args = |qk_norm| RopeStore {
            cos: &cos,
            signed_sin: &sin,
            heads,
            kv_heads,
            head_dim: dim,
            qk_norm,
        };
        let (mut k1, mut v1) = (cache(), cache());
        let q1 = kernels::rope_store(
            &qkv,
            &cells,
            &mut k1,
            &mut v1,
            &args(Some(kernels::QkNorm {
                q: &q_norm,
                k: &k_norm,
                eps,
            })),
        )
        .unwrap();
        // ATen's norms on the q and k heads, then the rotation alone.
        let part = |from: i64, n: i64| qkv.narrow(1, from * dim, n * dim).reshape([rows, n, dim]);
        let q = part(0, heads).rms_norm([dim].as_slice(), Some(&q_norm), eps);
        let k = part(heads, kv_heads).rms_norm([dim].as_slice(), Some(&k_norm), eps);
        let normed = Tensor::cat(
            &[
                q.view([rows, -1]),
                k.view([rows, -1]),
                qkv.narrow(1, (heads + kv_heads) * dim, kv_heads * dim),
            ],
            1,
        );
        let (mut k2, mut v2) = (cache(), cache());
        let q2 = kernels::rope_store(&normed, &cells, &mut k2, &mut v2, &args(None)).unwrap();
        let shape = format!("{kind:?} {heads}/{kv_heads} x {dim}");
        assert_eq!(differing(&q1, &q2), 0, "{shape}: q");
        assert_eq!(differing(&k1, &k2), 0, "{shape}: k");
        assert_eq!(differing(&v1, &v2), 0, "{shape}: v");
    }
}

/// The paged decode attention kernels (both arithmetics) against attention written out in fp32,
/// for key counts around the tile (16), split (256) and FlashAttention block (64/128) boundaries,
/// two head sizes and grouped queries.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_decode_attention_matches_reference() {
    require_gpu();
    use ooze_torch::kernels;
    use ooze_torch::tch::Tensor;
    let dev = Device::Cuda(0);
    for (heads, kv_heads, dim) in [(14, 2, 64), (32, 8, 128), (4, 4, 64)] {
        let lengths: [i64; 10] = [1, 2, 15, 16, 17, 255, 256, 257, 700, 1024];
        let rows = lengths.len() as i64;
        let (slots_total, slot_len) = (rows + 3, 1024);
        let k_cache = Tensor::randn(
            [slots_total, slot_len, kv_heads, dim],
            (Kind::BFloat16, dev),
        );
        let v_cache = Tensor::randn(
            [slots_total, slot_len, kv_heads, dim],
            (Kind::BFloat16, dev),
        );
        let q = Tensor::randn([rows, heads, dim], (Kind::BFloat16, dev));
        // Rows use scattered slots (each one block of the whole length: block tables one wide);
        // position = keys - 1.
        let slot_ids: Vec<i64> = (0..rows).map(|r| (r * 5 + 2) % slots_total).collect();
        let slots = Tensor::from_slice(&slot_ids).to_device(dev).unsqueeze(1);
        let positions = Tensor::from_slice(&lengths.map(|n| n - 1)).to_device(dev);
        let scale = 1.0 / (dim as f64).sqrt();
        for arithmetic in [
            kernels::PagedArithmetic::FlashOrder,
            kernels::PagedArithmetic::Split,
        ] {
            let out = kernels::decode_attention(
                &q, &k_cache, &v_cache, &slots, &positions, 1024, scale, arithmetic,
            )
            .unwrap()
            .to_kind(Kind::Float);
            let group = heads / kv_heads;
            let mut worst = 0.0f64;
            for (r, (&n, &slot)) in lengths.iter().zip(&slot_ids).enumerate() {
                let k = k_cache.get(slot).narrow(0, 0, n).to_kind(Kind::Float); // [n, kv, d]
                let v = v_cache.get(slot).narrow(0, 0, n).to_kind(Kind::Float);
                for h in 0..heads {
                    let kv = h / group;
                    let qh = q.get(r as i64).get(h).to_kind(Kind::Float); // [d]
                    let scores = k.select(1, kv).mv(&qh) * scale; // [n]
                    let p = scores.softmax(0, Kind::Float);
                    let want = v.select(1, kv).tr().mv(&p); // [d]
                    let got = out.get(r as i64).get(h);
                    worst = worst.max((got - want).abs().max().double_value(&[]));
                }
            }
            assert!(
            worst < 2e-2,
            "{arithmetic:?}, heads {heads}/{kv_heads}, dim {dim}: max |kernel - reference| {worst}"
        );
            eprintln!(
                "decode attention {arithmetic:?} {heads}/{kv_heads}x{dim}: max |diff| {worst:.2e}"
            );
        }
    }
}

/// Decode attention in FlashAttention-2's order gives, for the last token of each sequence, the
/// bits FlashAttention-2's forward (what training runs) gives it over the whole sequence — up to
/// 4,096 keys — and the paged prefill kernel gives every token's; past that, rows are merged from
/// chunks and stay close.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_flash_order_attention_equals_flash_attention() {
    require_gpu();
    use ooze_torch::kernels::{self, PagedArithmetic};
    use ooze_torch::tch::Tensor;
    let dev = Device::Cuda(0);
    for (heads, kv_heads, dim) in [(14, 2, 64), (32, 8, 128), (28, 4, 128)] {
        let lengths: Vec<i64> = vec![
            1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 700, 2048, 4096, 5000,
        ];
        let total: i64 = lengths.iter().sum();
        let q = Tensor::randn([total, heads, dim], (Kind::BFloat16, dev));
        let k = Tensor::randn([total, kv_heads, dim], (Kind::BFloat16, dev)) * 2.0;
        let k = k.to_kind(Kind::BFloat16);
        let v = Tensor::randn([total, kv_heads, dim], (Kind::BFloat16, dev));
        let mut offsets = vec![0i32];
        for &n in &lengths {
            offsets.push(offsets[offsets.len() - 1] + n as i32);
        }
        let cu = Tensor::from_slice(&offsets).to_device(dev);
        let longest = *lengths.iter().max().unwrap();
        let scale = 1.0 / (dim as f64).sqrt();
        let flash = kernels::flash_attention_varlen(&q, &k, &v, &cu, longest, scale).unwrap();
        // The same keys as paged memory: one block of 16 positions per cell run, the sequences'
        // blocks in order (block tables of consecutive blocks).
        let block = 16;
        let width = (longest + block - 1) / block;
        let rows = lengths.len() as i64;
        let k_cache = Tensor::zeros([rows * width, block, kv_heads, dim], (Kind::BFloat16, dev));
        let v_cache = Tensor::zeros([rows * width, block, kv_heads, dim], (Kind::BFloat16, dev));
        for (r, &n) in lengths.iter().enumerate() {
            let start = offsets[r] as i64;
            let cells = |x: &Tensor| x.view([rows * width * block, kv_heads, dim]);
            cells(&k_cache)
                .narrow(0, r as i64 * width * block, n)
                .copy_(&k.narrow(0, start, n));
            cells(&v_cache)
                .narrow(0, r as i64 * width * block, n)
                .copy_(&v.narrow(0, start, n));
        }
        let tables = (Tensor::arange(rows * width, (Kind::Int64, dev))).view([rows, width]);
        let last: Vec<i64> = offsets[1..].iter().map(|&o| o as i64 - 1).collect();
        let last = Tensor::from_slice(&last).to_device(dev);
        let positions =
            Tensor::from_slice(&lengths.iter().map(|n| n - 1).collect::<Vec<_>>()).to_device(dev);
        let decoded = kernels::decode_attention(
            &q.index_select(0, &last).contiguous(),
            &k_cache,
            &v_cache,
            &tables,
            &positions,
            longest,
            scale,
            PagedArithmetic::FlashOrder,
        )
        .unwrap();
        let past = vec![0i64; lengths.len()];
        // Every token of every row as a prefill (rows padded to the longest: q laid out row after
        // row, `longest` tokens each).
        let padded_q = Tensor::zeros([rows * longest, heads, dim], (Kind::BFloat16, dev));
        for (r, &n) in lengths.iter().enumerate() {
            padded_q
                .narrow(0, r as i64 * longest, n)
                .copy_(&q.narrow(0, offsets[r] as i64, n));
        }
        let prefilled = kernels::paged_prefill_attention(
            &padded_q,
            &k_cache,
            &v_cache,
            &tables,
            &past,
            &vec![longest; lengths.len()],
            scale,
            PagedArithmetic::FlashOrder,
        )
        .unwrap();
        for (r, &n) in lengths.iter().enumerate() {
            let want = flash.get(offsets[r + 1] as i64 - 1);
            let got = decoded.get(r as i64);
            let all_want = flash.narrow(0, offsets[r] as i64, n);
            let all_got = prefilled.narrow(0, r as i64 * longest, n);
            if n <= 4096 {
                assert!(
                    got.equal(&want),
                    "{heads}/{kv_heads}x{dim}, {n} keys: decode differs from FlashAttention-2"
                );
                assert!(
                    all_got.equal(&all_want),
                    "{heads}/{kv_heads}x{dim}, {n} keys: prefill differs from FlashAttention-2"
                );
            } else {
                let worst = (got.to_kind(Kind::Float) - want.to_kind(Kind::Float))
                    .abs()
                    .max()
                    .double_value(&[]);
                assert!(
                    worst < 2e-2,
                    "{heads}/{kv_heads}x{dim}, {n} keys: merged rows off by {worst}"
                );
            }
        }
        eprintln!("flash-order attention {heads}/{kv_heads}x{dim}: bitwise FlashAttention-2's up to 4,096 keys");
    }
}

/// Packed sequences through FlashAttention over variable lengths give the padded layout's
/// log-probs (bf16), and a training step runs backward through it.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_packed_flash_attention_matches_padded_and_trains() {
    require_gpu();
    use ooze_train::{Sample, Trainer, TrainerConfig};
    let dir = tempfile::tempdir().unwrap();
    let mut options = InitOptions::new(Family::Qwen2, Size::Small);
    options.seed = 12;
    init_model(
        dir.path(),
        &ooze_model::corpus::generate(0, 50_000),
        &options,
    )
    .unwrap();
    let decoder = Decoder::load(dir.path(), Device::Cuda(0), Kind::BFloat16).unwrap();
    let seqs = sequences(decoder.config.vocab_size);
    let score =
        |layout| score_sequences(&decoder, &seqs, layout, &ScoreOptions::default()).unwrap();
    let (packed, padded) = (score(Layout::Packed), score(Layout::Padded));
    let mut worst = 0.0f32;
    for (a, b) in packed.iter().zip(&padded) {
        for (x, y) in a.log_probs.iter().zip(&b.log_probs) {
            worst = worst.max((x - y).abs());
        }
    }
    assert!(
        worst < 0.1,
        "packed vs padded bf16 log-prob difference {worst}"
    );
    eprintln!("packed (flash varlen) vs padded: max |log-prob diff| {worst:.2e}");
    let samples: Vec<Sample> = seqs
        .iter()
        .map(|s| Sample::demonstration(s.clone(), vec![1; s.len() - 1]))
        .collect();
    let mut config = TrainerConfig::default();
    config.schedule.lr = 1e-3;
    let mut trainer = Trainer::new(decoder, None, config).unwrap();
    let first = trainer.sft_step(&samples).unwrap();
    for _ in 0..5 {
        trainer.sft_step(&samples).unwrap();
    }
    let last = trainer.sft_step(&samples).unwrap();
    assert!(
        first.grad_norm > 0.0 && last.loss < first.loss,
        "{} -> {}",
        first.loss,
        last.loss
    );
}

/// The kernels with a backward (silu·mul, rotary) against the libtorch operations they replace:
/// values and gradients, fp32.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_kernel_gradients_match_libtorch() {
    require_gpu();
    use ooze_torch::kernels;
    use ooze_torch::tch::Tensor;
    let dev = Device::Cuda(0);
    let close = |a: &Tensor, b: &Tensor, what: &str| {
        let diff = (a - b).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "{what}: max |diff| {diff}");
    };
    // silu·mul
    let mut x = Tensor::randn([37, 2 * 80], (Kind::Float, dev)).set_requires_grad(true);
    let w = Tensor::randn([37, 80], (Kind::Float, dev));
    let fused = kernels::silu_mul(&x).unwrap();
    (&fused * &w).sum(Kind::Float).backward();
    let g_fused = x.grad().copy();
    x.zero_grad();
    let plain = x.narrow(1, 0, 80).silu() * x.narrow(1, 80, 80);
    (&plain * &w).sum(Kind::Float).backward();
    close(&fused, &plain, "silu_mul value");
    close(&g_fused, &x.grad(), "silu_mul gradient");
    // rotary: 6 heads of 64 out of rows of 7 heads (the last one untouched, like v)
    let (tokens, heads, dim) = (29i64, 6i64, 64i64);
    let mut rows =
        Tensor::randn([tokens, (heads + 1) * dim], (Kind::Float, dev)).set_requires_grad(true);
    let (cos, sin) = rotary_tables(tokens, dim, Kind::Float);
    let w = Tensor::randn([tokens, heads, dim], (Kind::Float, dev));
    let fused = kernels::rope(
        &rows,
        &cos.view([tokens, dim]),
        &sin.view([tokens, dim]),
        heads,
        dim,
    )
    .unwrap();
    (&fused * &w).sum(Kind::Float).backward();
    let g_fused = rows.grad().copy();
    rows.zero_grad();
    let x = rows
        .narrow(1, 0, heads * dim)
        .view([1, tokens, heads, dim])
        .transpose(1, 2);
    let plain = ooze_model::rope::apply(&x, &cos, &sin)
        .transpose(1, 2)
        .reshape([tokens, heads, dim]);
    (&plain * &w).sum(Kind::Float).backward();
    close(&fused, &plain, "rope value");
    close(&g_fused, &rows.grad(), "rope gradient");
}

/// Rotary tables `[1, tokens, dim]` (cos, and the sine with its first half negated) of positions
/// 0, 37, 74, … at θ = 1e6, on the GPU in `kind`.
fn rotary_tables(
    tokens: i64,
    dim: i64,
    kind: Kind,
) -> (ooze_torch::tch::Tensor, ooze_torch::tch::Tensor) {
    use ooze_model::config::Rope;
    let dev = Device::Cuda(0);
    let inv = ooze_model::rope::inverse_frequencies(
        &Rope {
            theta: 1e6,
            llama3: None,
        },
        dim,
        dev,
    );
    let positions = ooze_torch::tch::Tensor::arange(tokens, (Kind::Int64, dev)).unsqueeze(0) * 37;
    ooze_model::rope::cos_sin(&inv, &positions, kind)
}

/// `x`'s values in a tensor whose data starts 4 bytes past a 16-byte boundary: ooze's elementwise
/// kernels then take their two-element (or one-element) paths instead of the 16-byte ones.
fn misaligned_copy(x: &ooze_torch::tch::Tensor) -> ooze_torch::tch::Tensor {
    let n = x.numel() as i64;
    let buffer = ooze_torch::tch::Tensor::zeros([n + 2], (x.kind(), x.device()));
    let view = buffer.narrow(0, 2, n).view(x.size().as_slice());
    view.detach().copy_(x);
    view
}

/// The bf16 kernels that read eight elements at a time (silu·mul and its backward, the rotary
/// embedding and its backward) give the bits of the narrower kernels they stand in for.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_wide_elementwise_kernels_equal_narrow_ones() {
    require_gpu();
    use ooze_torch::kernels;
    use ooze_torch::tch::Tensor;
    let dev = Device::Cuda(0);
    let bf16 = (Kind::BFloat16, dev);
    for (rows, width) in [(1i64, 8i64), (37, 4864), (300, 9728)] {
        let x = Tensor::randn([rows, 2 * width], bf16) * 3.0;
        let up = Tensor::randn([rows, width], bf16);
        let mut results = Vec::new();
        for input in [x.copy(), misaligned_copy(&x)] {
            let leaf = input.detach().set_requires_grad(true);
            let y = kernels::silu_mul(&leaf).unwrap();
            (&y * &up).sum(Kind::Float).backward();
            results.push((y.detach(), leaf.grad()));
        }
        assert!(results[0].0.equal(&results[1].0), "silu_mul {rows}x{width}");
        assert!(
            results[0].1.equal(&results[1].1),
            "silu_mul backward {rows}x{width}"
        );
    }
    for (tokens, heads, dim) in [(29i64, 6i64, 64i64), (300, 48, 128)] {
        let rows = Tensor::randn([tokens, (heads + 2) * dim], bf16);
        let (cos, sin) = rotary_tables(tokens, dim, Kind::BFloat16);
        let (cos, sin) = (cos.view([tokens, dim]), sin.view([tokens, dim]));
        let wide = kernels::rope(&rows, &cos, &sin, heads, dim).unwrap();
        let narrow = kernels::rope(&misaligned_copy(&rows), &cos, &sin, heads, dim).unwrap();
        assert!(wide.equal(&narrow), "rope {tokens}x{heads}x{dim}");
        // The backward (sixteen-byte path: autograd's gradient is aligned) is the rotation by
        // the negated sine, which the narrow forward computes the same way.
        let leaf = rows.copy().set_requires_grad(true);
        let upstream = Tensor::randn([tokens, heads, dim], bf16);
        let y = kernels::rope(&leaf, &cos, &sin, heads, dim).unwrap();
        (&y * &upstream).sum(Kind::Float).backward();
        let back = kernels::rope(
            &misaligned_copy(&upstream.view([tokens, heads * dim])),
            &cos,
            &(-&sin),
            heads,
            dim,
        )
        .unwrap()
        .view([tokens, heads * dim]);
        let grad = leaf.grad();
        assert!(
            grad.narrow(1, 0, heads * dim).equal(&back),
            "rope backward {tokens}x{heads}x{dim}"
        );
        let rest = grad.narrow(1, heads * dim, 2 * dim);
        assert!(
            rest.eq(0.0).all().int64_value(&[]) == 1,
            "columns past the heads get no gradient"
        );
    }
}

/// Each (what, ours, ATen's, exact fp64) gradient: ours at most twice ATen's relative error (largest
/// absolute error over the largest exact value), plus 1e-3.
fn gradients_as_close_as_aten(
    label: &str,
    gradients: &[(
        &str,
        &ooze_torch::tch::Tensor,
        &ooze_torch::tch::Tensor,
        &ooze_torch::tch::Tensor,
    )],
) {
    let err = |a: &ooze_torch::tch::Tensor, exact: &ooze_torch::tch::Tensor| {
        (a.to_kind(Kind::Double) - exact)
            .abs()
            .max()
            .double_value(&[])
            / exact.abs().max().double_value(&[])
    };
    for (what, ours, aten, exact) in gradients {
        let (e_ours, e_aten) = (err(ours, exact), err(aten, exact));
        assert!(
            e_ours <= 2.0 * e_aten + 1e-3,
            "{label}, {what} gradient: relative error {e_ours:.2e}, ATen's {e_aten:.2e}"
        );
    }
}

/// Training's RMSNorm, alone and after the residual add: ATen's forward bit for bit, and a
/// backward at least as close to the exact gradient (fp64) as ATen's own bf16 backward, for the
/// inputs and the weight.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_trained_rms_norm_matches_aten() {
    require_gpu();
    use ooze_torch::kernels;
    use ooze_torch::tch::Tensor;
    let dev = Device::Cuda(0);
    for (rows, n) in [(1i64, 256i64), (33, 896), (4099, 2560), (517, 3584)] {
        let x = (Tensor::randn([rows, n], (Kind::Float, dev)) * 2.0).to_kind(Kind::BFloat16);
        let w = (Tensor::randn([n], (Kind::Float, dev)) * 0.3 + 1.0).to_kind(Kind::BFloat16);
        let up = Tensor::randn([rows, n], (Kind::BFloat16, dev));
        let run = |ours: bool, kind: Kind| {
            let x = x.to_kind(kind).detach().set_requires_grad(true);
            let w = w.to_kind(kind).detach().set_requires_grad(true);
            let y = if ours {
                kernels::rms_norm_trained(&x, &w, 1e-6).unwrap()
            } else {
                x.rms_norm([n].as_slice(), Some(&w), 1e-6)
            };
            (&y * up.to_kind(kind)).sum(kind).backward();
            (y.detach(), x.grad(), w.grad())
        };
        let (y_ours, dx_ours, dw_ours) = run(true, Kind::BFloat16);
        let (y_aten, dx_aten, dw_aten) = run(false, Kind::BFloat16);
        let (_, dx_exact, dw_exact) = run(false, Kind::Double);
        assert!(
            y_ours.equal(&y_aten),
            "forward {rows}x{n} differs from ATen's"
        );
        gradients_as_close_as_aten(
            &format!("{rows}x{n} norm"),
            &[
                ("input", &dx_ours, &dx_aten, &dx_exact),
                ("weight", &dw_ours, &dw_aten, &dw_exact),
            ],
        );
        // The residual add before the norm; both the sum and the normed rows feed the loss.
        let delta = Tensor::randn([rows, n], (Kind::BFloat16, dev));
        let up_sum = Tensor::randn([rows, n], (Kind::BFloat16, dev));
        let run_add = |ours: bool, kind: Kind| {
            let x = x.to_kind(kind).detach().set_requires_grad(true);
            let d = delta.to_kind(kind).detach().set_requires_grad(true);
            let w = w.to_kind(kind).detach().set_requires_grad(true);
            let (sum, y) = if ours {
                kernels::add_rms_norm_trained(&x, &d, &w, 1e-6).unwrap()
            } else {
                let sum = &x + &d;
                let y = sum.rms_norm([n].as_slice(), Some(&w), 1e-6);
                (sum, y)
            };
            ((&y * up.to_kind(kind)).sum(kind) + (&sum * up_sum.to_kind(kind)).sum(kind))
                .backward();
            (sum.detach(), y.detach(), x.grad(), d.grad(), w.grad())
        };
        let ours = run_add(true, Kind::BFloat16);
        let aten = run_add(false, Kind::BFloat16);
        let exact = run_add(false, Kind::Double);
        assert!(ours.0.equal(&aten.0), "residual sum {rows}x{n}");
        assert!(ours.1.equal(&aten.1), "add + norm forward {rows}x{n}");
        gradients_as_close_as_aten(
            &format!("{rows}x{n} add + norm"),
            &[
                ("x", &ours.2, &aten.2, &exact.2),
                ("delta", &ours.3, &aten.3, &exact.3),
                ("weight", &ours.4, &aten.4, &exact.4),
            ],
        );
    }
}

/// The fused head log-prob kernel against log_softmax written out: values, entropies and the
/// gradients with respect to the hidden states and the head, fp32, at temperature 0.7, over 37
/// rows in chunks of 16 (the last one short, the head's gradient accumulated across them).
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_linear_log_prob_matches_log_softmax() {
    require_gpu();
    use ooze_torch::kernels;
    use ooze_torch::tch::Tensor;
    let dev = Device::Cuda(0);
    ooze_torch::tch::manual_seed(11);
    let mut hidden = Tensor::randn([37, 64], (Kind::Float, dev)).set_requires_grad(true);
    let mut weight = (Tensor::randn([3001, 64], (Kind::Float, dev)) * 0.3).set_requires_grad(true);
    let targets = Tensor::randint(3001, [37], (Kind::Int64, dev));
    let w = Tensor::randn([37], (Kind::Float, dev));
    let (lp, h) = kernels::linear_log_prob(&hidden, &weight, &targets, 0.7, false, 16).unwrap();
    (&lp * &w).sum(Kind::Float).backward();
    let (gh, gw) = (hidden.grad().copy(), weight.grad().copy());
    hidden.zero_grad();
    weight.zero_grad();
    let logp = (hidden.matmul(&weight.tr()) / 0.7).log_softmax(-1, Kind::Float);
    let plain = logp.gather(1, &targets.unsqueeze(1), false).squeeze_dim(1);
    let entropy = -(logp.exp() * &logp).sum_dim_intlist([-1i64].as_slice(), false, Kind::Float);
    (&plain * &w).sum(Kind::Float).backward();
    let close = |a: &Tensor, b: &Tensor, what: &str| {
        let diff = (a - b).abs().max().double_value(&[]);
        assert!(diff < 2e-5, "{what}: max |diff| {diff}");
    };
    close(&lp, &plain, "log-prob");
    close(&h, &entropy.detach(), "entropy");
    close(&gh, &hidden.grad(), "d/dhidden");
    close(&gw, &weight.grad(), "d/dweight");

    // bf16: the backward from logits kept in bf16 (the logits' gradients written over them, one
    // product per gradient over all rows) against the one that recomputes them in fp32 chunk by
    // chunk, and both against the fp32 gradients above.
    let grads = |keep: bool| {
        let mut h16 = hidden
            .detach()
            .to_kind(Kind::BFloat16)
            .set_requires_grad(true);
        let mut w16 = weight
            .detach()
            .to_kind(Kind::BFloat16)
            .set_requires_grad(true);
        let (lp, _) = kernels::linear_log_prob(&h16, &w16, &targets, 0.7, keep, 10).unwrap();
        (&lp * &w).sum(Kind::Float).backward();
        let g = (
            h16.grad().to_kind(Kind::Float),
            w16.grad().to_kind(Kind::Float),
        );
        h16.zero_grad();
        w16.zero_grad();
        (lp.detach(), g)
    };
    let ((lp_keep, g_keep), (lp_re, g_re)) = (grads(true), grads(false));
    assert!(
        lp_keep.equal(&lp_re),
        "the forward does not depend on keeping the logits"
    );
    // Relative in norm: single entries near zero carry bf16's rounding of the larger ones.
    let norm = |t: &Tensor| t.norm().double_value(&[]);
    let rel = |a: &Tensor, b: &Tensor| norm(&(a - b)) / norm(b);
    let (fp32_h, fp32_w) = (hidden.grad(), weight.grad());
    for (what, got, want) in [
        ("kept-logits d/dhidden vs recomputed", &g_keep.0, &g_re.0),
        ("kept-logits d/dweight vs recomputed", &g_keep.1, &g_re.1),
        ("kept-logits d/dhidden vs fp32", &g_keep.0, &fp32_h),
        ("kept-logits d/dweight vs fp32", &g_keep.1, &fp32_w),
        ("recomputed d/dweight vs fp32", &g_re.1, &fp32_w),
    ] {
        // Both bf16 paths round the same inputs; against fp32 the inputs' rounding adds its own.
        let bound = if what.ends_with("fp32") { 2e-2 } else { 1e-2 };
        let r = rel(got, want);
        assert!(r < bound, "{what}: off by {r} (relative, in norm)");
    }
}

/// Training's fused attention step (Qwen3's q/k norms where the model has them, the rotary
/// embedding and FlashAttention-2 on the projection's output, one gradient for it) against the
/// separate operations it replaces (ATen's `rms_norm` over the heads, ooze's rotary kernel,
/// FlashAttention-2), on three packed sequences with 16 columns past the heads, for 14 query and
/// 2 key heads of 64 (Qwen2.5-0.5B) and 32 and 8 of 128 with norms (Qwen3-4B): the same output
/// bitwise (the engine's bits), the same gradients of the projection and the norm weights (up to
/// FlashAttention's atomic dq sums and the order of the weights' sums; zero past the heads).
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_fused_qkv_attention_matches_separate_ops() {
    require_gpu();
    use ooze_model::config::Rope;
    use ooze_torch::kernels;
    use ooze_torch::tch::Tensor;
    let dev = Device::Cuda(0);
    let lengths = [37i64, 64, 5];
    let total: i64 = lengths.iter().sum();
    let positions: Vec<i64> = lengths.iter().flat_map(|&l| 0..l).collect();
    let offsets = Tensor::from_slice(&[0i32, 37, 101, 106]).to_device(dev);
    let relative = |a: &Tensor, b: &Tensor| -> f64 {
        let d = (a.to_kind(Kind::Float) - b.to_kind(Kind::Float)).norm();
        d.double_value(&[]) / b.to_kind(Kind::Float).norm().double_value(&[])
    };
    for (heads, kv, d, normed) in [(14i64, 2i64, 64i64, false), (32, 8, 128, true)] {
        ooze_torch::tch::manual_seed(5);
        let qkv = Tensor::randn([total, (heads + 2 * kv) * d + 16], (Kind::BFloat16, dev));
        let inv_freq = ooze_model::rope::inverse_frequencies(
            &Rope {
                theta: 1e6,
                llama3: None,
            },
            d,
            dev,
        );
        let (cos, sin) = ooze_model::rope::cos_sin(
            &inv_freq,
            &Tensor::from_slice(&positions).to_device(dev),
            Kind::BFloat16,
        );
        let (cos, sin) = (cos.view([total, d]), sin.view([total, d]));
        let upstream = Tensor::randn([total, heads, d], (Kind::BFloat16, dev));
        let norm_weight = || (Tensor::rand([d], (Kind::Float, dev)) + 0.5).to_kind(Kind::BFloat16);
        let (q_norm, k_norm) = (norm_weight(), norm_weight());
        let eps = 1e-6;
        let scale = 1.0 / (d as f64).sqrt();
        let run = |fused: bool| {
            let x = qkv.copy().set_requires_grad(true);
            let qn = q_norm.copy().set_requires_grad(normed);
            let kn = k_norm.copy().set_requires_grad(normed);
            let out = if fused {
                let norms = normed.then_some(kernels::QkNorm {
                    q: &qn,
                    k: &kn,
                    eps,
                });
                kernels::qkv_flash_attention_varlen(
                    &x, &cos, &sin, &offsets, norms, heads, kv, d, 64, scale,
                )
                .unwrap()
            } else {
                let qk = if normed {
                    let part = |from: i64, n: i64, w: &Tensor| {
                        x.narrow(1, from * d, n * d).view([total, n, d]).rms_norm(
                            [d].as_slice(),
                            Some(w),
                            eps,
                        )
                    };
                    let qk = Tensor::cat(&[part(0, heads, &qn), part(heads, kv, &kn)], 1);
                    kernels::rope(&qk.view([total, -1]), &cos, &sin, heads + kv, d).unwrap()
                } else {
                    kernels::rope(&x, &cos, &sin, heads + kv, d).unwrap()
                };
                let v = x.narrow(1, (heads + kv) * d, kv * d).view([total, kv, d]);
                kernels::flash_attention_varlen(
                    &qk.narrow(1, 0, heads),
                    &qk.narrow(1, heads, kv),
                    &v,
                    &offsets,
                    64,
                    scale,
                )
                .unwrap()
            };
            (&out * &upstream).sum(Kind::Float).backward();
            let norm_grads = normed.then(|| (qn.grad(), kn.grad()));
            (out.detach(), x.grad(), norm_grads)
        };
        let ((out_f, grad_f, norms_f), (out_s, grad_s, norms_s)) = (run(true), run(false));
        let shape = format!("{heads}/{kv}x{d}");
        assert!(out_f.equal(&out_s), "{shape}: the fused forward differs");
        let past = grad_f.narrow(1, (heads + 2 * kv) * d, 16);
        assert_eq!(
            past.abs().max().double_value(&[]),
            0.0,
            "{shape}: columns past the heads"
        );
        let e = relative(&grad_f, &grad_s);
        eprintln!("{shape}: the projection's gradient differs by {e:.2e} (relative)");
        assert!(
            e < 1e-2,
            "{shape}: the projection's gradient differs by {e:.3e}"
        );
        if let (Some((qf, kf)), Some((qs, ks))) = (norms_f, norms_s) {
            for (what, f, s) in [("q_norm", qf, qs), ("k_norm", kf, ks)] {
                let e = relative(&f, &s);
                eprintln!("{shape}: {what}'s gradient differs by {e:.2e} (relative)");
                assert!(e < 2e-2, "{shape}: {what}'s gradient differs by {e:.3e}");
            }
        }
    }
}

/// Split attention over packed sequences (deterministic training's forward) trains like
/// FlashAttention-2: the same outputs to bf16 rounding, and the same gradients, which
/// FlashAttention's backward takes from split attention's own output and log-sum-exp.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_split_attention_gradients_match_flash_attention() {
    require_gpu();
    use ooze_torch::kernels::{flash_attention_varlen, split_attention_varlen};
    use ooze_torch::tch::Tensor;
    let lengths = [300i64, 517, 64, 1, 129];
    let total: i64 = lengths.iter().sum();
    let mut offsets = vec![0i32];
    for &l in &lengths {
        offsets.push(offsets[offsets.len() - 1] + l as i32);
    }
    let device = Device::Cuda(0);
    let cu = Tensor::from_slice(&offsets).to_device(device);
    let relative = |a: &Tensor, b: &Tensor| -> f64 {
        let d = (a.to_kind(Kind::Float) - b.to_kind(Kind::Float)).norm();
        d.double_value(&[]) / b.to_kind(Kind::Float).norm().double_value(&[])
    };
    for (heads, kv_heads, dim) in [(14i64, 2i64, 64i64), (32, 8, 128)] {
        ooze_torch::tch::manual_seed(5);
        let leaf = |h: i64| {
            Tensor::randn([total, h, dim], (Kind::BFloat16, device)).set_requires_grad(true)
        };
        let (q, k, v) = (leaf(heads), leaf(kv_heads), leaf(kv_heads));
        let weight = Tensor::randn([total, heads, dim], (Kind::Float, device));
        let scale = 1.0 / (dim as f64).sqrt();
        let run = |split: bool| {
            for t in [&q, &k, &v] {
                let mut g = t.grad();
                if g.defined() {
                    let _ = g.zero_();
                }
            }
            let out = if split {
                split_attention_varlen(&q, &k, &v, &cu, &lengths, scale).unwrap()
            } else {
                flash_attention_varlen(&q, &k, &v, &cu, 517, scale).unwrap()
            };
            (out.to_kind(Kind::Float) * &weight)
                .sum(Kind::Float)
                .backward();
            (
                out.detach(),
                q.grad().copy(),
                k.grad().copy(),
                v.grad().copy(),
            )
        };
        let (out_s, dq_s, dk_s, dv_s) = run(true);
        let (out_f, dq_f, dk_f, dv_f) = run(false);
        let errors = [
            relative(&out_s, &out_f),
            relative(&dq_s, &dq_f),
            relative(&dk_s, &dk_f),
            relative(&dv_s, &dv_f),
        ];
        eprintln!(
            "split vs flash attention {heads}/{kv_heads}x{dim}: relative error of out, dq, dk, dv {:.2e} {:.2e} {:.2e} {:.2e}",
            errors[0], errors[1], errors[2], errors[3]
        );
        for (what, e) in ["out", "dq", "dk", "dv"].iter().zip(errors) {
            assert!(
                e < 1e-2,
                "{heads}/{kv_heads}x{dim}: {what} differs by {e:.3e} (relative)"
            );
        }
    }
}

/// The master-weight AdamW kernel (bf16 gradients read once, fp32 masters and moments, the bf16
/// weight written back) against libtorch's fused AdamW on upcast gradients followed by the copy
/// down: parameters of odd sizes (tails), more than one chunk, and one not 16-byte aligned (a view
/// one element in), two weight decays, a clipping divisor, three steps. The masters and moments
/// agree to fp32 rounding; the model weights are the masters rounded to bf16, bitwise.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_master_adamw_matches_fused_adamw() {
    require_gpu();
    use ooze_torch::optim::{fused_adamw, master_adamw, AdamW, MasterSlot};
    use ooze_torch::tch::Tensor;
    let dev = Device::Cuda(0);
    ooze_torch::tch::manual_seed(11);
    let sizes = [7i64, 4096 + 3, 200_001, 64];
    let hyper = AdamW {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.98,
        weight_decay: 0.1,
        eps: 1e-8,
    };
    let f32 = (Kind::Float, dev);
    let masters: Vec<Tensor> = sizes.iter().map(|&n| Tensor::randn([n], f32)).collect();
    let decays = [0.1, 0.0, 0.1, 0.0];
    let state = |n: i64| {
        (
            Tensor::zeros([n], f32),
            Tensor::zeros([n], f32),
            Tensor::zeros([], f32),
        )
    };
    // The kernel's last master a view one element into its storage: not 16-byte aligned.
    let placed = |i: usize, m: &Tensor| {
        let n = m.numel() as i64;
        let mut view = if i == 3 {
            Tensor::zeros([n + 1], f32).narrow(0, 1, n)
        } else {
            Tensor::zeros([n], f32)
        };
        view.copy_(m);
        view
    };
    let mine: Vec<_> = masters
        .iter()
        .enumerate()
        .map(|(i, m)| (placed(i, m), state(m.numel() as i64)))
        .collect();
    let theirs: Vec<_> = masters
        .iter()
        .map(|m| (m.copy(), state(m.numel() as i64)))
        .collect();
    let models: Vec<Tensor> = masters.iter().map(|m| m.to_kind(Kind::BFloat16)).collect();
    let divisor = Tensor::from_slice(&[1.7f32]).to_device(dev).view([]);
    for _ in 0..3 {
        let grads: Vec<Tensor> = sizes
            .iter()
            .map(|&n| Tensor::randn([n], (Kind::BFloat16, dev)))
            .collect();
        let slots: Vec<MasterSlot<'_>> = (0..sizes.len())
            .map(|i| MasterSlot {
                grad: &grads[i],
                model: &models[i],
                master: &mine[i].0,
                exp_avg: &mine[i].1 .0,
                exp_avg_sq: &mine[i].1 .1,
                step: &mine[i].1 .2,
                weight_decay: decays[i],
            })
            .collect();
        master_adamw(&slots, hyper, &divisor).unwrap();
        for (i, (p, (m, v, s))) in theirs.iter().enumerate() {
            fused_adamw(
                &mut [p.shallow_clone()],
                &[grads[i].to_kind(Kind::Float)],
                &mut [m.shallow_clone()],
                &mut [v.shallow_clone()],
                &mut [s.shallow_clone()],
                AdamW {
                    weight_decay: decays[i],
                    ..hyper
                },
                Some(&divisor),
            )
            .unwrap();
        }
    }
    for i in 0..sizes.len() {
        let ((p, (m, v, s)), (tp, (tm, tv, ts))) = (&mine[i], &theirs[i]);
        for (what, a, b) in [("master", p, tp), ("exp_avg", m, tm), ("exp_avg_sq", v, tv)] {
            assert!(
                a.allclose(b, 1e-5, 1e-7, false),
                "parameter {i}: {what} differs by {}",
                (a - b).abs().max().double_value(&[])
            );
        }
        assert_eq!(s.double_value(&[]), 3.0);
        assert_eq!(ts.double_value(&[]), 3.0);
        assert!(
            models[i].equal(&p.to_kind(Kind::BFloat16)),
            "parameter {i}: the model weight is not its master in bf16"
        );
    }
}
