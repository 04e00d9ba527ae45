//! Checkpoints of a sharded trainer ([`crate::sharding`]), in the layout of
//! [`crate::checkpoint`]: `model/` is the whole HF model (gathered to rank 0, which writes it),
//! and each rank writes its own optimizer shard, `optimizer-rank-00001-of-00002/` (fp32 masters
//! and moments of its slices of every tensor); a sharded critic likewise, `critic/` whole and
//! `critic_optimizer-rank-R-of-N/`.
//!
//! Saving is asynchronous: the ranks copy what they write to host memory and go on training
//! while a thread writes it; the checkpoint is renamed into place (and `latest` moved to it) at
//! the next save or at [`finish_pending`], once every rank's part is on disk. Until then the
//! previous checkpoint stays the latest, so a crash mid-write loses nothing that was complete.
//!
//! Resuming on the same number of ranks reads only the rank's own shard. On another number (or
//! from a checkpoint of a run whose ranks each held everything, `optimizer/`), every rank
//! rebuilds the whole state on the host and takes its slices.

use crate::checkpoint::{io, write_atomic};
use crate::data_parallel::{dist_error, sum_over_ranks};
use crate::trainer::Trainer;
use crate::TrainError;
use ooze_core::atomic_file;
use ooze_model::checkpoint::{export_model, save_weights, SaveOptions, WeightSet};
use ooze_torch::dist::ReduceOp;
use ooze_torch::tch::{Device, Kind, Tensor};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

/// A checkpoint whose files are still being written.
pub(crate) struct PendingWrite {
    pub(crate) tmp: PathBuf,
    pub(crate) done: PathBuf,
    pub(crate) run_dir: PathBuf,
    pub(crate) writer: JoinHandle<Result<(), TrainError>>,
}

impl PendingWrite {
    /// Waits for this process's writer.
    pub(crate) fn join(self) -> (PendingDirs, Result<(), TrainError>) {
        let result = self.writer.join().unwrap_or_else(|_| {
            Err(TrainError::Checkpoint(format!(
                "the thread writing {} stopped",
                self.tmp.display()
            )))
        });
        let dirs = PendingDirs {
            tmp: self.tmp,
            done: self.done,
            run_dir: self.run_dir,
        };
        (dirs, result)
    }
}

/// Where a written checkpoint is, and where it goes.
pub(crate) struct PendingDirs {
    tmp: PathBuf,
    pub(crate) done: PathBuf,
    run_dir: PathBuf,
}

impl PendingDirs {
    /// Renames the complete checkpoint into place and points `latest` at it.
    pub(crate) fn complete(&self) -> Result<(), TrainError> {
        let (tmp, done) = (&self.tmp, &self.done);
        atomic_file::sync_dir(tmp)?;
        if done.exists() {
            std::fs::remove_dir_all(done).map_err(io("remove", done))?;
        }
        atomic_file::rename(tmp, done)?;
        let name = done
            .file_name()
            .expect("a checkpoint name")
            .to_string_lossy();
        write_atomic(&self.run_dir.join("latest"), name.as_bytes())?;
        Ok(())
    }
}

/// The policy's optimizer state (`optimizer/`, `optimizer-rank-*`) and the critic's.
const POLICY_STATE: &str = "optimizer";
const CRITIC_STATE: &str = "critic_optimizer";

/// This rank's shard directory of optimizer state `state` in a checkpoint.
fn shard_dir(dir: &Path, state: &str, rank: usize, world: usize) -> PathBuf {
    dir.join(format!("{state}-rank-{rank:05}-of-{world:05}"))
}

/// Host copies of `tensors` in `kind`, made once: a GPU tensor is converted on the GPU and copied
/// down; a CPU tensor copied (or converted, which copies).
pub(crate) fn to_host(tensors: Vec<(String, Tensor)>, kind: Kind) -> Vec<(String, Tensor)> {
    tensors
        .into_iter()
        .map(|(name, t)| {
            let host = if t.device() != Device::Cpu {
                t.to_kind(kind).to_device(Device::Cpu)
            } else if t.kind() != kind {
                t.to_kind(kind)
            } else {
                t.copy()
            };
            (name, host)
        })
        .collect()
}

