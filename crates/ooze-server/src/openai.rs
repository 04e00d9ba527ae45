//! OpenAI-compatible endpoints: `/v1/models`, `/v1/completions`, `/v1/chat/completions` (chat
//! template, `tools` with `<tool_call>` parsing into `tool_calls`, `logprobs`, streaming over SSE).
//!
//! Requests are checked before anything runs, with errors naming the field at fault in the
//! request's own terms: sampling settings by [`SamplingParams::validate`] (`max_tokens` for its
//! `max_new_tokens`), `max_tokens` / `max_completion_tokens` ≥ 1 as in OpenAI's API (scoring a
//! prompt with no new tokens is SGLang's `/generate` with `max_new_tokens: 0`), `messages[i]`
//! and `tools[i]` by shape before the chat template sees them.

use crate::error::ApiError;
use crate::lenient_json::LenientJson;
use crate::text_stream::TextStream;
use crate::tool_calls;
use crate::{follow, new_rid, send_json, try_send_json, AppState};
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ooze_core::FinishReason;
use ooze_engine::{
    EngineError, Output, ParamError, Request, Sampling, SamplingParams, StopStrings, MAX_NEW_TOKENS,
};
use ooze_model::RenderOptions;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn finish_str(finish: &FinishReason) -> &'static str {
    match finish {
        FinishReason::Stop { .. } => "stop",
        FinishReason::Length => "length",
        FinishReason::Abort => "abort",
    }
}

/// Sampling fields common to both endpoints (OpenAI names, plus SGLang/vLLM extensions).
#[derive(Deserialize, Default)]
pub struct CommonFields {
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    min_p: Option<f64>,
    n: Option<usize>,
    stop: Option<StopStrings>,
    stop_token_ids: Option<Vec<u32>>,
    seed: Option<u64>,
    stream: Option<bool>,
    stream_options: Option<Value>,
    ignore_eos: Option<bool>,
    min_tokens: Option<usize>,
    frequency_penalty: Option<f64>,
    presence_penalty: Option<f64>,
    user: Option<String>,
    /// Every other field of the request (the serde_ignored count in `LenientJson` does not see
    /// through `flatten`): ignored, and counted by `check`. `model` is one: whatever a request
    /// names (agents send `gpt-…` and `claude-…`), the one model here serves it.
    #[serde(flatten)]
    unknown: Map<String, Value>,
}

impl CommonFields {
    /// Checks the fields ooze acts on and counts the rest as ignored; penalties, which would
    /// change the log-prob definition, are not applied and count as ignored when set.
    fn check(&self, state: &AppState) -> Result<(), ApiError> {
        state
            .ignored_fields
            .count(&self.unknown.keys().cloned().collect::<Vec<_>>());
        for (name, v) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if v.unwrap_or(0.0) != 0.0 {
                state.ignored_fields.count(&[name.to_owned()]);
            }
        }
        let n = self.n.unwrap_or(1);
        if n == 0 || n > 128 {
            return Err(ApiError::invalid(format!(
                "n: must be between 1 and 128, got {n}"
            )));
        }
        if self.stream == Some(true) && n != 1 {
            return Err(ApiError::invalid("n: streaming supports n = 1"));
        }
        let _ = &self.user;
        Ok(())
    }

    fn sampling(&self, max: MaxTokens) -> Result<Sampling, ApiError> {
        match max.value {
            Some(0) => {
                return Err(ApiError::invalid(format!(
                    "{}: must be ≥ 1, got 0 (to score a prompt without generating, use /generate \
                     with max_new_tokens 0 and return_logprob)",
                    max.field
                )))
            }
            Some(v) if v > MAX_NEW_TOKENS => {
                return Err(ApiError::invalid(format!(
                    "{}: must be in [1, {MAX_NEW_TOKENS}], got {v}",
                    max.field
                )))
            }
            _ => {}
        }
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            seed: self.seed,
            max_new_tokens: Some(max.value.unwrap_or(max.default)),
            min_new_tokens: self.min_tokens,
            stop_token_ids: self.stop_token_ids.clone(),
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            skip_special_tokens: Some(true),
            no_stop_trim: None,
        }
        .validate()
        .map_err(|e| max.param_error(e))
    }

    fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }
}

