//! ToolOrchestra: an orchestrator (the policy) solves a problem by calling expert models as tools,
//! paying for each. Tools, called as `<tool_call>{"name": …, "arguments": {"model": …}}</tool_call>`:
//! - `reason(model)`: the expert writes Python for the problem (given what is known so far); the
//!   sandbox runs it and the code and its output join the context;
//! - `search(model)` (with a corpus): the expert writes a query, BM25 returns documents;
//! - `answer(model)`: the expert answers in `\boxed{}`; this ends the execution.
//!
//! Tool descriptions list every expert with its price and its measured mean latency. The context
//! is rebuilt every turn (problem, documents, code and outputs, earlier attempts), so each turn is
//! its own conversation and sample; all share the execution's reward:
//! `correct − min(max_penalty, cost_weight · cost$ + latency_s / latency_scale_secs)`. The recipe
//! clips group z-scores at ±3 and drops groups whose reward std is ≤ 0.1.

use super::problem_text;
use crate::parse::tool_calls;
use crate::sandbox::Sandbox;
use crate::search::{format_documents, Searcher};
use ooze_rollout::agent::{Agent, AgentContext, AgentError, AgentFuture, AgentOutput};
use ooze_rollout::math_answer::{equivalent, last_boxed};
use ooze_rollout::prompts::PromptItem;
use ooze_rollout::qa::exact_match;
use ooze_rollout::reward::golds;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Mutex;

#[derive(Debug, Clone)]
pub struct OrchestraConfig {
    /// Orchestrator turns at most.
    pub max_turns: usize,
    /// The helpers the orchestrator may call.
    pub experts: Vec<String>,
    pub cost_weight: f64,
    pub latency_scale_secs: f64,
    pub max_penalty: f64,
    /// Tokens per expert call, and of each tool result kept in the context.
    pub expert_tokens: usize,
    pub max_observation_tokens: usize,
    pub topk: usize,
}

pub struct ToolOrchestraAgent {
    pub sandbox: Sandbox,
    pub searcher: Option<Searcher>,
    pub config: OrchestraConfig,
    /// Per expert: total seconds and calls so far in this run (for the tool descriptions).
    latency: Mutex<BTreeMap<String, (f64, usize)>>,
}

/// An expert as the orchestrator's tool description shows it.
#[derive(Debug, Clone)]
pub struct Expert {
    pub name: String,
    pub description: String,
    pub price_per_million_tokens: f64,
    /// Measured mean seconds per call (`None` before the first call).
    pub latency_secs: Option<f64>,
}

/// The tools and the experts, with prices and latencies.
pub fn tools_description(experts: &[Expert], search: bool) -> String {
    let models: String = experts
        .iter()
        .map(|e| {
            let latency = e
                .latency_secs
                .map_or("unmeasured".to_owned(), |s| format!("{s:.1} s"));
            format!(
                "- {}: {} (${:.2} per million tokens, latency {latency})\n",
                e.name, e.description, e.price_per_million_tokens
            )
        })
        .collect();
    let search = if search {
        "- search(model): the model writes a search query; documents come back\n"
    } else {
        ""
    };
    format!(
        "Tools (call one per turn as <tool_call>{{\"name\": \"TOOL\", \"arguments\": \
         {{\"model\": \"MODEL\"}}}}</tool_call>):\n- reason(model): the model writes and runs \
         Python for the problem\n{search}- answer(model): the model gives the final answer; \
         this ends the task\nModels:\n{models}"
    )
}

/// The orchestrator's prompt of one turn: the tools, the problem, what is known so far.
pub fn orchestrator_prompt(tools: &str, problem: &str, known: &str) -> String {
    format!(
        "Solve the problem by calling models as tools; cheaper and faster is better when it is \
         still right.\n{tools}\nProblem: {problem}\n{known}"
    )
}

/// What the orchestrator asks an expert for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertTask {
    Answer,
    Reason,
    Search,
}

/// The one user message an expert gets: the problem, what is known so far, the task.
pub fn expert_request(task: ExpertTask, problem: &str, known: &str) -> String {
    let ask = match task {
        ExpertTask::Answer => "Give the final answer in \\boxed{}.",
        ExpertTask::Reason => {
            "Write Python that solves the problem and prints the answer, in one ```python block."
        }
        ExpertTask::Search => {
            "Write one short search query that would find what is missing. Reply with the query \
             only."
        }
    };
    format!("Problem: {problem}\n{known}\n{ask}")
}

