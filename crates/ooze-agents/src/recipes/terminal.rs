//! Terminal agents (Endless Terminals; SWE-style coding): the model works in a container episode
//! of a task directory ([`ooze_env::Task`]) and the task's tests decide the reward.
//!
//! Each execution loads its task from the row's metadata (`task_dir`), starts an episode in the
//! task's starting state, and lets the model act for up to `max_turns` turns. An action is a
//! `<tool_call>{"name": "bash", "arguments": {"command": "…"}}</tool_call>`; with `file_tools`,
//! also `view` (`path`: the file with numbered lines) and `edit` (`path`, `old`, `new`: `old`
//! replaced by `new`, where `old` occurs exactly once). The result comes back inside
//! `<tool_response>…</tool_response>` in the same assistant turn (loss mask 0), cut to
//! `max_observation_tokens`. Generation stops at `</tool_call>`, so nothing after an action is
//! trained. A turn without an action (the model ending its turn) ends the execution; then the
//! task's verifier runs on the episode's final state (or a clean copy, for coding tasks) and its
//! reward (1 if the tests pass, else 0) is the execution's.

use crate::parse::tool_calls;
use ooze_core::{FinishReason, StopMatch};
use ooze_env::{EpisodeLimits, Image, ImageCache, Sandbox, Task};
use ooze_rollout::agent::{Agent, AgentContext, AgentError, AgentFuture, AgentOutput};
use ooze_rollout::prompts::PromptItem;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct TerminalConfig {
    /// Model turns (each ends at an action or the end of the turn).
    pub max_turns: usize,
    /// Tokens of a tool's result kept.
    pub max_observation_tokens: usize,
    /// Wall clock per command.
    pub command_timeout: Duration,
    /// `view` and `edit` beside `bash`.
    pub file_tools: bool,
}

/// A task with its built image, loaded once per directory.
type Loaded = Arc<(Task, Image)>;

pub struct TerminalAgent {
    pub sandbox: Sandbox,
    pub cache: ImageCache,
    pub config: TerminalConfig,
    tasks: Mutex<HashMap<PathBuf, Loaded>>,
}

impl TerminalAgent {
    pub fn new(sandbox: Sandbox, cache: ImageCache, config: TerminalConfig) -> TerminalAgent {
        TerminalAgent {
            sandbox,
            cache,
            config,
            tasks: Mutex::new(HashMap::new()),
        }
    }

    /// The row's task (`metadata.task_dir`), loaded and its image built at first use.
    fn task(&self, prompt: &PromptItem) -> Result<Loaded, AgentError> {
        let dir = task_dir(prompt)?;
        if let Some(t) = self.tasks.lock().expect("not poisoned").get(&dir) {
            return Ok(t.clone());
        }
        let task = Task::load(&dir).map_err(|e| AgentError::Agent(e.to_string()))?;
        let image = task
            .build_image(&self.cache)
            .map_err(|e| AgentError::Agent(e.to_string()))?;
        let loaded = Arc::new((task, image));
        self.tasks
            .lock()
            .expect("not poisoned")
            .insert(dir, loaded.clone());
        Ok(loaded)
    }
}

/// `metadata.task_dir` of a row.
pub fn task_dir(prompt: &PromptItem) -> Result<PathBuf, AgentError> {
    prompt
        .metadata
        .get("task_dir")
        .and_then(Value::as_str)
        .map(PathBuf::from)
        .ok_or_else(|| {
            AgentError::Agent(format!(
                "prompt at line {}: a terminal task row needs `task_dir` (the task directory) in \
                 its metadata (data.metadata_key)",
                prompt.source_line
            ))
        })
}

/// What one action did.
enum Action {
    Command(ooze_env::CommandOutput),
    File(Result<String, String>),
    Malformed(String),
}

impl TerminalAgent {
    async fn act(&self, episode: &mut ooze_env::Episode, text: &str) -> Option<Action> {
        let call = tool_calls(text).into_iter().next()?;
        let call = match call {
            Ok(call) => call,
            Err(e) => return Some(Action::Malformed(e.0)),
        };
        let arg = |k: &str| call.string_argument(k).map(str::to_owned).map_err(|e| e.0);
        Some(match (call.name.as_str(), self.config.file_tools) {
            ("bash", _) => match arg("command") {
                Ok(command) => match episode
                    .run(&command, Some(self.config.command_timeout))
                    .await
                {
                    Ok(out) => Action::Command(out),
                    Err(e) => Action::Malformed(e.to_string()),
                },
                Err(e) => Action::Malformed(e),
            },
            ("view", true) => Action::File(arg("path").and_then(|path| {
                let bytes = episode.get(&path, 1 << 20).map_err(|e| e.to_string())?;
                let text = String::from_utf8_lossy(&bytes);
                Ok(text
                    .lines()
                    .enumerate()
                    .map(|(i, l)| format!("{:>4} {l}", i + 1))
                    .collect::<Vec<_>>()
                    .join("\n"))
            })),
            ("edit", true) => Action::File((|| {
                let (path, old, new) = (arg("path")?, arg("old")?, arg("new")?);
                let bytes = episode.get(&path, 1 << 20).map_err(|e| e.to_string())?;
                let text =
                    String::from_utf8(bytes).map_err(|_| format!("{path} is not UTF-8 text"))?;
                match text.matches(old.as_str()).count() {
                    1 => {}
                    0 => return Err(format!("`old` does not occur in {path}")),
                    n => {
                        return Err(format!(
                            "`old` occurs {n} times in {path}; give more context"
                        ))
                    }
                }
                episode
                    .put(&path, text.replacen(&old, &new, 1).as_bytes(), 0o644)
                    .map_err(|e| e.to_string())?;
                Ok(format!("edited {path}"))
            })()),
            (name, _) => Action::Malformed(format!(
                "unknown tool \"{name}\"; the tools are {}",
                if self.config.file_tools {
                    "bash, view and edit"
                } else {
                    "bash"
                }
            )),
        })
    }
}