/// The request's length limit: which field gave it (`max_tokens` or `max_completion_tokens`), its
/// value, and the endpoint's default.
#[derive(Clone, Copy)]
struct MaxTokens {
    field: &'static str,
    value: Option<usize>,
    default: usize,
}

impl MaxTokens {
    /// A sampling error in this API's field names.
    fn param_error(self, err: ParamError) -> ApiError {
        let field = match err.field {
            "max_new_tokens" => self.field,
            "min_new_tokens" => "min_tokens",
            other => other,
        };
        ApiError::invalid(format!("{field}: {}", err.message))
    }

    /// An engine refusal in this API's field names.
    fn engine_error(self, err: EngineError) -> ApiError {
        match err {
            EngineError::TooLong {
                prompt,
                max_new,
                limit,
            } => {
                let field = self.field;
                let given = if self.value.is_some() {
                    ""
                } else {
                    ", the default"
                };
                ApiError {
                    code: "context_length_exceeded",
                    message: format!(
                        "{field}: prompt ({prompt} tokens) + {field} ({max_new}{given}) exceeds the engine's sequence length {limit}: {}",
                        ooze_engine::handle::room(prompt, limit, field, 1)
                    ),
                }
            }
            other => other.into(),
        }
    }
}

/// The `i`-th of `n` samples: seeds stay distinct and reproducible.
fn nth(sampling: &Sampling, i: usize) -> Sampling {
    Sampling {
        seed: sampling.seed.map(|s| s.wrapping_add(i as u64)),
        ..sampling.clone()
    }
}

async fn run_all(
    state: &Arc<AppState>,
    prompt: &[u32],
    sampling: &Sampling,
    n: usize,
    max: MaxTokens,
) -> Result<Vec<Output>, ApiError> {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let request = Request {
            input_ids: prompt.to_vec(),
            sampling: nth(sampling, i),
            session: None,
        };
        // Submitted here, so that a refusal names this API's fields.
        let submitted = state
            .engine
            .submit(request)
            .map_err(|e| max.engine_error(e))?;
        let state = state.clone();
        tasks.spawn(async move {
            follow(&state, submitted, &new_rid(), |_, _| true)
                .await
                .map(|o| (i, o))
        });
    }
    let mut outs = Vec::with_capacity(n);
    while let Some(joined) = tasks.join_next().await {
        outs.push(joined.map_err(|e| ApiError {
            code: "internal",
            message: e.to_string(),
        })??);
    }
    outs.sort_by_key(|(i, _)| *i);
    Ok(outs.into_iter().map(|(_, o)| o).collect())
}