/// Starts saving `trainer` (every rank calls it); returns the checkpoint's final path. The
/// previous pending checkpoint is finished first.
pub(crate) fn save(
    run_dir: &Path,
    source_model: &Path,
    trainer: &Trainer,
    state_json: Vec<u8>,
    model_kind: Kind,
) -> Result<PathBuf, TrainError> {
    finish_pending(trainer)?;
    let model = trainer
        .shards
        .as_ref()
        .expect("invariant: a sharded trainer");
    let (rank, world) = trainer.rank();
    let name = format!("checkpoint-{:06}", trainer.step());
    let done = run_dir.join(&name);
    let tmp = run_dir.join(format!(".{name}.partial"));
    if rank == 0 {
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(io("remove", &tmp))?;
        }
        std::fs::create_dir_all(&tmp).map_err(io("create directory", &tmp))?;
    }
    model.gather_all()?;
    let whole = (rank == 0).then(|| to_host(trainer.policy.named_parameters(), model_kind));
    model.release_all();
    let shard = to_host(trainer.optimizer().state(), Kind::Float);
    let critic = match (trainer.critic(), &trainer.critic_shards) {
        (Some(critic), Some(critic_model)) => {
            critic_model.gather_all()?;
            let whole = (rank == 0).then(|| to_host(critic.named_tensors(), model_kind));
            critic_model.release_all();
            let state = trainer
                .critic_optimizer_state()
                .expect("invariant: a critic has its optimizer");
            Some((whole, to_host(state, Kind::Float)))
        }
        _ => None,
    };
    // The directory exists before any rank writes into it.
    model.group().barrier().map_err(dist_error)?;
    let (source, tmp_dir) = (source_model.to_owned(), tmp.clone());
    let writer = std::thread::spawn(move || -> Result<(), TrainError> {
        let options = SaveOptions {
            kind: model_kind,
            ..Default::default()
        };
        if let Some(whole) = whole {
            export_model(&source, &tmp_dir.join("model"), &whole, options)?;
            write_atomic(&tmp_dir.join("trainer_state.json"), &state_json)?;
        }
        save_weights(
            &shard_dir(&tmp_dir, POLICY_STATE, rank, world),
            &shard,
            fp32(),
        )?;
        if let Some((whole, state)) = critic {
            if let Some(whole) = whole {
                export_model(&source, &tmp_dir.join("critic"), &whole, options)?;
            }
            save_weights(
                &shard_dir(&tmp_dir, CRITIC_STATE, rank, world),
                &state,
                fp32(),
            )?;
        }
        Ok(())
    });
    *trainer.pending_write() = Some(PendingWrite {
        tmp,
        done: done.clone(),
        run_dir: run_dir.to_owned(),
        writer,
    });
    Ok(done)
}

fn fp32() -> SaveOptions {
    SaveOptions {
        kind: Kind::Float,
        ..Default::default()
    }
}

/// Finishes the checkpoint being written, if any (every rank calls it): waits for this rank's
/// part, and once every rank's is on disk, rank 0 renames it into place and points `latest` at
/// it. Returns its path.
pub(crate) fn finish_pending(trainer: &Trainer) -> Result<Option<PathBuf>, TrainError> {
    let Some(pending) = trainer.pending_write().take() else {
        return Ok(None);
    };
    let (dirs, mine) = pending.join();
    let Some(model) = trainer.shards.as_ref() else {
        // A whole trainer's checkpoint, rank 0's alone.
        mine?;
        dirs.complete()?;
        return Ok(Some(dirs.done));
    };
    let device = trainer.policy.device();
    let failed = sum_over_ranks(
        model.group(),
        &[mine.is_err() as u8 as f64],
        ReduceOp::Sum,
        device,
    )?[0];
    mine?;
    if failed > 0.0 {
        return Err(TrainError::Checkpoint(format!(
            "{} is incomplete: another rank could not write its part (its error is in its log)",
            dirs.done.display()
        )));
    }
    if trainer.rank().0 == 0 {
        dirs.complete()?;
    }
    model.group().barrier().map_err(dist_error)?;
    Ok(Some(dirs.done))
}

/// Restores the policy's weights and this rank's optimizer shard from checkpoint `dir`.
pub(crate) fn load(dir: &Path, trainer: &mut Trainer) -> Result<(), TrainError> {
    let (device, kind) = (trainer.policy.device(), trainer.policy.kind());
    // Read before the collective, so that every rank joins it whatever it finds.
    let weights = WeightSet::load(&dir.join("model"), device, kind);
    trainer
        .shards
        .as_ref()
        .expect("invariant: a sharded trainer")
        .gather_all()?;
    let updated = weights.and_then(|w| trainer.policy.update_weights(w));
    let model = trainer.shards.as_mut().expect("checked");
    if updated.is_ok() {
        model.reshard_gathered();
    }
    model.release_all();
    updated?;
    let names = trainer.optimizer().state_names();
    let model = trainer.shards.as_ref().expect("checked");
    let state = shard_state(dir, POLICY_STATE, model, names)?;
    trainer.optimizer_mut().load_state(state)?;
    load_critic(dir, trainer)
}

