//! Checkpoints of a training run, written so that a crash never damages the last good one.
//!
//! `RUN/checkpoint-000042/` holds `model/` (a complete HF model directory: config, tokenizer and
//! safetensors, loadable by transformers), `optimizer/` (fp32 moments, step counters and master
//! weights as safetensors), with a critic also `critic/` and `critic_optimizer/`, and
//! `trainer_state.json` (step, trainer config, and the caller's own
//! state: data position, RNG). It is built under a hidden temporary name, flushed to disk and
//! renamed into place (the rename flushed too); `RUN/latest` (written atomically) names the newest
//! complete one. Every file goes through the one atomic writer, [`ooze_core::atomic_file`].
//!
//! With ranks every rank calls [`save`], [`save_final_model`] and [`finish_pending`]; rank 0
//! writes, except that a sharded trainer's ranks each write their own optimizer shard, in the
//! background (see `sharded_checkpoint`): its checkpoint is complete, renamed into place, only at
//! the next save or at [`finish_pending`]. [`save_in_background`] does the same for a whole
//! trainer (what `ooze train` and `ooze sft` use): training waits only for the copy to host
//! memory.
//!
//! Resuming takes the newest checkpoint that loads ([`load_newest`]): `latest`, or when that one is
//! damaged (a truncated safetensors file, missing files, bad JSON) the ones before it, newest
//! first, each failure reported on stderr.

use crate::sharded_checkpoint;
use crate::trainer::{Trainer, TrainerConfig};
use crate::TrainError;
use ooze_core::atomic_file;
use ooze_model::checkpoint::{export_model, save_weights, SaveOptions, WeightSet};
use ooze_torch::tch::Kind;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Serialize, Deserialize)]
struct TrainerState {
    step: u64,
    config: TrainerConfig,
    /// The caller's state (data position, RNG, …).
    extra: serde_json::Value,
}

pub(crate) fn io<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> TrainError + 'a {
    move |source| TrainError::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

/// Replaces `path` with `bytes` atomically: the one writer, [`ooze_core::atomic_file::write`],
/// re-exported for the callers that write run files through this module.
pub use ooze_core::atomic_file::write as write_atomic;

/// The dtype the model is saved in: its own when 16-bit, fp32 otherwise.
fn saved_kind(trainer: &Trainer) -> Kind {
    match trainer.policy.kind() {
        Kind::BFloat16 | Kind::Half => trainer.policy.kind(),
        _ => Kind::Float,
    }
}

/// `trainer_state.json`'s bytes.
fn state_json(trainer: &Trainer, extra: serde_json::Value) -> Vec<u8> {
    let state = TrainerState {
        step: trainer.step(),
        config: trainer.config.clone(),
        extra,
    };
    serde_json::to_vec_pretty(&state).expect("invariant: the state serialises")
}

/// Saves the trainer after its current step into `run_dir`; `source_model` is the model directory
/// the policy was loaded from (its config and tokenizer files are copied). Returns the checkpoint
/// (a sharded trainer's is still being written: see [`finish_pending`]). Every rank calls it.
pub fn save(
    run_dir: &Path,
    source_model: &Path,
    trainer: &Trainer,
    extra: serde_json::Value,
) -> Result<PathBuf, TrainError> {
    // The background writer, waited for: one way of writing a checkpoint. (A sharded trainer's
    // ranks each write their part, completed at the next save or `finish_pending`.)
    let done = save_in_background(run_dir, source_model, trainer, extra)?;
    if !trainer.is_sharded() {
        finish_pending(trainer)?;
    }
    Ok(done)
}