/// The last chunk of a stream when `stream_options.include_usage` is set.
pub(crate) fn usage_chunk(
    id: &str,
    object: &str,
    model: &str,
    prompt_tokens: usize,
    completion_tokens: usize,
) -> Value {
    json!({"id": id, "object": object, "created": unix_now(), "model": model, "choices": [],
           "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}})
}

pub async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(
        json!({"object": "list", "data": [{"id": state.model_name, "object": "model", "created": 0, "owned_by": "ooze"}]}),
    )
}

#[derive(Deserialize)]
#[serde(untagged)]
enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

#[derive(Deserialize)]
pub struct CompletionRequest {
    prompt: PromptInput,
    max_tokens: Option<usize>,
    logprobs: Option<u32>,
    echo: Option<bool>,
    /// vLLM's: the sampled ids in each choice (`token_ids`).
    return_token_ids: Option<bool>,
    /// vLLM's: log-prob tokens named `token_id:N` instead of their text.
    return_tokens_as_token_ids: Option<bool>,
    #[serde(flatten)]
    common: CommonFields,
}

fn token_texts(state: &AppState, tokens: &[u32], as_ids: bool) -> Vec<String> {
    tokens
        .iter()
        .map(|&t| {
            if as_ids {
                format!("token_id:{t}")
            } else {
                state.tokenizer.decode(&[t], false).unwrap_or_default()
            }
        })
        .collect()
}

/// vLLM's `stop_reason`: the stop token's id or the stop string.
fn stop_reason(finish: &FinishReason) -> Value {
    match finish {
        FinishReason::Stop {
            matched: ooze_core::StopMatch::Token(t),
        } => json!(t),
        FinishReason::Stop {
            matched: ooze_core::StopMatch::Text(s),
        } => json!(s),
        _ => Value::Null,
    }
}

pub async fn completions(
    State(state): State<Arc<AppState>>,
    LenientJson(req): LenientJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    req.common.check(&state)?;
    if req.echo == Some(true) {
        // Not acted on: the reply holds the completion only.
        state.ignored_fields.count(&["echo".to_owned()]);
    }
    let prompts: Vec<Vec<u32>> = match req.prompt {
        PromptInput::Text(t) => vec![state.tokenizer.encode(&t, true)?],
        PromptInput::Texts(ts) => ts
            .iter()
            .map(|t| state.tokenizer.encode(t, true))
            .collect::<Result<_, _>>()?,
        PromptInput::Ids(ids) => vec![ids],
        PromptInput::IdLists(lists) => lists,
    };
    let max = MaxTokens {
        field: "max_tokens",
        value: req.max_tokens,
        default: 16,
    };
    let sampling = req.common.sampling(max)?;
    let n = req.common.n.unwrap_or(1);
    let id = format!("cmpl-{}", new_rid());
    let as_ids = req.return_tokens_as_token_ids == Some(true);
    let with_ids = req.return_token_ids == Some(true);
    let model = state.model_name.clone();
    if req.common.stream == Some(true) {
        if prompts.len() != 1 {
            return Err(ApiError::invalid("prompt: streaming takes one prompt"));
        }
        let include_usage = req.common.include_usage();
        let prompt_tokens = prompts[0].len();
        let submitted = state
            .engine
            .submit(Request {
                input_ids: prompts[0].clone(),
                sampling,
                session: None,
            })
            .map_err(|e| max.engine_error(e))?;
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            let mut text = TextStream::new(true, false);
            let st = state.clone();
            let chunk = |text: &str, lp: Option<Value>, finish: Option<&str>| json!({"id": id, "object": "text_completion", "created": unix_now(), "model": model, "choices": [{"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}]});
            let result = follow(&state, submitted, &new_rid(), |token, log_prob| {
                let piece = text.push(&st.tokenizer, token);
                let lp = req.logprobs.map(|_| json!({"tokens": token_texts(&st, &[token], as_ids), "token_logprobs": [log_prob], "top_logprobs": null, "text_offset": [0]}));
                try_send_json(&tx, &chunk(&piece, lp, None))
            })
            .await;
            match result {
                Ok(out) => {
                    send_json(
                        &tx,
                        &chunk(text.rest(), None, Some(finish_str(&out.finish))),
                    )
                    .await;
                    if include_usage {
                        let usage = usage_chunk(
                            &id,
                            "text_completion",
                            &model,
                            prompt_tokens,
                            out.tokens.len(),
                        );
                        send_json(&tx, &usage).await;
                    }
                }
                Err(err) => send_json(&tx, &err.stream_chunk()).await,
            }
            let _ = tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
        });
        return Ok(Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx)).into_response());
    }
    let mut choices = Vec::new();
    let (mut prompt_total, mut completion_total) = (0, 0);
    for prompt in &prompts {
        prompt_total += prompt.len();
        for out in run_all(&state, prompt, &sampling, n, max).await? {
            completion_total += out.tokens.len();
            let text = state.tokenizer.decode(&out.tokens, true)?;
            let logprobs = req.logprobs.map(|_| json!({"tokens": token_texts(&state, &out.tokens, as_ids), "token_logprobs": out.log_probs, "top_logprobs": null, "text_offset": Value::Null}));
            let mut choice = json!({"index": choices.len(), "text": text, "logprobs": logprobs, "finish_reason": finish_str(&out.finish), "stop_reason": stop_reason(&out.finish)});
            if with_ids {
                choice["token_ids"] = json!(out.tokens);
            }
            choices.push(choice);
        }
    }
    Ok(Json(json!({
        "id": id, "object": "text_completion", "created": unix_now(), "model": model, "choices": choices,
        "usage": {"prompt_tokens": prompt_total, "completion_tokens": completion_total, "total_tokens": prompt_total + completion_total},
    }))
    .into_response())
}

#[derive(Deserialize)]
pub struct ChatRequest {
    messages: Vec<Value>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    max_tokens: Option<usize>,
    max_completion_tokens: Option<usize>,
    logprobs: Option<bool>,
    top_logprobs: Option<u32>,
    chat_template_kwargs: Option<Map<String, Value>>,
    response_format: Option<Value>,
    #[serde(flatten)]
    common: CommonFields,
}

/// Message roles a chat request may use; `developer` (OpenAI's newer name) becomes `system`.
const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// Checks each message's shape and normalises it for the chat template: content given as a list of
/// text parts becomes one string, a missing assistant content null, tool-call arguments given as
/// JSON strings objects. Errors name `messages[i].field` and what was expected.
pub(crate) fn normalise_messages(messages: Vec<Value>) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages: at least one message is required",
        ));
    }
    messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| normalise_message(i, m))
        .collect()
}

