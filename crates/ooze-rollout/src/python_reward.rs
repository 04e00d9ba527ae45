//! `[reward] type = "python"`: a reward function written in Python, run by a pool of worker
//! processes that load it once and score JSON lines (`python/ooze_reward_worker.py` says the
//! protocol).
//!
//! `path = "FILE.py:FUNCTION"` names the function: `FUNCTION(sample) -> float` per sample, or with
//! `group = true`, `FUNCTION(samples) -> [float]` over a prompt's samples together; a sample is a
//! dict with `prompt`, `response`, `label` and `metadata`. `workers` processes score at once (a
//! per-sample function spreads one group's samples over them); a call that takes longer than
//! `timeout_secs` has its worker killed (a fresh one takes its place) and fails. An exception is a
//! failure carrying the function's traceback; failures stop the run, naming the reward and the
//! sample, like a remote reward model that keeps failing. What the function prints goes to
//! ooze's stderr.
//!
//! The pool is built when the recipe's reward is: one worker is started at once, so a missing
//! file, an import error or a missing function is reported before the first rollout.

use crate::scorer::{RewardFailure, RewardInput};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

const WORKER: &str = include_str!("../../../python/ooze_reward_worker.py");

/// The keys of `[reward] type = "python"`.
#[derive(Debug, Clone, PartialEq)]
pub struct PythonRewardConfig {
    /// `FILE.py:FUNCTION`, the file relative to where ooze runs.
    pub path: String,
    /// The function scores a prompt's samples together (`FUNCTION(samples) -> [float]`).
    pub group: bool,
    /// Worker processes (0: one per CPU, at most 8).
    pub workers: usize,
    /// Seconds one call may take before its worker is killed.
    pub timeout_secs: f64,
    /// The interpreter.
    pub python: String,
}

impl Default for PythonRewardConfig {
    fn default() -> Self {
        PythonRewardConfig {
            path: String::new(),
            group: false,
            workers: 0,
            timeout_secs: 60.0,
            python: "python3".into(),
        }
    }
}

/// A pool of reward workers. Cloning shares it; the last clone dropped stops them.
#[derive(Clone)]
pub struct PythonReward {
    pool: Arc<Pool>,
}

struct Pool {
    file: PathBuf,
    function: String,
    python: String,
    group: bool,
    timeout: Duration,
    size: usize,
    state: Mutex<PoolState>,
    freed: Condvar,
}

#[derive(Default)]
struct PoolState {
    idle: Vec<Worker>,
    /// Workers alive, idle or busy.
    alive: usize,
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    answers: Receiver<String>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Its process group: the worker and whatever its function started.
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) on a process group this pool created; no memory is involved.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl PythonReward {
    /// Checks `config`, starts one worker and waits until it has loaded the function.
    pub fn start(config: &PythonRewardConfig) -> Result<PythonReward, String> {
        let (file, function) = config
            .path
            .rsplit_once(':')
            .filter(|(f, n)| !f.is_empty() && !n.is_empty())
            .ok_or_else(|| {
                format!(
                    "reward.path: expected FILE.py:FUNCTION, got `{}`",
                    config.path
                )
            })?;
        let file = PathBuf::from(file);
        if !file.is_file() {
            return Err(format!(
                "reward.path: {} is not a file (paths are relative to where ooze runs: {})",
                file.display(),
                std::env::current_dir()
                    .map(|d| d.display().to_string())
                    .unwrap_or_default()
            ));
        }
        if !(config.timeout_secs > 0.0 && config.timeout_secs.is_finite()) {
            return Err(format!(
                "reward.timeout_secs: expected a positive number of seconds, got {}",
                config.timeout_secs
            ));
        }
        let size = match config.workers {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get().min(8)),
            n => n,
        };
        let pool = Pool {
            file,
            function: function.to_owned(),
            python: config.python.clone(),
            group: config.group,
            timeout: Duration::from_secs_f64(config.timeout_secs),
            size,
            state: Mutex::new(PoolState::default()),
            freed: Condvar::new(),
        };
        let first = pool.spawn()?;
        {
            let mut state = pool.state.lock().expect("never poisoned");
            state.idle.push(first);
            state.alive = 1;
        }
        Ok(PythonReward {
            pool: Arc::new(pool),
        })
    }

    /// The rewards of one prompt's samples, in order. Blocks: call it off the async threads.
    pub fn score_group(&self, samples: &[RewardInput<'_>]) -> Result<Vec<f64>, RewardFailure> {
        let pool = &self.pool;
        if pool.group || samples.len() <= 1 {
            return pool.call(samples);
        }
        // One sample per call, spread over the workers.
        std::thread::scope(|scope| {
            let calls: Vec<_> = samples
                .iter()
                .map(|s| scope.spawn(move || pool.call(std::slice::from_ref(s))))
                .collect();
            let mut rewards = Vec::with_capacity(samples.len());
            for call in calls {
                rewards.extend(call.join().expect("invariant: reward calls do not panic")?);
            }
            Ok(rewards)
        })
    }
}