/// The efficiency reward: `correct − min(max_penalty, cost_weight·cost + latency/scale)`.
pub fn reward(correct: bool, cost: f64, latency_secs: f64, config: &OrchestraConfig) -> f64 {
    let penalty = (config.cost_weight * cost + latency_secs / config.latency_scale_secs)
        .min(config.max_penalty);
    correct as u8 as f64 - penalty
}

/// Whether `answer` is right for `label`: math-equivalent, or an exact match of a gold answer.
fn is_correct(answer: &str, label: &str) -> bool {
    equivalent(answer, label) || exact_match(answer, &golds(label)) == 1.0
}

/// What the orchestrator knows so far, rebuilt into every turn's prompt.
#[derive(Default)]
struct Context {
    documents: Vec<String>,
    code: Vec<String>,
    attempts: Vec<String>,
}

impl Context {
    fn text(&self) -> String {
        let section = |title: &str, items: &[String]| {
            if items.is_empty() {
                String::new()
            } else {
                format!("\n{title}:\n{}\n", items.join("\n"))
            }
        };
        section("Documents", &self.documents)
            + &section("Code and outputs", &self.code)
            + &section("Earlier attempts", &self.attempts)
    }
}

impl ToolOrchestraAgent {
    pub fn new(sandbox: Sandbox, searcher: Option<Searcher>, config: OrchestraConfig) -> Self {
        ToolOrchestraAgent {
            sandbox,
            searcher,
            config,
            latency: Mutex::new(BTreeMap::new()),
        }
    }

    /// The tool descriptions, with each expert's measured mean latency so far.
    fn tools_text(&self, ctx: &AgentContext) -> String {
        let latency = self.latency.lock().expect("never poisoned");
        let experts: Vec<Expert> = self
            .config
            .experts
            .iter()
            .filter_map(|name| ctx.helpers().get(name).ok())
            .map(|h| Expert {
                name: h.name.clone(),
                description: h.description.clone(),
                price_per_million_tokens: h.price_per_million_tokens,
                latency_secs: latency.get(&h.name).map(|(s, n)| s / *n as f64),
            })
            .collect();
        tools_description(&experts, self.searcher.is_some())
    }

    async fn ask(
        &self,
        ctx: &AgentContext,
        expert: &str,
        text: String,
    ) -> Result<String, AgentError> {
        let reply = ctx
            .prompt_helper(expert, &text, self.config.expert_tokens)
            .await?;
        let mut latency = self.latency.lock().expect("never poisoned");
        let e = latency.entry(expert.to_owned()).or_default();
        e.0 += reply.latency.as_secs_f64();
        e.1 += 1;
        Ok(reply.text)
    }
}

