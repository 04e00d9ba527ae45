//! `ooze sft`: supervised fine-tuning on chat JSONL, the trainer's first user (and the warm start
//! of RL runs). Assistant tokens only are trained (the chat template's own spans). The run
//! directory gets the resolved settings, `metrics.jsonl` (one line per step, with the held-out loss
//! where evaluated), atomic checkpoints, and the final model as a complete HF directory; a killed
//! run continues from its last checkpoint with `--resume` and takes exactly the same steps.
//!
//! Data order: the training conversations are shuffled per epoch with the seed; step `s` takes the
//! next `batch_size` of that sequence, so the position is the step number itself.

use super::{load_decoder, load_tokenizer, ComputeArgs};
use anyhow::{bail, Context};
use ooze_rollout::data::{Position, PromptOrder};
use ooze_train::sft_data::load_chat_jsonl;
use ooze_train::{
    checkpoint, Decay, OptimizerConfig, Schedule, TrainSample, Trainer, TrainerConfig,
};
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug, Clone, serde::Serialize)]
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
    #[command(flatten)]
    #[serde(skip)]
    compute: ComputeArgs,
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

/// The conversations of step `step`: items `step·B .. (step+1)·B` of the epoch-by-epoch seeded
/// order (the same order a resumed run continues).
fn batch_of(train: &[TrainSample], step: u64, batch: usize, seed: u64) -> Vec<TrainSample> {
    let n = train.len();
    let k = step as usize * batch;
    let position = Position {
        epoch: (k / n) as u64,
        offset: k % n,
    };
    PromptOrder::new(n, seed, true, position)
        .take(batch)
        .into_iter()
        .map(|i| train[i].clone())
        .collect()
}

/// Keeps the metrics lines of steps before `step` (a resumed run rewrites the rest).
fn truncate_metrics(path: &Path, step: u64) -> anyhow::Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let text = std::fs::read_to_string(path)?;
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v["step"].as_u64())
                .is_some_and(|s| s < step)
        })
        .collect();
    let mut body = kept.join("\n");
    if !body.is_empty() {
        body.push('\n');
    }
    checkpoint::write_atomic(path, body.as_bytes())?;
    Ok(())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    if !(0.0..1.0).contains(&args.eval_fraction) {
        bail!(
            "--eval-fraction must be in [0, 1), got {}",
            args.eval_fraction
        );
    }
    let latest = checkpoint::latest(&args.out)?;
    if latest.is_some() && !args.resume {
        bail!(
            "{} already has checkpoints; pass --resume to continue that run, or choose another --out",
            args.out.display()
        );
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let tokenizer = load_tokenizer(&args.model)?;
    let loaded = load_chat_jsonl(&args.data, &tokenizer, args.max_len)?;
    let mut train = loaded.samples;
    let mut too_long = loaded.too_long;
    let held_out = match &args.eval_data {
        Some(path) => {
            let held = load_chat_jsonl(path, &tokenizer, args.max_len)?;
            too_long += held.too_long;
            held.samples
        }
        None => {
            let mut order: Vec<usize> = (0..train.len()).collect();
            ooze_core::SplitMix64::new(args.seed ^ 0x5eed).shuffle(&mut order);
            let n_eval = (train.len() as f64 * args.eval_fraction).round() as usize;
            let eval_set: std::collections::HashSet<usize> =
                order[..n_eval].iter().copied().collect();
            let (mut keep, mut held) = (Vec::new(), Vec::new());
            for (i, s) in train.into_iter().enumerate() {
                if eval_set.contains(&i) {
                    held.push(s);
                } else {
                    keep.push(s);
                }
            }
            train = keep;
            held
        }
    };
    if train.is_empty() {
        bail!("{}: no training conversations left", args.data.display());
    }
    let steps_per_epoch = train.len().div_ceil(args.batch_size) as u64;
    let total = args
        .max_steps
        .unwrap_or(steps_per_epoch * args.epochs as u64);
    eprintln!(
        "sft: {} training and {} held-out conversations ({too_long} longer than {} tokens left out), {total} steps of {}",
        train.len(),
        held_out.len(),
        args.max_len,
        args.batch_size
    );
    let config = TrainerConfig {
        optimizer: OptimizerConfig {
            weight_decay: args.weight_decay,
            clip_grad: args.clip_grad,
            ..Default::default()
        },
        schedule: Schedule {
            lr: args.lr,
            warmup_steps: args.warmup_steps,
            decay: args.decay,
            total_steps: total.max(args.warmup_steps + 1),
            min_lr_ratio: args.min_lr_ratio,
        },
        max_tokens_per_micro_batch: args.micro_batch_tokens,
        ..Default::default()
    };
    let resolved = json!({"args": &args, "trainer": &config});
    checkpoint::write_atomic(
        &args.out.join("sft_config.json"),
        serde_json::to_string_pretty(&resolved)?.as_bytes(),
    )?;
    let decoder = load_decoder(&args.model, &args.compute)?;
    let mut trainer = Trainer::new(decoder, None, config)?;
    let metrics_path = args.out.join("metrics.jsonl");
    if let Some(dir) = &latest {
        checkpoint::load(dir, &mut trainer)?;
        eprintln!(
            "sft: resumed from {} at step {}",
            dir.display(),
            trainer.step()
        );
    }
    truncate_metrics(&metrics_path, trainer.step())?;
    let mut metrics_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&metrics_path)
        .with_context(|| format!("opening {}", metrics_path.display()))?;
    let evaluate = |trainer: &Trainer| -> anyhow::Result<Option<f64>> {
        if held_out.is_empty() {
            return Ok(None);
        }
        Ok(Some(trainer.eval_loss(&held_out)?))
    };
    if trainer.step() == 0 {
        if let Some(loss) = evaluate(&trainer)? {
            eprintln!("sft: held-out loss {loss:.4} before training");
            writeln!(
                metrics_file,
                "{}",
                json!({"step": 0, "eval_loss_before": loss})
            )?;
        }
    }
    while trainer.step() < total {
        let step = trainer.step();
        let batch = batch_of(&train, step, args.batch_size, args.seed);
        let m = trainer.sft_step(&batch)?;
        let done = trainer.step();
        let eval = if done % args.eval_every.max(1) == 0 || done == total {
            evaluate(&trainer)?
        } else {
            None
        };
        let mut line = serde_json::to_value(&m)?;
        if let Some(loss) = eval {
            line["eval_loss"] = json!(loss);
        }
        writeln!(metrics_file, "{line}")?;
        metrics_file.flush()?;
        eprintln!(
            "sft: step {done}/{total} loss {:.4} lr {:.2e} grad {:.3} {:.0} tok/s{}",
            m.loss,
            m.lr,
            m.grad_norm,
            m.tokens_per_second,
            eval.map(|l| format!(" held-out {l:.4}"))
                .unwrap_or_default()
        );
        if done % args.save_every.max(1) == 0 || done == total {
            checkpoint::save(
                &args.out,
                &args.model,
                &trainer,
                json!({"data_seed": args.seed}),
            )?;
        }
    }
    let final_dir = checkpoint::save_final_model(&args.out, &args.model, &trainer)?;
    eprintln!("sft: done; model in {}", final_dir.display());
    Ok(())
}