/// [`save`], with the files written in the background: the trainer's state is copied to host
/// memory (the only time training waits), a thread writes the checkpoint under its hidden name,
/// and it is renamed into place, `latest` moved to it, at the next save or at [`finish_pending`].
/// Until then the previous checkpoint stays the latest. Every rank calls it; rank 0 writes (a
/// sharded trainer's ranks each their shard, as [`save`] does).
pub fn save_in_background(
    run_dir: &Path,
    source_model: &Path,
    trainer: &Trainer,
    extra: serde_json::Value,
) -> Result<PathBuf, TrainError> {
    if trainer.is_sharded() {
        let json = state_json(trainer, extra);
        return sharded_checkpoint::save(run_dir, source_model, trainer, json, saved_kind(trainer));
    }
    finish_pending(trainer)?;
    let name = format!("checkpoint-{:06}", trainer.step());
    let done = run_dir.join(&name);
    if trainer.rank().0 != 0 {
        return Ok(done);
    }
    let model_kind = saved_kind(trainer);
    let json = state_json(trainer, extra);
    let host = sharded_checkpoint::to_host;
    let model = host(trainer.policy.named_parameters(), model_kind);
    let optimizer = host(trainer.optimizer().state(), Kind::Float);
    let critic = trainer
        .critic()
        .map(|c| host(c.named_tensors(), model_kind));
    let critic_optimizer = trainer
        .critic_optimizer_state()
        .map(|s| host(s, Kind::Float));
    let tmp = run_dir.join(format!(".{name}.partial"));
    let (source, dir) = (source_model.to_owned(), tmp.clone());
    let writer = std::thread::spawn(move || -> Result<(), TrainError> {
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(io("remove", &dir))?;
        }
        std::fs::create_dir_all(&dir).map_err(io("create directory", &dir))?;
        let kind = |kind| SaveOptions {
            kind,
            ..Default::default()
        };
        export_model(&source, &dir.join("model"), &model, kind(model_kind))?;
        save_weights(&dir.join("optimizer"), &optimizer, kind(Kind::Float))?;
        if let Some(critic) = critic {
            export_model(&source, &dir.join("critic"), &critic, kind(model_kind))?;
        }
        if let Some(state) = critic_optimizer {
            save_weights(&dir.join("critic_optimizer"), &state, kind(Kind::Float))?;
        }
        write_atomic(&dir.join("trainer_state.json"), &json)?;
        Ok(())
    });
    *trainer.pending_write() = Some(sharded_checkpoint::PendingWrite {
        tmp,
        done: done.clone(),
        run_dir: run_dir.to_owned(),
        writer,
    });
    Ok(done)
}

/// Finishes the checkpoint still being written in the background, if any (every rank calls it;
/// nothing to do otherwise), and returns it. Call it before the end of a run.
pub fn finish_pending(trainer: &Trainer) -> Result<Option<PathBuf>, TrainError> {
    sharded_checkpoint::finish_pending(trainer)
}

/// Writes the policy as a complete HF model directory `run_dir/final-model` (built under a hidden
/// name and renamed into place, replacing an older one); returns its path. Every rank calls it
/// (a sharded policy is gathered); rank 0 writes.
pub fn save_final_model(
    run_dir: &Path,
    source_model: &Path,
    trainer: &Trainer,
) -> Result<PathBuf, TrainError> {
    finish_pending(trainer)?;
    write_model_dir(
        &run_dir.join("final-model"),
        source_model,
        trainer,
        SaveOptions::default(),
    )
}

/// Writes the policy's current weights as a complete HF model directory
/// `weights_dir/step-000042` for external engines to load (`/update_weights_from_disk`), and
/// removes older ones but the one before it (an engine may still be reading it). Every rank
/// calls it; rank 0 writes. Returns the directory.
pub fn export_weights(
    weights_dir: &Path,
    source_model: &Path,
    trainer: &Trainer,
) -> Result<PathBuf, TrainError> {
    let done = weights_dir.join(format!("step-{:06}", trainer.step()));
    // In the model's own dtype: what the engines compute in, half the bytes of fp32 in bf16.
    let options = SaveOptions {
        kind: trainer.policy.kind(),
        ..Default::default()
    };
    write_model_dir(&done, source_model, trainer, options)?;
    if trainer.rank().0 == 0 {
        let mut older: Vec<PathBuf> = std::fs::read_dir(weights_dir)
            .map_err(io("read", weights_dir))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("step-"))
                    && *p != done
            })
            .collect();
        older.sort();
        if let Some((_, stale)) = older.split_last() {
            for dir in stale {
                std::fs::remove_dir_all(dir).map_err(io("remove", dir))?;
            }
        }
    }
    Ok(done)
}

