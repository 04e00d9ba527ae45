//! One gateway session: one execution of an external agent. Its calls, whatever API they came
//! through, arrive here as a [`ChatCall`] (OpenAI chat form) and go through the session's
//! [`Transcript`], which keeps the samples token-exact; budgets are enforced per call; every call
//! is written to the session's log. The conversations of its recent Responses API replies are kept
//! by response id, for `previous_response_id`.

use crate::error::ApiError;
use crate::tool_calls;
use ooze_core::{FinishReason, Sample, StopMatch};
use ooze_rollout::agent::{AgentContext, AgentError};
use ooze_rollout::transcript::Transcript;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What one session may use; `None` is no limit. The wall clock is the execution's deadline.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Budget {
    /// Model calls.
    pub max_calls: Option<usize>,
    /// Generated tokens over all calls.
    pub max_tokens: Option<usize>,
}

/// One model call, in OpenAI chat form whatever API it came through.
#[derive(Debug, Clone)]
pub struct ChatCall {
    /// Which API the call came through (`chat`, `responses`, `messages`), for the log.
    pub api: &'static str,
    /// Checked and normalised messages.
    pub messages: Vec<Value>,
    /// OpenAI function tools, checked; `None` renders the chat without tools.
    pub tools: Option<Vec<Value>>,
    pub stop: Vec<String>,
    /// New tokens at most (the agent's limit; the recipe's per-turn limit applies too).
    pub max_tokens: Option<usize>,
    /// The sampling settings the agent sent (`temperature`, `top_p`, `top_k`, …): recorded, not
    /// applied; the recipe's settings hold for trained calls.
    pub sent_sampling: Value,
    /// The request body as it came, for the log.
    pub request: Value,
}

/// The policy's answer to one call.
#[derive(Debug, Clone)]
pub struct ChatReply {
    /// Its number in the session, from 0.
    pub index: usize,
    /// The assistant message in OpenAI chat form: `content` (null when only tool calls) and
    /// `tool_calls` (when the chat has tools and the model wrote some).
    pub message: Value,
    /// The generated text (without the end-of-turn token).
    pub text: String,
    /// Content before any tool call, and the calls in OpenAI form (arguments as JSON strings).
    pub content: String,
    pub tool_calls: Vec<Value>,
    pub finish: FinishReason,
    pub tokens: Vec<u32>,
    pub log_probs: Vec<f32>,
    pub prompt_tokens: usize,
}

impl ChatReply {
    /// OpenAI's finish reason: `tool_calls` when the model called tools.
    pub fn finish_reason(&self) -> &'static str {
        match &self.finish {
            _ if !self.tool_calls.is_empty() => "tool_calls",
            FinishReason::Stop { .. } => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }

    /// The stop string the turn ended at, if it ended at one.
    pub fn stop_string(&self) -> Option<&str> {
        match &self.finish {
            FinishReason::Stop {
                matched: StopMatch::Text(s),
            } => Some(s),
            _ => None,
        }
    }
}

/// Counts a session reports when it closes, besides its samples.
#[derive(Debug, Default, Clone)]
struct Counts {
    calls: usize,
    tokens: usize,
    retokenized_turns: usize,
    extended: usize,
    /// Calls whose sent sampling settings differ from the recipe's.
    sampling_overridden: usize,
    ignored: BTreeMap<String, u64>,
}

/// What a closed session leaves: its samples and its metrics (`gateway/…`).
#[derive(Debug, Default)]
pub struct SessionRecord {
    pub samples: Vec<Sample>,
    pub metrics: BTreeMap<String, f64>,
    /// The text of the last assistant message generated (what `[reward]` judges when the program
    /// gives no answer).
    pub last_text: Option<String>,
}

/// How many Responses API replies a session keeps the conversation of (`previous_response_id`
/// names one of the latest).
pub const RESPONSES_KEPT: usize = 256;

/// The conversations of a session's latest Responses API replies, by response id.
#[derive(Default)]
struct ResponseHistory {
    /// Ids, oldest first.
    order: VecDeque<String>,
    conversations: HashMap<String, Vec<Value>>,
}

