//! `ooze bench train`: full training steps (forward, backward, clipping, fused AdamW on fp32
//! masters) on B sequences of L random tokens, on one process or on ranks (`--nproc-per-node`,
//! or under torchrun), whole or sharded. Prints, from rank 0, the median step's time, tokens/s
//! over all ranks, model TFLOP/s and their share of the GPUs' bf16 peak (MFU), the peak memory
//! a GPU had allocated, and with `--sync` the time to bring a colocated engine's own copy of the
//! weights up to date (sharded: one all-gather per unit) and its bandwidth.

use super::bench::sync;
use super::ranks::{join, launch, RankArgs};
use super::trace::Recording;
use super::{load_decoder_on, ComputeArgs};
use ooze_model::Decoder;
use ooze_torch::dist::{ProcessGroup, ReduceOp};
use ooze_torch::tch::{Device, Kind, Tensor};
use ooze_train::memory::{self, MemoryInputs};
use ooze_train::{Sample, Sharding, StepMetrics, Trainer, TrainerConfig};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[arg(long)]
    model: PathBuf,
    /// Sequences per step, over all ranks.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    #[arg(long, default_value_t = 2048)]
    seq_len: usize,
    /// Token budget of one micro-batch (default: a rank's whole share in one).
    #[arg(long)]
    micro_batch_tokens: Option<usize>,
    /// Timed steps (after 2 warm-up steps).
    #[arg(long, default_value_t = 5)]
    iters: usize,
    /// Activation recomputation (blocks replayed in the backward pass; always on when sharded).
    #[arg(long)]
    recompute: bool,
    /// How ranks hold the model: auto, replicated or sharded.
    #[arg(long, default_value = "auto")]
    sharding: Sharding,
    /// Also time the weight update of a colocated engine's own copy after each step.
    #[arg(long)]
    sync: bool,
    /// Sequence lengths drawn between half of --seq-len and all of it (a fixed seed), as an RL
    /// batch's are, instead of all equal.
    #[arg(long)]
    ragged: bool,
    /// Arithmetic of the (supervised) steps: `fastest` (the default of supervised steps: cuDNN's
    /// fused attention where it runs and pays, else FlashAttention-2, and bf16 logits) or `engine`
    /// (FlashAttention-2 and fp32 logits, the engine's arithmetic, which RL steps always take).
    #[arg(long, default_value = "fastest", value_parser = ["fastest", "engine"])]
    arithmetic: String,
    /// Record the timed steps with PyTorch's profiler: a Chrome trace (Perfetto) written here,
    /// and a summary printed of GPU busy time, the kernels that took it and the longest gaps.
    #[arg(long)]
    trace: Option<PathBuf>,
    #[command(flatten)]
    compute: ComputeArgs,
    #[command(flatten)]
    ranks: RankArgs,
}

/// `batch` demonstrations of random tokens below `vocab` (a fixed seed), every token trained: all
/// `seq_len` long, or `ragged`, between half of it and all of it.
fn random_samples(batch: usize, seq_len: usize, ragged: bool, vocab: u64) -> Vec<Sample> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut token = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % vocab) as u32
    };
    (0..batch)
        .map(|_| {
            let len = if ragged {
                seq_len / 2 + token() as usize % (seq_len - seq_len / 2 + 1)
            } else {
                seq_len
            }
            .max(2);
            let tokens: Vec<u32> = (0..len).map(|_| token()).collect();
            Sample::demonstration(tokens, vec![1; len - 1])
        })
        .collect()
}

/// The timed steps: each step's metrics, each weight sync's seconds (with an engine copy), and
/// the wall time a step over all of them.
struct Timed {
    steps: Vec<StepMetrics>,
    syncs: Vec<f64>,
    wall: f64,
}

/// `iters` supervised steps on `samples`, each followed by a weight sync into `engine` if given.
fn timed_steps(
    trainer: &mut Trainer,
    samples: &[Sample],
    engine: Option<&Decoder>,
    iters: usize,
) -> anyhow::Result<Timed> {
    let device = trainer.policy.device();
    let (mut steps, mut syncs) = (Vec::with_capacity(iters), Vec::new());
    // A step returns before its optimizer's kernels finish; the wall time over all steps, from
    // an idle GPU to an idle GPU, checks the steps' own times.
    sync(device);
    let wall = Instant::now();
    for _ in 0..iters {
        steps.push(trainer.sft_step(samples)?);
        if let Some(engine) = engine {
            sync(device);
            let started = Instant::now();
            trainer.sync_weights_into(engine)?;
            sync(device);
            syncs.push(started.elapsed().as_secs_f64());
        }
    }
    sync(device);
    Ok(Timed {
        steps,
        syncs,
        wall: wall.elapsed().as_secs_f64() / iters as f64,
    })
}

/// The largest peak of allocated GPU memory on any rank since the last reset (0 on the CPU).
fn largest_peak(device: Device, group: Option<&ProcessGroup>) -> anyhow::Result<u64> {
    let peak = match device {
        Device::Cuda(i) => ooze_torch::cuda_graph::peak_allocated(i, false).unwrap_or(0),
        _ => 0,
    };
    Ok(match group {
        Some(g) => {
            let mut t = Tensor::from_slice(&[peak as f64]).to_device(device);
            g.all_reduce(&mut t, ReduceOp::Max)?;
            t.to_kind(Kind::Double).double_value(&[0]) as u64
        }
        None => peak,
    })
}

