//! The recipes' agents, one module each.

pub mod agentflow;
pub mod memagent;
pub mod multi_agent;
pub mod retool;
pub mod search_r1;
pub mod tool_orchestra;

use crate::parse::code_block;
use crate::sandbox::{Execution, Sandbox};
use ooze_rollout::agent::AgentError;
use ooze_rollout::prompts::PromptItem;

/// The problem statement of `prompt` for agents that write their own prompts around it: the row's
/// metadata (`data.metadata_key`) when it is a string, else its `problem` or `question` field.
pub fn problem_text(prompt: &PromptItem) -> Result<&str, AgentError> {
    let m = &prompt.metadata;
    m.as_str()
        .or_else(|| m["problem"].as_str())
        .or_else(|| m["question"].as_str())
        .ok_or_else(|| {
            AgentError::Agent(format!(
                "prompt at line {}: this agent writes its own prompts around the problem text, \
                 which it reads from the row's metadata (data.metadata_key): a string, or an \
                 object with a \"problem\" or \"question\" string",
                prompt.source_line
            ))
        })
}

/// Runs the Python block a helper model wrote in `reply` (fenced as `python`, `py` or untagged):
/// the code and its execution, or why there was nothing to run (worded for the model's context).
pub async fn run_written_code<'r>(
    sandbox: &Sandbox,
    reply: &'r str,
) -> Result<Result<(&'r str, Execution), String>, AgentError> {
    match code_block(reply, &["python", "py", ""]) {
        Some(Ok(code)) => {
            let run = sandbox
                .run_python(code)
                .await
                .map_err(|e| AgentError::Agent(e.to_string()))?;
            Ok(Ok((code, run)))
        }
        Some(Err(e)) => Ok(Err(format!("the code was malformed: {}", e.0))),
        None => Ok(Err("no code was written".into())),
    }
}

/// A math problem set in the DAPO-Math / ReTool row layout: `prompt` chat messages (the problem
/// with `instruction` around it), `reward_model.ground_truth`, and the bare problem in
/// `extra_info.problem` (the agents' `data.metadata_key = "extra_info"`).
pub fn math_rows(
    n: usize,
    seed: u64,
    instruction: impl Fn(&str) -> String,
) -> Vec<serde_json::Value> {
    ooze_rollout::Task::Arithmetic
        .generate(n, seed)
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let problem = item
                .prompt
                .split(". Show your steps")
                .next()
                .unwrap_or(&item.prompt)
                .to_owned();
            serde_json::json!({
                "data_source": "ooze_synthetic_arithmetic",
                "prompt": [{"role": "user", "content": instruction(&problem)}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": item.label},
                "extra_info": {"index": i, "problem": problem},
            })
        })
        .collect()
}
