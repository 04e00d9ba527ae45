//! AgentFlow: a trainable planner steers fixed modules. Each step the planner (the policy, a fresh
//! conversation over the problem and the memory so far) writes the next step — a justification,
//! the context the tool needs, a sub-goal and a tool name. The fixed executor (helper `executor`)
//! turns the step into a tool command and the tool runs:
//! - `python_coder`: the executor writes Python, the sandbox runs it, the output is the result;
//! - `base_generator`: the executor answers the sub-goal as a plain LLM.
//!
//! The fixed verifier (helper `verifier`) then says STOP or CONTINUE. At the end the fixed
//! generator (helper `generator`) writes the final answer from the memory, and the judge (helper
//! `judge`) compares it with the ground truth: reward 1 if it says the answer is right, else 0.
//!
//! Every planner call is a sample; all of an execution are siblings and share its reward, so GRPO
//! groups over every turn of the n executions of a question.

use super::problem_text;
use crate::sandbox::Sandbox;
use ooze_rollout::agent::{Agent, AgentContext, AgentError, AgentFuture, AgentOutput};
use ooze_rollout::prompts::PromptItem;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The tools the planner may choose.
pub const TOOLS: [(&str, &str); 2] = [
    (
        "python_coder",
        "writes and runs Python code; use it for calculations",
    ),
    (
        "base_generator",
        "answers a sub-goal in plain language; use it for reasoning and recall",
    ),
];

#[derive(Debug, Clone)]
pub struct AgentflowConfig {
    /// Planner steps at most.
    pub max_steps: usize,
    /// Tokens of each tool result kept in the memory.
    pub max_result_tokens: usize,
    /// New tokens per helper call.
    pub helper_tokens: usize,
}

impl Default for AgentflowConfig {
    fn default() -> Self {
        AgentflowConfig {
            max_steps: 4,
            max_result_tokens: 256,
            helper_tokens: 256,
        }
    }
}

pub struct AgentflowAgent {
    pub sandbox: Sandbox,
    pub config: AgentflowConfig,
}

/// One planner step, as parsed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    pub justification: String,
    pub context: String,
    pub sub_goal: String,
    pub tool: String,
}

/// Reads `Justification:`, `Context:`, `Sub-goal:` and `Tool:` fields (each up to the next field);
/// the tool must be one of [`TOOLS`].
pub fn parse_plan(text: &str) -> Result<Plan, String> {
    const FIELDS: [&str; 4] = ["Justification:", "Context:", "Sub-goal:", "Tool:"];
    let field = |name: &str| -> Option<String> {
        let start = text.find(name)? + name.len();
        let end = FIELDS
            .iter()
            .filter_map(|f| text[start..].find(f).map(|i| start + i))
            .min()
            .unwrap_or(text.len());
        Some(text[start..end].trim().to_owned())
    };
    let tool = field("Tool:").ok_or("the step has no \"Tool:\" line")?;
    let tool = tool
        .split_whitespace()
        .next()
        .unwrap_or("")
        .trim_matches(|c: char| !c.is_alphanumeric() && c != '_')
        .to_owned();
    if !TOOLS.iter().any(|(name, _)| *name == tool) {
        return Err(format!(
            "unknown tool \"{tool}\"; the tools are python_coder and base_generator"
        ));
    }
    Ok(Plan {
        justification: field("Justification:").unwrap_or_default(),
        context: field("Context:").unwrap_or_default(),
        sub_goal: field("Sub-goal:").ok_or("the step has no \"Sub-goal:\" line")?,
        tool,
    })
}

