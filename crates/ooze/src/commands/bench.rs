//! `ooze bench`: throughput measurements. `forward`: the full-sequence scoring pass the trainer
//! runs (blocks + chunked LM-head log-probs) over a batch of random token ids. `generate`: the
//! rollout engine. `train` ([`super::bench_train`]): full training steps on one or more ranks.
//! `weight-sync` ([`super::bench_weight_sync`]): the weight update to engines on GPUs of their own.

use super::{load_decoder, ComputeArgs};
use ooze_model::scoring::head_log_probs;
use ooze_model::{Attention, ScoreOptions};
use ooze_torch::tch::{self, Device, Kind, Tensor};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand, Debug)]
enum What {
    /// Full-sequence forward + per-token log-probs (no gradient).
    Forward(ForwardArgs),
    /// The rollout engine: B concurrent requests of I prompt tokens and O output tokens.
    Generate(GenerateArgs),
    /// Training steps on B sequences of L random tokens (every token trained, one optimizer step
    /// per batch).
    Train(super::bench_train::Args),
    /// The trainer-to-engine weight update over a process group (NCCL between GPUs), timed
    /// against running engines.
    WeightSync(super::bench_weight_sync::Args),
}

#[derive(clap::Args, Debug)]
struct GenerateArgs {
    #[arg(long)]
    model: PathBuf,
    #[arg(long, default_value_t = 256)]
    batch: usize,
    #[arg(long, default_value_t = 512)]
    input_len: usize,
    #[arg(long, default_value_t = 512)]
    output_len: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    /// After the run, score this many of the generated sequences with the full-sequence scoring
    /// path and report the engine's log-prob error against it.
    #[arg(long, default_value_t = 0)]
    check_logprobs: usize,
    /// The engine's context length (default: input + output), as a server would set it for its
    /// longest request.
    #[arg(long)]
    context_len: Option<i64>,
    /// Sequences generated at once (default: --batch).
    #[arg(long)]
    max_running: Option<i64>,
    /// Tokens of KV memory (default: --max-running sequences of the whole context length).
    #[arg(long)]
    kv_tokens: Option<i64>,
    /// Tokens per KV block, or `fixed` for one block of the context length per sequence.
    #[arg(long, default_value = "16")]
    kv_block_size: String,
    /// Record the run (prefill and every decode step) with PyTorch's profiler: a Chrome trace
    /// written here, and a summary per output token of GPU busy time, kernels and idle gaps.
    #[arg(long)]
    trace: Option<PathBuf>,
    #[command(flatten)]
    compute: ComputeArgs,
}

#[derive(clap::Args, Debug)]
struct ForwardArgs {
    #[arg(long)]
    model: PathBuf,
    #[arg(long, default_value_t = 8)]
    batch: i64,
    #[arg(long, default_value_t = 2048)]
    seq_len: i64,
    /// Timed iterations (after 2 warm-up iterations).
    #[arg(long, default_value_t = 10)]
    iters: usize,
    /// Rows of fp32 logits materialised at once in the LM head.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(i64).range(1..))]
    chunk_tokens: i64,
    #[command(flatten)]
    compute: ComputeArgs,
}