impl ResponseHistory {
    /// Keeps `conversation` as response `id`'s, forgetting the oldest beyond `kept`.
    fn insert(&mut self, id: String, conversation: Vec<Value>, kept: usize) {
        if self
            .conversations
            .insert(id.clone(), conversation)
            .is_none()
        {
            self.order.push_back(id);
        }
        while self.order.len() > kept {
            if let Some(oldest) = self.order.pop_front() {
                self.conversations.remove(&oldest);
            }
        }
    }
}

pub struct Session {
    pub id: String,
    ctx: AgentContext,
    budget: Budget,
    started: Instant,
    transcript: Mutex<Transcript>,
    counts: Mutex<Counts>,
    last_text: Mutex<Option<String>>,
    /// Calls generating now.
    in_flight: AtomicUsize,
    log: Option<Mutex<std::fs::File>>,
    responses: Mutex<ResponseHistory>,
}

impl Session {
    /// A session answering with `ctx` (the policy, its sampling, limits and deadline), writing its
    /// calls to `log` (JSON lines) when given.
    pub fn new(
        id: String,
        ctx: AgentContext,
        budget: Budget,
        log: Option<PathBuf>,
    ) -> std::io::Result<Session> {
        let log = match log {
            Some(path) => {
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map_err(|e| {
                        std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
                    })?;
                Some(Mutex::new(file))
            }
            None => None,
        };
        Ok(Session {
            id,
            ctx,
            budget,
            started: Instant::now(),
            transcript: Mutex::new(Transcript::default()),
            counts: Mutex::new(Counts::default()),
            last_text: Mutex::new(None),
            in_flight: AtomicUsize::new(0),
            log,
            responses: Mutex::new(ResponseHistory::default()),
        })
    }

    pub fn context(&self) -> &AgentContext {
        &self.ctx
    }

    /// Counts request fields the gateway ignored in one of this session's calls.
    pub fn count_ignored(&self, names: &[String]) {
        let mut counts = self.counts.lock().expect("never poisoned");
        for name in names {
            *counts.ignored.entry(name.clone()).or_insert(0) += 1;
        }
    }

    /// Calls generating now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Refuses a call the budget no longer allows.
    fn check_budget(&self) -> Result<(), ApiError> {
        let exhausted = |message: String| ApiError {
            code: "budget_exhausted",
            message,
        };
        if self.ctx.should_stop() {
            return Err(exhausted(format!(
                "the session's {:.0} s wall clock is over",
                self.ctx.limits().deadline.as_secs_f64()
            )));
        }
        let counts = self.counts.lock().expect("never poisoned");
        if let Some(max) = self.budget.max_calls.filter(|&m| counts.calls >= m) {
            return Err(exhausted(format!(
                "the session has made its {max} model calls (max_turns)"
            )));
        }
        if let Some(max) = self.budget.max_tokens.filter(|&m| counts.tokens >= m) {
            return Err(exhausted(format!(
                "the session has generated its {max} tokens (max_response_tokens)"
            )));
        }
        Ok(())
    }

    /// Keeps the conversation (OpenAI chat form, without the call's instructions) that Responses
    /// API reply `id` ended, for a later `previous_response_id`; the oldest beyond
    /// [`RESPONSES_KEPT`] are forgotten.
    pub fn remember_response(&self, id: String, conversation: Vec<Value>) {
        self.responses
            .lock()
            .expect("never poisoned")
            .insert(id, conversation, RESPONSES_KEPT);
    }

    /// The conversation Responses API reply `id` ended, if the session still keeps it.
    pub fn response_conversation(&self, id: &str) -> Option<Vec<Value>> {
        let history = self.responses.lock().expect("never poisoned");
        history.conversations.get(id).cloned()
    }

    /// Answers one call with the policy, calling `on_token` with each token as it is sampled.
    pub async fn call(
        &self,
        call: ChatCall,
        on_token: &mut (dyn FnMut(u32, f32) -> bool + Send),
    ) -> Result<ChatReply, ApiError> {
        self.call_with_prompt(call, &mut |_| {}, on_token).await
    }

