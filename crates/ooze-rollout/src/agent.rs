//! The agent API: one execution of one prompt, multi-turn, token-in/token-out.
//!
//! An [`Agent`] gets an [`AgentContext`] and builds one or more [`Conversation`]s with it:
//! - [`AgentContext::generate`] sends the conversation's exact tokens to the engine and appends the
//!   tokens it sampled, with their log-probs, as trained tokens (mask 1). They are never
//!   re-tokenised: the decoded text goes into the chat history only for rendering what follows.
//! - [`AgentContext::append_text`] appends environment text inside the running assistant turn
//!   (Search-R1's `<information>` blocks); [`AgentContext::append_message`] closes the turn and
//!   appends a new chat message (a tool result, a user turn) as exactly the tokens the chat template
//!   adds to the conversation, followed by the generation prompt. Both have loss mask 0.
//! - Budgets: tokens per turn, response tokens per conversation, the model's context, and a
//!   wall-clock deadline for the whole execution. Generation past the deadline or after
//!   [`CancelToken::cancel`] is aborted in the engine and the conversation is marked aborted.
//!
//! The agent returns its conversations as [`Sample`]s (siblings: one execution, one rollout id),
//! with rewards per sample, per trajectory (broadcast to the siblings), or left to the recipe's
//! scorer.
//!
//! A context made with [`AgentContext::scripted`] asks an [`Oracle`] instead of the engine and the
//! helpers, and records every conversation: the demonstrations of [`crate::oracle`].

use crate::activity::{Activity, Phase};
use crate::cancel::{wait_output, CancelToken, WaitError};
use crate::helpers::{HelperError, HelperUsage, Helpers};
use crate::oracle::{Caller, Oracle, Recording};
use crate::prompts::PromptItem;
use crate::seeds::sample_seed;
use ooze_core::{FinishReason, Sample, SplitMix64, StopMatch};
use ooze_engine::{EngineError, EngineHandle, Request, Sampling};
use ooze_model::{RenderOptions, Tokenizer};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

mod editing;
mod helper_calls;

/// What an agent's run returns: its future, boxed so agents can be trait objects.
pub type AgentFuture<'a> =
    Pin<Box<dyn Future<Output = Result<AgentOutput, AgentError>> + Send + 'a>>;

/// One execution of one prompt.
pub trait Agent: Send + Sync {
    fn run<'a>(&'a self, ctx: &'a mut AgentContext, prompt: &'a PromptItem) -> AgentFuture<'a>;
}

/// What one execution produced.
#[derive(Debug, Clone, Default)]
pub struct AgentOutput {
    /// The trainable conversations (siblings), in order. Each keeps its own prompt/response split.
    pub samples: Vec<Sample>,
    /// A reward for the whole execution, broadcast to every sample without its own.
    pub reward: Option<f64>,
    /// The text the recipe's scorer judges when neither the samples nor the trajectory have a
    /// reward (default: the last sample's response).
    pub final_response: Option<String>,
    /// Counts for the logs (`tool_calls`, `turns`, …), summed over a rollout.
    pub metrics: BTreeMap<String, f64>,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    #[error("chat template: {0}")]
    Template(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("{0}")]
    Helper(#[from] HelperError),
    #[error("{0}")]
    Agent(String),
}

impl From<WaitError> for AgentError {
    fn from(e: WaitError) -> AgentError {
        match e {
            WaitError::Engine(e) => AgentError::Engine(e),
            WaitError::AbortUnanswered => AgentError::Agent(WaitError::AbortUnanswered.to_string()),
        }
    }
}

/// Per-execution limits.
#[derive(Debug, Clone)]
pub struct AgentLimits {
    /// New tokens per `generate` call.
    pub max_tokens_per_turn: usize,
    /// Response tokens (generated and appended) per conversation.
    pub max_response_tokens: usize,
    /// Prompt + response tokens per conversation (the engine's slot length at most).
    pub max_context: usize,
    /// Wall clock for the whole execution, tool calls included.
    pub deadline: Duration,
}

impl Default for AgentLimits {
    fn default() -> Self {
        AgentLimits {
            max_tokens_per_turn: 512,
            max_response_tokens: 4096,
            max_context: 8192,
            deadline: Duration::from_secs(600),
        }
    }
}

/// One chat being built: its messages (for the template) and its exact tokens (the [`Sample`]).
#[derive(Debug, Clone)]
pub struct Conversation {
    pub messages: Vec<Value>,
    pub tools: Option<Vec<Value>>,
    pub sample: Sample,
    /// The last assistant turn is still open: the model stopped at a stop string, not at the
    /// template's end-of-turn token, so appending a new message must close it first.
    pub(crate) open_turn: bool,
    /// Engine calls made for this conversation.
    pub turns: usize,
    /// Its number within the execution (the order conversations started in).
    id: u64,
}

impl Conversation {
    /// The response text so far (generated and appended), special tokens included.
    pub fn response_text(&self, tokenizer: &Tokenizer) -> Result<String, AgentError> {
        tokenizer
            .decode(self.sample.response_tokens(), false)
            .map_err(|e| AgentError::Tokenizer(e.to_string()))
    }

