//! Multi-agent math (slime's multi-agent example): `solvers` policy calls solve the problem in
//! parallel; as many rewriters, each shown every solution, write improved ones in parallel; a
//! selector reads the rewritten solutions and names the best as `Judgment: <number>`. Every call
//! is its own conversation and a trainable sample; all of one execution are siblings (one rollout
//! id).
//!
//! Rewards per sample: a solver or rewriter scores 1 when its own `\boxed{}` answer is right, the
//! selector the score of the solution it chose (0 when it chose none); then every sample is
//! multiplied by 1.2 when the selected answer is right and by 0.8 when it is not.

use super::problem_text;
use futures_util::future::join_all;
use ooze_rollout::agent::{
    Agent, AgentContext, AgentError, AgentFuture, AgentOutput, Conversation,
};
use ooze_rollout::math_answer::{equivalent, last_boxed};
use ooze_rollout::prompts::PromptItem;
use serde_json::{json, Value};
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
pub struct MultiAgentConfig {
    /// Parallel solvers, and as many rewriters.
    pub solvers: usize,
}

impl Default for MultiAgentConfig {
    fn default() -> Self {
        MultiAgentConfig { solvers: 5 }
    }
}

pub struct MultiAgent {
    pub config: MultiAgentConfig,
}

/// The solver's instruction around a problem.
pub fn solver_instruction(problem: &str) -> String {
    format!("Solve the problem step by step and put the final answer in \\boxed{{}}.\nProblem: {problem}")
}

fn rewriter_instruction(problem: &str, solutions: &[String]) -> String {
    let mut text = format!(
        "Problem: {problem}\n\nOther solvers wrote these solutions. Check them and write one \
         improved, correct solution with the final answer in \\boxed{{}}.\n"
    );
    for (i, s) in solutions.iter().enumerate() {
        text.push_str(&format!("\nSolution {}:\n{s}\n", i + 1));
    }
    text
}

fn selector_instruction(problem: &str, solutions: &[String]) -> String {
    let mut text = format!(
        "Problem: {problem}\n\nChoose the best of these solutions. End with \
         \"Judgment: <number>\".\n"
    );
    for (i, s) in solutions.iter().enumerate() {
        text.push_str(&format!("\nSolution {}:\n{s}\n", i + 1));
    }
    text
}

/// The solution number in the last `Judgment: N` of `text`, if it is in `1..=n`.
pub fn judgment(text: &str, n: usize) -> Option<usize> {
    let at = text.rfind("Judgment:")?;
    let digits: String = text[at + "Judgment:".len()..]
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok().filter(|k| (1..=n).contains(k))
}

fn correct(text: &str, label: &str) -> f64 {
    last_boxed(text).is_some_and(|a| equivalent(a, label)) as u8 as f64
}

impl MultiAgent {
    /// One conversation per prompt text, all generated at once; returns them with their texts.
    async fn generate_all(
        ctx: &AgentContext,
        prompts: Vec<String>,
    ) -> Result<(Vec<Conversation>, Vec<String>), AgentError> {
        let mut convs = prompts
            .into_iter()
            .map(|p| ctx.start(vec![json!({"role": "user", "content": p})], None))
            .collect::<Result<Vec<_>, _>>()?;
        let turns = join_all(convs.iter_mut().map(|c| ctx.generate(c, &[]))).await;
        let texts = turns
            .into_iter()
            .map(|t| t.map(|t| t.text))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((convs, texts))
    }

    /// `texts` cut so that `n` of them and a turn fit in one conversation.
    fn excerpts(
        ctx: &AgentContext,
        problem: &str,
        texts: &[String],
    ) -> Result<Vec<String>, AgentError> {
        let limits = ctx.limits();
        let fixed = ctx
            .tokenizer()
            .encode(problem, false)
            .map_err(|e| AgentError::Tokenizer(e.to_string()))?
            .len()
            + limits.max_tokens_per_turn
            + 96;
        let each = limits.max_context.saturating_sub(fixed) / texts.len().max(1);
        texts.iter().map(|t| ctx.truncate(t, each.max(8))).collect()
    }
}