    /// [`Session::call`], telling `on_prompt` the prompt's length in tokens once it is rendered
    /// (before the first token; a call refused earlier never calls it).
    pub async fn call_with_prompt(
        &self,
        call: ChatCall,
        on_prompt: &mut (dyn FnMut(usize) + Send),
        on_token: &mut (dyn FnMut(u32, f32) -> bool + Send),
    ) -> Result<ChatReply, ApiError> {
        self.check_budget()?;
        let begun = Instant::now();
        let mut turn_call = self
            .transcript
            .lock()
            .expect("never poisoned")
            .begin(&self.ctx, call.messages.clone(), call.tools.clone())
            .map_err(agent_error)?;
        if turn_call.conversation.tokens_left(self.ctx.limits()) == 0 {
            // The conversation's response (its turns and what was added between them) is as
            // long as the limits allow: refused, not answered with nothing.
            let limits = self.ctx.limits();
            self.transcript
                .lock()
                .expect("never poisoned")
                .abandon(turn_call);
            return Err(ApiError {
                code: "budget_exhausted",
                message: format!(
                    "the conversation is at its length limit (max_response_tokens {}, context {} tokens)",
                    limits.max_response_tokens, limits.max_context
                ),
            });
        }
        on_prompt(turn_call.prompt_tokens);
        let index = {
            let mut counts = self.counts.lock().expect("never poisoned");
            counts.calls += 1;
            counts.calls - 1
        };
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let stop: Vec<&str> = call.stop.iter().map(String::as_str).collect();
        let generated = self
            .ctx
            .generate_streaming(
                &mut turn_call.conversation,
                &stop,
                call.max_tokens,
                on_token,
            )
            .await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        let turn = match generated {
            Ok(turn) => turn,
            Err(e) => {
                self.transcript
                    .lock()
                    .expect("never poisoned")
                    .abandon(turn_call);
                return Err(agent_error(e));
            }
        };
        let sample = &turn_call.conversation.sample;
        let tokens = sample.tokens[sample.tokens.len() - turn.tokens..].to_vec();
        let log_probs =
            sample.rollout_log_probs[sample.rollout_log_probs.len() - turn.tokens..].to_vec();
        let (content, calls) = match &call.tools {
            Some(_) => {
                let parsed = tool_calls::parse(&turn.text, &format!("call_{}_{index}", self.id));
                (parsed.content, parsed.tool_calls)
            }
            None => (turn.text.clone(), Vec::new()),
        };
        let message = assistant_message(&content, &calls);
        let (prompt_tokens, extended, retokenized) = (
            turn_call.prompt_tokens,
            turn_call.extended,
            turn_call.retokenized_turns,
        );
        self.transcript
            .lock()
            .expect("never poisoned")
            .finish(&self.ctx, turn_call, &turn, &message)
            .map_err(agent_error)?;
        {
            let mut counts = self.counts.lock().expect("never poisoned");
            counts.tokens += tokens.len();
            counts.retokenized_turns += retokenized;
            counts.extended += usize::from(extended);
            counts.sampling_overridden += usize::from(self.overrides(&call.sent_sampling));
        }
        *self.last_text.lock().expect("never poisoned") = Some(turn.text.clone());
        let reply = ChatReply {
            index,
            message,
            text: turn.text,
            content,
            tool_calls: calls,
            finish: turn.finish,
            tokens,
            log_probs,
            prompt_tokens,
        };
        self.write_log(&call, &reply, extended, retokenized, begun.elapsed());
        Ok(reply)
    }

    /// Whether the agent asked for sampling settings other than the recipe's.
    fn overrides(&self, sent: &Value) -> bool {
        let s = self.ctx.sampling();
        let differs =
            |key: &str, ours: f64| sent[key].as_f64().is_some_and(|v| (v - ours).abs() > 1e-9);
        differs("temperature", s.temperature)
            || differs("top_p", s.top_p)
            || sent["top_k"]
                .as_i64()
                .is_some_and(|k| k.max(0) != s.top_k.max(0))
    }

