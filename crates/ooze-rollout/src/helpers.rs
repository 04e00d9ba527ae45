//! Helper models: fixed (untrained) models an agent calls besides the policy — a judge, an
//! executor, experts with a price. Each is named in the recipe and is one of:
//! - an engine in this process over its own weights (`Embedded`), or the policy's own engine used
//!   as a fixed model (`Policy`: same weights as the policy at the time of the call, nothing
//!   trained on its output);
//! - an OpenAI-compatible chat endpoint (`Http`: `ooze serve`, SGLang, vLLM, a hosted API).
//!
//! A call renders the messages with the helper's chat template (embedded) or sends them as JSON
//! (HTTP) and returns the text with its token counts and latency. Calls obey the execution's
//! deadline and cancellation like the policy's own generation; they never become training samples.

use crate::cancel::{wait_output, CancelToken};
use crate::http_client::JsonClient;
use ooze_engine::{EngineHandle, Request, Sampling};
use ooze_model::{RenderOptions, Tokenizer};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Where a helper's answers come from.
#[derive(Clone)]
pub enum HelperBackend {
    /// An engine in this process (its own weights, or the policy's engine).
    Engine {
        engine: EngineHandle,
        tokenizer: Arc<Tokenizer>,
    },
    /// An OpenAI-compatible server: `base_url` is the part before `/chat/completions`
    /// (`http://127.0.0.1:30000/v1`).
    Http {
        base_url: String,
        model: String,
        api_key: Option<String>,
    },
    /// No model: a scripted context's oracle answers in its place (demonstrations,
    /// [`crate::oracle`]); the helper keeps its price and description for the agent's prompts.
    Scripted,
}

/// One named helper model and its settings.
#[derive(Clone)]
pub struct Helper {
    pub name: String,
    pub backend: HelperBackend,
    /// 0 = greedy.
    pub temperature: f64,
    /// New tokens per call unless the caller asks for fewer.
    pub max_tokens: usize,
    /// Per call, on top of the execution's deadline.
    pub timeout: Duration,
    /// US dollars per million tokens (prompt + completion), for cost-aware rewards.
    pub price_per_million_tokens: f64,
    /// What the helper is good at, for tool descriptions shown to the policy.
    pub description: String,
}

impl std::fmt::Debug for Helper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backend = match &self.backend {
            HelperBackend::Engine { .. } => "engine".to_owned(),
            HelperBackend::Http { base_url, .. } => base_url.clone(),
            HelperBackend::Scripted => "scripted".to_owned(),
        };
        f.debug_struct("Helper")
            .field("name", &self.name)
            .field("backend", &backend)
            .field("temperature", &self.temperature)
            .field("max_tokens", &self.max_tokens)
            .finish_non_exhaustive()
    }
}

/// A helper's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct HelperReply {
    pub text: String,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub latency: Duration,
}

impl HelperReply {
    /// What the call cost at `price_per_million_tokens`.
    pub fn cost(&self, price_per_million_tokens: f64) -> f64 {
        (self.prompt_tokens + self.completion_tokens) as f64 * price_per_million_tokens / 1e6
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    #[error("no helper model named \"{name}\" (the recipe's [helpers] has: {known})")]
    Unknown { name: String, known: String },
    #[error("helper \"{name}\": {message}")]
    Failed { name: String, message: String },
    #[error("helper \"{name}\": the execution's deadline passed or it was cancelled")]
    Stopped { name: String },
}

/// Usage of one helper during one execution.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HelperUsage {
    pub calls: usize,
    pub tokens: usize,
    pub cost: f64,
    pub seconds: f64,
}

/// The recipe's helpers by name.
#[derive(Debug, Clone, Default)]
pub struct Helpers(BTreeMap<String, Arc<Helper>>);

impl Helpers {
    pub fn new(helpers: impl IntoIterator<Item = Helper>) -> Helpers {
        Helpers(
            helpers
                .into_iter()
                .map(|h| (h.name.clone(), Arc::new(h)))
                .collect(),
        )
    }

