//! The engines of `rollout.gpus` (disaggregated rollout): rank 0 starts one `ooze serve` per GPU
//! after the trainer's before it loads the policy, so the engines load while the trainer does.
//! Each engine sees only its own GPU (`CUDA_VISIBLE_DEVICES` names it, counted within the
//! run's own visible devices), listens on a free local port and logs to
//! `RUN/engines/engine-I.log`. The run routes over them like over `rollout.engines`
//! ([`ooze_router`]) and broadcasts new weights to them (`rollout.weight_sync`). They are
//! stopped when the run ends (SIGTERM, then SIGKILL), and die with the run should it die first
//! (`PR_SET_PDEATHSIG`): no engine outlives its trainer.

use anyhow::{bail, Context};
use ooze_rollout::http_client::JsonClient;
use ooze_torch::tch::{Device, Kind};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long an engine may take to load its model and answer `/health`.
const READY_TIMEOUT: Duration = Duration::from_secs(900);

/// What the engines run: the model, where, and how long their sequences are.
pub(crate) struct EngineLaunch<'a> {
    pub model: &'a Path,
    /// The trainer's device: a GPU (the engines take the GPUs after the trainer's) or the CPU.
    pub device: Device,
    pub kind: Kind,
    /// The trainer's GPUs on this machine: the engines start at this index.
    pub trainer_gpus: usize,
    pub engines: usize,
    pub slot_len: i64,
    /// `rollout.max_running` (default: as many sequences as fit the engine's GPU).
    pub max_running: Option<i64>,
    /// `rollout.deterministic`.
    pub deterministic: bool,
}

/// The run's engine processes; stopped when dropped.
pub(crate) struct EngineProcesses {
    engines: Vec<EngineProcess>,
}

struct EngineProcess {
    child: Child,
    url: String,
    log: PathBuf,
    /// The GPU (in the run's numbering), or None on the CPU.
    gpu: Option<usize>,
}

