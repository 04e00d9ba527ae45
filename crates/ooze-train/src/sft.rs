//! Supervised fine-tuning on chat JSONL (`ooze sft`, and the warm start of RL runs): data →
//! batches → steps → held-out loss → checkpoints. Assistant tokens only are trained (the chat
//! template's own spans). The run directory gets the resolved settings (`sft_config.json`),
//! `metrics.jsonl` (one line per step, with the held-out loss where evaluated), atomic
//! checkpoints, and the final model as a complete HF directory; a killed run continues from its
//! last checkpoint with `resume` and takes exactly the same steps.
//!
//! Data order: the training conversations are shuffled per epoch with the seed; step `s` takes the
//! next `batch_size` of that sequence, so the position is the step number itself.
//!
//! [`SftConfig`]'s fields mirror `ooze sft`'s flags, and its messages name the flags.

use crate::checkpoint;
use crate::sft_data::load_chat_jsonl;
use crate::{Decay, OptimizerConfig, Schedule, Sharding, TrainError, Trainer, TrainerConfig};
use ooze_core::order::{Position, PromptOrder};
use ooze_core::Sample;
use ooze_model::{Decoder, Tokenizer};
use ooze_torch::dist::ProcessGroup;
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One fine-tuning run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SftConfig {
    /// The model to fine-tune (HF directory).
    pub model: PathBuf,
    /// Chat JSONL: one `{"messages": [...], "tools": [...]?}` per line.
    pub data: PathBuf,
    /// Run directory (metrics, checkpoints, final model).
    pub out: PathBuf,
    /// Held-out chat JSONL; without it, `eval_fraction` of the data is held out.
    pub eval_data: Option<PathBuf>,
    pub eval_fraction: f64,
    pub epochs: usize,
    /// Stop after this many optimizer steps (default: the epochs' worth).
    pub max_steps: Option<u64>,
    /// Conversations per optimizer step.
    pub batch_size: usize,
    /// Token budget of one micro-batch.
    pub micro_batch_tokens: usize,
    /// Longer conversations are left out (and counted).
    pub max_len: usize,
    pub lr: f64,
    pub warmup_steps: u64,
    pub decay: Decay,
    pub min_lr_ratio: f64,
    pub weight_decay: f64,
    pub clip_grad: f64,
    pub seed: u64,
    /// Checkpoint every N steps (and at the end).
    pub save_every: u64,
    /// Held-out loss every N steps (and at the start and the end).
    pub eval_every: u64,
    /// Continue the run in `out` from its latest checkpoint.
    pub resume: bool,
    /// How ranks hold the model (with one rank: whole).
    pub sharding: Sharding,
}

/// What a finished run did.
#[derive(Debug, Clone, PartialEq)]
pub struct SftSummary {
    /// Optimizer steps of the run (resumed ones included).
    pub steps: u64,
    pub train_conversations: usize,
    pub held_out_conversations: usize,
    /// The held-out loss after the last step (none without held-out data).
    pub final_eval_loss: Option<f64>,
    /// `out/final-model`.
    pub final_model: PathBuf,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        action: "read",
        path: path.to_owned(),
        source,
    }
}

