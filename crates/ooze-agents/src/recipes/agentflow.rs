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

impl AgentflowAgent {
    /// Runs `plan`'s tool through the executor; returns the result text.
    async fn execute(
        &self,
        ctx: &AgentContext,
        problem: &str,
        plan: &Plan,
    ) -> Result<String, AgentError> {
        let tokens = self.config.helper_tokens;
        let task = format!(
            "Problem: {problem}\nContext: {}\nSub-goal: {}",
            plan.context, plan.sub_goal
        );
        if plan.tool == "python_coder" {
            let ask = format!(
                "{task}\nWrite Python code that achieves the sub-goal and prints the result, in \
                 one ```python block."
            );
            let reply = ctx.prompt_helper("executor", &ask, tokens).await?;
            Ok(
                match super::run_written_code(&self.sandbox, &reply.text).await? {
                    Ok((_, run)) => run.observation(),
                    Err(nothing) => format!("executor: {nothing}"),
                },
            )
        } else {
            let ask = format!("{task}\nAchieve the sub-goal. Be brief.");
            let reply = ctx.prompt_helper("executor", &ask, tokens).await?;
            Ok(reply.text)
        }
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
                        format!(
                            "tool {}, sub-goal: {}; result: {result}",
                            plan.tool, plan.sub_goal
                        )
                    }
                };
                memory.push(entry);
                if ctx.should_stop() {
                    break;
                }
                let check = format!(
                    "Problem: {problem}\nSteps so far:\n{}\nIs the problem solved by these \
                     steps? Reply STOP if it is, CONTINUE if more steps are needed.",
                    memory_text(&memory)
                );
                let verdict = ctx.prompt_helper("verifier", &check, 16).await?;
                if verdict.text.to_ascii_uppercase().contains("STOP") {
                    stopped = true;
                    break;
                }
            }
            let ask = format!(
                "Problem: {problem}\nSteps and results:\n{}\nGive the final answer.",
                memory_text(&memory)
            );
            let answer = ctx.prompt_helper("generator", &ask, tokens).await?;
            let judge = format!(
                "Question: {problem}\nReference answer: {}\nResponse: {}\nDoes the response give \
                 the reference answer? Reply yes or no.",
                prompt.label, answer.text
            );
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

/// A planner demonstration for a [`synthetic`] row: a first step that computes the expression.
pub fn demonstration(row: &Value) -> Value {
    let problem = row["extra_info"]["problem"].as_str().unwrap_or_default();
    let expression = super::expression(problem);
    let step = format!(
        "Justification: the expression has several operations and must be exact.\n\
         Context: the expression is {expression}\nSub-goal: compute {expression}\nTool: python_coder"
    );
    json!({"messages": [
        {"role": "user", "content": planner_instruction(problem, &memory_text(&[]))},
        {"role": "assistant", "content": step},
    ]})
}

#[cfg(test)]
mod tests {
    use super::*;

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
        for row in crate::recipes::MATH_TASKS
            .iter()
            .flat_map(|(_, task)| synthetic(5, 1, *task))
        {
            let demo = demonstration(&row);
            assert!(parse_plan(demo["messages"][1]["content"].as_str().unwrap()).is_ok());
        }
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
