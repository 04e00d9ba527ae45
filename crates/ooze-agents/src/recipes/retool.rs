//! ReTool-style tool-integrated math: the model writes Python in a
//! `<tool_call>{"name": "code_interpreter", "arguments": {"code": "…"}}</tool_call>` (or a fenced
//! ```` ```python ```` block), ooze runs it in the sandbox, and the output comes back inside
//! `<interpreter>…</interpreter>` in the same assistant turn (loss mask 0). Generation stops at
//! `</tool_call>` (and after a closed code fence), so nothing after a call is trained. The
//! execution ends when the model writes a `\boxed{}` answer or ends its turn.
//!
//! Reward (computed by the agent, per execution): +1 for a correct boxed answer; otherwise
//! `min(−0.6, −1 + (tool_calls − 2) / 2 · 0.1)`, which makes a wrong answer after more tool use
//! less bad.

use crate::parse::{code_block, tool_calls};
use crate::sandbox::Sandbox;
use ooze_core::{FinishReason, StopMatch};
use ooze_rollout::agent::{Agent, AgentContext, AgentError, AgentFuture, AgentOutput};
use ooze_rollout::math_answer::{equivalent, last_boxed};
use ooze_rollout::prompts::PromptItem;
use serde_json::{json, Value};
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
pub struct RetoolConfig {
    /// Model turns (each ends at a tool call, an answer, or the turn budget).
    pub max_turns: usize,
    /// Tokens of tool output kept per call.
    pub max_observation_tokens: usize,
}

impl Default for RetoolConfig {
    fn default() -> Self {
        RetoolConfig {
            max_turns: 16,
            max_observation_tokens: 512,
        }
    }
}

/// The tool's name.
pub const TOOL: &str = "code_interpreter";

pub struct RetoolAgent {
    pub sandbox: Sandbox,
    pub config: RetoolConfig,
}

/// The ReTool reward of a final response with `tool_calls` calls.
pub fn reward(response: &str, label: &str, tool_calls: usize) -> f64 {
    let correct = last_boxed(response).is_some_and(|a| equivalent(a, label));
    if correct {
        1.0
    } else {
        (-1.0 + (tool_calls as f64 - 2.0) / 2.0 * 0.1).min(-0.6)
    }
}

/// The code of the first action in `text`: a tool call, else a fenced Python block; or what the
/// model did wrong, worded for it.
fn code_of(text: &str) -> Option<Result<String, String>> {
    if let Some(call) = tool_calls(text).into_iter().next() {
        return Some(match call {
            Ok(call) if call.name == TOOL => call
                .string_argument("code")
                .map(str::to_owned)
                .map_err(|e| e.0),
            Ok(call) => Err(format!(
                "unknown tool \"{}\"; the tool is \"{TOOL}\"",
                call.name
            )),
            Err(e) => Err(e.0),
        });
    }
    code_block(text, &["python", "py"]).map(|r| r.map(str::to_owned).map_err(|e| e.0))
}

impl Agent for RetoolAgent {
    fn run<'a>(&'a self, ctx: &'a mut AgentContext, prompt: &'a PromptItem) -> AgentFuture<'a> {
        Box::pin(async move {
            let mut conv = ctx.start_rendered(prompt);
            let (mut calls, mut errors, mut turns) = (0usize, 0usize, 0usize);
            for _ in 0..self.config.max_turns {
                // Stop after a call or a closed code fence: nothing after an action is trained.
                let turn = ctx
                    .generate(&mut conv, &["</tool_call>", "\n```\n"])
                    .await?;
                turns += 1;
                if turn.tokens == 0 || turn.finish == FinishReason::Length {
                    break;
                }
                // An answer, or a turn the model ended itself, ends the execution.
                let ended = matches!(
                    turn.finish,
                    FinishReason::Stop {
                        matched: StopMatch::Token(_)
                    }
                );
                if ended || last_boxed(&turn.text).is_some() {
                    break;
                }
                let observation = match code_of(&turn.text) {
                    None => {
                        errors += 1;
                        format!("Error: no tool call found; write <tool_call>{{\"name\": \"{TOOL}\", \"arguments\": {{\"code\": \"...\"}}}}</tool_call> or give the answer in \\boxed{{}}")
                    }
                    Some(Ok(code)) => {
                        calls += 1;
                        let run = self
                            .sandbox
                            .run_python(&code)
                            .await
                            .map_err(|e| AgentError::Agent(e.to_string()))?;
                        if !run.success() {
                            errors += 1;
                        }
                        ctx.truncate(&run.observation(), self.config.max_observation_tokens)?
                    }
                    Some(Err(problem)) => {
                        errors += 1;
                        format!("Error: {problem}")
                    }
                };
                ctx.append_text(
                    &mut conv,
                    &format!("\n<interpreter>\n{observation}\n</interpreter>\n"),
                )?;
            }
            let response = conv.response_text(ctx.tokenizer())?;
            let r = reward(&response, &prompt.label, calls);
            let metrics = BTreeMap::from([
                ("turns".to_string(), turns as f64),
                ("tool_calls".to_string(), calls as f64),
                ("tool_errors".to_string(), errors as f64),
                (
                    "answered".to_string(),
                    last_boxed(&response).is_some() as u8 as f64,
                ),
                ("correct".to_string(), (r > 0.0) as u8 as f64),
            ]);
            Ok(AgentOutput {
                samples: vec![conv.sample],
                reward: Some(r),
                final_response: Some(response),
                metrics,
            })
        })
    }
}