    pub fn get(&self, name: &str) -> Result<&Arc<Helper>, HelperError> {
        self.0.get(name).ok_or_else(|| HelperError::Unknown {
            name: name.to_owned(),
            known: if self.0.is_empty() {
                "none".into()
            } else {
                self.0.keys().cloned().collect::<Vec<_>>().join(", ")
            },
        })
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Helper>> {
        self.0.values()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Helper {
    /// Answers `messages` (chat messages) with at most `max_tokens` new tokens (the helper's own
    /// limit when larger), stopping at `stop` strings, before `deadline` or cancellation.
    pub async fn chat(
        &self,
        messages: &[Value],
        max_tokens: usize,
        stop: &[&str],
        seed: u64,
        deadline: Instant,
        cancel: &CancelToken,
    ) -> Result<HelperReply, HelperError> {
        let fail = |message: String| HelperError::Failed {
            name: self.name.clone(),
            message,
        };
        let started = Instant::now();
        let deadline = deadline.min(started + self.timeout);
        let max_tokens = max_tokens.min(self.max_tokens).max(1);
        match &self.backend {
            HelperBackend::Engine { engine, tokenizer } => {
                let template = tokenizer
                    .chat_template(false)
                    .map_err(|e| fail(format!("chat template: {e}")))?;
                let options = RenderOptions {
                    add_generation_prompt: true,
                    tools: None,
                    kwargs: Default::default(),
                };
                let text = template
                    .render(messages, &options)
                    .map_err(|e| fail(format!("chat template: {e}")))?;
                let input_ids = tokenizer
                    .encode(&text, false)
                    .map_err(|e| fail(format!("tokenizer: {e}")))?;
                let sampling = Sampling {
                    temperature: self.temperature,
                    max_new_tokens: max_tokens,
                    stop: stop.iter().map(|s| s.to_string()).collect(),
                    seed: Some(seed),
                    ..Sampling::default()
                };
                let output = wait_output(
                    engine,
                    Request {
                        input_ids,
                        sampling,
                        session: None,
                    },
                    deadline,
                    cancel,
                    &mut |_, _| true,
                )
                .await
                .map_err(|e| fail(e.to_string()))?;
                if output.finish == ooze_core::FinishReason::Abort {
                    return Err(HelperError::Stopped {
                        name: self.name.clone(),
                    });
                }
                let text = tokenizer
                    .decode(&output.tokens, true)
                    .map_err(|e| fail(format!("tokenizer: {e}")))?;
                Ok(HelperReply {
                    text,
                    prompt_tokens: output.prompt_tokens,
                    completion_tokens: output.tokens.len(),
                    latency: started.elapsed(),
                })
            }
            HelperBackend::Http {
                base_url,
                model,
                api_key,
            } => {
                let url = format!("{}/chat/completions", base_url.trim_end_matches('/'));
                let mut body = json!({
                    "model": model,
                    "messages": messages,
                    "max_tokens": max_tokens,
                    "temperature": self.temperature,
                    "seed": seed,
                });
                if !stop.is_empty() {
                    body["stop"] = json!(stop);
                }
                let timeout = deadline.saturating_duration_since(Instant::now());
                if timeout.is_zero() || cancel.is_cancelled() {
                    return Err(HelperError::Stopped {
                        name: self.name.clone(),
                    });
                }
                let key = api_key.clone();
                let request = tokio::task::spawn_blocking(move || {
                    post_chat(&url, key.as_deref(), &body, timeout)
                });
                let reply = tokio::select! {
                    r = request => r.map_err(|e| fail(format!("the HTTP call panicked: {e}")))?,
                    _ = cancel.cancelled() => return Err(HelperError::Stopped { name: self.name.clone() }),
                };
                let (text, prompt_tokens, completion_tokens) = reply.map_err(fail)?;
                Ok(HelperReply {
                    text,
                    prompt_tokens,
                    completion_tokens,
                    latency: started.elapsed(),
                })
            }
            HelperBackend::Scripted => Err(fail(
                "a scripted helper has no model; only a scripted context's oracle answers it"
                    .into(),
            )),
        }
    }
}

/// POSTs one chat completion and reads the first choice's text and the usage counts.
fn post_chat(
    url: &str,
    api_key: Option<&str>,
    body: &Value,
    timeout: Duration,
) -> Result<(String, usize, usize), String> {
    let value = JsonClient::new(timeout)
        .post(url, api_key, body)
        .map_err(|e| e.to_string())?;
    let content = value["choices"][0]["message"]["content"]
        .as_str()
        .ok_or_else(|| {
            format!("POST {url}: the answer has no choices[0].message.content string: {value}")
        })?;
    let count = |key: &str| value["usage"][key].as_u64().unwrap_or(0) as usize;
    Ok((
        content.to_owned(),
        count("prompt_tokens"),
        count("completion_tokens"),
    ))
}
