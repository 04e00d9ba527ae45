//! One module per subcommand; each has clap `Args` and a `run`.

pub mod bench;
pub mod bench_train;
pub mod bench_weight_sync;
pub mod env;
pub mod generate;
pub mod info;
pub mod init_model;
pub mod ranks;
pub mod recipe_data;
pub mod render;
pub mod report;
pub mod retrieve;
pub mod score;
pub mod serve;
pub mod sft;
pub mod task;
pub mod trace;
pub mod train;

use anyhow::Context;
use ooze_model::{Decoder, Tokenizer};
use ooze_torch::{DeviceSpec, DtypeSpec};
use std::path::Path;

/// Device and dtype flags shared by commands that run a model.
#[derive(clap::Args, Debug, Clone)]
pub struct ComputeArgs {
    /// auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: DeviceSpec,
    /// fp32 or bf16.
    #[arg(long, default_value = "fp32")]
    pub dtype: DtypeSpec,
    /// Deterministic numerics (`rollout.deterministic`): batch-invariant kernels in one reduction
    /// order for decode, prefill and training, so an engine's log-probs equal a trainer's bitwise
    /// (a GPU in bf16).
    #[arg(long)]
    pub deterministic: bool,
}

/// Loads the decoder of a model directory onto the requested device.
pub fn load_decoder(dir: &Path, compute: &ComputeArgs) -> anyhow::Result<Decoder> {
    load_decoder_on(dir, compute.device.resolve()?, compute)
}

/// Loads the decoder of a model directory onto `device` (a rank's), in the requested dtype.
pub fn load_decoder_on(
    dir: &Path,
    device: ooze_torch::tch::Device,
    compute: &ComputeArgs,
) -> anyhow::Result<Decoder> {
    let started = std::time::Instant::now();
    let decoder = Decoder::load(dir, device, compute.dtype.kind())
        .with_context(|| format!("loading the model in {}", dir.display()))?;
    if compute.deterministic {
        ooze_model::enable_deterministic(&decoder.config, decoder.kind(), device)
            .map_err(|e| anyhow::anyhow!("--deterministic {e}"))?;
    }
    eprintln!(
        "loaded {} ({:.1}M parameters, {}) on {:?} in {:.2}s",
        dir.display(),
        decoder.config.num_parameters() as f64 / 1e6,
        compute.dtype,
        device,
        started.elapsed().as_secs_f64()
    );
    Ok(decoder)
}

pub fn load_tokenizer(dir: &Path) -> anyhow::Result<Tokenizer> {
    Tokenizer::load(dir).with_context(|| format!("loading the tokenizer in {}", dir.display()))
}

/// Reads a JSON file, naming it on failure.
pub fn read_json_file(path: &Path) -> anyhow::Result<serde_json::Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not valid JSON", path.display()))
}

/// Writes `rows` as JSON lines to `path`, atomically, creating its directory.
pub fn write_jsonl(path: &Path, rows: &[serde_json::Value]) -> anyhow::Result<()> {
    let mut body = String::new();
    for row in rows {
        body.push_str(&row.to_string());
        body.push('\n');
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    ooze_train::checkpoint::write_atomic(path, body.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}