/// `done` ← the policy as an HF directory, built under a hidden name beside it and renamed.
fn write_model_dir(
    done: &Path,
    source_model: &Path,
    trainer: &Trainer,
    options: SaveOptions,
) -> Result<PathBuf, TrainError> {
    let name = done
        .file_name()
        .expect("invariant: a named directory")
        .to_string_lossy();
    let parent = done
        .parent()
        .expect("invariant: a directory in a directory");
    let tmp = parent.join(format!(".{name}.partial"));
    let sharded = trainer.shards.as_ref();
    if let Some(model) = sharded {
        model.gather_all()?;
    }
    let written = if trainer.rank().0 == 0 {
        std::fs::create_dir_all(parent)
            .map_err(io("create directory", parent))
            .and_then(|()| write_model(&tmp, source_model, trainer, options))
    } else {
        Ok(())
    };
    if let Some(model) = sharded {
        model.release_all();
    }
    written?;
    if trainer.rank().0 != 0 {
        return Ok(done.to_owned());
    }
    atomic_file::sync_dir(&tmp)?;
    if done.exists() {
        std::fs::remove_dir_all(done).map_err(io("remove", done))?;
    }
    atomic_file::rename(&tmp, done)?;
    Ok(done.to_owned())
}

fn write_model(
    tmp: &Path,
    source_model: &Path,
    trainer: &Trainer,
    options: SaveOptions,
) -> Result<(), TrainError> {
    if tmp.exists() {
        std::fs::remove_dir_all(tmp).map_err(io("remove", tmp))?;
    }
    trainer.policy.save(source_model, tmp, options)?;
    Ok(())
}

/// The newest complete checkpoint of `run_dir`, if any.
pub fn latest(run_dir: &Path) -> Result<Option<PathBuf>, TrainError> {
    let pointer = run_dir.join("latest");
    if !pointer.exists() {
        return Ok(None);
    }
    let name = std::fs::read_to_string(&pointer).map_err(io("read", &pointer))?;
    let dir = run_dir.join(name.trim());
    if !dir.join("trainer_state.json").exists() {
        return Err(TrainError::Checkpoint(format!(
            "{} names {}, which is not a complete checkpoint",
            pointer.display(),
            dir.display()
        )));
    }
    Ok(Some(dir))
}

/// Restores weights, optimizer state and step from `dir` into `trainer` (built with the same
/// model shape); returns the caller's saved state.
pub fn load(dir: &Path, trainer: &mut Trainer) -> Result<serde_json::Value, TrainError> {
    let path = dir.join("trainer_state.json");
    let text = std::fs::read_to_string(&path).map_err(io("read", &path))?;
    let state: TrainerState = serde_json::from_str(&text).map_err(|e| {
        TrainError::Checkpoint(format!("{}: not a trainer state: {e}", path.display()))
    })?;
    let (device, kind) = (trainer.policy.device(), trainer.policy.kind());
    let sharded = trainer.is_sharded();
    if sharded {
        sharded_checkpoint::load(dir, trainer)?;
    } else {
        trainer
            .policy
            .update_weights(WeightSet::load(&dir.join("model"), device, kind)?)?;
        trainer.optimizer_mut().load_state(WeightSet::load(
            &dir.join("optimizer"),
            device,
            Kind::Float,
        )?)?;
    }
    // A sharded trainer's critic was restored with it.
    if let Some((critic, optimizer)) = trainer.critic_parts_mut().filter(|_| !sharded) {
        let critic_dir = dir.join("critic");
        if !critic_dir.exists() {
            return Err(TrainError::Checkpoint(format!(
                "{} has no critic/ but this run trains one",
                dir.display()
            )));
        }
        critic.update_weights(&critic_dir)?;
        optimizer.load_state(WeightSet::load(
            &dir.join("critic_optimizer"),
            device,
            Kind::Float,
        )?)?;
    }
    trainer.set_step(state.step);
    Ok(state.extra)
}

