//! Decoding end to end on a GPU: against scoring and the CPU, CUDA graphs against eager steps,
//! overlapped steps against sequential ones, engines sharing a GPU, and the projections' row bits.

use super::*;

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
    let dir = random_model(Family::Qwen2, Size::Small, 3);
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
    let dir = random_model(Family::Qwen2, Size::Small, 5);
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
    // fp32 Qwen3 (q/k norms; head size 32: ATen's attention), and bf16 Qwen2 at head size 64,
    // where both run ooze's decode kernels with the rotary step inside attention and the graph
    // gathers its rotary rows from tables and takes its KV cells from the host: bitwise equal.
    for (family, size, kind, tolerance) in [
        (Family::Qwen3, Size::Small, Kind::Float, 1e-4),
        (Family::Qwen2, Size::Medium, Kind::BFloat16, 0.0),
    ] {
        let dir = random_model(family, size, 9);
        let mut results = Vec::new();
        for graphs in [true, false] {
            let mut config = EngineConfig::new(16, 400, vec![]);
            config.cuda_graphs = graphs;
            let engine = start(
                Decoder::load(dir.path(), Device::Cuda(0), kind).unwrap(),
                None,
                config,
            );
            let prompts = sequences(600);
            let outs: Vec<_> = generate_all(&runtime, &engine, &prompts, &params);
            results.push(outs);
        }
        let what = format!("{family:?} {kind:?}: graph and eager decoding");
        let worst = same_tokens_log_prob_gap(&results[0], &results[1], &what);
        assert!(worst <= tolerance, "{what}: log-prob error {worst}");
        eprintln!("{what}: max |log-prob diff| {worst:.2e}");
    }
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
    let dir = random_model(Family::Qwen3, Size::Small, 13);
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
    let dir = random_model(Family::Qwen2, Size::Small, 0);
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
