//! Checkpoints of a training run, written so that a crash never damages the last good one.
//!
//! `RUN/checkpoint-000042/` holds `model/` (a complete HF model directory: config, tokenizer and
//! safetensors, loadable by transformers), `optimizer/` (fp32 moments, step counters and master
//! weights as safetensors), with a critic also `critic/` and `critic_optimizer/`, and
//! `trainer_state.json` (step, trainer config, and the caller's own
//! state: data position, RNG). It is built under a hidden temporary name and renamed into place;
//! `RUN/latest` (written atomically) names the newest complete one.

use crate::trainer::{Trainer, TrainerConfig};
use crate::TrainError;
use ooze_model::checkpoint::{SaveOptions, WeightSet};
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

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes `bytes` to `path` through a temporary file and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), TrainError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// Saves the trainer after its current step into `run_dir`; `source_model` is the model directory
/// the policy was loaded from (its config and tokenizer files are copied). Returns the checkpoint.
pub fn save(
    run_dir: &Path,
    source_model: &Path,
    trainer: &Trainer,
    extra: serde_json::Value,
) -> Result<PathBuf, TrainError> {
    let name = format!("checkpoint-{:06}", trainer.step());
    let done = run_dir.join(&name);
    let tmp = run_dir.join(format!(".{name}.partial"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    let model_kind = match trainer.policy.kind() {
        Kind::BFloat16 | Kind::Half => trainer.policy.kind(),
        _ => Kind::Float,
    };
    trainer.policy.save(
        source_model,
        &tmp.join("model"),
        SaveOptions {
            kind: model_kind,
            ..Default::default()
        },
    )?;
    ooze_model::checkpoint::save_weights(
        &tmp.join("optimizer"),
        &trainer.optimizer().state(),
        SaveOptions {
            kind: Kind::Float,
            ..Default::default()
        },
    )?;
    if let Some(critic) = trainer.critic() {
        critic.save(
            source_model,
            &tmp.join("critic"),
            SaveOptions {
                kind: model_kind,
                ..Default::default()
            },
        )?;
    }
    if let Some(state) = trainer.critic_optimizer_state() {
        ooze_model::checkpoint::save_weights(
            &tmp.join("critic_optimizer"),
            &state,
            SaveOptions {
                kind: Kind::Float,
                ..Default::default()
            },
        )?;
    }
    let state = TrainerState {
        step: trainer.step(),
        config: trainer.config.clone(),
        extra,
    };
    let json = serde_json::to_vec_pretty(&state).expect("invariant: the state serialises");
    write_atomic(&tmp.join("trainer_state.json"), &json)?;
    if done.exists() {
        std::fs::remove_dir_all(&done).map_err(io(&done))?;
    }
    std::fs::rename(&tmp, &done).map_err(io(&done))?;
    write_atomic(&run_dir.join("latest"), name.as_bytes())?;
    Ok(done)
}

/// Writes the policy as a complete HF model directory `run_dir/final-model` (built under a hidden
/// name and renamed into place, replacing an older one); returns its path.
pub fn save_final_model(
    run_dir: &Path,
    source_model: &Path,
    trainer: &Trainer,
) -> Result<PathBuf, TrainError> {
    let done = run_dir.join("final-model");
    let tmp = run_dir.join(".final-model.partial");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    trainer
        .policy
        .save(source_model, &tmp, SaveOptions::default())?;
    if done.exists() {
        std::fs::remove_dir_all(&done).map_err(io(&done))?;
    }
    std::fs::rename(&tmp, &done).map_err(io(&done))?;
    Ok(done)
}

/// The newest complete checkpoint of `run_dir`, if any.
pub fn latest(run_dir: &Path) -> Result<Option<PathBuf>, TrainError> {
    let pointer = run_dir.join("latest");
    if !pointer.exists() {
        return Ok(None);
    }
    let name = std::fs::read_to_string(&pointer).map_err(io(&pointer))?;
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
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    let state: TrainerState = serde_json::from_str(&text).map_err(|e| {
        TrainError::Checkpoint(format!("{}: not a trainer state: {e}", path.display()))
    })?;
    let (device, kind) = (trainer.policy.device(), trainer.policy.kind());
    trainer
        .policy
        .update_weights(WeightSet::load(&dir.join("model"), device, kind)?)?;
    trainer.optimizer_mut().load_state(WeightSet::load(
        &dir.join("optimizer"),
        device,
        Kind::Float,
    )?)?;
    if let Some((critic, optimizer)) = trainer.critic_parts_mut() {
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
