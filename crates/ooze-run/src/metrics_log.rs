//! Where a run's numbers go: `RUN/metrics.jsonl` (one flat JSON object per rollout, keys like
//! `reward/mean`, `train/kl`, `eval/heldout/pass@1`) and TensorBoard event files in
//! `RUN/tensorboard/` (the same keys as tags, the rollout as the step). A resumed run cuts the
//! JSONL back to its checkpoint and writes the event file anew from it, so both agree; a run that
//! resumes from nothing (it died before its first checkpoint) starts both empty, so its
//! `rollout: 0` line (the at-start eval) is written once, not again after the old one.

use crate::report::read_metrics;
use crate::tensorboard::EventWriter;
use anyhow::Context;
use serde_json::{Map, Value};
use std::io::Write;
use std::path::{Path, PathBuf};

pub struct MetricsLog {
    path: PathBuf,
    file: std::fs::File,
    tensorboard: Option<EventWriter>,
}

fn scalars(line: &Map<String, Value>) -> Vec<(String, f32)> {
    line.iter()
        .filter(|(k, _)| k.as_str() != "rollout")
        .filter_map(|(k, v)| v.as_f64().map(|x| (k.clone(), x as f32)))
        .collect()
}

impl MetricsLog {
    /// Opens the run's log, keeping only lines of rollouts up to `keep_through`, the rollout of
    /// the checkpoint the run resumed from (a resumed run redoes the rest); `None` (nothing was
    /// restored) keeps no line, since the run redoes everything from rollout 0.
    pub fn open(
        run_dir: &Path,
        keep_through: Option<u64>,
        tensorboard: bool,
    ) -> anyhow::Result<MetricsLog> {
        let path = run_dir.join("metrics.jsonl");
        let kept: Vec<Map<String, Value>> = match keep_through {
            Some(last) if path.exists() => read_metrics(run_dir)?
                .into_iter()
                .filter(|l| {
                    l.get("rollout")
                        .and_then(Value::as_u64)
                        .is_some_and(|r| r <= last)
                })
                .collect(),
            _ => Vec::new(),
        };
        let mut body = String::new();
        for l in &kept {
            body.push_str(&serde_json::to_string(l)?);
            body.push('\n');
        }
        ooze_core::atomic_file::write(&path, body.as_bytes())?;
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let tensorboard = if tensorboard {
            let dir = run_dir.join("tensorboard");
            if dir.exists() {
                std::fs::remove_dir_all(&dir)
                    .with_context(|| format!("clearing {}", dir.display()))?;
            }
            let mut w =
                EventWriter::create(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for l in &kept {
                let step = l.get("rollout").and_then(Value::as_i64).unwrap_or(0);
                w.scalars(step, &scalars(l))?;
            }
            Some(w)
        } else {
            None
        };
        Ok(MetricsLog {
            path,
            file,
            tensorboard,
        })
    }

    /// Appends one rollout's line (with its `rollout` key) to both logs.
    pub fn write(&mut self, line: &Map<String, Value>) -> anyhow::Result<()> {
        writeln!(self.file, "{}", serde_json::to_string(line)?)
            .and_then(|()| self.file.flush())
            .with_context(|| format!("writing {}", self.path.display()))?;
        if let Some(w) = self.tensorboard.as_mut() {
            let step = line.get("rollout").and_then(Value::as_i64).unwrap_or(0);
            w.scalars(step, &scalars(line))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn line(rollout: u64) -> Map<String, Value> {
        let Value::Object(m) = json!({"rollout": rollout, "reward/mean": rollout as f64 / 10.0})
        else {
            unreachable!()
        };
        m
    }

    fn rollouts(run_dir: &Path) -> Vec<u64> {
        read_metrics(run_dir)
            .unwrap()
            .iter()
            .map(|l| l["rollout"].as_u64().unwrap())
            .collect()
    }

    /// A first run that wrote the at-start eval (rollout 0) and rollouts 1 and 2.
    fn first_run(run_dir: &Path) {
        let mut log = MetricsLog::open(run_dir, None, true).unwrap();
        for r in 0..3 {
            log.write(&line(r)).unwrap();
        }
        assert_eq!(rollouts(run_dir), [0, 1, 2]);
    }

    #[test]
    fn a_resume_from_nothing_writes_the_at_start_line_once() {
        let dir = tempfile::tempdir().unwrap();
        first_run(dir.path());
        // The run died before its first checkpoint: it redoes everything, eval at start included.
        let mut log = MetricsLog::open(dir.path(), None, true).unwrap();
        assert_eq!(rollouts(dir.path()), Vec::<u64>::new());
        log.write(&line(0)).unwrap();
        log.write(&line(1)).unwrap();
        assert_eq!(rollouts(dir.path()), [0, 1]);
    }

    #[test]
    fn a_resume_from_a_checkpoint_keeps_the_lines_through_it() {
        let dir = tempfile::tempdir().unwrap();
        first_run(dir.path());
        let mut log = MetricsLog::open(dir.path(), Some(1), true).unwrap();
        assert_eq!(rollouts(dir.path()), [0, 1]);
        log.write(&line(2)).unwrap();
        assert_eq!(rollouts(dir.path()), [0, 1, 2]);
    }
}
