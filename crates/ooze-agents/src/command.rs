//! Agents as programs (`[agent] type = "command"`): each execution starts the recipe's command,
//! which talks to the policy through the agent gateway like any OpenAI or Anthropic client, so an
//! agent in any language (or an agent framework, or a coding CLI) is trained with no Rust written.
//!
//! For each execution:
//! - a gateway session is opened (the gateway itself starts with the first execution, on a free
//!   loopback port of this process); its token is the API key;
//! - the program starts with `OPENAI_BASE_URL` (`…/v1`), `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL`,
//!   `ANTHROPIC_API_KEY`, `OOZE_GATEWAY_URL` and `OOZE_SESSION_ID` set (besides the recipe's `env`
//!   and this process's own environment), `HOME` and `TMPDIR` a fresh directory of its own, in a
//!   session and process group of its own, without core dumps, and (`network = "gateway"`, the
//!   default) in a network namespace of its own whose only way out is the gateway
//!   ([`crate::net_jail`]), where the kernel allows one;
//! - the task arrives on stdin as one JSON object ([`task_json`]);
//! - the last non-empty stdout line may be a JSON object `{"reward": number or {"name": number},
//!   "answer": "…", "metrics": {"name": number}}`: the program's reward (named parts are summed
//!   and logged as `reward/NAME`), else the recipe's `[reward]` judges `answer`, else the last
//!   assistant text generated in the session;
//! - its metrics (logged per step under `agent/`): the program's own, `seconds`, `result_line`
//!   (1 when the last line was a result object), `reward/NAME`, and the session's `gateway/…`
//!   (calls, turns, conversations, retokenized turns, sampling overrides, ignored fields);
//! - stderr is kept in the run directory (`agent/g{group}-s{index}.stderr`), the session's calls
//!   in `gateway/g{group}-s{index}.jsonl`.
//!
//! Budgets (calls, generated tokens, wall clock) are enforced by the gateway. At the deadline, on
//! cancellation, or when the execution is dropped, the whole process tree is killed: the process
//! group, and every process that still carries the session's `OOZE_SESSION_ID` (children that left
//! the group). A program that exits non-zero, is killed, or made no model call fails the
//! execution (reward 0; the step goes on), with its stderr's tail in the error.

use ooze_rollout::agent::{Agent, AgentContext, AgentError, AgentFuture, AgentOutput};
use ooze_rollout::prompts::PromptItem;
use ooze_server::gateway::session::Budget;
use ooze_server::gateway::{self, Gateway};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{OnceCell, Semaphore};

/// stdout kept per execution (its tail: the result is the last line).
const STDOUT_TAIL_BYTES: usize = 64 << 10;
/// stderr kept per execution in the run directory.
const STDERR_BYTES: usize = 4 << 20;

/// How the program runs.
#[derive(Debug, Clone, Default)]
pub struct CommandConfig {
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Its working directory (default: this process's).
    pub cwd: Option<PathBuf>,
    /// Variables set besides the gateway's.
    pub env: BTreeMap<String, String>,
    /// Programs running at once (0: as many as the rollout runs).
    pub concurrency: usize,
    pub budget: Budget,
    /// Address space per process, bytes (0: no limit).
    pub memory_bytes: u64,
    /// Where stderr and call logs go (`agent/`, `gateway/` below it); `None` keeps none.
    pub log_dir: Option<PathBuf>,
    /// What the program's network reaches.
    pub network: Network,
}

/// What an agent program's network reaches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Network {
    /// The agent gateway only, where the kernel allows a network namespace ([`crate::net_jail`]);
    /// the host's network where it does not (said once, and `agent/network_jailed` is 0).
    #[default]
    Gateway,
    /// The host's network, as any process of this user.
    Host,
}

/// The running gateway: its sessions and its base URL.
struct Running {
    gateway: Arc<Gateway>,
    url: String,
    addr: std::net::SocketAddr,
}

/// `ooze_agent`, the Python module that reads the task, makes the session's clients and prints
/// the result: put on every program's `PYTHONPATH`.
const PYTHON_MODULE: &str = include_str!("../../../python/ooze_agent.py");

pub struct CommandAgent {
    config: CommandConfig,
    slots: Option<Arc<Semaphore>>,
    running: OnceCell<Running>,
    /// Holds `ooze_agent.py`.
    python_dir: tempfile::TempDir,
    /// Programs get a network namespace of their own (`Some(true)`: with a user namespace).
    jail: Option<bool>,
}