impl Agent for TerminalAgent {
    fn run<'a>(&'a self, ctx: &'a mut AgentContext, prompt: &'a PromptItem) -> AgentFuture<'a> {
        Box::pin(async move {
            let loaded = self.task(prompt)?;
            let (task, image) = (&loaded.0, &loaded.1);
            let started = Instant::now();
            let mut episode = task
                .start(&self.sandbox, image)
                .await
                .map_err(|e| AgentError::Agent(e.to_string()))?;
            let start_seconds = started.elapsed().as_secs_f64();
            let mut conv = ctx.start_rendered(prompt);
            let (mut turns, mut commands, mut failed, mut timeouts, mut errors, mut file_calls) =
                (0usize, 0usize, 0usize, 0usize, 0usize, 0usize);
            let (mut tool_seconds, mut generate_seconds) = (0.0, 0.0);
            for _ in 0..self.config.max_turns {
                let t = Instant::now();
                let turn = ctx.generate(&mut conv, &["</tool_call>"]).await?;
                generate_seconds += t.elapsed().as_secs_f64();
                turns += 1;
                if turn.tokens == 0 || turn.finish == FinishReason::Length {
                    break;
                }
                if matches!(
                    turn.finish,
                    FinishReason::Stop {
                        matched: StopMatch::Token(_)
                    }
                ) {
                    break;
                }
                let t = Instant::now();
                let observation = match self.act(&mut episode, &turn.text).await {
                    None => break,
                    Some(Action::Command(out)) => {
                        commands += 1;
                        failed += (!out.success()) as usize;
                        timeouts += (out.ending == ooze_env::Ending::TimedOut) as usize;
                        out.observation()
                    }
                    Some(Action::File(result)) => {
                        file_calls += 1;
                        result.unwrap_or_else(|e| {
                            errors += 1;
                            format!("Error: {e}")
                        })
                    }
                    Some(Action::Malformed(problem)) => {
                        errors += 1;
                        format!("Error: {problem}")
                    }
                };
                tool_seconds += t.elapsed().as_secs_f64();
                let observation = ctx.truncate(&observation, self.config.max_observation_tokens)?;
                ctx.append_text(
                    &mut conv,
                    &format!("\n<tool_response>\n{observation}\n</tool_response>\n"),
                )?;
            }
            let t = Instant::now();
            let verdict = task.verify(&self.sandbox, image, &mut episode).await;
            let verify_seconds = t.elapsed().as_secs_f64();
            let report = episode.close().await;
            let verdict = verdict.map_err(|e| AgentError::Agent(e.to_string()))?;
            let metrics = BTreeMap::from([
                ("turns".to_string(), turns as f64),
                ("commands".to_string(), commands as f64),
                ("failed_commands".to_string(), failed as f64),
                ("command_timeouts".to_string(), timeouts as f64),
                ("file_tool_calls".to_string(), file_calls as f64),
                ("tool_errors".to_string(), errors as f64),
                ("passed".to_string(), verdict.passed() as u8 as f64),
                ("episode_start_seconds".to_string(), start_seconds),
                ("tool_seconds".to_string(), tool_seconds),
                ("generate_seconds".to_string(), generate_seconds),
                ("verify_seconds".to_string(), verify_seconds),
                (
                    "episode_memory_mib".to_string(),
                    report.memory_peak_bytes.unwrap_or(0) as f64 / (1u64 << 20) as f64,
                ),
            ]);
            let response = conv.response_text(ctx.tokenizer())?;
            Ok(AgentOutput {
                samples: vec![conv.sample],
                reward: Some(verdict.reward),
                final_response: Some(response),
                metrics,
            })
        })
    }
}

/// The episode limits of terminal tasks unless a task says otherwise.
pub fn episode_limits(command_timeout: Duration, concurrent: usize) -> EpisodeLimits {
    EpisodeLimits {
        command_timeout,
        concurrent: if concurrent == 0 {
            EpisodeLimits::default_concurrent()
        } else {
            concurrent
        },
        ..EpisodeLimits::default()
    }
}