impl Pool {
    /// `reward.path` as the recipe wrote it, for messages.
    fn name(&self) -> String {
        format!("{}:{}", self.file.display(), self.function)
    }

    /// Starts a worker and waits for it to load the function.
    fn spawn(&self) -> Result<Worker, String> {
        let mut command = Command::new(&self.python);
        command
            .arg("-c")
            .arg(WORKER)
            .arg(&self.file)
            .arg(&self.function)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // Its own process group, killed whole. No parent-death signal: that follows the
            // spawning thread, not ooze; should ooze die, the worker reads the end of its stdin
            // and exits.
            .process_group(0);
        let mut child = command.spawn().map_err(|e| {
            format!(
                "reward.python: cannot start `{}` for reward {}: {e}",
                self.python,
                self.name()
            )
        })?;
        let stdin = child.stdin.take().expect("invariant: piped");
        let stdout = child.stdout.take().expect("invariant: piped");
        let (send, answers) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let mut worker = Worker {
            child,
            stdin,
            answers,
        };
        // Loading may import heavy modules: it gets the longer of the call timeout and a minute.
        let load = self.timeout.max(Duration::from_secs(60));
        match worker.answers.recv_timeout(load) {
            Ok(line) => {
                let answer: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
                if answer["ready"] == json!(true) {
                    Ok(worker)
                } else {
                    Err(format!(
                        "reward.path: cannot load {}:\n{}",
                        self.name(),
                        answer["error"].as_str().unwrap_or(&line).trim_end()
                    ))
                }
            }
            Err(RecvTimeoutError::Timeout) => Err(format!(
                "reward.path: {} did not load within {} s",
                self.name(),
                load.as_secs()
            )),
            Err(RecvTimeoutError::Disconnected) => Err(format!(
                "reward.path: the worker for {} exited while loading ({}); see its stderr above",
                self.name(),
                exit_status(&mut worker.child)
            )),
        }
    }

    /// An idle worker, a new one while the pool has room, or the next one freed.
    fn take(&self) -> Result<Worker, RewardFailure> {
        let mut state = self.state.lock().expect("never poisoned");
        loop {
            if let Some(worker) = state.idle.pop() {
                return Ok(worker);
            }
            if state.alive < self.size {
                state.alive += 1;
                drop(state);
                return self.spawn().map_err(|e| {
                    self.lost();
                    RewardFailure(e)
                });
            }
            state = self.freed.wait(state).expect("never poisoned");
        }
    }

    fn give_back(&self, worker: Worker) {
        self.state.lock().expect("never poisoned").idle.push(worker);
        self.freed.notify_one();
    }

    /// A worker is gone (killed or dead): room for another.
    fn lost(&self) {
        self.state.lock().expect("never poisoned").alive -= 1;
        self.freed.notify_one();
    }