/// The conversations of step `step`: items `step·B .. (step+1)·B` of the epoch-by-epoch seeded
/// order (the same order a resumed run continues).
fn batch_of(train: &[Sample], step: u64, batch: usize, seed: u64) -> Vec<Sample> {
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
fn truncate_metrics(path: &Path, step: u64) -> Result<(), TrainError> {
    if !path.exists() {
        return Ok(());
    }
    let text = std::fs::read_to_string(path).map_err(io(path))?;
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
    Ok(checkpoint::write_atomic(path, body.as_bytes())?)
}

/// The training and held-out conversations, and how many were too long.
fn load_data(
    config: &SftConfig,
    tokenizer: &Tokenizer,
) -> Result<(Vec<Sample>, Vec<Sample>, usize), TrainError> {
    let loaded = load_chat_jsonl(&config.data, tokenizer, config.max_len)?;
    let mut train = loaded.samples;
    let mut too_long = loaded.too_long;
    let held_out = match &config.eval_data {
        Some(path) => {
            let held = load_chat_jsonl(path, tokenizer, config.max_len)?;
            too_long += held.too_long;
            held.samples
        }
        None => {
            let mut order: Vec<usize> = (0..train.len()).collect();
            ooze_core::SplitMix64::new(config.seed ^ 0x5eed).shuffle(&mut order);
            let n_eval = (train.len() as f64 * config.eval_fraction).round() as usize;
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
        return Err(TrainError::Config(format!(
            "{}: no training conversations left",
            config.data.display()
        )));
    }
    Ok((train, held_out, too_long))
}

/// Runs (or resumes) the fine-tuning `config` describes. The caller loads the model's tokenizer
/// and decoder (on its device, in its dtype) when the run needs them; their errors, and the
/// run's own as `E::from`, come back as `E`.
///
/// With `group`, every rank of it calls this with the same settings (and sees the same files):
/// each runs its share of every step, and rank 0 alone writes the run directory and prints.
pub fn run_sft<E: From<TrainError>>(
    config: &SftConfig,
    group: Option<Arc<ProcessGroup>>,
    load_tokenizer: impl FnOnce(&Path) -> Result<Tokenizer, E>,
    load_decoder: impl FnOnce(&Path) -> Result<Decoder, E>,
) -> Result<SftSummary, E> {
    let first = group.as_ref().is_none_or(|g| g.rank() == 0);
    if config.batch_size == 0 {
        return Err(TrainError::Config("--batch-size must be at least 1".into()).into());
    }
    if !(0.0..1.0).contains(&config.eval_fraction) {
        return Err(TrainError::Config(format!(
            "--eval-fraction must be in [0, 1), got {}",
            config.eval_fraction
        ))
        .into());
    }
    let has_checkpoint = !checkpoint::candidates(&config.out)?.is_empty();
    if has_checkpoint && !config.resume {
        return Err(TrainError::Config(format!(
            "{} already has checkpoints; pass --resume to continue that run, or choose another --out",
            config.out.display()
        ))
        .into());
    }
    if first {
        std::fs::create_dir_all(&config.out).map_err(io(&config.out))?;
    }
    let tokenizer = load_tokenizer(&config.model)?;
    let (train, held_out, too_long) = load_data(config, &tokenizer)?;
    let steps_per_epoch = train.len().div_ceil(config.batch_size) as u64;
    let total = config
        .max_steps
        .unwrap_or(steps_per_epoch * config.epochs as u64);
    if first {
        eprintln!(
            "sft: {} training and {} held-out conversations ({too_long} longer than {} tokens left out), {total} steps of {}",
            train.len(),
            held_out.len(),
            config.max_len,
            config.batch_size
        );
    }
    let trainer_config = TrainerConfig {
        optimizer: OptimizerConfig {
            weight_decay: config.weight_decay,
            clip_grad: config.clip_grad,
            ..Default::default()
        },
        schedule: Schedule {
            lr: config.lr,
            warmup_steps: config.warmup_steps,
            decay: config.decay,
            total_steps: total.max(config.warmup_steps + 1),
            min_lr_ratio: config.min_lr_ratio,
        },
        max_tokens_per_micro_batch: config.micro_batch_tokens,
        ..Default::default()
    };
    let ranks = group.as_ref().map_or(1, |g| g.world_size());
    if first {
        let resolved = json!({"args": config, "trainer": &trainer_config, "ranks": ranks});
        checkpoint::write_atomic(
            &config.out.join("sft_config.json"),
            serde_json::to_string_pretty(&resolved)
                .expect("invariant: the settings serialise")
                .as_bytes(),
        )
        .map_err(TrainError::from)?;
    }
    let decoder = load_decoder(&config.model)?;
    let gpu = crate::memory::gpu_of(decoder.device());
    let sharded = crate::memory::choose(
        config.sharding,
        &crate::memory::MemoryInputs {
            config: &decoder.config,
            value_bytes: crate::memory::value_bytes(decoder.kind()),
            ranks: ranks as u64,
            sharded: false,
            tokens_per_micro_batch: config.micro_batch_tokens as u64,
            recompute: false,
            reference: false,
            critic: false,
            engine_sequence_bytes: None,
        },
        gpu.as_ref().map(|(c, n)| (*c, n.as_str())),
    )? && group.is_some();
    let mut trainer = match &group {
        Some(g) if sharded => Trainer::sharded(decoder, None, trainer_config, g.clone())?,
        _ => Trainer::new(decoder, None, trainer_config)?,
    };
    // The newest checkpoint that loads (a corrupt one is reported and the one before tried).
    let restored = if config.resume {
        checkpoint::load_newest(&config.out, &mut trainer)?
    } else {
        None
    };
    if let (Some(group), false) = (group, sharded) {
        trainer.set_process_group(group)?;
    }
    if let (true, Some(checkpoint::Restored { dir, .. })) = (first, &restored) {
        eprintln!(
            "sft: resumed from {} at step {}",
            dir.display(),
            trainer.step()
        );
    }
    let final_eval_loss = train_steps(config, &mut trainer, &train, &held_out, total, first)?;
    let final_model = checkpoint::save_final_model(&config.out, &config.model, &trainer)?;
    if first {
        eprintln!("sft: done; model in {}", final_model.display());
    }
    // Every rank returns once the final model is written.
    trainer.barrier()?;
    Ok(SftSummary {
        steps: trainer.step(),
        train_conversations: train.len(),
        held_out_conversations: held_out.len(),
        final_eval_loss,
        final_model,
    })
}

/// The step loop, from the trainer's step to `total`: a metrics line per step, the held-out loss
/// every `eval_every` steps (and before the first and after the last), a checkpoint every
/// `save_every` steps and after the last. Returns the last held-out loss. Only the `first` rank
/// writes and prints; every rank computes.
fn train_steps(
    config: &SftConfig,
    trainer: &mut Trainer,
    train: &[Sample],
    held_out: &[Sample],
    total: u64,
    first: bool,
) -> Result<Option<f64>, TrainError> {
    let metrics_path = config.out.join("metrics.jsonl");
    let mut metrics_file = if first {
        truncate_metrics(&metrics_path, trainer.step())?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&metrics_path)
            .map_err(io(&metrics_path))?;
        Some(file)
    } else {
        None
    };
    let evaluate = |trainer: &Trainer| -> Result<Option<f64>, TrainError> {
        if held_out.is_empty() {
            return Ok(None);
        }
        Ok(Some(trainer.eval_loss(held_out)?))
    };
    let mut last_eval = None;
    if trainer.step() == 0 {
        if let Some(loss) = evaluate(trainer)? {
            if let Some(file) = &mut metrics_file {
                eprintln!("sft: held-out loss {loss:.4} before training");
                writeln!(file, "{}", json!({"step": 0, "eval_loss_before": loss}))
                    .map_err(io(&metrics_path))?;
            }
            last_eval = Some(loss);
        }
    }
    while trainer.step() < total {
        let step = trainer.step();
        let batch = batch_of(train, step, config.batch_size, config.seed);
        let m = trainer.sft_step(&batch)?;
        let done = trainer.step();
        let eval = if done.is_multiple_of(config.eval_every.max(1)) || done == total {
            evaluate(trainer)?
        } else {
            None
        };
        let mut line = serde_json::to_value(&m).expect("invariant: step metrics serialise");
        if let Some(loss) = eval {
            line["eval_loss"] = json!(loss);
            last_eval = Some(loss);
        }
        if let Some(file) = &mut metrics_file {
            writeln!(file, "{line}").map_err(io(&metrics_path))?;
            file.flush().map_err(io(&metrics_path))?;
            eprintln!(
                "sft: step {done}/{total} loss {:.4} lr {:.2e} grad {:.3} {:.0} tok/s{}",
                m.loss,
                m.lr,
                m.grad_norm,
                m.tokens_per_second,
                eval.map(|l| format!(" held-out {l:.4}"))
                    .unwrap_or_default()
            );
        }
        // Every rank: a sharded trainer's ranks each write their part. Written in the
        // background; the last is finished with the final model.
        if done.is_multiple_of(config.save_every.max(1)) || done == total {
            checkpoint::save_in_background(
                &config.out,
                &config.model,
                trainer,
                json!({"data_seed": config.seed}),
            )?;
        }
    }
    Ok(last_eval)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(id: u32) -> Sample {
        Sample::demonstration(vec![id, id + 1], vec![1])
    }

    #[test]
    fn a_step_takes_its_place_in_the_seeded_order() {
        let train: Vec<Sample> = (0..5).map(|i| sample(10 * i)).collect();
        let first_of =
            |batch: Vec<Sample>| -> Vec<u32> { batch.iter().map(|s| s.tokens[0] / 10).collect() };
        // Steps of 2 over 5 conversations: step 2 starts at item 4 of epoch 0 and crosses into
        // epoch 1, as one order taken 4 then 2 does.
        let mut order = PromptOrder::new(5, 7, true, Position::default());
        let taken: Vec<u32> = order.take(6).into_iter().map(|i| i as u32).collect();
        assert_eq!(first_of(batch_of(&train, 0, 2, 7)), taken[0..2]);
        assert_eq!(first_of(batch_of(&train, 2, 2, 7)), taken[4..6]);
    }

    #[test]
    fn resumed_metrics_keep_only_earlier_steps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        truncate_metrics(&path, 3).unwrap();
        assert!(!path.exists());
        std::fs::write(
            &path,
            "{\"step\": 0, \"eval_loss_before\": 2}\n{\"step\": 1}\n{\"step\": 2}\n{\"step\": 3}\nnot json\n",
        )
        .unwrap();
        truncate_metrics(&path, 2).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"step\": 0, \"eval_loss_before\": 2}\n{\"step\": 1}\n"
        );
    }
}