impl CommandAgent {
    pub fn new(config: CommandConfig) -> Result<CommandAgent, String> {
        let Some(program) = config.command.first() else {
            return Err(
                "agent.command: the program to run is required, e.g. [\"python3\", \"agent.py\"]"
                    .into(),
            );
        };
        if program.is_empty() {
            return Err("agent.command[0]: the program name is empty".into());
        }
        if let Some(cwd) = &config.cwd {
            if !cwd.is_dir() {
                return Err(format!("agent.cwd: {} is not a directory", cwd.display()));
            }
        }
        let slots = (config.concurrency > 0).then(|| Arc::new(Semaphore::new(config.concurrency)));
        let python_dir = tempfile::Builder::new()
            .prefix("ooze-python-")
            .tempdir()
            .and_then(|dir| {
                std::fs::write(dir.path().join("ooze_agent.py"), PYTHON_MODULE)?;
                Ok(dir)
            })
            .map_err(|e| format!("writing the ooze_agent Python module: {e}"))?;
        let jail = match config.network {
            Network::Host => None,
            Network::Gateway => match crate::net_jail::probe() {
                Some(user_namespace) => Some(user_namespace),
                None => {
                    eprintln!(
                        "agent: this kernel gives no network namespace to this user: agent programs use the host's network (agent.network = \"gateway\" cannot be kept)"
                    );
                    None
                }
            },
        };
        Ok(CommandAgent {
            config,
            slots,
            running: OnceCell::new(),
            python_dir,
            jail,
        })
    }

    /// The gateway, started on first use on a free loopback port.
    async fn gateway(&self, ctx: &AgentContext) -> Result<&Running, AgentError> {
        self.running
            .get_or_try_init(|| async {
                let gateway = Arc::new(Gateway::new(ctx.tokenizer().clone(), "policy".into()));
                // Each program holds pipes and a connection or two: hundreds at once need more
                // than the usual soft limit of 1024 descriptors.
                if let Err(e) = ooze_server::fd_limit::raise_open_file_limit() {
                    eprintln!("agent gateway: cannot raise the open-file limit: {e}");
                }
                let listener = ooze_server::listen_on("127.0.0.1", 0)
                    .await
                    .map_err(|e| AgentError::Agent(format!("starting the agent gateway: {e}")))?;
                let addr = listener
                    .local_addr()
                    .map_err(|e| AgentError::Agent(format!("starting the agent gateway: {e}")))?;
                let app = gateway::router(gateway.clone());
                let config = ooze_server::serve::ServeConfig {
                    body_read_timeout: Duration::from_secs(60),
                    ..Default::default()
                };
                tokio::spawn(async move {
                    let shutdown = ooze_server::serve::Shutdown::new();
                    if let Err(e) =
                        ooze_server::serve::serve(listener, app, &config, &shutdown, || {}).await
                    {
                        eprintln!("agent gateway: stopped: {e}");
                    }
                });
                eprintln!("agent gateway: http://{addr}");
                Ok(Running {
                    gateway,
                    url: format!("http://{addr}"),
                    addr,
                })
            })
            .await
    }

    async fn execute(
        &self,
        ctx: &AgentContext,
        prompt: &PromptItem,
    ) -> Result<AgentOutput, AgentError> {
        let _slot = match &self.slots {
            Some(slots) => Some(slots.clone().acquire_owned().await.expect("never closed")),
            None => None,
        };
        let running = self.gateway(ctx).await?;
        let execution = ctx.execution();
        let name = format!("g{}-s{}", execution.group, execution.index);
        let token = gateway::new_token();
        let log = |dir: &str, ext: &str| {
            self.config
                .log_dir
                .as_ref()
                .map(|d| d.join(dir).join(format!("{name}.{ext}")))
        };
        running
            .gateway
            .open(
                token.clone(),
                ctx.clone(),
                self.config.budget,
                log("gateway", "jsonl"),
            )
            .map_err(|e| AgentError::Agent(format!("opening the gateway session: {e}")))?;
        let mut open = OpenSession {
            gateway: &running.gateway,
            token: Some(token.clone()),
        };
        let ran = self
            .run_program(ctx, prompt, running, &token, log("agent", "stderr"))
            .await;
        open.token = None;
        let record = running
            .gateway
            .close(&token)
            .await
            .expect("invariant: opened above, closed only here");
        let ran = ran?;
        let mut metrics = record.metrics;
        metrics.insert("seconds".into(), ran.seconds);
        metrics.insert(
            "network_jailed".into(),
            f64::from(u8::from(self.jail.is_some())),
        );
        if !ran.status.success() {
            let how = match (ran.status.code(), ran.status.signal()) {
                (Some(code), _) => format!("exited with status {code}"),
                (None, Some(signal)) => format!("was killed by signal {signal}"),
                _ => "ended abnormally".into(),
            };
            return Err(AgentError::Agent(format!(
                "the agent program {how}; the end of its stderr:\n{}",
                ran.stderr_tail
            )));
        }
        if record.samples.is_empty() {
            return Err(AgentError::Agent(format!(
                "the agent program made no model call (its API key was the session token, its base URL {}/v1); the end of its stderr:\n{}",
                running.url, ran.stderr_tail
            )));
        }
        let result = parse_result(&ran.stdout_tail);
        for (key, value) in result.metrics {
            metrics.insert(key, value);
        }
        if let Some(parts) = &result.reward_parts {
            for (key, value) in parts {
                metrics.insert(format!("reward/{key}"), *value);
            }
        }
        metrics.insert("result_line".into(), f64::from(u8::from(result.found)));
        Ok(AgentOutput {
            samples: record.samples,
            reward: result.reward,
            final_response: result.answer.or(record.last_text),
            metrics,
        })
    }

