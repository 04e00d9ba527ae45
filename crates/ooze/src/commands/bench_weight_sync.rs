//! `ooze bench weight-sync`: the weight update of disaggregated rollout, measured alone. This
//! process plays the trainer: it loads the model's weights onto its device and sends them to
//! running engines (`ooze serve` or SGLang, on GPUs of their own) exactly as `ooze train` does
//! with `rollout.weight_sync = "distributed"`: through the router, over a process group that
//! the engines join by SGLang's `init_weights_update_group` (NCCL between GPUs, Gloo between
//! CPUs), every tensor named and then broadcast from rank 0. The first update also forms the
//! group; each later one reuses it. Prints every update's time, the median of the later ones,
//! and the bandwidth it reached against the bytes sent. A trainer needs no optimizer state here,
//! so a model that no single GPU could train (7B on one H200) can still be measured.

use super::{load_decoder, ComputeArgs};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[arg(long)]
    model: PathBuf,
    /// An engine to update (its base URL, `http://host:port`); repeat for several.
    #[arg(long = "engine", required = true)]
    engines: Vec<String>,
    /// Timed updates (the first one also forms the process group).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    iters: u32,
    /// The address the engines reach this process at (the weight group's store).
    #[arg(long, default_value = "127.0.0.1")]
    trainer_address: String,
    #[command(flatten)]
    compute: ComputeArgs,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let decoder = load_decoder(&a.model, &a.compute)?;
    let device = decoder.device();
    let weights = decoder.named_parameters();
    let tensors = weights.len();
    let bytes: usize = weights
        .iter()
        .map(|(_, t)| t.numel() * t.kind().elt_size_in_bytes())
        .sum();
    drop(weights);
    let mut config = ooze_router::RouterConfig::new(
        a.engines.clone(),
        decoder.config.max_position_embeddings,
        decoder.config.vocab_size,
    );
    config.trainer_address = a.trainer_address.clone();
    let backend = ooze_torch::dist::Backend::for_device(device);
    config.weight_backend = backend;
    let engine = ooze_router::start(config)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    eprintln!(
        "weight-sync: {} tensors, {:.2} GB, to {} engine(s) over {:?}",
        tensors,
        bytes as f64 / 1e9,
        a.engines.len(),
        backend
    );
    let mut seconds = Vec::new();
    for i in 0..a.iters {
        let started = Instant::now();
        let version =
            runtime.block_on(engine.update_weights_from_tensors(decoder.named_parameters()))?;
        let took = started.elapsed().as_secs_f64();
        println!(
            "update {}: weight version {version}, {:.3} s, {:.1} GB/s{}",
            i + 1,
            took,
            bytes as f64 / took / 1e9,
            if i == 0 { " (forms the group)" } else { "" }
        );
        seconds.push(took);
    }
    let stats = runtime.block_on(engine.stats())?;
    runtime.block_on(engine.shutdown());
    // The first update also forms the group: the median is of the later ones, when there are.
    let later = if seconds.len() > 1 {
        seconds[1..].to_vec()
    } else {
        seconds
    };
    let median = super::bench_train::median(later);
    println!(
        "weight-sync {:.2} GB to {} engine(s): median {:.3} s per update, {:.1} GB/s; engines at weight version {}",
        bytes as f64 / 1e9,
        a.engines.len(),
        median,
        bytes as f64 / median / 1e9,
        stats.weight_version
    );
    Ok(())
}