impl EngineProcesses {
    /// Starts the engines and waits until every one answers `/health`.
    pub(crate) fn start(launch: &EngineLaunch, run_dir: &Path) -> anyhow::Result<EngineProcesses> {
        let gpus = engine_gpus(launch)?;
        let exe = std::env::current_exe().context("finding this program to start the engines")?;
        let log_dir = run_dir.join("engines");
        std::fs::create_dir_all(&log_dir)
            .with_context(|| format!("creating {}", log_dir.display()))?;
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let mut processes = EngineProcesses {
            engines: Vec::new(),
        };
        for (i, gpu) in gpus.into_iter().enumerate() {
            let port = ooze_torch::dist::free_port("127.0.0.1")
                .context("finding a free port for an engine")?;
            let log = log_dir.join(format!("engine-{i}.log"));
            let out = std::fs::File::create(&log)
                .with_context(|| format!("creating {}", log.display()))?;
            let err = out.try_clone()?;
            let mut cmd = Command::new(&exe);
            cmd.arg("serve")
                .arg("--model")
                .arg(launch.model)
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .args(["--context-len", &launch.slot_len.to_string()])
                .args(["--dtype", dtype_flag(launch.kind)])
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err);
            match gpu {
                Some(g) => {
                    cmd.args(["--device", "cuda:0"]).env(
                        "CUDA_VISIBLE_DEVICES",
                        visible_device(visible.as_deref(), g),
                    );
                }
                None => {
                    cmd.args(["--device", "cpu"]);
                }
            }
            if let Some(n) = launch.max_running {
                cmd.args(["--max-running", &n.to_string()]);
            }
            if launch.deterministic {
                cmd.arg("--deterministic");
            }
            // SAFETY: one async-signal-safe system call, in the child before exec.
            unsafe {
                cmd.pre_exec(|| {
                    // Stopped with the run, should it die first.
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                    Ok(())
                });
            }
            let child = cmd
                .spawn()
                .with_context(|| format!("starting engine {i} ({} serve)", exe.display()))?;
            processes.engines.push(EngineProcess {
                child,
                url: format!("http://127.0.0.1:{port}"),
                log,
                gpu,
            });
        }
        let gpus: Vec<String> = processes
            .engines
            .iter()
            .filter_map(|e| e.gpu.map(|g| g.to_string()))
            .collect();
        eprintln!(
            "engines: starting {} (`ooze serve` on {}; logs in {})",
            processes.engines.len(),
            if gpus.is_empty() {
                "the CPU".to_string()
            } else {
                format!("GPU {}", gpus.join(", "))
            },
            log_dir.display()
        );
        processes.wait_ready(READY_TIMEOUT)?;
        Ok(processes)
    }

    /// The engines' base URLs.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.engines.iter().map(|e| e.url.clone()).collect()
    }

    fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        let client = JsonClient::new(Duration::from_secs(2));
        let mut ready = vec![false; self.engines.len()];
        let mut last_report = Instant::now();
        while ready.iter().any(|r| !r) {
            for (i, e) in self.engines.iter_mut().enumerate() {
                if ready[i] {
                    continue;
                }
                if let Some(status) = e.child.try_wait()? {
                    bail!(
                        "engine {i} ({}) exited while starting ({status}); the end of {}:\n{}",
                        e.url,
                        e.log.display(),
                        log_tail(&e.log, 20)
                    );
                }
                ready[i] = client.get(&format!("{}/health", e.url), None).is_ok();
            }
            if started.elapsed() > timeout {
                let waiting: Vec<String> = ready
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| !**r)
                    .map(|(i, _)| i.to_string())
                    .collect();
                bail!(
                    "engines {} did not answer /health within {}s (see {})",
                    waiting.join(", "),
                    timeout.as_secs(),
                    self.engines[0]
                        .log
                        .parent()
                        .unwrap_or(Path::new("."))
                        .display()
                );
            }
            if last_report.elapsed() > Duration::from_secs(15) {
                last_report = Instant::now();
                eprintln!(
                    "engines: {}/{} ready after {:.0}s",
                    ready.iter().filter(|r| **r).count(),
                    ready.len(),
                    started.elapsed().as_secs_f64()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        eprintln!(
            "engines: {} ready in {:.1}s",
            self.engines.len(),
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }
}

impl Drop for EngineProcesses {
    fn drop(&mut self) {
        for e in &self.engines {
            // SAFETY: a plain kill(2) of our own child's pid.
            unsafe {
                libc::kill(e.child.id() as libc::pid_t, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for e in &mut self.engines {
            while matches!(e.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if matches!(e.child.try_wait(), Ok(None)) {
                let _ = e.child.kill();
                let _ = e.child.wait();
            }
        }
    }
}

/// Which GPU each engine takes (None for CPU engines), checked against the machine.
fn engine_gpus(launch: &EngineLaunch) -> anyhow::Result<Vec<Option<usize>>> {
    match launch.device {
        Device::Cuda(_) => {
            let count = ooze_torch::tch::Cuda::device_count() as usize;
            let needed = launch.trainer_gpus + launch.engines;
            if needed > count {
                bail!(
                    "rollout.gpus = {} beside {} trainer GPU(s) needs {needed} GPUs; this machine \
                     has {count}: lower rollout.gpus or trainer.gpus",
                    launch.engines,
                    launch.trainer_gpus
                );
            }
            Ok((launch.trainer_gpus..needed).map(Some).collect())
        }
        _ => Ok(vec![None; launch.engines]),
    }
}

/// `CUDA_VISIBLE_DEVICES` for a child that should see only the run's GPU `gpu`: that entry of the
/// run's own list when it has one.
fn visible_device(visible: Option<&str>, gpu: usize) -> String {
    visible
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
        })
        .and_then(|list| list.get(gpu).map(|s| s.to_string()))
        .unwrap_or_else(|| gpu.to_string())
}

fn dtype_flag(kind: Kind) -> &'static str {
    match kind {
        Kind::BFloat16 => "bf16",
        _ => "fp32",
    }
}

/// The last `n` lines of a log file.
fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_sees_its_entry_of_the_runs_visible_devices() {
        assert_eq!(visible_device(None, 3), "3");
        assert_eq!(visible_device(Some("4,5,6,7"), 2), "6");
        assert_eq!(visible_device(Some("GPU-a, GPU-b"), 1), "GPU-b");
        // A list shorter than the index (the count check refuses this earlier) falls back.
        assert_eq!(visible_device(Some("4"), 1), "1");
    }

    #[test]
    fn the_engines_take_the_gpus_after_the_trainers_and_the_cpu_needs_none() {
        let launch = EngineLaunch {
            model: Path::new("m"),
            device: Device::Cpu,
            kind: Kind::Float,
            trainer_gpus: 2,
            engines: 3,
            slot_len: 64,
            max_running: None,
            deterministic: false,
        };
        assert_eq!(engine_gpus(&launch).unwrap(), vec![None, None, None]);
        assert_eq!(dtype_flag(Kind::BFloat16), "bf16");
        assert_eq!(dtype_flag(Kind::Float), "fp32");
    }
}