    async fn run_program(
        &self,
        ctx: &AgentContext,
        prompt: &PromptItem,
        running: &Running,
        token: &str,
        stderr_path: Option<PathBuf>,
    ) -> Result<Ran, AgentError> {
        let url = running.url.as_str();
        let jail = match self.jail {
            Some(user_namespace) => Some(Arc::new(
                crate::net_jail::Jail::new(running.addr.port(), user_namespace).map_err(|e| {
                    AgentError::Agent(format!("preparing the program's network namespace: {e}"))
                })?,
            )),
            None => None,
        };
        let jail_in_child = jail.clone();
        let home = tempfile::Builder::new()
            .prefix("ooze-agent-")
            .tempdir()
            .map_err(|e| AgentError::Agent(format!("making the program's home: {e}")))?;
        let mut python_path = self.python_dir.path().as_os_str().to_owned();
        if let Some(outer) = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
            python_path.push(":");
            python_path.push(outer);
        }
        let mut program = ooze_env::spawn::Program::new(&self.config.command[0]);
        program
            .args(&self.config.command[1..])
            .env("PYTHONPATH", python_path)
            .envs(&self.config.env)
            .env("OPENAI_BASE_URL", format!("{url}/v1"))
            .env("OPENAI_API_KEY", token)
            .env("ANTHROPIC_BASE_URL", url)
            .env("ANTHROPIC_API_KEY", token)
            .env("OOZE_GATEWAY_URL", url)
            .env("OOZE_SESSION_ID", token)
            .env("HOME", home.path())
            .env("TMPDIR", home.path())
            .env("PYTHONUNBUFFERED", "1");
        if let Some(cwd) = &self.config.cwd {
            program.current_dir(cwd);
        }
        let memory = self.config.memory_bytes;
        let mut hook = move || {
            // SAFETY: only async-signal-safe system calls, on values computed before the spawn.
            unsafe {
                if libc::setsid() == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(jail) = &jail_in_child {
                    jail.enter()?;
                }
                // Killed with this process, should it die first.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                let no_core = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::setrlimit(libc::RLIMIT_CORE, &no_core);
                if memory > 0 {
                    let limit = libc::rlimit {
                        rlim_cur: memory,
                        rlim_max: memory,
                    };
                    libc::setrlimit(libc::RLIMIT_AS, &limit);
                }
            }
            Ok(())
        };
        let started = Instant::now();
        // Started from this runtime worker, not a blocking-pool thread: `PR_SET_PDEATHSIG` fires
        // when the starting *thread* exits, and idle blocking threads exit after 10 s, which
        // would kill the program with them. Not forked: a fork of a trainer this size stalls it
        // (see `ooze_env::spawn`).
        // SAFETY: the hook makes async-signal-safe calls only.
        let mut child = unsafe { program.spawn(&mut hook) }.map_err(|e| {
            AgentError::Agent(format!(
                "agent.command: starting {:?}: {e}",
                self.config.command[0]
            ))
        })?;
        let tree = ProcessTree {
            pgid: child.id() as i32,
            marker: format!("OOZE_SESSION_ID={token}"),
        };
        // The relay into the program's namespace, stopped with the execution.
        let _relay = match jail.as_ref().map(|jail| jail.serve(running.addr)) {
            Some(Ok(relay)) => Some(AbortOnDrop(relay)),
            Some(Err(e)) => {
                tree.kill();
                return Err(AgentError::Agent(format!(
                    "serving the program's network namespace: {e}"
                )));
            }
            None => None,
        };
        let task = task_json(ctx, prompt, url, token).to_string() + "\n";
        let mut stdin = child.stdin.take().expect("invariant: piped");
        let stdout = child.stdout.take().expect("invariant: piped");
        let stderr = child.stderr.take().expect("invariant: piped");
        // A program that never reads stdin must not block us: the write is a task of its own.
        tokio::spawn(async move {
            let _ = stdin.write_all(task.as_bytes()).await;
        });
        let out = tokio::spawn(read_tail(stdout, STDOUT_TAIL_BYTES));
        let err = tokio::spawn(keep_stderr(stderr, stderr_path));
        let cancel = ctx.cancel_token().clone();
        let ended = tokio::select! {
            status = child.wait() => Some(status),
            () = tokio::time::sleep_until(ctx.deadline()) => None,
            () = cancel.cancelled() => None,
        };
        // Children left behind (the program exited, or is stopped now) go with it.
        tree.kill();
        let status = match ended {
            Some(status) => {
                status.map_err(|e| AgentError::Agent(format!("waiting for the program: {e}")))?
            }
            None => {
                let _ = child.wait().await;
                let stderr_tail = tail(&err.await.unwrap_or_default(), 2000);
                return Err(AgentError::Agent(format!(
                    "the agent program ran past its {:.0} s deadline and was killed with its whole process tree; the end of its stderr:\n{stderr_tail}",
                    ctx.limits().deadline.as_secs_f64()
                )));
            }
        };
        let stdout_tail = out.await.unwrap_or_default();
        let stderr_tail = tail(&err.await.unwrap_or_default(), 2000);
        Ok(Ran {
            status,
            stdout_tail,
            stderr_tail,
            seconds: started.elapsed().as_secs_f64(),
        })
    }
}

