//! The recipes' agents, one module each.

pub mod agentflow;
pub mod memagent;
pub mod multi_agent;
pub mod retool;
pub mod search_r1;
pub mod tau_retail;
pub mod terminal;
pub mod tool_orchestra;

use crate::parse::code_block;
use crate::sandbox::{Execution, Sandbox};
use ooze_rollout::agent::AgentError;
use ooze_rollout::prompts::PromptItem;
use ooze_rollout::Task;

/// A capitalised made-up name of 2 to `max_syllables` syllables, for generated facts no model
/// knows from pretraining (memagent's documents, search_r1's corpus).
pub(crate) fn invented_name(rng: &mut ooze_core::SplitMix64, max_syllables: usize) -> String {
    const SYLLABLES: &[&str] = &[
        "ka", "lo", "mi", "ren", "tas", "vo", "qu", "zel", "dor", "fin", "gar", "hul", "is", "jo",
        "ne", "pra", "sul", "tem", "ur", "wix",
    ];
    let parts = 2 + rng.below(max_syllables.saturating_sub(1).max(1) as u64) as usize;
    let mut s: String = (0..parts)
        .map(|_| SYLLABLES[rng.below(SYLLABLES.len() as u64) as usize])
        .collect();
    s[..1].make_ascii_uppercase();
    s
}

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

/// The generated problems the arithmetic recipes can use: `arithmetic` (multi-step expressions,
/// which a small model gets right with a tool, rarely without) or `addition` (two numbers below
/// 100, which it learns to answer directly).
pub const MATH_TASKS: &[(&str, Task)] = &[
    ("arithmetic", Task::Arithmetic),
    ("addition", Task::Addition),
];

/// Which of `n` demonstrated strategies the oracle follows for `text` (a problem or question): a
/// hash of it, so the choice is fixed per problem and spread evenly over a data set. The FNV-1a
/// hash is mixed once more (SplitMix64's output step) because its low bits are weak: its lowest
/// is the parity of the bytes' lowest bits, so texts differing in one digit would alternate.
pub(crate) fn strategy(text: &str, n: u64) -> u64 {
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    ooze_core::SplitMix64::new(hash).next_u64() % n
}

/// A generated arithmetic problem as its demonstrations' oracle knows it.
pub(crate) struct KnownProblem {
    pub expression: String,
    pub answer: String,
    /// The bare problem, whose hash fixes the habit the oracle demonstrates ([`strategy`]).
    pub problem: String,
}

impl KnownProblem {
    /// The problem of `prompt` (its metadata, as the agents read it) and its label.
    pub fn of(prompt: &PromptItem) -> Result<KnownProblem, AgentError> {
        let problem = problem_text(prompt)?;
        Ok(KnownProblem {
            expression: expression(problem).to_owned(),
            answer: prompt.label.clone(),
            problem: problem.to_owned(),
        })
    }

    /// Which of `n` habits the oracle shows on this problem.
    pub fn habit(&self, n: u64) -> u64 {
        strategy(&self.problem, n)
    }
}

/// Refuses a helper's call to the oracle of an agent that asks no helpers.
pub(crate) fn policy_only(
    caller: ooze_rollout::oracle::Caller<'_>,
    agent: &str,
) -> Result<(), String> {
    match caller {
        ooze_rollout::oracle::Caller::Policy => Ok(()),
        ooze_rollout::oracle::Caller::Helper(name) => Err(format!(
            "{agent} asks no helpers, yet helper \"{name}\" was asked"
        )),
    }
}

/// A prompt for an oracle's unit test: `label`, `metadata` and the chat `messages`.
#[cfg(test)]
pub(crate) fn test_prompt(
    label: String,
    metadata: serde_json::Value,
    messages: Vec<serde_json::Value>,
) -> PromptItem {
    let text = messages
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect::<Vec<_>>()
        .join("\n");
    PromptItem {
        source_line: 1,
        text,
        input_ids: vec![1],
        label,
        metadata,
        messages,
        tools: None,
    }
}

/// The text of the last message of `messages` (what an oracle is asked, or the policy's open turn).
pub(crate) fn last_text(messages: &[serde_json::Value]) -> &str {
    messages
        .last()
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
}

/// "about N": `answer` rounded to ten, the demonstrations' guess at a sum (right one time in ten).
pub(crate) fn estimate_of(answer: &str) -> i64 {
    let value: f64 = answer.trim().parse().unwrap_or(0.0);
    ((value / 10.0).round() * 10.0) as i64
}

/// The expression of a generated problem (`Compute (3 + 4) * 2` or `What is 3 + 4?`).
pub fn expression(problem: &str) -> &str {
    let body = ["Compute ", "What is "]
        .iter()
        .find_map(|prefix| problem.strip_prefix(prefix))
        .unwrap_or(problem);
    body.trim_end_matches(['?', '.'])
}

/// A math problem set in the DAPO-Math / ReTool row layout: `prompt` chat messages (the problem
/// with `instruction` around it), `reward_model.ground_truth`, and the bare problem in
/// `extra_info.problem` (the agents' `data.metadata_key = "extra_info"`). `task` is one of
/// [`MATH_TASKS`].
pub fn math_rows(
    n: usize,
    seed: u64,
    task: Task,
    instruction: impl Fn(&str) -> String,
) -> Vec<serde_json::Value> {
    let source = format!("ooze_synthetic_{task:?}").to_lowercase();
    task.generate(n, seed)
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            // The bare question, without the task's answer-format instruction.
            let problem = item
                .prompt
                .split(". Show your steps")
                .next()
                .and_then(|p| p.split(" Answer with").next())
                .unwrap_or(&item.prompt)
                .to_owned();
            serde_json::json!({
                "data_source": source,
                "prompt": [{"role": "user", "content": instruction(&problem)}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": item.label},
                "extra_info": {"index": i, "problem": problem},
            })
        })
        .collect()
}
