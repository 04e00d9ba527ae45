//! OpenAI-compatible endpoints: `/v1/models`, `/v1/completions`, `/v1/chat/completions` (chat
//! template, `tools` with `<tool_call>` parsing into `tool_calls`, `logprobs`, streaming over SSE).

use crate::error::ApiError;
use crate::text_stream::TextStream;
use crate::tool_calls;
use crate::{follow, new_rid, run_request, send_json, try_send_json, AppState};
use axum::extract::{rejection::JsonRejection, State};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ooze_core::FinishReason;
use ooze_engine::{Output, Request, Sampling, SamplingParams, StopStrings};
use ooze_model::RenderOptions;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;

fn unix_now() -> u64 {
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
#[serde(deny_unknown_fields)]
pub struct CommonFields {
    model: Option<String>,
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
}

impl CommonFields {
    fn check(&self, state: &AppState) -> Result<(), ApiError> {
        if let Some(model) = &self.model {
            if model != &state.model_name && model != &state.model_path.display().to_string() {
                return Err(ApiError {
                    code: "not_found",
                    message: format!(
                        "model `{model}` is not served here; this server has `{}`",
                        state.model_name
                    ),
                });
            }
        }
        for (name, v) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if v.unwrap_or(0.0) != 0.0 {
                return Err(ApiError::invalid(format!("{name}: penalties are not supported (they would change the log-prob definition)")));
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

    fn sampling(
        &self,
        max_tokens: Option<usize>,
        default_max: usize,
    ) -> Result<Sampling, ApiError> {
        Ok(SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            seed: self.seed,
            max_new_tokens: Some(max_tokens.unwrap_or(default_max)),
            min_new_tokens: self.min_tokens,
            stop_token_ids: self.stop_token_ids.clone(),
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            skip_special_tokens: Some(true),
            no_stop_trim: None,
        }
        .validate()?)
    }

    fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
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
) -> Result<Vec<Output>, ApiError> {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let (state, request) = (
            state.clone(),
            Request {
                input_ids: prompt.to_vec(),
                sampling: nth(sampling, i),
            },
        );
        tasks.spawn(async move {
            run_request(&state, request, &new_rid(), |_, _| true)
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
fn usage_chunk(
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
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    prompt: PromptInput,
    max_tokens: Option<usize>,
    logprobs: Option<u32>,
    echo: Option<bool>,
    #[serde(flatten)]
    common: CommonFields,
}

fn token_texts(state: &AppState, tokens: &[u32]) -> Vec<String> {
    tokens
        .iter()
        .map(|&t| state.tokenizer.decode(&[t], false).unwrap_or_default())
        .collect()
}

pub async fn completions(
    State(state): State<Arc<AppState>>,
    body: Result<Json<CompletionRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body?;
    req.common.check(&state)?;
    if req.echo == Some(true) {
        return Err(ApiError::invalid("echo: not supported"));
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
    let sampling = req.common.sampling(req.max_tokens, 16)?;
    let n = req.common.n.unwrap_or(1);
    let id = format!("cmpl-{}", new_rid());
    let model = state.model_name.clone();
    if req.common.stream == Some(true) {
        if prompts.len() != 1 {
            return Err(ApiError::invalid("prompt: streaming takes one prompt"));
        }
        let include_usage = req.common.include_usage();
        let prompt_tokens = prompts[0].len();
        let submitted = state.engine.submit(Request {
            input_ids: prompts[0].clone(),
            sampling,
        })?;
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            let mut text = TextStream::new(true, false);
            let st = state.clone();
            let chunk = |text: &str, lp: Option<Value>, finish: Option<&str>| json!({"id": id, "object": "text_completion", "created": unix_now(), "model": model, "choices": [{"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}]});
            let result = follow(&state, submitted, &new_rid(), |token, log_prob| {
                let piece = text.push(&st.tokenizer, token);
                let lp = req.logprobs.map(|_| json!({"tokens": token_texts(&st, &[token]), "token_logprobs": [log_prob], "top_logprobs": null, "text_offset": [0]}));
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
        for out in run_all(&state, prompt, &sampling, n).await? {
            completion_total += out.tokens.len();
            let text = state.tokenizer.decode(&out.tokens, true)?;
            let logprobs = req.logprobs.map(|_| json!({"tokens": token_texts(&state, &out.tokens), "token_logprobs": out.log_probs, "top_logprobs": null, "text_offset": Value::Null}));
            choices.push(json!({"index": choices.len(), "text": text, "logprobs": logprobs, "finish_reason": finish_str(&out.finish)}));
        }
    }
    Ok(Json(json!({
        "id": id, "object": "text_completion", "created": unix_now(), "model": model, "choices": choices,
        "usage": {"prompt_tokens": prompt_total, "completion_tokens": completion_total, "total_tokens": prompt_total + completion_total},
    }))
    .into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
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

/// Checks each message and flattens content given as a list of text parts into a string.
fn normalise_messages(messages: Vec<Value>) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages: at least one message is required",
        ));
    }
    messages
        .into_iter()
        .enumerate()
        .map(|(i, mut m)| {
            let obj = m
                .as_object_mut()
                .ok_or_else(|| ApiError::invalid(format!("messages[{i}]: expected an object")))?;
            if !obj.get("role").is_some_and(Value::is_string) {
                return Err(ApiError::invalid(format!(
                    "messages[{i}].role: expected a string"
                )));
            }
            if let Some(Value::Array(parts)) = obj.get("content") {
                let mut text = String::new();
                for (j, part) in parts.iter().enumerate() {
                    match (
                        part.get("type").and_then(Value::as_str),
                        part.get("text").and_then(Value::as_str),
                    ) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        _ => {
                            return Err(ApiError::invalid(format!(
                                "messages[{i}].content[{j}]: only text parts are supported"
                            )))
                        }
                    }
                }
                obj.insert("content".into(), Value::String(text));
            }
            // Tool-call arguments arrive as JSON strings from OpenAI clients; templates expect objects.
            if let Some(Value::Array(calls)) = obj.get_mut("tool_calls") {
                for call in calls {
                    if let Some(args) = call.pointer_mut("/function/arguments") {
                        if let Some(parsed) = args
                            .as_str()
                            .and_then(|s| serde_json::from_str::<Value>(s).ok())
                            .filter(Value::is_object)
                        {
                            *args = parsed;
                        }
                    }
                }
            }
            Ok(m)
        })
        .collect()
}

fn chat_logprobs(state: &AppState, tokens: &[u32], log_probs: &[f32]) -> Value {
    let content: Vec<Value> = tokens
        .iter()
        .zip(log_probs)
        .map(|(&t, &lp)| {
            let text = state.tokenizer.decode(&[t], false).unwrap_or_default();
            json!({"token": text, "logprob": lp, "bytes": text.as_bytes(), "top_logprobs": []})
        })
        .collect();
    json!({"content": content})
}

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    body: Result<Json<ChatRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body?;
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
    let sampling = req
        .common
        .sampling(req.max_completion_tokens.or(req.max_tokens), 1024)?;
    let n = req.common.n.unwrap_or(1);
    let rid = new_rid();
    let id = format!("chatcmpl-{rid}");
    let model = state.model_name.clone();
    let want_logprobs = req.logprobs == Some(true);
    if req.common.stream == Some(true) {
        let include_usage = req.common.include_usage();
        let prompt_tokens = prompt.len();
        let submitted = state.engine.submit(Request {
            input_ids: prompt,
            sampling,
        })?;
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
                            let calls: Vec<Value> = p
                                .tool_calls
                                .into_iter()
                                .enumerate()
                                .map(|(i, mut c)| {
                                    c["index"] = json!(i);
                                    c
                                })
                                .collect();
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
    let outputs = run_all(&state, &prompt, &sampling, n).await?;
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