    /// One request to one worker.
    fn call(&self, samples: &[RewardInput<'_>]) -> Result<Vec<f64>, RewardFailure> {
        let request = json!({
            "group": self.group,
            "samples": samples.iter().map(|s| json!({
                "prompt": s.prompt, "response": s.response, "label": s.label, "metadata": s.metadata,
            })).collect::<Vec<_>>(),
        });
        let mut worker = self.take()?;
        let sent = writeln!(worker.stdin, "{request}").and_then(|()| worker.stdin.flush());
        let answer = match sent {
            Ok(()) => worker.answers.recv_timeout(self.timeout),
            Err(_) => Err(RecvTimeoutError::Disconnected),
        };
        let line = match answer {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => {
                drop(worker);
                self.lost();
                return Err(RewardFailure(format!(
                    "python reward {}: no answer within {} s (reward.timeout_secs); its worker was killed",
                    self.name(),
                    self.timeout.as_secs_f64()
                )));
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = exit_status(&mut worker.child);
                drop(worker);
                self.lost();
                return Err(RewardFailure(format!(
                    "python reward {}: its worker exited ({status}) while scoring; see its stderr above",
                    self.name()
                )));
            }
        };
        self.give_back(worker);
        let answer: Value = serde_json::from_str(&line).map_err(|e| {
            RewardFailure(format!(
                "python reward {}: the worker answered something that is not JSON ({e}): {}",
                self.name(),
                line.chars().take(200).collect::<String>()
            ))
        })?;
        if let Some(trace) = answer["error"].as_str() {
            return Err(RewardFailure(format!(
                "python reward {} raised:\n{}",
                self.name(),
                trace.trim_end()
            )));
        }
        let rewards: Vec<f64> = answer["rewards"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default();
        if rewards.len() != samples.len() {
            return Err(RewardFailure(format!(
                "python reward {}: expected {} rewards, the worker answered {}",
                self.name(),
                samples.len(),
                line.chars().take(200).collect::<String>()
            )));
        }
        Ok(rewards)
    }
}

/// How a worker ended, waiting a moment for it to be reaped.
fn exit_status(child: &mut Child) -> String {
    for _ in 0..50 {
        if let Ok(Some(status)) = child.try_wait() {
            return status.to_string();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    "still running".into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scorer::tests::input;

    fn reward_file(dir: &std::path::Path, source: &str) -> String {
        let path = dir.join("rewards.py");
        std::fs::write(&path, source).unwrap();
        path.display().to_string()
    }

    fn config(path: String, function: &str) -> PythonRewardConfig {
        PythonRewardConfig {
            path: format!("{path}:{function}"),
            workers: 2,
            timeout_secs: 5.0,
            ..Default::default()
        }
    }

    const SOURCE: &str = r#"
import asyncio, time

def exact(sample):
    print("scoring", sample["response"])  # must not disturb the protocol
    return sample["response"] == sample["label"]

def parts(sample):
    return {"score": len(sample["response"]) / 10}

def ranked(samples):
    order = sorted(range(len(samples)), key=lambda i: len(samples[i]["response"]))
    out = [0.0] * len(samples)
    for rank, i in enumerate(order):
        out[i] = rank
    return out

async def slow_async(sample):
    await asyncio.sleep(0.01)
    return 0.5

def broken(sample):
    return {"label": sample["label"]}["missing"]

def dies(sample):
    import os
    os._exit(3)

def nan(sample):
    return float("nan")

not_a_function = 3
"#;

    #[test]
    fn scores_per_sample_and_per_group() {
        let dir = tempfile::tempdir().unwrap();
        let path = reward_file(dir.path(), SOURCE);
        let exact = PythonReward::start(&config(path.clone(), "exact")).unwrap();
        let group = [input("4", "4"), input("5", "4"), input("4", "4")];
        assert_eq!(exact.score_group(&group).unwrap(), vec![1.0, 0.0, 1.0]);
        let parts = PythonReward::start(&config(path.clone(), "parts")).unwrap();
        assert_eq!(parts.score_group(&group[..1]).unwrap(), vec![0.1]);
        let ranked = PythonReward::start(&PythonRewardConfig {
            group: true,
            ..config(path.clone(), "ranked")
        })
        .unwrap();
        let group = [input("ccc", ""), input("a", ""), input("bb", "")];
        assert_eq!(ranked.score_group(&group).unwrap(), vec![2.0, 0.0, 1.0]);
        let slow = PythonReward::start(&config(path, "slow_async")).unwrap();
        assert_eq!(slow.score_group(&group).unwrap(), vec![0.5; 3]);
    }

    #[test]
    fn bad_functions_are_named_with_their_traceback() {
        let dir = tempfile::tempdir().unwrap();
        let path = reward_file(dir.path(), SOURCE);
        let fail = |function: &str| {
            let reward = PythonReward::start(&config(path.clone(), function)).unwrap();
            reward
                .score_group(&[input("a", "b")])
                .unwrap_err()
                .to_string()
        };
        let broken = fail("broken");
        assert!(
            broken.contains("rewards.py:broken raised")
                && broken.contains("KeyError: 'missing'")
                && broken.contains("line 23"),
            "{broken}"
        );
        assert!(fail("nan").contains("not finite"), "nan");
        let died = fail("dies");
        assert!(died.contains("exited (exit status: 3)"), "{died}");

        let missing = PythonReward::start(&config(path.clone(), "nope"))
            .err()
            .unwrap();
        assert!(
            missing.contains("has no function 'nope'; it defines: broken, dies, exact")
                && !missing.contains("<string>"),
            "{missing}"
        );
        let not_fn = PythonReward::start(&config(path.clone(), "not_a_function"))
            .err()
            .unwrap();
        assert!(not_fn.contains("is a int, not a function"), "{not_fn}");
        let no_file = PythonReward::start(&config("nowhere.py".into(), "f"))
            .err()
            .unwrap();
        assert!(
            no_file.contains("reward.path: nowhere.py is not a file"),
            "{no_file}"
        );
        let no_colon = PythonReward::start(&PythonRewardConfig {
            path: path.clone(),
            ..Default::default()
        })
        .err()
        .unwrap();
        assert!(no_colon.contains("expected FILE.py:FUNCTION"), "{no_colon}");
        std::fs::write(dir.path().join("syntax.py"), "def f(:\n").unwrap();
        let syntax = PythonReward::start(&config(
            dir.path().join("syntax.py").display().to_string(),
            "f",
        ))
        .err()
        .unwrap();
        assert!(syntax.contains("SyntaxError"), "{syntax}");
    }

    #[test]
    fn a_call_past_its_timeout_kills_the_worker_and_the_pool_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = reward_file(
            dir.path(),
            &format!("{SOURCE}\ndef maybe_sleepy(sample):\n    if sample['response'] == 'slow':\n        time.sleep(30)\n    return 1\n"),
        );
        let reward = PythonReward::start(&PythonRewardConfig {
            timeout_secs: 0.5,
            workers: 1,
            ..config(path, "maybe_sleepy")
        })
        .unwrap();
        let err = reward
            .score_group(&[input("slow", "")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("no answer within 0.5 s"), "{err}");
        // The only worker was killed; a fresh one answers.
        assert_eq!(
            reward
                .score_group(&[input("x", ""), input("y", "")])
                .unwrap(),
            vec![1.0, 1.0]
        );
    }
}