/// The memory as text for the modules' prompts.
fn memory_text(memory: &[String]) -> String {
    if memory.is_empty() {
        "(no steps yet)".into()
    } else {
        memory
            .iter()
            .enumerate()
            .map(|(i, m)| format!("Step {}: {m}", i + 1))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The planner's prompt.
pub fn planner_instruction(problem: &str, memory: &str) -> String {
    let tools: String = TOOLS
        .iter()
        .map(|(name, what)| format!("- {name}: {what}\n"))
        .collect();
    format!(
        "You plan the next step towards solving a problem with tools.\nTools:\n{tools}\
         Problem: {problem}\nSteps so far:\n{memory}\n\nReply with four lines:\n\
         Justification: why this step\nContext: what the tool needs to know\n\
         Sub-goal: what the step must achieve\nTool: python_coder or base_generator"
    )
}

/// Whether a judge's reply says "yes" (the first yes/no word decides; neither is `None`).
pub fn judge_verdict(reply: &str) -> Option<bool> {
    reply.split(|c: char| !c.is_alphanumeric()).find_map(|w| {
        match w.to_ascii_lowercase().as_str() {
            "yes" | "correct" => Some(true),
            "no" | "incorrect" | "wrong" => Some(false),
            _ => None,
        }
    })
}

/// What the executor is asked for a step: Python for `python_coder`, a brief answer otherwise.
pub fn executor_request(problem: &str, plan: &Plan) -> String {
    let task = format!(
        "Problem: {problem}\nContext: {}\nSub-goal: {}",
        plan.context, plan.sub_goal
    );
    if plan.tool == "python_coder" {
        format!("{task}\n{PYTHON_ASK}")
    } else {
        format!("{task}\n{BRIEF_ASK}")
    }
}

const PYTHON_ASK: &str =
    "Write Python code that achieves the sub-goal and prints the result, in one ```python block.";
const BRIEF_ASK: &str = "Achieve the sub-goal. Be brief.";

/// A step as the memory keeps it.
fn memory_entry(plan: &Plan, result: &str) -> String {
    format!(
        "tool {}, sub-goal: {}; result: {result}",
        plan.tool, plan.sub_goal
    )
}

/// The verifier's question after each step.
pub fn verifier_request(problem: &str, memory: &str) -> String {
    format!(
        "Problem: {problem}\nSteps so far:\n{memory}\nIs the problem solved by these \
         steps? Reply STOP if it is, CONTINUE if more steps are needed."
    )
}

/// The generator's request for the final answer.
pub fn generator_request(problem: &str, memory: &str) -> String {
    format!("Problem: {problem}\nSteps and results:\n{memory}\nGive the final answer.")
}

/// The judge's question.
pub fn judge_request(problem: &str, reference: &str, response: &str) -> String {
    format!(
        "Question: {problem}\nReference answer: {reference}\nResponse: {response}\nDoes the \
         response give the reference answer? Reply yes or no."
    )
}

impl AgentflowAgent {
    /// Runs `plan`'s tool through the executor; returns the result text.
    async fn execute(
        &self,
        ctx: &AgentContext,
        problem: &str,
        plan: &Plan,
    ) -> Result<String, AgentError> {
        let ask = executor_request(problem, plan);
        let reply = ctx
            .prompt_helper("executor", &ask, self.config.helper_tokens)
            .await?;
        if plan.tool != "python_coder" {
            return Ok(reply.text);
        }
        Ok(
            match super::run_written_code(&self.sandbox, &reply.text).await? {
                Ok((_, run)) => run.observation(),
                Err(nothing) => format!("executor: {nothing}"),
            },
        )
    }
}

impl Agent for AgentflowAgent {
    fn run<'a>(&'a self, ctx: &'a mut AgentContext, prompt: &'a PromptItem) -> AgentFuture<'a> {
        Box::pin(async move {
            let problem = problem_text(prompt)?.to_owned();
            let tokens = self.config.helper_tokens;
            let mut memory: Vec<String> = Vec::new();
            let mut samples = Vec::new();
            let (mut invalid, mut coder, mut generator) = (0.0, 0.0, 0.0);
            let mut stopped = false;
            for _ in 0..self.config.max_steps {
                let text = planner_instruction(&problem, &memory_text(&memory));
                let mut conv = ctx.start(vec![json!({"role": "user", "content": text})], None)?;
                let turn = ctx.generate(&mut conv, &[]).await?;
                samples.push(conv.sample);
                let entry = match parse_plan(&turn.text) {
                    Err(problem_with_plan) => {
                        invalid += 1.0;
                        format!("invalid plan ({problem_with_plan})")
                    }
                    Ok(plan) => {
                        if plan.tool == "python_coder" {
                            coder += 1.0;
                        } else {
                            generator += 1.0;
                        }
                        let result = self.execute(ctx, &problem, &plan).await?;
                        let result = ctx.truncate(result.trim(), self.config.max_result_tokens)?;
                        memory_entry(&plan, &result)
                    }
                };
                memory.push(entry);
                if ctx.should_stop() {
                    break;
                }
                let check = verifier_request(&problem, &memory_text(&memory));
                let verdict = ctx.prompt_helper("verifier", &check, 16).await?;
                if verdict.text.to_ascii_uppercase().contains("STOP") {
                    stopped = true;
                    break;
                }
            }
            let ask = generator_request(&problem, &memory_text(&memory));
            let answer = ctx.prompt_helper("generator", &ask, tokens).await?;
            let judge = judge_request(&problem, &prompt.label, &answer.text);
            let verdict = ctx.prompt_helper("judge", &judge, 8).await?;
            let judged = judge_verdict(&verdict.text);
            let reward = (judged == Some(true)) as u8 as f64;
            let metrics = BTreeMap::from([
                ("steps".to_string(), samples.len() as f64),
                ("invalid_plans".to_string(), invalid),
                ("python_coder_calls".to_string(), coder),
                ("base_generator_calls".to_string(), generator),
                ("verifier_stopped".to_string(), stopped as u8 as f64),
                ("judge_unparsed".to_string(), judged.is_none() as u8 as f64),
                ("correct".to_string(), reward),
            ]);
            Ok(AgentOutput {
                samples,
                reward: Some(reward),
                final_response: Some(answer.text),
                metrics,
            })
        })
    }
}