/// The instruction wrapped around each problem.
pub fn instruction(problem: &str) -> String {
    format!(
        "Solve the problem. You can run Python: write <tool_call>{{\"name\": \"{TOOL}\", \
         \"arguments\": {{\"code\": \"print(...)\"}}}}</tool_call> and its output comes back \
         between <interpreter> and </interpreter>. Put the final answer in \\boxed{{}}.\n\
         Problem: {problem}"
    )
}

/// `n` generated problems (multi-step arithmetic) in the row layout of DAPO-Math / ReTool's
/// parquet files: `prompt` chat messages and `reward_model.ground_truth`.
pub fn synthetic(n: usize, seed: u64, task: ooze_rollout::Task) -> Vec<Value> {
    super::math_rows(n, seed, task, instruction)
}

/// The demonstrations' teacher ([`ooze_rollout::oracle`]) for a [`synthetic`] row, writing the
/// agent's turns in its own run (so the interpreter's output is the sandbox's). Two habits, fixed
/// per problem (a hash of it), so the warm-started policy starts imperfect and RL has the tool to
/// find:
/// - half the problems: one `code_interpreter` call that prints the expression, then the
///   interpreter's output boxed;
/// - half: the answer boxed at once, worked out without the tool (which a small model gets right
///   only by luck on multi-step expressions).
pub struct RetoolOracle {
    known: super::KnownProblem,
    uses_the_tool: bool,
}

impl RetoolOracle {
    pub fn new(prompt: &PromptItem) -> Result<RetoolOracle, AgentError> {
        let known = super::KnownProblem::of(prompt)?;
        Ok(RetoolOracle {
            uses_the_tool: known.habit(2) == 0,
            known,
        })
    }
}

impl ooze_rollout::oracle::Oracle for RetoolOracle {
    fn reply(
        &self,
        caller: ooze_rollout::oracle::Caller<'_>,
        messages: &[Value],
    ) -> Result<String, String> {
        super::policy_only(caller, "retool")?;
        let so_far = match messages.last() {
            Some(m) if m["role"] == "assistant" => super::last_text(messages),
            _ => "",
        };
        Ok(match so_far.rsplit_once("<interpreter>\n") {
            Some((_, output)) => {
                let value = output.split("\n</interpreter>").next().unwrap_or("").trim();
                format!("The result is \\boxed{{{value}}}")
            }
            None if self.uses_the_tool => {
                let call = json!({"name": TOOL, "arguments": {"code": format!("print({})", self.known.expression)}});
                format!("<tool_call>{call}</tool_call>")
            }
            None => format!(
                "Working it out directly: {} = {}, so the answer is \\boxed{{{}}}",
                self.known.expression, self.known.answer, self.known.answer
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reward_shaping() {
        assert_eq!(reward(r"so \boxed{14}", "14", 0), 1.0);
        assert_eq!(reward(r"so \boxed{13}", "14", 0), -1.0 + (-2.0 / 2.0 * 0.1));
        assert_eq!(reward("no answer", "14", 2), -1.0);
        // Many calls cannot lift a wrong answer above −0.6.
        assert_eq!(reward("no answer", "14", 30), -0.6);
    }

    #[test]
    fn actions_and_their_errors() {
        let call = r#"<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(1)"}}</tool_call>"#;
        assert_eq!(code_of(call), Some(Ok("print(1)".into())));
        assert!(
            code_of(r#"<tool_call>{"name": "search", "arguments": {}}</tool_call>"#)
                .unwrap()
                .unwrap_err()
                .contains("unknown tool")
        );
        assert_eq!(code_of("```python\nx = 2\n```"), Some(Ok("x = 2\n".into())));
        assert_eq!(code_of("just text"), None);
    }

    #[test]
    fn the_oracle_calls_the_tool_or_answers_at_once() {
        use ooze_rollout::oracle::{Caller, Oracle};
        let mut habits = [0, 0];
        for row in synthetic(20, 3, ooze_rollout::Task::Arithmetic) {
            let prompt = crate::recipes::test_prompt(
                row["reward_model"]["ground_truth"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
                row["extra_info"].clone(),
                Vec::new(),
            );
            let o = RetoolOracle::new(&prompt).unwrap();
            habits[o.uses_the_tool as usize] += 1;
            let user = row["prompt"][0].clone();
            let first = o
                .reply(Caller::Policy, std::slice::from_ref(&user))
                .unwrap();
            if !o.uses_the_tool {
                assert_eq!(reward(&first, &prompt.label, 0), 1.0, "{first}");
                continue;
            }
            assert!(first.ends_with("</tool_call>"));
            assert_eq!(
                code_of(&first),
                Some(Ok(format!("print({})", o.known.expression)))
            );
            let shown = format!(
                "{first}\n<interpreter>\n{}\n\n</interpreter>\n",
                prompt.label
            );
            let assistant = json!({"role": "assistant", "content": shown});
            let last = o.reply(Caller::Policy, &[user, assistant]).unwrap();
            assert_eq!(reward(&last, &prompt.label, 1), 1.0, "{last}");
        }
        assert!(habits[0] > 0 && habits[1] > 0, "{habits:?}");
    }
}