    /// Response tokens left under `limits` (generated and appended ones both count, and the
    /// context's room).
    pub fn tokens_left(&self, limits: &AgentLimits) -> usize {
        let used = self.sample.response_length;
        limits
            .max_response_tokens
            .saturating_sub(used)
            .min(limits.max_context.saturating_sub(self.sample.tokens.len()))
    }
}

/// One `generate` call's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    /// The generated text without the end-of-turn token (other special tokens kept).
    pub text: String,
    pub finish: FinishReason,
    pub tokens: usize,
}

impl Turn {
    /// The stop string the turn ended at, if any.
    pub fn stop_text(&self) -> Option<&str> {
        match &self.finish {
            FinishReason::Stop {
                matched: StopMatch::Text(s),
            } => Some(s),
            _ => None,
        }
    }
}

/// Who writes the policy's turns.
#[derive(Clone)]
enum PolicySource {
    /// The policy's engine.
    Engine(EngineHandle),
    /// An oracle, for demonstrations; it answers the helpers' calls too, and every conversation
    /// is recorded.
    Oracle {
        oracle: Arc<dyn Oracle>,
        recording: Arc<Recording>,
    },
}

/// Which execution a context serves: sample `index` of prompt group `group`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecutionId {
    pub group: u64,
    pub index: usize,
}

/// What an agent may use during one execution. A clone is a second handle on the same execution
/// (an agent gateway session answering an external program's calls): the seeds of its calls, its
/// helper usage and its conversation numbers continue those of the original.
#[derive(Clone)]
pub struct AgentContext {
    policy: PolicySource,
    tokenizer: Arc<Tokenizer>,
    sampling: Sampling,
    limits: AgentLimits,
    deadline: Instant,
    cancel: CancelToken,
    /// Seeds the engine calls: call `k` draws with a seed derived from (seed, k).
    seed: u64,
    calls: Arc<AtomicU64>,
    helpers: Helpers,
    helper_usage: Arc<Mutex<BTreeMap<String, HelperUsage>>>,
    /// Conversations and helper calls started so far.
    conversations: Arc<AtomicU64>,
    execution: ExecutionId,
    activity: Activity,
}

impl AgentContext {
    pub fn new(
        engine: EngineHandle,
        tokenizer: Arc<Tokenizer>,
        sampling: Sampling,
        limits: AgentLimits,
        seed: u64,
        cancel: CancelToken,
    ) -> AgentContext {
        AgentContext {
            deadline: Instant::now() + limits.deadline,
            policy: PolicySource::Engine(engine),
            tokenizer,
            sampling,
            limits,
            cancel,
            seed,
            calls: Arc::default(),
            helpers: Helpers::default(),
            helper_usage: Arc::default(),
            conversations: Arc::default(),
            execution: ExecutionId::default(),
            activity: Activity::default(),
        }
    }

    /// A context whose turns and helper replies `oracle` writes, recording every conversation in
    /// `recording` (see [`crate::oracle`]).
    pub fn scripted(
        tokenizer: Arc<Tokenizer>,
        limits: AgentLimits,
        oracle: Arc<dyn Oracle>,
        recording: Arc<Recording>,
    ) -> AgentContext {
        AgentContext {
            deadline: Instant::now() + limits.deadline,
            policy: PolicySource::Oracle { oracle, recording },
            tokenizer,
            sampling: Sampling::default(),
            limits,
            cancel: CancelToken::default(),
            seed: 0,
            calls: Arc::default(),
            helpers: Helpers::default(),
            helper_usage: Arc::default(),
            conversations: Arc::default(),
            execution: ExecutionId::default(),
            activity: Activity::default(),
        }
    }