/// Waits until the work queued on `device` is done (nothing on the CPU).
pub(super) fn sync(device: Device) {
    if let Device::Cuda(i) = device {
        ooze_torch::cuda_graph::synchronize(i);
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.what {
        What::Forward(a) => forward(a),
        What::Generate(a) => generate(a),
        What::Train(a) => super::bench_train::run(a),
        What::WeightSync(a) => super::bench_weight_sync::run(a),
    }
}

/// The engine `generate` measures: the context, batch limit and KV layout its flags ask for.
fn engine_config(a: &GenerateArgs) -> anyhow::Result<ooze_engine::EngineConfig> {
    use ooze_engine::EngineConfig;
    let context_len = a.context_len.unwrap_or((a.input_len + a.output_len) as i64);
    let max_running = a.max_running.unwrap_or(a.batch as i64);
    let block_size = match a.kv_block_size.as_str() {
        "fixed" => EngineConfig::aligned_context_len(context_len),
        n => n.parse().map_err(|_| {
            anyhow::anyhow!("--kv-block-size: expected a number of tokens or `fixed`, got {n:?}")
        })?,
    };
    EngineConfig::new(max_running, context_len, Vec::new())
        .with_kv(Some(block_size), a.kv_tokens)
        .map_err(|e| anyhow::anyhow!("--kv-block-size / --kv-tokens: {e}"))
}

fn generate(a: GenerateArgs) -> anyhow::Result<()> {
    use ooze_engine::{Request, SamplingParams};
    let decoder = load_decoder(&a.model, &a.compute)?;
    let vocab = decoder.config.vocab_size as u64;
    let config = engine_config(&a)?;
    let kv_line = format!(
        "KV memory: {} blocks of {} tokens ({} tokens), at most {} sequences of {} tokens",
        config.kv_blocks(),
        config.kv_block_size,
        config.kv_blocks() * config.kv_block_size,
        config.max_running,
        config.context_len
    );
    let roofline = Roofline::of(&decoder);
    let device = decoder.device();
    let engine = ooze_engine::start(decoder, None, config);
    eprintln!("{kv_line}");
    let sampling = SamplingParams {
        temperature: Some(a.temperature),
        max_new_tokens: Some(a.output_len),
        ignore_eos: Some(true),
        ..Default::default()
    }
    .validate()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    warm_up(&engine, &runtime, &a, vocab)?;
    let before = runtime.block_on(engine.stats())?;
    let recording = super::trace::Recording::start(a.trace.as_deref(), device.is_cuda())?;
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let prompts: Vec<Vec<u32>> = (0..a.batch)
        .map(|_| random_prompt(&mut state, a.input_len, vocab))
        .collect();
    let started = Instant::now();
    let requests = prompts.iter().map(|input_ids| Request {
        input_ids: input_ids.clone(),
        sampling: sampling.clone(),
        session: None,
    });
    let streams = submit_as_one(&engine, requests)?;
    let (mut first_tokens, outputs, total, peak_running) =
        read_streams(&runtime, &engine, streams, started);
    if let Some(recording) = recording {
        recording.finish(a.output_len.max(1), "one output token of every sequence")?;
    }
    let stats = runtime.block_on(engine.stats())?;
    let generated: usize = outputs.iter().map(|o| o.tokens.len()).sum();
    first_tokens.sort_by(|x, y| x.partial_cmp(y).expect("finite"));
    let ttft = first_tokens[first_tokens.len() / 2];
    println!(
        "generate {} x ({} in + {} out) {}: {:.2} s, {:.0} output tokens/s, median time to first token {:.0} ms, time per output token {:.2} ms",
        a.batch,
        a.input_len,
        a.output_len,
        a.compute.dtype,
        total,
        generated as f64 / total,
        ttft * 1e3,
        (total - ttft) / (a.output_len.max(2) - 1) as f64 * 1e3
    );
    println!(
        "concurrency: peak {peak_running} sequences running, {} preempted",
        stats.preempted
    );
    let steady = SteadyDecode::between(&before, &stats);
    println!("{}", steady.line());
    println!("{}", roofline.line(&steady));
    runtime.block_on(engine.shutdown());
    let checked = &prompts[..a.check_logprobs.min(prompts.len())];
    if !checked.is_empty() {
        check_logprobs(&a, checked, &outputs)?;
    }
    Ok(())
}

/// Runs the timed run's own shapes once: as many prompts of the same length, arriving together,
/// each drawing two tokens. Its prefill passes are the timed run's (same rows, same width), so the
/// GEMM kernels for their row counts are loaded (CUDA loads modules lazily, at a kernel's first
/// launch), cuBLASLt's heuristics for them are cached and the caching allocator has grown to their
/// activations; its decode step replays the full batch's CUDA graph for the first time (the
/// graph's upload). Otherwise all of that stalls the host inside the timed window: the trace's
/// longest GPU gaps (layer_norm → GEMM, rms_norm → Memset, flash → GEMM, 3.5-6.3 ms each). Its
/// prompts come from a generator of their own and its requests carry seeds, so the timed run's
/// prompts and seeds stay what they would be without it; its prefixes are flushed after.
fn warm_up(
    engine: &ooze_engine::EngineHandle,
    runtime: &tokio::runtime::Runtime,
    a: &GenerateArgs,
    vocab: u64,
) -> anyhow::Result<()> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut requests = Vec::with_capacity(a.batch);
    for i in 0..a.batch {
        let sampling = ooze_engine::SamplingParams {
            temperature: Some(a.temperature),
            max_new_tokens: Some(a.output_len.min(2)),
            ignore_eos: Some(true),
            seed: Some(i as u64),
            ..Default::default()
        }
        .validate()?;
        requests.push(ooze_engine::Request {
            input_ids: random_prompt(&mut state, a.input_len, vocab),
            sampling,
            session: None,
        });
    }
    let streams = submit_as_one(engine, requests)?;
    runtime.block_on(async {
        for mut rx in streams {
            while rx.recv().await.is_some() {}
        }
    });
    runtime.block_on(engine.flush_cache())?;
    Ok(())
}