/// The step of a complete checkpoint's directory name (`checkpoint-000042` → 42).
fn checkpoint_step(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("checkpoint-")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The checkpoints of `run_dir` in the order a resume tries them: the one `RUN/latest` names, then
/// every other `checkpoint-NNNNNN` directory, newest first. (Hidden `.partial` directories are
/// never complete and never listed.) Empty when the run has none.
pub fn candidates(run_dir: &Path) -> Result<Vec<PathBuf>, TrainError> {
    if !run_dir.exists() {
        return Ok(Vec::new());
    }
    let mut named = Vec::new();
    for entry in std::fs::read_dir(run_dir).map_err(io("read", run_dir))? {
        let entry = entry.map_err(io("read", run_dir))?;
        if let Some(step) = entry.file_name().to_str().and_then(checkpoint_step) {
            named.push((step, entry.path()));
        }
    }
    named.sort_by_key(|(step, _)| std::cmp::Reverse(*step));
    let mut order: Vec<PathBuf> = Vec::new();
    let pointer = run_dir.join("latest");
    // An unreadable pointer only loses the first place; the directories are still tried.
    if let Ok(name) = std::fs::read_to_string(&pointer) {
        let name = name.trim();
        if checkpoint_step(name).is_some() {
            order.push(run_dir.join(name));
        }
    }
    for (_, dir) in named {
        if !order.contains(&dir) {
            order.push(dir);
        }
    }
    Ok(order)
}

/// What [`load_newest`] restored.
#[derive(Debug)]
pub struct Restored {
    /// The checkpoint that loaded.
    pub dir: PathBuf,
    /// The caller's state saved with it.
    pub extra: serde_json::Value,
    /// The newer checkpoints that did not load, with why (already reported on stderr).
    pub skipped: Vec<(PathBuf, String)>,
}

/// Restores the newest checkpoint of `run_dir` that loads into `trainer` (see [`candidates`] for
/// the order); `None` when the run has no checkpoint. Each one that fails to load (missing files,
/// a corrupt safetensors file, bad JSON) is reported on stderr, naming it and its error, before the
/// one before it is tried; it is an error only when none loads. A failed attempt may have changed
/// part of `trainer`; the checkpoint that loads replaces all of it (weights, optimizer state,
/// critic, step).
pub fn load_newest(run_dir: &Path, trainer: &mut Trainer) -> Result<Option<Restored>, TrainError> {
    let order = candidates(run_dir)?;
    if order.is_empty() {
        return Ok(None);
    }
    let mut skipped = Vec::new();
    for dir in order {
        match load(&dir, trainer) {
            Ok(extra) => {
                return Ok(Some(Restored {
                    dir,
                    extra,
                    skipped,
                }))
            }
            Err(e) => {
                let why = ooze_core::error_chain(&e);
                eprintln!(
                    "warning: checkpoint {} does not load ({why}); trying the one before it",
                    dir.display()
                );
                skipped.push((dir, why));
            }
        }
    }
    let tried: Vec<String> = skipped
        .iter()
        .map(|(dir, why)| format!("{}: {why}", dir.display()))
        .collect();
    Err(TrainError::Checkpoint(format!(
        "no checkpoint in {} loads ({})",
        run_dir.display(),
        tried.join("; ")
    )))
}