/// `n` generated problems in the DAPO-Math row layout (see [`super::math_rows`]), the problem
/// alone as the user message (the planner's prompt is built by the agent).
pub fn synthetic(n: usize, seed: u64, task: ooze_rollout::Task) -> Vec<Value> {
    super::math_rows(n, seed, task, str::to_owned)
}

/// The demonstrations' teacher ([`ooze_rollout::oracle`]): it plans, and plays every fixed module,
/// knowing the problem's answer. Plans differ by problem (a hash of it), so that the demonstrations
/// show the planner after one and more earlier steps, and show the verifier both verdicts:
/// - a third of the problems: `python_coder` at once;
/// - a third: a `base_generator` estimate first, then `python_coder`;
/// - a third: estimates until the turns run out, whose answer is usually wrong: the warm-started
///   planner starts imperfect, and RL has the exact tool to find.
///
/// The modules, as fixed models that an SFT model can learn from their inputs alone: the executor
/// writes `print(EXPRESSION)` for `python_coder` and "about N" (the answer rounded to ten) for
/// `base_generator`; the verifier says STOP after a `python_coder` result and CONTINUE after an
/// estimate or a failed step; the generator boxes the last `python_coder` result (else the last
/// estimate); the judge says yes when the boxed answer is the reference.
pub struct AgentflowOracle {
    known: super::KnownProblem,
    estimates: usize,
}

impl AgentflowOracle {
    pub fn new(prompt: &PromptItem) -> Result<AgentflowOracle, AgentError> {
        let known = super::KnownProblem::of(prompt)?;
        Ok(AgentflowOracle {
            estimates: match known.habit(3) {
                0 => 0,
                1 => 1,
                _ => usize::MAX,
            },
            known,
        })
    }

    fn plan(&self, steps_so_far: usize) -> String {
        let x = &self.known.expression;
        if steps_so_far < self.estimates {
            format!(
                "Justification: a quick estimate may be enough.\nContext: the expression is {x}\n\
                 Sub-goal: estimate {x}\nTool: base_generator"
            )
        } else if steps_so_far == 0 {
            format!(
                "Justification: the expression has several operations and must be exact.\n\
                 Context: the expression is {x}\nSub-goal: compute {x}\nTool: python_coder"
            )
        } else {
            format!(
                "Justification: an estimate is not exact; compute the value with code.\n\
                 Context: the expression is {x}\nSub-goal: compute {x}\nTool: python_coder"
            )
        }
    }

    fn estimate(&self) -> String {
        format!("about {}", super::estimate_of(&self.known.answer))
    }
}

/// The memory's steps: (tool, result) per `Step k:` line of a module's request.
fn steps_in(request: &str) -> Vec<(&str, &str)> {
    request
        .lines()
        .filter(|l| l.starts_with("Step "))
        .map(|l| {
            let tool = l
                .split_once(": tool ")
                .and_then(|(_, r)| r.split(',').next())
                .unwrap_or("");
            let result = l.rsplit_once("; result: ").map_or("", |(_, r)| r);
            (tool, result)
        })
        .collect()
}

