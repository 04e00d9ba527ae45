//! `ooze sft`: supervised fine-tuning on chat JSONL, the trainer's first user (and the warm start
//! of RL runs). The flags become an [`SftConfig`]; the run itself (data, steps, held-out loss,
//! checkpoints, resume) is [`ooze_train::sft::run_sft`].

use super::ranks::{join, launch, RankArgs};
use super::{load_decoder_on, load_tokenizer, ComputeArgs};
use ooze_train::sft::{run_sft, SftConfig};
use ooze_train::{Decay, Sharding};
use std::path::PathBuf;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The model to fine-tune (HF directory).
    #[arg(long)]
    model: PathBuf,
    /// Chat JSONL: one `{"messages": [...], "tools": [...]?}` per line.
    #[arg(long)]
    data: PathBuf,
    /// Run directory (metrics, checkpoints, final model).
    #[arg(long)]
    out: PathBuf,
    /// Held-out chat JSONL; without it, `--eval-fraction` of the data is held out.
    #[arg(long)]
    eval_data: Option<PathBuf>,
    #[arg(long, default_value_t = 0.05)]
    eval_fraction: f64,
    #[arg(long, default_value_t = 1)]
    epochs: usize,
    /// Stop after this many optimizer steps (default: the epochs' worth).
    #[arg(long)]
    max_steps: Option<u64>,
    /// Conversations per optimizer step.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Token budget of one micro-batch.
    #[arg(long, default_value_t = 16_384)]
    micro_batch_tokens: usize,
    /// Longer conversations are left out (and counted).
    #[arg(long, default_value_t = 4096)]
    max_len: usize,
    #[arg(long, default_value_t = 1e-5)]
    lr: f64,
    #[arg(long, default_value_t = 0)]
    warmup_steps: u64,
    /// constant, linear or cosine.
    #[arg(long, default_value = "cosine", value_parser = parse_decay)]
    decay: Decay,
    #[arg(long, default_value_t = 0.1)]
    min_lr_ratio: f64,
    #[arg(long, default_value_t = 0.0)]
    weight_decay: f64,
    #[arg(long, default_value_t = 1.0)]
    clip_grad: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Checkpoint every N steps (and at the end).
    #[arg(long, default_value_t = 50)]
    save_every: u64,
    /// Held-out loss every N steps (and at the start and the end).
    #[arg(long, default_value_t = 50)]
    eval_every: u64,
    /// Continue the run in `--out` from its latest checkpoint.
    #[arg(long)]
    resume: bool,
    /// How ranks hold the model: auto (sharded when a whole copy per GPU does not fit),
    /// replicated (each rank the whole model) or sharded (ZeRO-3).
    #[arg(long, default_value = "auto")]
    sharding: Sharding,
    #[command(flatten)]
    compute: ComputeArgs,
    #[command(flatten)]
    ranks: RankArgs,
}

fn parse_decay(s: &str) -> Result<Decay, String> {
    match s {
        "constant" => Ok(Decay::Constant),
        "linear" => Ok(Decay::Linear),
        "cosine" => Ok(Decay::Cosine),
        _ => Err(format!(
            "unknown decay `{s}`; expected constant, linear or cosine"
        )),
    }
}

impl Args {
    fn config(&self) -> SftConfig {
        SftConfig {
            model: self.model.clone(),
            data: self.data.clone(),
            out: self.out.clone(),
            eval_data: self.eval_data.clone(),
            eval_fraction: self.eval_fraction,
            epochs: self.epochs,
            max_steps: self.max_steps,
            batch_size: self.batch_size,
            micro_batch_tokens: self.micro_batch_tokens,
            max_len: self.max_len,
            lr: self.lr,
            warmup_steps: self.warmup_steps,
            decay: self.decay,
            min_lr_ratio: self.min_lr_ratio,
            weight_decay: self.weight_decay,
            clip_grad: self.clip_grad,
            seed: self.seed,
            save_every: self.save_every,
            eval_every: self.eval_every,
            resume: self.resume,
            sharding: self.sharding,
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(job) = launch(&args.ranks) {
        return job;
    }
    let ranks = join(args.compute.device, &args.ranks)?;
    let device = ranks.device;
    run_sft(
        &args.config(),
        ranks.group,
        load_tokenizer,
        |model: &std::path::Path| load_decoder_on(model, device, &args.compute),
    )?;
    Ok(())
}