/// The instruction wrapped around a task's `instruction.md`.
pub fn instruction(task: &str, file_tools: bool) -> String {
    let tools = if file_tools {
        "<tool_call>{\"name\": \"bash\", \"arguments\": {\"command\": \"...\"}}</tool_call> runs a \
         shell command; <tool_call>{\"name\": \"view\", \"arguments\": {\"path\": \"...\"}}</tool_call> \
         shows a file; <tool_call>{\"name\": \"edit\", \"arguments\": {\"path\": \"...\", \"old\": \
         \"...\", \"new\": \"...\"}}</tool_call> replaces text that occurs once in a file"
    } else {
        "<tool_call>{\"name\": \"bash\", \"arguments\": {\"command\": \"...\"}}</tool_call> runs a \
         shell command"
    };
    format!(
        "You are working in a Linux terminal (working directory /work). {tools}; the result comes \
         back in <tool_response></tool_response>. When the task is done, say so without a tool \
         call.\n\nTask: {}",
        task.trim()
    )
}

/// The demonstrations' teacher. Two habits, so the warm-started policy starts imperfect and RL
/// has the finishing to find, as the other recipes' oracles mix a weak habit with a good one:
/// - the task's reference solution as one `bash` call, then "Done.";
/// - a look at the working directory (`ls /work`), then "Done." with the task not done (the
///   premature claim of completion weak terminal agents make; reward 0).
///
/// The first take of a task picks the habit by a hash of its instruction (half the tasks each);
/// every further take switches to the other habit. With two takes per task the demonstrations
/// show every task both ways, so the warm-started policy is undecided on each task rather than
/// decided by whatever SFT made of the hash.
pub struct TerminalOracle {
    solution: String,
    solves: bool,
}

/// The weak habit's one command.
const LOOK: &str = "ls /work";

impl TerminalOracle {
    /// The oracle of `prompt`'s `take`-th recording (0 for the first).
    pub fn new(prompt: &PromptItem, take: usize) -> Result<TerminalOracle, AgentError> {
        let dir = task_dir(prompt)?;
        let task = Task::load(&dir).map_err(|e| AgentError::Agent(e.to_string()))?;
        let solution = task.solution.ok_or_else(|| {
            AgentError::Agent(format!(
                "{}: no solution/solve.sh to demonstrate",
                dir.display()
            ))
        })?;
        Ok(TerminalOracle {
            solution: solution.trim_start_matches("set -e\n").trim().to_owned(),
            solves: (super::strategy(&task.instruction, 2) + take as u64).is_multiple_of(2),
        })
    }
}

impl ooze_rollout::oracle::Oracle for TerminalOracle {
    fn reply(
        &self,
        caller: ooze_rollout::oracle::Caller<'_>,
        messages: &[Value],
    ) -> Result<String, String> {
        super::policy_only(caller, "terminal")?;
        let so_far = match messages.last() {
            Some(m) if m["role"] == "assistant" => super::last_text(messages),
            _ => "",
        };
        Ok(if so_far.contains("<tool_response>") {
            "Done.".to_string()
        } else {
            let command = if self.solves { &self.solution } else { LOOK };
            let call = json!({"name": "bash", "arguments": {"command": command}});
            format!("<tool_call>{call}</tool_call>")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ooze_rollout::oracle::{Caller, Oracle};

    #[test]
    fn the_oracle_solves_or_looks_and_stops() {
        let tmp = tempfile::tempdir().unwrap();
        let families = ooze_env::families::terminal_families();
        let dirs = ooze_env::families::write_tasks(tmp.path(), &families, 16, 3).unwrap();
        let mut habits = [0, 0];
        for dir in dirs {
            let prompt = crate::recipes::test_prompt(
                "pass".into(),
                json!({"task_dir": dir.display().to_string()}),
                vec![json!({"role": "user", "content": "Task: …"})],
            );
            let o = TerminalOracle::new(&prompt, 0).unwrap();
            habits[o.solves as usize] += 1;
            // The next take shows the task the other way, the one after it as the first.
            assert_ne!(TerminalOracle::new(&prompt, 1).unwrap().solves, o.solves);
            assert_eq!(TerminalOracle::new(&prompt, 2).unwrap().solves, o.solves);
            let first = o.reply(Caller::Policy, &prompt.messages).unwrap();
            let call = tool_calls(&first).remove(0).unwrap();
            let command = call.string_argument("command").unwrap();
            let solution = Task::load(&dir).unwrap().solution.unwrap();
            if o.solves {
                assert!(solution.contains(command), "{command}");
            } else {
                assert_eq!(command, LOOK);
            }
            let shown = format!("{first}\n<tool_response>\n…\n</tool_response>\n");
            let mut messages = prompt.messages.clone();
            messages.push(json!({"role": "assistant", "content": shown}));
            assert_eq!(o.reply(Caller::Policy, &messages).unwrap(), "Done.");
        }
        assert!(habits[0] > 0 && habits[1] > 0, "{habits:?}");
    }
}