    /// The same context with `helpers` available to the agent.
    pub fn with_helpers(mut self, helpers: Helpers) -> AgentContext {
        self.helpers = helpers;
        self
    }

    /// The same context, serving sample `index` of group `group`.
    pub fn with_execution(mut self, execution: ExecutionId) -> AgentContext {
        self.execution = execution;
        self
    }

    /// The same context, counting its policy turns and helper calls in `activity`.
    pub fn with_activity(mut self, activity: Activity) -> AgentContext {
        self.activity = activity;
        self
    }

    /// Which execution this is.
    pub fn execution(&self) -> ExecutionId {
        self.execution
    }

    /// The recipe's sampling settings for the policy's turns.
    pub fn sampling(&self) -> &Sampling {
        &self.sampling
    }

    /// The cancellation token of the execution.
    pub fn cancel_token(&self) -> &CancelToken {
        &self.cancel
    }

    /// The helper models the recipe configured.
    pub fn helpers(&self) -> &Helpers {
        &self.helpers
    }

    /// The seed of the next engine or helper call.
    fn next_seed(&self) -> u64 {
        let k = self.calls.fetch_add(1, Ordering::Relaxed);
        SplitMix64::new(self.seed ^ k.wrapping_mul(0x9e37_79b9_7f4a_7c15)).next_u64()
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    pub fn limits(&self) -> &AgentLimits {
        &self.limits
    }

    /// When the execution must end.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Wall-clock time left (zero once past the deadline).
    pub fn time_left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Whether the execution was cancelled or ran out of time.
    pub fn should_stop(&self) -> bool {
        self.cancel.is_cancelled() || self.time_left().is_zero()
    }

    pub(crate) fn template_error(e: impl std::fmt::Display) -> AgentError {
        AgentError::Template(e.to_string())
    }

    /// The chat template a conversation with (or without) `tools` renders with.
    pub(crate) fn template(
        &self,
        tools: &Option<Vec<Value>>,
    ) -> Result<&ooze_model::ChatTemplate, AgentError> {
        self.tokenizer
            .chat_template(tools.is_some())
            .map_err(Self::template_error)
    }

    pub(crate) fn encode(&self, text: &str) -> Result<Vec<u32>, AgentError> {
        self.tokenizer
            .encode(text, false)
            .map_err(|e| AgentError::Tokenizer(e.to_string()))
    }

    pub(crate) fn render_options(
        &self,
        tools: &Option<Vec<Value>>,
        generation: bool,
    ) -> RenderOptions {
        RenderOptions {
            add_generation_prompt: generation,
            tools: tools.clone(),
            kwargs: Default::default(),
        }
    }

    /// A conversation whose prompt is `messages` rendered with the generation prompt.
    pub fn start(
        &self,
        messages: Vec<Value>,
        tools: Option<Vec<Value>>,
    ) -> Result<Conversation, AgentError> {
        let template = self.template(&tools)?;
        let text = template
            .render(&messages, &self.render_options(&tools, true))
            .map_err(Self::template_error)?;
        let ids = self.encode(&text)?;
        Ok(self.start_tokens(messages, tools, ids))
    }

    /// A conversation whose prompt is `ids`, already rendered from `messages` and `tools`.
    pub(crate) fn start_tokens(
        &self,
        messages: Vec<Value>,
        tools: Option<Vec<Value>>,
        ids: Vec<u32>,
    ) -> Conversation {
        Conversation {
            messages,
            tools,
            sample: Sample::with_prompt(ids),
            open_turn: false,
            turns: 0,
            id: self.conversations.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// A conversation that starts from an already rendered prompt (the dataset's `input_ids`); its
    /// messages are the ones the prompt was rendered from (none for a raw text prompt).
    pub fn start_rendered(&self, prompt: &PromptItem) -> Conversation {
        self.start_tokens(prompt.messages.clone(), None, prompt.input_ids.clone())
    }

    /// Generates the next assistant tokens of `conv`, stopping at `stop` strings (kept in the
    /// output, nothing after them), the end-of-turn token, the turn and conversation budgets, or
    /// the deadline. The tokens join the conversation with mask 1 and the engine's log-probs.
    pub async fn generate(
        &self,
        conv: &mut Conversation,
        stop: &[&str],
    ) -> Result<Turn, AgentError> {
        self.generate_streaming(conv, stop, None, &mut |_, _| true)
            .await
    }

    /// [`AgentContext::generate`] with at most `max_tokens` new tokens (within the budgets), and
    /// `on_token` called with each token and its log-prob as the engine samples it (an oracle's
    /// turn is given whole at the end); `on_token` returning false aborts the turn.
    pub async fn generate_streaming(
        &self,
        conv: &mut Conversation,
        stop: &[&str],
        max_tokens: Option<usize>,
        on_token: &mut (dyn FnMut(u32, f32) -> bool + Send),
    ) -> Result<Turn, AgentError> {
        let budget = conv
            .tokens_left(&self.limits)
            .min(self.limits.max_tokens_per_turn)
            .min(max_tokens.unwrap_or(usize::MAX));
        if budget == 0 || self.should_stop() {
            let finish = if budget == 0 {
                FinishReason::Length
            } else {
                FinishReason::Abort
            };
            conv.sample.finish(&finish);
            return Ok(Turn {
                text: String::new(),
                finish,
                tokens: 0,
            });
        }
        let output = match &self.policy {
            PolicySource::Engine(engine) => {
                let mut sampling = self.sampling.clone();
                sampling.max_new_tokens = budget;
                sampling.stop = stop.iter().map(|s| s.to_string()).collect();
                sampling.seed = Some(self.next_seed());
                let request = Request {
                    input_ids: conv.sample.tokens.clone(),
                    sampling,
                    // One conversation, one engine (its prefix stays cached there).
                    session: Some(
                        conv.sample.group.wrapping_mul(0x9e37_79b9_7f4a_7c15)
                            ^ conv.sample.execution as u64,
                    ),
                };
                let _generating = self.activity.enter(Phase::Generating);
                wait_output(engine, request, self.deadline, &self.cancel, on_token).await?
            }
            PolicySource::Oracle { oracle, .. } => {
                let output = self.scripted_turn(oracle.as_ref(), conv, stop, budget)?;
                for (&t, &lp) in output.tokens.iter().zip(&output.log_probs) {
                    on_token(t, lp);
                }
                output
            }
        };
        conv.sample
            .push_generated(&output.tokens, &output.log_probs, &output.versions())
            .map_err(|e| AgentError::Agent(e.to_string()))?;
        conv.sample.finish(&output.finish);
        conv.turns += 1;
        // The turn is closed only when the model produced a stop token (the end of turn). The
        // history keeps the text of every other token, special ones included, so that the
        // template renders the conversation back to these very tokens.
        let closed = matches!(
            output.finish,
            FinishReason::Stop {
                matched: StopMatch::Token(_)
            }
        );
        let own = &output.tokens[..output.tokens.len() - usize::from(closed)];
        let text = self
            .tokenizer
            .decode(own, false)
            .map_err(|e| AgentError::Tokenizer(e.to_string()))?;
        let continuing = conv.open_turn
            && conv.messages.last().and_then(|m| m["role"].as_str()) == Some("assistant");
        if continuing {
            let last = conv.messages.last_mut().expect("checked");
            let content = last["content"].as_str().unwrap_or("").to_owned() + &text;
            last["content"] = Value::String(content);
        } else {
            conv.messages
                .push(json!({"role": "assistant", "content": text.clone()}));
        }
        conv.open_turn = !closed;
        if let PolicySource::Oracle { recording, .. } = &self.policy {
            recording.put(conv.id, "policy", &conv.messages);
        }
        Ok(Turn {
            text,
            finish: output.finish,
            tokens: output.tokens.len(),
        })
    }

    /// The oracle's turn as the engine would return it: the reply's tokens, ending at a stop
    /// string (the turn stays open) or with the end-of-turn token, cut to `budget`.
    fn scripted_turn(
        &self,
        oracle: &dyn Oracle,
        conv: &Conversation,
        stop: &[&str],
        budget: usize,
    ) -> Result<ooze_engine::Output, AgentError> {
        let text = oracle
            .reply(Caller::Policy, &conv.messages)
            .map_err(AgentError::Agent)?;
        let mut tokens = self.encode(&text)?;
        let mut finish = match stop.iter().find(|s| text.ends_with(**s)) {
            Some(s) => FinishReason::Stop {
                matched: StopMatch::Text((*s).to_owned()),
            },
            None => {
                // The end-of-turn token: the first token of what the template writes after an
                // assistant message's content.
                let mut closed = conv.clone();
                closed
                    .messages
                    .push(json!({"role": "assistant", "content": text}));
                let eos = *self
                    .encode(&self.turn_closing(&closed)?)?
                    .first()
                    .ok_or_else(|| {
                        AgentError::Template("the template closes a turn with no text".into())
                    })?;
                tokens.push(eos);
                FinishReason::Stop {
                    matched: StopMatch::Token(eos),
                }
            }
        };
        if tokens.len() > budget {
            tokens.truncate(budget);
            finish = FinishReason::Length;
        }
        Ok(ooze_engine::Output {
            id: ooze_engine::RequestId(0),
            log_probs: vec![0.0; tokens.len()],
            prompt_log_probs: Vec::new(),
            prompt_tokens: conv.sample.tokens.len(),
            cached_tokens: 0,
            weight_version: 0,
            token_versions: Vec::new(),
            seed: 0,
            tokens,
            finish,
        })
    }
}

/// One execution's result in a group.
#[derive(Debug, Clone)]
pub struct Trajectory {
    /// Index within the group.
    pub index: usize,
    pub output: AgentOutput,
    /// Why the execution produced nothing trainable (agent error, missed deadline).
    pub error: Option<String>,
}

/// An agent with its limits and helper models, as the rollout manager runs it.
#[derive(Clone)]
pub struct AgentRollout {
    pub agent: Arc<dyn Agent>,
    pub limits: AgentLimits,
    /// How long past its deadline an execution may run before it is dropped.
    pub grace: Duration,
    /// The fixed models the agent may call.
    pub helpers: Helpers,
    /// Where executions count what they are doing (the manager restarts it per rollout).
    pub activity: Activity,
}

impl std::fmt::Debug for AgentRollout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentRollout")
            .field("limits", &self.limits)
            .field("grace", &self.grace)
            .field("helpers", &self.helpers.names().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Runs the agent once for sample `index` of prompt group `group`: its seed is the manager's
/// per-sample seed, its deadline `limits.deadline`. An agent that overruns the deadline by more
/// than `grace` is dropped (its in-flight generation aborted) and reported as an error, so one
/// stuck execution never stalls the rollout. Helper usage is added to the metrics as
/// `helper/NAME/{calls,tokens,cost,seconds}`.
#[allow(clippy::too_many_arguments)]
pub async fn run_one(
    rollout: &AgentRollout,
    engine: &EngineHandle,
    tokenizer: &Arc<Tokenizer>,
    sampling: &Sampling,
    run_seed: u64,
    group: u64,
    index: usize,
    prompt: &PromptItem,
) -> Trajectory {
    let limits = &rollout.limits;
    let cancel = CancelToken::default();
    let mut ctx = AgentContext::new(
        engine.clone(),
        tokenizer.clone(),
        sampling.clone(),
        limits.clone(),
        sample_seed(run_seed, group, index),
        cancel.clone(),
    )
    .with_helpers(rollout.helpers.clone())
    .with_execution(ExecutionId { group, index })
    .with_activity(rollout.activity.clone());
    let _alive = rollout.activity.enter(Phase::Execution);
    let hard = ctx.deadline() + rollout.grace;
    let result = tokio::time::timeout_at(hard, rollout.agent.run(&mut ctx, prompt)).await;
    let usage = ctx.helper_usage();
    match result {
        Ok(Ok(mut output)) => {
            for (name, u) in usage {
                for (key, value) in [
                    ("calls", u.calls as f64),
                    ("tokens", u.tokens as f64),
                    ("cost", u.cost),
                    ("seconds", u.seconds),
                ] {
                    output.metrics.insert(format!("helper/{name}/{key}"), value);
                }
            }
            Trajectory {
                index,
                output,
                error: None,
            }
        }
        Ok(Err(e)) => Trajectory {
            index,
            output: AgentOutput::default(),
            error: Some(e.to_string()),
        },
        Err(_) => {
            // The agent's future is dropped here; its generation in flight was aborted.
            cancel.cancel();
            Trajectory {
                index,
                output: AgentOutput::default(),
                error: Some(format!(
                    "the agent ran past its {:?} deadline (plus {:?} grace) and was stopped",
                    limits.deadline, rollout.grace
                )),
            }
        }
    }
}