fn normalise_message(i: usize, mut m: Value) -> Result<Value, ApiError> {
    let bad = |field: &str, expected: &str, got: Option<&Value>| {
        let got = got.map_or("nothing".to_owned(), Value::to_string);
        ApiError::invalid(format!(
            "messages[{i}]{field}: expected {expected}, got {got}"
        ))
    };
    if !m.is_object() {
        return Err(bad("", "an object with `role` and `content`", Some(&m)));
    }
    let obj = m.as_object_mut().expect("invariant: checked above");
    let role = match obj.get("role").and_then(Value::as_str) {
        Some(r) if ROLES.contains(&r) => r.to_owned(),
        _ => {
            return Err(bad(
                ".role",
                "one of \"system\", \"developer\", \"user\", \"assistant\", \"tool\"",
                obj.get("role"),
            ))
        }
    };
    if role == "developer" {
        obj.insert("role".into(), json!("system"));
    }
    for key in ["name", "tool_call_id"] {
        if obj.get(key).is_some_and(|v| !v.is_string()) {
            return Err(bad(&format!(".{key}"), "a string", obj.get(key)));
        }
    }
    let has_calls = match obj.get_mut("tool_calls") {
        None | Some(Value::Null) => false,
        Some(Value::Array(calls)) if role == "assistant" => {
            for (j, call) in calls.iter_mut().enumerate() {
                normalise_tool_call(call).map_err(|(field, expected)| {
                    bad(
                        &format!(".tool_calls[{j}]{field}"),
                        expected,
                        call.pointer(&field.replace('.', "/")),
                    )
                })?;
            }
            !calls.is_empty()
        }
        Some(other) => {
            let expected = if role == "assistant" {
                "a list of tool calls"
            } else {
                "no tool_calls (only assistant messages make tool calls)"
            };
            return Err(bad(".tool_calls", expected, Some(other)));
        }
    };
    let content = match obj.get("content") {
        Some(Value::String(_)) => None,
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                match (
                    part.get("type").and_then(Value::as_str),
                    part.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    _ => {
                        return Err(bad(
                            &format!(".content[{j}]"),
                            "a text part {\"type\": \"text\", \"text\": \"…\"} (only text is supported)",
                            Some(part),
                        ))
                    }
                }
            }
            Some(Value::String(text))
        }
        None | Some(Value::Null) if role == "assistant" && has_calls => Some(Value::Null),
        other => {
            let expected = if role == "assistant" {
                "a string or a list of text parts (null only with tool_calls)"
            } else {
                "a string or a list of text parts"
            };
            return Err(bad(".content", expected, other));
        }
    };
    if let Some(content) = content {
        obj.insert("content".into(), content);
    }
    Ok(m)
}

