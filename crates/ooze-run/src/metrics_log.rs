//! Where a run's numbers go: `RUN/metrics.jsonl` (one flat JSON object per rollout, keys like
//! `reward/mean`, `train/kl`, `eval/heldout/pass@1`) and TensorBoard event files in
//! `RUN/tensorboard/` (the same keys as tags, the rollout as the step). A resumed run cuts the
//! JSONL back to its checkpoint and writes the event file anew from it, so both agree.

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
    /// Opens the run's log, keeping only lines of rollouts up to `keep_through` (a resumed run
    /// redoes the rest).
    pub fn open(
        run_dir: &Path,
        keep_through: u64,
        tensorboard: bool,
    ) -> anyhow::Result<MetricsLog> {
        let path = run_dir.join("metrics.jsonl");
        let kept: Vec<Map<String, Value>> = if path.exists() {
            read_metrics(run_dir)?
                .into_iter()
                .filter(|l| {
                    l.get("rollout")
                        .and_then(Value::as_u64)
                        .is_some_and(|r| r <= keep_through)
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut body = String::new();
        for l in &kept {
            body.push_str(&serde_json::to_string(l)?);
            body.push('\n');
        }
        ooze_train::checkpoint::write_atomic(&path, body.as_bytes())?;
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