/// A sharded critic's weights and this rank's slices of its optimizer state.
fn load_critic(dir: &Path, trainer: &mut Trainer) -> Result<(), TrainError> {
    let (Some((critic, optimizer)), Some(model)) =
        (&mut trainer.critic, &mut trainer.critic_shards)
    else {
        return Ok(());
    };
    let critic_dir = dir.join("critic");
    let (device, kind) = (critic.body.device(), critic.body.kind());
    // Read before the collective, so that every rank joins it whatever it finds.
    let weights = if critic_dir.exists() {
        WeightSet::load(&critic_dir, device, kind).map_err(TrainError::from)
    } else {
        Err(TrainError::Checkpoint(format!(
            "{} has no critic/ but this run trains one",
            dir.display()
        )))
    };
    model.gather_all()?;
    let updated = weights.and_then(|w| critic.update_from(w));
    if updated.is_ok() {
        model.reshard_gathered();
    }
    model.release_all();
    updated?;
    let state = shard_state(dir, CRITIC_STATE, model, optimizer.state_names())?;
    optimizer.load_state(state)
}

/// This rank's slices of optimizer state `state` (`optimizer` or `critic_optimizer`): its own
/// shard, or rebuilt from another number of ranks' shards or from a whole one.
fn shard_state(
    dir: &Path,
    state: &str,
    model: &crate::sharding::ShardedModel,
    names: Vec<(String, String)>,
) -> Result<WeightSet, TrainError> {
    let (rank, world) = (model.group().rank(), model.group().world_size());
    let own = shard_dir(dir, state, rank, world);
    if own.exists() {
        let device = model.device();
        return WeightSet::load(&own, device, Kind::Float).map_err(Into::into);
    }
    resharded_state(dir, state, &model.slot_layout(), rank, world, names)
}

/// This rank's slices of the optimizer state of checkpoint `dir` written by another number of
/// ranks, or by ranks that each held all of it (`optimizer/`): rebuilt whole on the host.
fn resharded_state(
    dir: &Path,
    state: &str,
    layout: &[(String, Vec<i64>, i64)],
    rank: usize,
    world: usize,
    names: Vec<(String, String)>,
) -> Result<WeightSet, TrainError> {
    let whole_dir = dir.join(state);
    let old_shards = old_shard_dirs(dir, state)?;
    if !whole_dir.exists() && old_shards.is_empty() {
        return Err(TrainError::Checkpoint(format!(
            "{} has neither {state}/ nor {state}-rank-* shards",
            dir.display()
        )));
    }
    let mut whole = whole_dir
        .exists()
        .then(|| WeightSet::load(&whole_dir, Device::Cpu, Kind::Float))
        .transpose()?;
    let mut shards = old_shards
        .iter()
        .map(|d| WeightSet::load(d, Device::Cpu, Kind::Float))
        .collect::<Result<Vec<_>, _>>()?;
    let old_world = shards.len() as i64;
    let mut out = Vec::new();
    for (key, slot) in names {
        let (_, shape, slice) = layout
            .iter()
            .find(|(name, _, _)| *name == slot)
            .expect("invariant: every state tensor belongs to a slot");
        let is_step = key.starts_with("step.");
        let full_shape: Vec<i64> = if is_step { vec![1] } else { shape.clone() };
        let numel: i64 = full_shape.iter().product();
        let full = if let Some(whole) = whole.as_mut() {
            whole.take(&key, &full_shape)?.reshape([-1])
        } else if is_step {
            shards[0].take(&key, &[1])?
        } else {
            let old_slice = (numel + old_world - 1) / old_world;
            let parts = shards
                .iter_mut()
                .map(|s| s.take(&key, &[old_slice]))
                .collect::<Result<Vec<_>, _>>()?;
            Tensor::cat(&parts, 0).narrow(0, 0, numel)
        };
        let mine = if is_step {
            full
        } else {
            let padded_len = slice * world as i64;
            let padded = Tensor::cat(
                &[
                    full,
                    Tensor::zeros([padded_len - numel], (Kind::Float, Device::Cpu)),
                ],
                0,
            );
            padded.narrow(0, rank as i64 * slice, *slice)
        };
        out.push((key, mine));
    }
    Ok(WeightSet::from_tensors(out, Device::Cpu, Kind::Float)?)
}

/// The `STATE-rank-R-of-W` directories of `dir`, in rank order (all of one world size).
fn old_shard_dirs(dir: &Path, state: &str) -> Result<Vec<PathBuf>, TrainError> {
    let prefix = format!("{state}-rank-");
    let mut found: Vec<(usize, usize, PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io("read", dir))? {
        let entry = entry.map_err(io("read", dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(prefix.as_str()) else {
            continue;
        };
        let Some((r, w)) = rest.split_once("-of-") else {
            continue;
        };
        if let (Ok(r), Ok(w)) = (r.parse(), w.parse()) {
            found.push((r, w, entry.path()));
        }
    }
    found.sort();
    let world = found.first().map_or(0, |f| f.1);
    let complete = found.len() == world
        && found
            .iter()
            .enumerate()
            .all(|(i, f)| f.0 == i && f.1 == world);
    if !complete {
        return Err(TrainError::Checkpoint(format!(
            "{}: the optimizer shards are incomplete (found {} of {world})",
            dir.display(),
            found.len()
        )));
    }
    Ok(found.into_iter().map(|f| f.2).collect())
}