/// Checks one assistant tool call (`{"id"?, "type"?: "function", "function": {"name", "arguments"}}`)
/// and turns arguments given as a JSON string (OpenAI clients) into the object templates expect.
/// An error is the field at fault (a JSON-pointer-like path) and what was expected.
fn normalise_tool_call(call: &mut Value) -> Result<(), (&'static str, &'static str)> {
    let Some(obj) = call.as_object_mut() else {
        return Err(("", "an object with `function`"));
    };
    if obj.get("type").is_some_and(|t| t != "function") {
        return Err((".type", "\"function\""));
    }
    if obj.get("id").is_some_and(|v| !v.is_string()) {
        return Err((".id", "a string"));
    }
    let Some(function) = obj.get_mut("function").and_then(Value::as_object_mut) else {
        return Err((".function", "an object with `name` and `arguments`"));
    };
    if function
        .get("name")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err((".function.name", "a non-empty string"));
    }
    match function.get_mut("arguments") {
        None | Some(Value::Null) => {
            function.insert("arguments".into(), json!({}));
        }
        Some(Value::Object(_)) => {}
        // A string that is no JSON object (a model's malformed call, sent back) stays text.
        Some(args @ Value::String(_)) => {
            if let Some(parsed) = args
                .as_str()
                .and_then(|s| serde_json::from_str::<Value>(s).ok())
                .filter(Value::is_object)
            {
                *args = parsed;
            }
        }
        Some(_) => {
            return Err((
                ".function.arguments",
                "a JSON object, or a string holding one",
            ))
        }
    }
    Ok(())
}

fn chat_logprobs(state: &AppState, tokens: &[u32], log_probs: &[f32]) -> Value {
    token_logprobs(&state.tokenizer, tokens, log_probs)
}