/// The middle value (the upper one of an even count).
pub(super) fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    xs[xs.len() / 2]
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if let Some(job) = launch(&a.ranks) {
        return job;
    }
    let ranks = join(a.compute.device, &a.ranks)?;
    let device = ranks.device;
    let (rank, world) = ranks
        .group
        .as_ref()
        .map_or((0, 1), |g| (g.rank(), g.world_size()));
    let first = rank == 0;
    let config = ooze_model::ModelConfig::load(&a.model)?;
    let gpu = memory::gpu_of(device);
    let tokens_per_rank = a.batch.div_ceil(world) * a.seq_len;
    let micro = a.micro_batch_tokens.unwrap_or(tokens_per_rank);
    let sharded = memory::choose(
        a.sharding,
        &MemoryInputs {
            config: &config,
            value_bytes: memory::value_bytes(a.compute.dtype.kind()),
            ranks: world as u64,
            sharded: false,
            tokens_per_micro_batch: micro as u64,
            recompute: a.recompute,
            reference: false,
            critic: false,
            engine_sequence_bytes: a.sync.then_some(0),
        },
        gpu.as_ref().map(|(c, n)| (*c, n.as_str())),
    )? && ranks.group.is_some();
    let decoder = load_decoder_on(&a.model, device, &a.compute)?;
    let vocab = decoder.config.vocab_size as u64;
    let samples = random_samples(a.batch, a.seq_len, a.ragged, vocab);
    let config = TrainerConfig {
        max_tokens_per_micro_batch: micro,
        recompute_activations: a.recompute,
        sft_arithmetic: match a.arithmetic.as_str() {
            "engine" => ooze_model::Arithmetic::Engine,
            _ => ooze_model::Arithmetic::Fastest,
        },
        ..Default::default()
    };
    let engine = if a.sync && sharded {
        Some(load_decoder_on(&a.model, device, &a.compute)?)
    } else {
        None
    };
    let mut trainer = match &ranks.group {
        Some(g) if sharded => Trainer::sharded(decoder, None, config, g.clone())?,
        Some(g) => {
            let mut t = Trainer::new(decoder, None, config)?;
            t.set_process_group(g.clone())?;
            t
        }
        None => Trainer::new(decoder, None, config)?,
    };
    for _ in 0..2 {
        trainer.sft_step(&samples)?;
    }
    if let Device::Cuda(i) = device {
        ooze_torch::cuda_graph::peak_allocated(i, true);
    }
    // Rank 0 records (one trace per process; the others' match it).
    let recording = Recording::start(a.trace.as_deref().filter(|_| first), device.is_cuda())?;
    let Timed {
        mut steps,
        syncs,
        wall,
    } = timed_steps(&mut trainer, &samples, engine.as_ref(), a.iters)?;
    if let Some(recording) = recording {
        recording.finish(a.iters, "one training step")?;
    }
    let peak = largest_peak(device, ranks.group.as_deref())?;
    trainer.barrier()?;
    if !first {
        return Ok(());
    }
    steps.sort_by(|x, y| x.seconds.partial_cmp(&y.seconds).expect("finite times"));
    let m = &steps[steps.len() / 2];
    let achieved = m.flops / m.seconds;
    let mfu = m
        .mfu
        .map(|u| format!(", MFU {:.1}%", 100.0 * u))
        .unwrap_or_default();
    let how = match (world, sharded) {
        (1, _) => String::new(),
        (w, true) => format!(" on {w} ranks, sharded"),
        (w, false) => format!(" on {w} ranks, replicated"),
    };
    let peak = if device.is_cuda() {
        format!(
            "; peak {:.1} GiB allocated per GPU",
            peak as f64 / f64::from(1 << 30)
        )
    } else {
        String::new()
    };
    println!(
        "train step {}x{}{} {}{how} ({} micro-batches{}, {} arithmetic): median {:.1} ms ({:.1} ms a step over all {}), {:.0} tokens/s, {:.1} TFLOP/s{mfu}{peak}; loss {:.4}, grad norm {:.3}",
        a.batch,
        a.seq_len,
        if a.ragged { " (ragged)" } else { "" },
        a.compute.dtype,
        m.micro_batches,
        if a.recompute || sharded { ", recomputed" } else { "" },
        a.arithmetic,
        m.seconds * 1e3,
        wall * 1e3,
        a.iters,
        m.tokens_per_second,
        achieved / 1e12,
        m.loss,
        m.grad_norm
    );
    if !syncs.is_empty() {
        let bytes = memory::parameter_count(&trainer.policy.config) as f64
            * memory::value_bytes(a.compute.dtype.kind()) as f64;
        let s = median(syncs);
        println!(
            "weight sync into the engine's copy: median {:.1} ms, {:.1} GB/s of weights gathered",
            s * 1e3,
            bytes / s / 1e9
        );
    }
    Ok(())
}
