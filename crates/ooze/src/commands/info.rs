//! `ooze info`: what this process can compute on.

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let info = ooze_torch::runtime_info();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&info)?);
        return Ok(());
    }
    println!("ooze {}", env!("CARGO_PKG_VERSION"));
    println!("PyTorch (libtorch) {}", info.torch_version);
    println!("CPU threads: {}", info.cpu_threads);
    match (&info.cuda_available, &info.cuda_runtime_version) {
        (true, Some(v)) => println!(
            "CUDA: available (runtime {v}, cuDNN {})",
            if info.cudnn_available { "yes" } else { "no" }
        ),
        (true, None) => println!("CUDA: available"),
        (false, _) => println!("CUDA: not available (computing on CPU)"),
    }
    for gpu in &info.gpus {
        println!(
            "GPU {}: {} — {:.1} GiB, compute capability {}.{}, {} SMs",
            gpu.index,
            gpu.name,
            gpu.total_memory_bytes as f64 / (1u64 << 30) as f64,
            gpu.compute_capability.0,
            gpu.compute_capability.1,
            gpu.multiprocessors
        );
    }
    if let Some(err) = &info.gpu_query_error {
        println!("GPU details unavailable: {err}");
    }
    Ok(())
}