impl Agent for MultiAgent {
    fn run<'a>(&'a self, ctx: &'a mut AgentContext, prompt: &'a PromptItem) -> AgentFuture<'a> {
        Box::pin(async move {
            let problem = problem_text(prompt)?.to_owned();
            let n = self.config.solvers;
            let (solvers, solutions) =
                Self::generate_all(ctx, vec![solver_instruction(&problem); n]).await?;
            let shown = Self::excerpts(ctx, &problem, &solutions)?;
            let (rewriters, rewritten) =
                Self::generate_all(ctx, vec![rewriter_instruction(&problem, &shown); n]).await?;
            let shown = Self::excerpts(ctx, &problem, &rewritten)?;
            let (mut selector, choice) =
                Self::generate_all(ctx, vec![selector_instruction(&problem, &shown)]).await?;
            let chosen = judgment(&choice[0], n);
            let label = &prompt.label;
            let mut rewards: Vec<f64> = solutions
                .iter()
                .chain(&rewritten)
                .map(|t| correct(t, label))
                .collect();
            let selected = chosen.map_or(0.0, |k| correct(&rewritten[k - 1], label));
            rewards.push(selected);
            let scale = if selected == 1.0 { 1.2 } else { 0.8 };
            let mut samples: Vec<_> = solvers
                .into_iter()
                .chain(rewriters)
                .chain(selector.pop())
                .map(|c| c.sample)
                .collect();
            for (s, r) in samples.iter_mut().zip(&rewards) {
                s.reward = Some(r * scale);
            }
            let metrics = BTreeMap::from([
                (
                    "solver_correct".to_string(),
                    rewards[..n].iter().sum::<f64>() / n as f64,
                ),
                (
                    "rewriter_correct".to_string(),
                    rewards[n..2 * n].iter().sum::<f64>() / n as f64,
                ),
                ("selector_parsed".to_string(), chosen.is_some() as u8 as f64),
                ("correct".to_string(), selected),
            ]);
            Ok(AgentOutput {
                samples,
                reward: None,
                final_response: chosen.map(|k| rewritten[k - 1].clone()),
                metrics,
            })
        })
    }
}

/// `n` generated problems in the DAPO-Math row layout (see [`super::math_rows`]).
pub fn synthetic(n: usize, seed: u64, task: ooze_rollout::Task) -> Vec<Value> {
    super::math_rows(n, seed, task, solver_instruction)
}

/// SFT demonstrations for a [`synthetic`] row, one per role: a solver's and a rewriter's worked
/// answer, and a selector's judgment. Each is `{"messages": [user, assistant]}`.
pub fn demonstrations(row: &Value, solvers: usize) -> Vec<Value> {
    let (problem, expression, answer) = super::worked_problem(row);
    let solution = format!("{expression} = {answer}, so the answer is \\boxed{{{answer}}}.");
    let solutions = vec![solution.clone(); solvers];
    let chat = |user: String, assistant: String| json!({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]});
    vec![
        chat(solver_instruction(problem), solution.clone()),
        chat(rewriter_instruction(problem, &solutions), solution),
        chat(
            selector_instruction(problem, &solutions),
            "All solutions agree. Judgment: 1".into(),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judgments() {
        assert_eq!(judgment("… Judgment: 3", 5), Some(3));
        assert_eq!(judgment("Judgment: 2 then Judgment: 4", 5), Some(4));
        assert_eq!(judgment("Judgment: 6", 5), None);
        assert_eq!(judgment("Judgment: none", 5), None);
        assert_eq!(judgment("no verdict", 5), None);
    }

    #[test]
    fn demonstrations_are_right() {
        for row in crate::recipes::MATH_TASKS
            .iter()
            .flat_map(|(_, task)| synthetic(10, 1, *task))
        {
            let label = row["reward_model"]["ground_truth"].as_str().unwrap();
            let demos = demonstrations(&row, 3);
            let reply = |d: &Value| d["messages"][1]["content"].as_str().unwrap().to_owned();
            assert_eq!(correct(&reply(&demos[0]), label), 1.0);
            assert_eq!(correct(&reply(&demos[1]), label), 1.0);
            assert_eq!(judgment(&reply(&demos[2]), 3), Some(1));
        }
    }
}