impl Agent for CommandAgent {
    fn run<'a>(&'a self, ctx: &'a mut AgentContext, prompt: &'a PromptItem) -> AgentFuture<'a> {
        Box::pin(self.execute(ctx, prompt))
    }
}

/// Discards the session if the execution is dropped before it closes it.
struct OpenSession<'a> {
    gateway: &'a Gateway,
    token: Option<String>,
}

impl Drop for OpenSession<'_> {
    fn drop(&mut self) {
        if let Some(token) = self.token.take() {
            self.gateway.discard(&token);
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How the program ended.
struct Ran {
    status: std::process::ExitStatus,
    stdout_tail: String,
    stderr_tail: String,
    seconds: f64,
}

/// The last `max` bytes of `text`, at a character boundary.
fn tail(text: &str, max: usize) -> String {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_owned()
}

/// Reads `pipe` to its end, keeping the last `keep` bytes.
async fn read_tail(mut pipe: impl tokio::io::AsyncRead + Unpin, keep: usize) -> String {
    let mut kept: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 16 << 10];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        kept.extend_from_slice(&buf[..n]);
        if kept.len() > 2 * keep {
            kept.drain(..kept.len() - keep);
        }
    }
    if kept.len() > keep {
        kept.drain(..kept.len() - keep);
    }
    String::from_utf8_lossy(&kept).into_owned()
}

/// Copies stderr to `path` (up to [`STDERR_BYTES`], then a note) and returns its tail.
async fn keep_stderr(mut pipe: impl tokio::io::AsyncRead + Unpin, path: Option<PathBuf>) -> String {
    let mut file = match &path {
        Some(path) => {
            if let Some(dir) = path.parent() {
                let _ = tokio::fs::create_dir_all(dir).await;
            }
            tokio::fs::File::create(path).await.ok()
        }
        None => None,
    };
    let (mut written, mut tail_buf) = (0usize, Vec::<u8>::new());
    let mut buf = vec![0u8; 16 << 10];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        if let Some(f) = file.as_mut() {
            let room = STDERR_BYTES.saturating_sub(written);
            if room > 0 {
                let _ = f.write_all(&buf[..n.min(room)]).await;
                if n > room {
                    let _ = f.write_all(b"\n[ooze: stderr cut here]\n").await;
                }
            }
            written += n;
        }
        tail_buf.extend_from_slice(&buf[..n]);
        if tail_buf.len() > 8192 {
            tail_buf.drain(..tail_buf.len() - 4096);
        }
    }
    String::from_utf8_lossy(&tail_buf).into_owned()
}