impl Agent for ToolOrchestraAgent {
    fn run<'a>(&'a self, ctx: &'a mut AgentContext, prompt: &'a PromptItem) -> AgentFuture<'a> {
        Box::pin(async move {
            let problem = problem_text(prompt)?.to_owned();
            let mut known = Context::default();
            let mut samples = Vec::new();
            let mut answer: Option<String> = None;
            let mut tool_seconds = 0.0;
            let mut counts: BTreeMap<String, f64> = BTreeMap::new();
            for _ in 0..self.config.max_turns {
                let text = orchestrator_prompt(&self.tools_text(ctx), &problem, &known.text());
                let mut conv = ctx.start(vec![json!({"role": "user", "content": text})], None)?;
                let turn = ctx.generate(&mut conv, &["</tool_call>"]).await?;
                samples.push(conv.sample);
                let call = match tool_calls(&turn.text).into_iter().next() {
                    None => Err("no tool call".to_owned()),
                    Some(Err(e)) => Err(e.0),
                    Some(Ok(call)) => call
                        .string_argument("model")
                        .map(|m| (call.name.clone(), m.to_owned()))
                        .map_err(|e| e.0),
                };
                let (tool, expert) = match call {
                    Ok((tool, expert)) if !self.config.experts.contains(&expert) => {
                        known.attempts.push(format!(
                            "{tool}: unknown model \"{expert}\" (models: {})",
                            self.config.experts.join(", ")
                        ));
                        *counts.entry("invalid_calls".into()).or_default() += 1.0;
                        continue;
                    }
                    Ok(pair) => pair,
                    Err(problem_with_call) => {
                        known
                            .attempts
                            .push(format!("invalid call: {problem_with_call}"));
                        *counts.entry("invalid_calls".into()).or_default() += 1.0;
                        continue;
                    }
                };
                *counts.entry(format!("calls/{expert}")).or_default() += 1.0;
                let request = |tool| expert_request(tool, &problem, &known.text());
                match tool.as_str() {
                    "answer" => {
                        let reply = self.ask(ctx, &expert, request(ExpertTask::Answer)).await?;
                        answer = Some(reply);
                        break;
                    }
                    "reason" => {
                        let reply = self.ask(ctx, &expert, request(ExpertTask::Reason)).await?;
                        let result = match super::run_written_code(&self.sandbox, &reply).await? {
                            Ok((code, run)) => {
                                tool_seconds += run.duration.as_secs_f64();
                                format!("{code}\n# output:\n{}", run.observation())
                            }
                            Err(nothing) => format!("{expert}: {nothing}"),
                        };
                        known
                            .code
                            .push(ctx.truncate(&result, self.config.max_observation_tokens)?);
                    }
                    "search" if self.searcher.is_some() => {
                        let query = self.ask(ctx, &expert, request(ExpertTask::Search)).await?;
                        let searcher = self.searcher.as_ref().expect("checked");
                        let docs = searcher
                            .search(&[query.trim().to_owned()], self.config.topk)
                            .await
                            .map_err(|e| AgentError::Agent(e.to_string()))?;
                        known.documents.push(ctx.truncate(
                            &format_documents(&docs[0]),
                            self.config.max_observation_tokens,
                        )?);
                    }
                    other => {
                        known.attempts.push(format!("unknown tool \"{other}\""));
                        *counts.entry("invalid_calls".into()).or_default() += 1.0;
                    }
                }
                if ctx.should_stop() {
                    break;
                }
            }
            let usage = ctx.helper_usage();
            let cost: f64 = usage.values().map(|u| u.cost).sum();
            let latency: f64 = usage.values().map(|u| u.seconds).sum::<f64>() + tool_seconds;
            let boxed = answer.as_deref().and_then(last_boxed);
            let correct = boxed.is_some_and(|a| is_correct(a, &prompt.label));
            let r = reward(correct, cost, latency, &self.config);
            let mut metrics = counts;
            metrics.extend([
                ("turns".to_string(), samples.len() as f64),
                ("answered".to_string(), answer.is_some() as u8 as f64),
                ("correct".to_string(), correct as u8 as f64),
                ("cost".to_string(), cost),
                ("latency_secs".to_string(), latency),
            ]);
            Ok(AgentOutput {
                samples,
                reward: Some(r),
                final_response: answer,
                metrics,
            })
        })
    }
}

/// `n` generated problems in the DAPO-Math row layout (see [`super::math_rows`]).
pub fn synthetic(n: usize, seed: u64, task: ooze_rollout::Task) -> Vec<Value> {
    super::math_rows(n, seed, task, str::to_owned)
}

/// The demonstrations' teacher ([`ooze_rollout::oracle`]) for a [`synthetic`] row, writing the
/// orchestrator's turns and every expert's reply in the agent's own run (tool descriptions,
/// prices and measured latencies as the run shows them). The orchestrator asks one expert listed
/// in its prompt to answer, the expert chosen by a hash of the problem, so each expert is called
/// as often and RL learns which one pays. The experts answer right: a `\boxed{}` answer, a
/// program printing the expression, or a query. The recorded expert conversations warm-start the
/// expert models (`experts.jsonl`).
pub struct OrchestraOracle {
    known: super::KnownProblem,
    pick: u64,
}

impl OrchestraOracle {
    pub fn new(prompt: &PromptItem) -> Result<OrchestraOracle, AgentError> {
        let known = super::KnownProblem::of(prompt)?;
        Ok(OrchestraOracle {
            pick: known.habit(1 << 16),
            known,
        })
    }
}

