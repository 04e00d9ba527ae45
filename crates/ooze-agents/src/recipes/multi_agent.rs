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

/// The demonstrations' teacher ([`ooze_rollout::oracle`]) for a [`synthetic`] row, writing every
/// call of the agent's own run (the rewriters and the selector see the solvers' real solutions,
/// as many as `agent.solvers`). Each call takes a good habit one time in three and a weak one
/// otherwise, so the warm-started policy starts imperfect and RL has the good habits to find:
/// - solvers: compute the expression exactly, or estimate it rounded to ten (right one time in
///   ten);
/// - rewriters: check the problem by computing it exactly, or trust the first solution and
///   rewrite it as it is (right when that solver was).
///
/// Each call's habit is fixed by a hash of the problem, the role and the call's number, so the
/// habits of one problem's calls are independent: rewriters and the selector are shown every mix
/// of right and wrong solutions, as they will be once RL has made the solvers better. The selector
/// chooses the solution most solutions agree on (the first of the most common boxed answers), so
/// RL can also teach it to tell a right solution from a wrong one.
pub struct MultiAgentOracle {
    known: super::KnownProblem,
    solved: std::sync::atomic::AtomicU64,
    rewritten: std::sync::atomic::AtomicU64,
}

impl MultiAgentOracle {
    pub fn new(prompt: &PromptItem) -> Result<MultiAgentOracle, AgentError> {
        let known = super::KnownProblem::of(prompt)?;
        Ok(MultiAgentOracle {
            solved: Default::default(),
            rewritten: Default::default(),
            known,
        })
    }

    /// Whether `role`'s next call (`calls` counts them) takes the good habit (one time in three;
    /// with one in two, the warm-started agent was right three times in four before any RL).
    fn good_habit(&self, role: &str, calls: &std::sync::atomic::AtomicU64) -> bool {
        let k = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        super::strategy(&format!("{} {role} {k}", self.known.problem), 3) == 0
    }

    /// The exact solution.
    fn exact(&self) -> String {
        format!(
            "{} = {}, so the answer is \\boxed{{{}}}.",
            self.known.expression, self.known.answer, self.known.answer
        )
    }

    /// A solver's solution.
    fn solve(&self) -> String {
        if self.good_habit("solver", &self.solved) {
            return self.exact();
        }
        let guess = super::estimate_of(&self.known.answer);
        format!(
            "{} is about {guess}, so the answer is \\boxed{{{guess}}}.",
            self.known.expression
        )
    }

    /// A rewriter's solution, shown `solutions`.
    fn rewrite(&self, solutions: &[&str]) -> String {
        match solutions.first() {
            Some(first) if !self.good_habit("rewriter", &self.rewritten) => (*first).to_owned(),
            _ => self.exact(),
        }
    }
}

/// The solutions of a rewriter's or selector's request, in order.
fn solutions_in(request: &str) -> Vec<&str> {
    request
        .split("\nSolution ")
        .skip(1)
        .map(|s| s.split_once(":\n").map_or("", |(_, text)| text.trim_end()))
        .collect()
}

/// The index of the first solution whose boxed answer is the most common one.
fn agreed(solutions: &[&str]) -> Option<usize> {
    let answers: Vec<Option<&str>> = solutions.iter().map(|s| last_boxed(s)).collect();
    let count = |a: &Option<&str>| answers.iter().filter(|b| *b == a).count();
    (0..answers.len())
        .filter(|i| answers[*i].is_some())
        .max_by_key(|i| (count(&answers[*i]), std::cmp::Reverse(*i)))
}

impl ooze_rollout::oracle::Oracle for MultiAgentOracle {
    fn reply(
        &self,
        caller: ooze_rollout::oracle::Caller<'_>,
        messages: &[Value],
    ) -> Result<String, String> {
        super::policy_only(caller, "multi_agent")?;
        let asked = super::last_text(messages);
        let solutions = solutions_in(asked);
        let chosen = agreed(&solutions);
        Ok(if asked.contains("\nChoose the best of these solutions.") {
            format!("Judgment: {}", chosen.map_or(1, |i| i + 1))
        } else if solutions.is_empty() {
            self.solve()
        } else {
            self.rewrite(&solutions)
        })
    }
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
    fn the_oracle_solves_rewrites_and_selects() {
        use ooze_rollout::oracle::{Caller, Oracle};
        // How often two solvers were both right, one of them, neither; how often a rewriter shown
        // a wrong first solution checked the problem, and how often it trusted that solution.
        let (mut solvers_right, mut rewriters) = ([0; 3], [0, 0]);
        for row in synthetic(64, 1, ooze_rollout::Task::Addition) {
            let problem = row["extra_info"]["problem"].as_str().unwrap();
            let label = row["reward_model"]["ground_truth"].as_str().unwrap();
            if crate::recipes::estimate_of(label).to_string() == label {
                continue; // the estimate is right too
            }
            let prompt =
                crate::recipes::test_prompt(label.into(), row["extra_info"].clone(), Vec::new());
            let o = MultiAgentOracle::new(&prompt).unwrap();
            let ask = |text: String| {
                o.reply(Caller::Policy, &[json!({"role": "user", "content": text})])
                    .unwrap()
            };
            let solutions: Vec<String> = (0..2).map(|_| ask(solver_instruction(problem))).collect();
            let right = solutions
                .iter()
                .filter(|s| correct(s, label) == 1.0)
                .count();
            solvers_right[right] += 1;
            // A rewriter writes the exact solution or the first one as it is.
            let exact = format!(
                "{} = {label}, so the answer is \\boxed{{{label}}}.",
                o.known.expression
            );
            for _ in 0..2 {
                let rewritten = ask(rewriter_instruction(problem, &solutions));
                assert!(
                    rewritten == exact || rewritten == solutions[0],
                    "{rewritten}"
                );
                if correct(&solutions[0], label) == 0.0 {
                    rewriters[(rewritten == exact) as usize] += 1;
                }
            }
            // The selector names the majority's first solution.
            let shown = vec![solutions[0].clone(), exact.clone(), exact.clone()];
            let majority = if solutions[0] == exact { 1 } else { 2 };
            assert_eq!(
                judgment(&ask(selector_instruction(problem, &shown)), 3),
                Some(majority)
            );
        }
        assert!(solvers_right.iter().all(|n| *n > 0), "{solvers_right:?}");
        assert!(rewriters.iter().all(|n| *n > 0), "{rewriters:?}");
    }
}