/// The task as the program reads it on stdin.
pub fn task_json(ctx: &AgentContext, prompt: &PromptItem, url: &str, token: &str) -> Value {
    let execution = ctx.execution();
    // The question: the last user message's text, or the raw prompt.
    let text = prompt
        .messages
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .map_or_else(|| prompt.text.clone(), str::to_owned);
    json!({
        "prompt": text,
        "messages": prompt.messages,
        "label": prompt.label,
        "metadata": prompt.metadata,
        "tools": prompt.tools,
        "group": execution.group,
        "index": execution.index,
        "source_line": prompt.source_line,
        "session": token,
        "base_url": format!("{url}/v1"),
        "gateway_url": url,
    })
}

/// What the program's last stdout line says.
#[derive(Debug, Default, PartialEq)]
struct ProgramResult {
    /// The line was a JSON object.
    found: bool,
    reward: Option<f64>,
    reward_parts: Option<BTreeMap<String, f64>>,
    answer: Option<String>,
    metrics: BTreeMap<String, f64>,
}

/// Reads the last non-empty line of `stdout`; anything that is not the documented object (no
/// JSON, another shape, non-numbers) is ignored field by field, never an error.
fn parse_result(stdout: &str) -> ProgramResult {
    let Some(line) = stdout.lines().rev().map(str::trim).find(|l| !l.is_empty()) else {
        return ProgramResult::default();
    };
    let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(line) else {
        return ProgramResult::default();
    };
    let finite = |v: &Value| v.as_f64().filter(|x| x.is_finite());
    let numbers = |v: Option<&Value>| -> BTreeMap<String, f64> {
        v.and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| finite(v).map(|x| (k.clone(), x)))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (reward, reward_parts) = match obj.get("reward") {
        Some(Value::Object(_)) => {
            let parts = numbers(obj.get("reward"));
            (Some(parts.values().sum()), Some(parts))
        }
        Some(v) => (finite(v), None),
        None => (None, None),
    };
    ProgramResult {
        found: true,
        reward,
        reward_parts,
        answer: obj.get("answer").and_then(Value::as_str).map(str::to_owned),
        metrics: numbers(obj.get("metrics")),
    }
}

/// A program's processes: its process group, and every process carrying its marker variable.
struct ProcessTree {
    pgid: i32,
    marker: String,
}

impl ProcessTree {
    /// SIGKILLs them all, repeating while new ones appear (a fork racing the kill).
    fn kill(&self) {
        for _ in 0..50 {
            // SAFETY: a plain system call.
            unsafe {
                libc::killpg(self.pgid, libc::SIGKILL);
            }
            let marked = processes_with(&self.marker);
            if marked.is_empty() {
                return;
            }
            for pid in marked {
                // SAFETY: a plain system call.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for ProcessTree {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Live processes whose environment holds `marker` (`NAME=value`); zombies have none.
fn processes_with(marker: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let needle = marker.as_bytes();
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(Path::new("/proc").join(pid.to_string()).join("environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|var| var == needle))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_line_is_the_result() {
        let r = parse_result("log line\n{\"reward\": 1.5, \"answer\": \"42\", \"metrics\": {\"tool_calls\": 3, \"bad\": \"x\"}}\n\n");
        assert!(r.found);
        assert_eq!(r.reward, Some(1.5));
        assert_eq!(r.answer.as_deref(), Some("42"));
        assert_eq!(r.metrics, BTreeMap::from([("tool_calls".to_owned(), 3.0)]));
        let r = parse_result("{\"reward\": {\"correct\": 1, \"format\": 0.25}}");
        assert_eq!(r.reward, Some(1.25));
        assert_eq!(r.reward_parts.unwrap().len(), 2);
    }

    #[test]
    fn garbage_is_no_result() {
        for out in [
            "",
            "hello",
            "[1, 2]",
            "{\"reward\": \"high\"}",
            "{not json",
            "\u{0}\u{1}",
        ] {
            let r = parse_result(out);
            assert_eq!(r.reward, None, "{out:?}");
            assert_eq!(r.answer, None, "{out:?}");
        }
        // An object with a non-number reward is still a result line (its answer counts).
        let r = parse_result("{\"reward\": null, \"answer\": \"x\"}");
        assert!(r.found && r.reward.is_none() && r.answer.as_deref() == Some("x"));
    }

    #[test]
    fn an_empty_command_is_refused() {
        let e = CommandAgent::new(CommandConfig::default()).err().unwrap();
        assert!(e.contains("agent.command"), "{e}");
        let e = CommandAgent::new(CommandConfig {
            command: vec!["python3".into()],
            cwd: Some("/no/such/dir".into()),
            ..Default::default()
        })
        .err()
        .unwrap();
        assert!(e.contains("agent.cwd"), "{e}");
    }
}