/// The model names of a tool description's `Models:` list.
fn models_in(prompt: &str) -> Vec<&str> {
    prompt
        .split_once("\nModels:\n")
        .map_or("", |(_, rest)| rest)
        .lines()
        .map_while(|l| l.strip_prefix("- "))
        .filter_map(|l| l.split_once(':').map(|(name, _)| name))
        .collect()
}

impl ooze_rollout::oracle::Oracle for OrchestraOracle {
    fn reply(
        &self,
        caller: ooze_rollout::oracle::Caller<'_>,
        messages: &[Value],
    ) -> Result<String, String> {
        use ooze_rollout::oracle::Caller;
        let asked = super::last_text(messages);
        Ok(match caller {
            Caller::Policy => {
                let models = models_in(asked);
                if models.is_empty() {
                    return Err("the orchestrator's prompt lists no models".into());
                }
                let model = models[(self.pick % models.len() as u64) as usize];
                let call = json!({"name": "answer", "arguments": {"model": model}});
                format!("<tool_call>{call}</tool_call>")
            }
            Caller::Helper(_) if asked.ends_with("in one ```python block.") => {
                format!("```python\nprint({})\n```", self.known.expression)
            }
            Caller::Helper(_) if asked.ends_with("Reply with the query only.") => {
                self.known.expression.clone()
            }
            Caller::Helper(_) => format!("\\boxed{{{}}}", self.known.answer),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn efficiency_reward() {
        let config = OrchestraConfig {
            max_turns: 4,
            experts: vec![],
            cost_weight: 5.0,
            latency_scale_secs: 500.0,
            max_penalty: 0.8,
            expert_tokens: 64,
            max_observation_tokens: 64,
            topk: 3,
        };
        assert_eq!(reward(true, 0.0, 0.0, &config), 1.0);
        assert!((reward(true, 0.01, 50.0, &config) - (1.0 - 0.05 - 0.1)).abs() < 1e-12);
        // The penalty is capped: a right answer always beats a wrong one.
        assert!((reward(true, 10.0, 1e6, &config) - 0.2).abs() < 1e-12);
        assert!((reward(false, 0.0, 100.0, &config) + 0.2).abs() < 1e-12);
        assert!(is_correct("14", "14") && is_correct("Paris", r#"["paris", "Lutetia"]"#));
    }

    #[test]
    fn the_oracle_calls_each_expert_and_plays_them() {
        use ooze_rollout::oracle::{Caller, Oracle};
        let experts: Vec<Expert> = [("small", 0.2), ("large", 3.0), ("huge", 9.0)]
            .into_iter()
            .map(|(name, price)| Expert {
                name: name.into(),
                description: "a model".into(),
                price_per_million_tokens: price,
                latency_secs: Some(0.5),
            })
            .collect();
        let tools = tools_description(&experts, true);
        let mut called = std::collections::BTreeMap::<String, usize>::new();
        for row in synthetic(30, 3, ooze_rollout::Task::Arithmetic) {
            let label = row["reward_model"]["ground_truth"].as_str().unwrap();
            let problem = row["extra_info"]["problem"].as_str().unwrap();
            let prompt =
                crate::recipes::test_prompt(label.into(), row["extra_info"].clone(), Vec::new());
            let o = OrchestraOracle::new(&prompt).unwrap();
            let ask = |caller, text: String| {
                o.reply(caller, &[json!({"role": "user", "content": text})])
                    .unwrap()
            };
            let turn = ask(Caller::Policy, orchestrator_prompt(&tools, problem, ""));
            let call = tool_calls(&turn).remove(0).unwrap();
            assert_eq!(call.name, "answer");
            *called
                .entry(call.string_argument("model").unwrap().to_owned())
                .or_default() += 1;
            let answer = ask(
                Caller::Helper("small"),
                expert_request(ExpertTask::Answer, problem, ""),
            );
            assert!(
                last_boxed(&answer).is_some_and(|a| is_correct(a, label)),
                "{answer}"
            );
            let code = ask(
                Caller::Helper("large"),
                expert_request(ExpertTask::Reason, problem, ""),
            );
            let code = crate::parse::code_block(&code, &["python"])
                .unwrap()
                .unwrap();
            assert_eq!(
                code.trim(),
                format!("print({})", crate::recipes::expression(problem))
            );
        }
        assert_eq!(called.len(), 3, "{called:?}");
    }
}