/// Submits `requests` as one arrival (B concurrent requests): the engine takes none until the
/// last is queued. Otherwise it wakes on the first submission and prefills the few that have
/// arrived by then: an extra short pass (launch-bound, shapes of its own), a decode step for those
/// few alone, and a ragged last pass, differently on every run.
fn submit_as_one(
    engine: &ooze_engine::EngineHandle,
    requests: impl IntoIterator<Item = ooze_engine::Request>,
) -> anyhow::Result<Vec<EventStream>> {
    engine.pause(ooze_engine::PauseMode::InPlace);
    let streams: Result<Vec<_>, _> = requests
        .into_iter()
        .map(|r| engine.submit(r).map(|(_, rx)| rx))
        .collect();
    engine.resume();
    Ok(streams?)
}

/// A request's events, as `EngineHandle::submit` returns them.
type EventStream = tokio::sync::mpsc::UnboundedReceiver<ooze_engine::Event>;

/// Reads every stream concurrently, so each first-token time is taken when it arrives, and samples
/// the engine's running count meanwhile. Returns the first-token times (seconds after `started`),
/// the outputs, the run's time (at its last output) and the peak number of running sequences.
fn read_streams(
    runtime: &tokio::runtime::Runtime,
    engine: &ooze_engine::EngineHandle,
    streams: Vec<EventStream>,
    started: Instant,
) -> (Vec<f64>, Vec<ooze_engine::Output>, f64, usize) {
    use ooze_engine::Event;
    let readers_done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    runtime.block_on(async {
        let watcher = engine.clone();
        let done = readers_done.clone();
        let peak = tokio::spawn(async move {
            let mut peak = 0;
            while let Ok(stats) = watcher.stats().await {
                peak = peak.max(stats.running);
                // Idle after running, or the whole run over before the first sample.
                if stats.running + stats.waiting == 0
                    && (peak > 0 || done.load(std::sync::atomic::Ordering::Acquire))
                {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            peak
        });
        let tasks: Vec<_> = streams
            .into_iter()
            .map(|mut rx| {
                tokio::spawn(async move {
                    let (mut first, mut done) = (None, None);
                    while let Some(event) = rx.recv().await {
                        match event {
                            Event::Token { .. } => {
                                first.get_or_insert_with(|| started.elapsed().as_secs_f64());
                            }
                            Event::Done(out) => done = Some(out),
                        }
                    }
                    (first.unwrap_or(f64::NAN), done)
                })
            })
            .collect();
        let (mut firsts, mut outputs) = (Vec::new(), Vec::new());
        for task in tasks {
            let (first, out) = task.await.expect("invariant: reader tasks do not panic");
            firsts.push(first);
            outputs.extend(out);
        }
        // The run ends with its last output, not when the concurrency sampler next wakes (it
        // sleeps 20 ms between samples: 0-20 ms more, ~10 ms on average).
        let total = started.elapsed().as_secs_f64();
        readers_done.store(true, std::sync::atomic::Ordering::Release);
        (firsts, outputs, total, peak.await.unwrap_or(0))
    })
}

/// `len` token ids below `vocab` from the xorshift generator at `state`.
fn random_prompt(state: &mut u64, len: usize, vocab: u64) -> Vec<u32> {
    (0..len)
        .map(|_| {
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            (*state % vocab) as u32
        })
        .collect()
}

/// Scores each of `prompts` + its output with the trainer's full-sequence path and prints the
/// engine's log-prob error against it.
fn check_logprobs(
    a: &GenerateArgs,
    prompts: &[Vec<u32>],
    outputs: &[ooze_engine::Output],
) -> anyhow::Result<()> {
    let scorer = load_decoder(&a.model, &a.compute)?;
    let mut errors = Vec::new();
    for (prompt, out) in prompts.iter().zip(outputs) {
        let full: Vec<u32> = prompt.iter().chain(&out.tokens).copied().collect();
        let options = ooze_model::ScoreOptions {
            temperature: if a.temperature > 0.0 {
                a.temperature
            } else {
                1.0
            },
            ..Default::default()
        };
        let scored =
            ooze_model::score_sequences(&scorer, &[full], ooze_model::Layout::Padded, &options)?;
        errors.extend(
            scored[0].log_probs[prompt.len() - 1..]
                .iter()
                .zip(&out.log_probs)
                .map(|(s, e)| (s - e).abs() as f64),
        );
    }
    let mean = errors.iter().sum::<f64>() / errors.len().max(1) as f64;
    let max = errors.iter().copied().fold(0.0, f64::max);
    println!("engine vs scoring log-probs over {} tokens of {} sequences: mean |diff| {mean:.2e}, max |diff| {max:.2e}", errors.len(), prompts.len());
    Ok(())
}

/// The run's steady decode steps (see [`ooze_engine::EngineStats::decode_steps`]): those queued
/// right behind another decode step, so that no prefill is inside their time.
struct SteadyDecode {
    steps: u64,
    seconds: f64,
    rows: u64,
    positions: u64,
}

impl SteadyDecode {
    fn between(before: &ooze_engine::EngineStats, after: &ooze_engine::EngineStats) -> Self {
        SteadyDecode {
            steps: after.decode_steps - before.decode_steps,
            seconds: after.decode_seconds - before.decode_seconds,
            rows: after.decode_rows - before.decode_rows,
            positions: after.decode_positions - before.decode_positions,
        }
    }

    fn line(&self) -> String {
        let steps = self.steps.max(1) as f64;
        format!(
            "decode steps without a prefill: {} of {:.2} ms on average, {:.0} sequences and {:.0} key positions a step",
            self.steps,
            self.seconds / steps * 1e3,
            self.rows as f64 / steps,
            self.positions as f64 / steps
        )
    }
}

/// The memory roofline of decode: a step reads every weight (the input embedding only where the
/// LM head is tied to it: otherwise a step gathers a few rows of it) and the keys and values of
/// every position its sequences attend, at the copy bandwidth measured on the device itself.
struct Roofline {
    weight_bytes: f64,
    kv_bytes_per_position: f64,
    bandwidth: f64,
}

impl Roofline {
    fn of(decoder: &ooze_model::Decoder) -> Roofline {
        let c = &decoder.config;
        let gathered = if c.tie_word_embeddings {
            0
        } else {
            c.vocab_size * c.hidden_size
        };
        let weight_bytes =
            (c.num_parameters() - gathered) * decoder.kind().elt_size_in_bytes() as i64;
        let per_position = ooze_model::PagedKv::bytes_per_token(&decoder.config, decoder.kind());
        Roofline {
            weight_bytes: weight_bytes as f64,
            kv_bytes_per_position: per_position as f64,
            bandwidth: copy_bandwidth(decoder.device()),
        }
    }

    /// The bytes the steady steps read, the time they would take at the copy bandwidth, and the
    /// share of that the measured time reaches.
    fn line(&self, steady: &SteadyDecode) -> String {
        if steady.steps == 0 {
            return "roofline: no decode step ran without a prefill beside it".into();
        }
        let steps = steady.steps as f64;
        let kv = self.kv_bytes_per_position * steady.positions as f64 / steps;
        let ideal = (self.weight_bytes + kv) / self.bandwidth;
        let measured = steady.seconds / steps;
        format!(
            "roofline: {:.3} GB weights + {:.3} GB KV a step at {:.0} GB/s (measured copy) = {:.2} ms; the engine's {:.2} ms a step reaches {:.0}% of it",
            self.weight_bytes / 1e9,
            kv / 1e9,
            self.bandwidth / 1e9,
            ideal * 1e3,
            measured * 1e3,
            100.0 * ideal / measured
        )
    }
}

/// Bytes per second a device-to-device copy moves (read + write), best of five.
fn copy_bandwidth(device: Device) -> f64 {
    let _guard = tch::no_grad_guard();
    let bytes: i64 = if device.is_cuda() { 1 << 30 } else { 1 << 27 };
    let src = Tensor::ones([bytes / 2], (Kind::BFloat16, device));
    let dst = Tensor::empty([bytes / 2], (Kind::BFloat16, device));
    let mut best = f64::MAX;
    for _ in 0..6 {
        sync(device);
        let t0 = Instant::now();
        dst.shallow_clone().copy_(&src);
        sync(device);
        best = best.min(t0.elapsed().as_secs_f64());
    }
    2.0 * bytes as f64 / best
}

fn forward(a: ForwardArgs) -> anyhow::Result<()> {
    let decoder = load_decoder(&a.model, &a.compute)?;
    let device = decoder.device();
    let _guard = tch::no_grad_guard();
    tch::manual_seed(0);
    let ids = Tensor::randint(
        decoder.config.vocab_size,
        [a.batch, a.seq_len],
        (Kind::Int64, device),
    );
    let positions = Tensor::arange(a.seq_len, (Kind::Int64, device))
        .unsqueeze(0)
        .expand([a.batch, a.seq_len], false);
    let targets = ids.narrow(1, 1, a.seq_len - 1).reshape([-1]);
    let options = ScoreOptions {
        chunk_tokens: a.chunk_tokens,
        ..Default::default()
    };
    let step = || {
        let hidden = decoder.hidden_states(&ids, &positions, Attention::Causal);
        let hidden = hidden
            .narrow(1, 0, a.seq_len - 1)
            .reshape([-1, decoder.config.hidden_size]);
        let (log_probs, _) = head_log_probs(&decoder, &hidden, &targets, &options);
        log_probs
    };
    for _ in 0..2 {
        let _ = step();
    }
    sync(device);
    let mut times = Vec::with_capacity(a.iters);
    let mut checksum = 0.0;
    for _ in 0..a.iters {
        let t = Instant::now();
        let lp = step();
        sync(device);
        times.push(t.elapsed().as_secs_f64());
        checksum = lp.mean(Kind::Float).double_value(&[]);
    }
    times.sort_by(|x, y| x.partial_cmp(y).expect("finite times"));
    // Where the time goes: the blocks alone (hidden states), the rest is the LM head + log-probs.
    let mut blocks = Vec::with_capacity(a.iters);
    for _ in 0..a.iters {
        let t = Instant::now();
        let _ = decoder.hidden_states(&ids, &positions, Attention::Causal);
        sync(device);
        blocks.push(t.elapsed().as_secs_f64());
    }
    blocks.sort_by(|x, y| x.partial_cmp(y).expect("finite times"));
    let median = times[times.len() / 2];
    let tokens = (a.batch * a.seq_len) as f64;
    let c = &decoder.config;
    let flops_per_token = 2.0 * c.num_parameters() as f64
        + 4.0 * (c.num_layers * a.seq_len * c.num_heads * c.head_dim) as f64 / 2.0;
    println!(
        "forward+logprobs {}x{} {}: median {:.1} ms ({:.0} tokens/s, {:.1} TFLOP/s), min {:.1} ms; blocks alone {:.1} ms; mean log-prob {:.4}",
        a.batch,
        a.seq_len,
        a.compute.dtype,
        median * 1e3,
        tokens / median,
        flops_per_token * tokens / median / 1e12,
        times[0] * 1e3,
        blocks[blocks.len() / 2] * 1e3,
        checksum
    );
    Ok(())
}