/// Chat Completions' `logprobs`: each chosen token with its log-prob (no alternatives).
pub(crate) fn token_logprobs(
    tokenizer: &ooze_model::Tokenizer,
    tokens: &[u32],
    log_probs: &[f32],
) -> Value {
    let content: Vec<Value> = tokens
        .iter()
        .zip(log_probs)
        .map(|(&t, &lp)| {
            let text = tokenizer.decode(&[t], false).unwrap_or_default();
            json!({"token": text, "logprob": lp, "bytes": text.as_bytes(), "top_logprobs": []})
        })
        .collect();
    json!({"content": content})
}

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    LenientJson(req): LenientJson<ChatRequest>,
) -> Result<Response, ApiError> {
    req.common.check(&state)?;
    if req.top_logprobs.unwrap_or(0) > 0 {
        return Err(ApiError::invalid(
            "top_logprobs: only the chosen tokens' log-probs are returned; use logprobs: true",
        ));
    }
    if let Some(format) = &req.response_format {
        if format.get("type").and_then(Value::as_str) != Some("text") {
            return Err(ApiError::invalid(
                "response_format: only {\"type\": \"text\"} is supported",
            ));
        }
    }
    let _ = req.parallel_tool_calls;
    let declared = req.tools.as_deref().unwrap_or_default();
    tool_calls::check_tools(declared).map_err(ApiError::invalid)?;
    if let Some(choice) = &req.tool_choice {
        tool_calls::check_tool_choice(choice, declared).map_err(ApiError::invalid)?;
    }
    let tools = match req.tool_choice.as_ref().and_then(Value::as_str) {
        Some("none") => None,
        _ => req.tools.clone().filter(|t| !t.is_empty()),
    };
    let messages = normalise_messages(req.messages)?;
    let options = RenderOptions {
        add_generation_prompt: true,
        tools: tools.clone(),
        kwargs: req.chat_template_kwargs.unwrap_or_default(),
    };
    let text = state
        .tokenizer
        .chat_template(tools.is_some())?
        .render(&messages, &options)?;
    let prompt = state.tokenizer.encode(&text, false)?;
    let max = match (req.max_completion_tokens, req.max_tokens) {
        (Some(v), _) => MaxTokens {
            field: "max_completion_tokens",
            value: Some(v),
            default: 1024,
        },
        (None, v) => MaxTokens {
            field: "max_tokens",
            value: v,
            default: 1024,
        },
    };
    let sampling = req.common.sampling(max)?;
    let n = req.common.n.unwrap_or(1);
    let rid = new_rid();
    let id = format!("chatcmpl-{rid}");
    let model = state.model_name.clone();
    let want_logprobs = req.logprobs == Some(true);
    if req.common.stream == Some(true) {
        let include_usage = req.common.include_usage();
        let prompt_tokens = prompt.len();
        let submitted = state
            .engine
            .submit(Request {
                input_ids: prompt,
                sampling,
                session: None,
            })
            .map_err(|e| max.engine_error(e))?;
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            let chunk = |delta: Value, lp: Option<Value>, finish: Option<&str>| json!({"id": id, "object": "chat.completion.chunk", "created": unix_now(), "model": model, "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}]});
            try_send_json(
                &tx,
                &chunk(json!({"role": "assistant", "content": ""}), None, None),
            );
            let mut text = TextStream::new(true, tools.is_some());
            let st = state.clone();
            let result = follow(&state, submitted, &rid, |token, log_prob| {
                let piece = text.push(&st.tokenizer, token);
                let lp = want_logprobs.then(|| chat_logprobs(&st, &[token], &[log_prob]));
                if piece.is_empty() && lp.is_none() {
                    return !tx.is_closed();
                }
                try_send_json(&tx, &chunk(json!({"content": piece}), lp, None))
            })
            .await;
            match result {
                Ok(out) => {
                    let parsed = tools
                        .as_ref()
                        .map(|_| tool_calls::parse(text.text(), &format!("call_{rid}")));
                    let mut finish = finish_str(&out.finish);
                    match parsed {
                        Some(p) if !p.tool_calls.is_empty() => {
                            let calls = tool_calls::indexed(&p.tool_calls);
                            send_json(&tx, &chunk(json!({"tool_calls": calls}), None, None)).await;
                            finish = "tool_calls";
                        }
                        _ if !text.rest().is_empty() => {
                            send_json(&tx, &chunk(json!({"content": text.rest()}), None, None))
                                .await;
                        }
                        _ => {}
                    }
                    send_json(&tx, &chunk(json!({}), None, Some(finish))).await;
                    if include_usage {
                        let usage = usage_chunk(
                            &id,
                            "chat.completion.chunk",
                            &model,
                            prompt_tokens,
                            out.tokens.len(),
                        );
                        send_json(&tx, &usage).await;
                    }
                }
                Err(err) => send_json(&tx, &err.stream_chunk()).await,
            }
            let _ = tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
        });
        return Ok(Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx)).into_response());
    }
    let outputs = run_all(&state, &prompt, &sampling, n, max).await?;
    let mut completion_tokens = 0;
    let choices: Vec<Value> = outputs
        .iter()
        .enumerate()
        .map(|(i, out)| {
            completion_tokens += out.tokens.len();
            let text = state.tokenizer.decode(&out.tokens, true).unwrap_or_default();
            let mut finish = finish_str(&out.finish);
            let mut message = json!({"role": "assistant", "content": text});
            if tools.is_some() {
                let parsed = tool_calls::parse(&text, &format!("call_{rid}_{i}"));
                if !parsed.tool_calls.is_empty() {
                    message = json!({"role": "assistant", "content": if parsed.content.is_empty() { Value::Null } else { Value::String(parsed.content) }, "tool_calls": parsed.tool_calls});
                    finish = "tool_calls";
                }
            }
            let logprobs = want_logprobs.then(|| chat_logprobs(&state, &out.tokens, &out.log_probs));
            json!({"index": i, "message": message, "logprobs": logprobs, "finish_reason": finish})
        })
        .collect();
    Ok(Json(json!({
        "id": id, "object": "chat.completion", "created": unix_now(), "model": model, "choices": choices,
        "usage": {"prompt_tokens": prompt.len(), "completion_tokens": completion_tokens, "total_tokens": prompt.len() + completion_tokens},
    }))
    .into_response())
}