impl ooze_rollout::oracle::Oracle for AgentflowOracle {
    fn reply(
        &self,
        caller: ooze_rollout::oracle::Caller<'_>,
        messages: &[Value],
    ) -> Result<String, String> {
        use ooze_rollout::oracle::Caller;
        let asked = super::last_text(messages);
        Ok(match caller {
            Caller::Policy => self.plan(steps_in(asked).len()),
            Caller::Helper("executor") if asked.ends_with(PYTHON_ASK) => {
                format!("```python\nprint({})\n```", self.known.expression)
            }
            Caller::Helper("executor") => self.estimate(),
            Caller::Helper("verifier") => {
                let done = steps_in(asked).last().is_some_and(|(tool, result)| {
                    *tool == "python_coder" && *result == self.known.answer
                });
                if done { "STOP" } else { "CONTINUE" }.to_owned()
            }
            Caller::Helper("generator") => {
                let steps = steps_in(asked);
                let exact = steps
                    .iter()
                    .rev()
                    .find(|(tool, r)| *tool == "python_coder" && !r.is_empty());
                let value = match exact {
                    Some((_, r)) => r.trim().to_owned(),
                    None => steps
                        .iter()
                        .rev()
                        .find_map(|(_, r)| r.strip_prefix("about "))
                        .unwrap_or("0")
                        .to_owned(),
                };
                format!("The answer is \\boxed{{{value}}}.")
            }
            Caller::Helper("judge") => {
                let response = asked.split_once("\nResponse: ").map_or("", |(_, r)| {
                    r.split("\nDoes the response").next().unwrap_or("")
                });
                let right = ooze_rollout::math_answer::last_boxed(response)
                    .is_some_and(|a| ooze_rollout::math_answer::equivalent(a, &self.known.answer));
                if right { "yes" } else { "no" }.to_owned()
            }
            Caller::Helper(other) => return Err(format!("agentflow has no helper \"{other}\"")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prompt of `problem` with answer 184.
    fn prompt(problem: &str) -> PromptItem {
        crate::recipes::test_prompt("184".into(), json!({ "problem": problem }), Vec::new())
    }

    #[test]
    fn plans() {
        let plan =
            parse_plan("Justification: j\nContext: c\nSub-goal: compute 2+2\nTool: python_coder.")
                .unwrap();
        assert_eq!(plan.sub_goal, "compute 2+2");
        assert_eq!(plan.tool, "python_coder");
        assert!(parse_plan("Sub-goal: x\nTool: web_search")
            .unwrap_err()
            .contains("unknown tool"));
        assert!(parse_plan("Sub-goal: x").unwrap_err().contains("Tool:"));
        assert!(parse_plan("Tool: base_generator")
            .unwrap_err()
            .contains("Sub-goal"));
        let oracle = |problem: &str| AgentflowOracle::new(&prompt(problem)).unwrap();
        for problem in [
            "Compute ((20 + 4) - 1) * 8",
            "Compute (5 * 7) + 149",
            "Compute 1 + 183",
        ] {
            let o = oracle(problem);
            for steps in 0..3 {
                assert!(parse_plan(&o.plan(steps)).is_ok());
            }
        }
    }

    #[test]
    fn the_oracle_plays_the_modules() {
        use ooze_rollout::oracle::{Caller, Oracle};
        let o = AgentflowOracle::new(&prompt("Compute ((20 + 4) - 1) * 8")).unwrap();
        let ask = |who, text: String| {
            o.reply(who, &[json!({"role": "user", "content": text})])
                .unwrap()
        };
        let step = parse_plan(&o.plan(0)).unwrap();
        let plan = Plan {
            tool: "python_coder".into(),
            ..step
        };
        let p = "Compute ((20 + 4) - 1) * 8";
        let code = ask(Caller::Helper("executor"), executor_request(p, &plan));
        let estimate = |tool: &str| Plan {
            tool: tool.into(),
            ..plan.clone()
        };
        assert_eq!(
            ask(
                Caller::Helper("executor"),
                executor_request(p, &estimate("base_generator"))
            ),
            "about 180"
        );
        assert!(code.contains("print(((20 + 4) - 1) * 8)"), "{code}");
        let exact = memory_text(&[memory_entry(&plan, "184")]);
        let rough = memory_text(&[memory_entry(&estimate("base_generator"), "about 180")]);
        assert_eq!(
            ask(Caller::Helper("verifier"), verifier_request(p, &exact)),
            "STOP"
        );
        assert_eq!(
            ask(Caller::Helper("verifier"), verifier_request(p, &rough)),
            "CONTINUE"
        );
        assert!(
            ask(Caller::Helper("generator"), generator_request(p, &exact)).contains("\\boxed{184}")
        );
        assert!(
            ask(Caller::Helper("generator"), generator_request(p, &rough)).contains("\\boxed{180}")
        );
        assert_eq!(
            ask(
                Caller::Helper("judge"),
                judge_request(p, "184", "so \\boxed{184}.")
            ),
            "yes"
        );
        assert_eq!(
            ask(
                Caller::Helper("judge"),
                judge_request(p, "184", "so \\boxed{180}.")
            ),
            "no"
        );
        assert!(o.reply(Caller::Helper("nobody"), &[]).is_err());
    }

    #[test]
    fn verdicts() {
        assert_eq!(judge_verdict("Yes, it matches."), Some(true));
        assert_eq!(judge_verdict("no"), Some(false));
        assert_eq!(
            judge_verdict("The response is incorrect; yes?"),
            Some(false)
        );
        assert_eq!(judge_verdict("maybe"), None);
    }
}