    fn write_log(
        &self,
        call: &ChatCall,
        reply: &ChatReply,
        extended: bool,
        retokenized: usize,
        latency: Duration,
    ) {
        let Some(log) = &self.log else {
            return;
        };
        let line = json!({
            "call": reply.index,
            "api": call.api,
            "at_secs": self.started.elapsed().as_secs_f64(),
            "latency_secs": latency.as_secs_f64(),
            "request": call.request,
            "sent_sampling": call.sent_sampling,
            "prompt_tokens": reply.prompt_tokens,
            "extended": extended,
            "retokenized_turns": retokenized,
            "tokens": reply.tokens,
            "log_probs": reply.log_probs,
            "finish_reason": reply.finish_reason(),
            "message": reply.message,
        });
        let mut file = log.lock().expect("never poisoned");
        // A log that cannot be written loses the log, not the call.
        if let Err(e) = writeln!(file, "{line}") {
            eprintln!("gateway: session {}: writing its call log: {e}", self.id);
        }
    }

    /// The session's samples and metrics, once no call is generating (cancel the context first
    /// to end calls in flight).
    pub fn record(&self) -> SessionRecord {
        let transcript = std::mem::take(&mut *self.transcript.lock().expect("never poisoned"));
        let (conversations, turns) = transcript.counts();
        let counts = self.counts.lock().expect("never poisoned").clone();
        let mut metrics = BTreeMap::new();
        metrics.insert("gateway/calls".to_owned(), counts.calls as f64);
        metrics.insert("gateway/turns".to_owned(), turns as f64);
        metrics.insert("gateway/conversations".to_owned(), conversations as f64);
        metrics.insert(
            "gateway/retokenized_turns".to_owned(),
            counts.retokenized_turns as f64,
        );
        metrics.insert(
            "gateway/sampling_overridden".to_owned(),
            counts.sampling_overridden as f64,
        );
        for (name, n) in &counts.ignored {
            metrics.insert(format!("gateway/ignored_field/{name}"), *n as f64);
        }
        SessionRecord {
            samples: transcript.into_samples(),
            metrics,
            last_text: self.last_text.lock().expect("never poisoned").clone(),
        }
    }

    /// The samples so far, without closing (for `GET /gateway/sessions/{id}`).
    pub fn snapshot(&self) -> Vec<Sample> {
        self.transcript
            .lock()
            .expect("never poisoned")
            .samples_so_far()
    }
}

fn agent_error(e: AgentError) -> ApiError {
    match e {
        AgentError::Engine(e) => e.into(),
        AgentError::Template(m) => ApiError::invalid(format!("the chat template: {m}")),
        other => ApiError {
            code: "internal",
            message: other.to_string(),
        },
    }
}

/// The assistant message of a turn in OpenAI chat form: with tool calls, `content` is null when
/// the turn wrote nothing else.
fn assistant_message(content: &str, calls: &[Value]) -> Value {
    if calls.is_empty() {
        json!({"role": "assistant", "content": content})
    } else {
        let content = if content.is_empty() {
            Value::Null
        } else {
            json!(content)
        };
        json!({"role": "assistant", "content": content, "tool_calls": calls})
    }
}

/// Replies for the API converters' tests.
#[cfg(test)]
pub(crate) mod test_replies {
    use super::*;

    /// A reply that wrote `content` and called `calls` (name, arguments), ending with `finish`.
    pub fn reply(content: &str, calls: &[(&str, &str)], finish: FinishReason) -> ChatReply {
        let tool_calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, (name, args))| {
                json!({"id": format!("call_s_0_{i}"), "type": "function",
                       "function": {"name": name, "arguments": args}})
            })
            .collect();
        ChatReply {
            index: 0,
            message: assistant_message(content, &tool_calls),
            text: content.to_owned(),
            content: content.to_owned(),
            tool_calls,
            finish,
            tokens: vec![1, 2, 3],
            log_probs: vec![-0.1; 3],
            prompt_tokens: 7,
        }
    }

    /// The end-of-sequence finish.
    pub fn eos() -> FinishReason {
        FinishReason::Stop {
            matched: ooze_core::StopMatch::Token(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_history_keeps_the_latest() {
        let mut history = ResponseHistory::default();
        for i in 0..5 {
            history.insert(format!("resp_{i}"), vec![json!(i)], 3);
        }
        history.insert("resp_3".into(), vec![json!("again")], 3);
        assert_eq!(history.order, ["resp_2", "resp_3", "resp_4"]);
        assert!(!history.conversations.contains_key("resp_1"));
        assert_eq!(history.conversations["resp_3"], [json!("again")]);
        assert_eq!(history.conversations.len(), 3);
    }
}
