//! OpenAI Chat Completions on a gateway session: `messages`, `tools`, `tool_choice`, parallel
//! tool calls (every `<tool_call>` block of a turn is one call), `logprobs`, `stop`, `max_tokens` /
//! `max_completion_tokens`, streaming (with `stream_options.include_usage`).
//!
//! `tool_choice: "none"` renders the chat without its tools; `"required"` or a named function is
//! not enforced (the policy's sampling is not constrained) and counts as ignored, as does
//! `top_logprobs` (only chosen tokens' log-probs exist). Sampling settings are recorded, not
//! applied.

use super::session::{ChatCall, ChatReply, Session};
use super::{Gateway, GatewayError};
use crate::error::ApiError;
use crate::openai::{normalise_messages, token_logprobs, unix_now, usage_chunk};
use crate::text_stream::TextStream;
use crate::tool_calls;
use crate::{send_json, try_send_json};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ooze_engine::StopStrings;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// The fields the gateway reads; every other one is counted as ignored.
#[derive(Deserialize)]
pub struct ChatRequest {
    messages: Vec<Value>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    max_tokens: Option<usize>,
    max_completion_tokens: Option<usize>,
    stop: Option<StopStrings>,
    stream: Option<bool>,
    stream_options: Option<Value>,
    logprobs: Option<bool>,
    top_logprobs: Option<u32>,
    n: Option<usize>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    seed: Option<u64>,
}

/// `stop` as a list.
pub fn stop_list(stop: Option<StopStrings>) -> Vec<String> {
    match stop {
        None => Vec::new(),
        Some(StopStrings::One(s)) => vec![s],
        Some(StopStrings::Many(v)) => v,
    }
    .into_iter()
    .filter(|s| !s.is_empty())
    .collect()
}

/// Checks `tools` and `tool_choice` (OpenAI shapes); the tools the chat is rendered with
/// (`None` for none, or `tool_choice: "none"`). A choice the gateway cannot enforce is counted
/// as ignored.
pub fn chat_tools(
    gateway: &Gateway,
    session: &Session,
    tools: Option<Vec<Value>>,
    tool_choice: Option<&Value>,
) -> Result<Option<Vec<Value>>, ApiError> {
    let declared = tools.as_deref().unwrap_or_default();
    tool_calls::check_tools(declared).map_err(ApiError::invalid)?;
    if let Some(choice) = tool_choice {
        tool_calls::check_tool_choice(choice, declared).map_err(ApiError::invalid)?;
        if choice.as_str().is_none_or(|c| c == "required") {
            gateway.count_ignored(session, &["tool_choice".to_owned()]);
        }
    }
    Ok(match tool_choice.and_then(Value::as_str) {
        Some("none") => None,
        _ => tools.filter(|t| !t.is_empty()),
    })
}

/// Sampling settings as sent, for the log and the override count.
pub fn sent_sampling(
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    seed: Option<u64>,
) -> Value {
    let mut sent = serde_json::Map::new();
    for (key, value) in [
        ("temperature", temperature.map(Value::from)),
        ("top_p", top_p.map(Value::from)),
        ("top_k", top_k.map(Value::from)),
        ("seed", seed.map(Value::from)),
    ] {
        if let Some(v) = value {
            sent.insert(key.to_owned(), v);
        }
    }
    Value::Object(sent)
}

pub async fn chat_completions(
    State(gateway): State<Arc<Gateway>>,
    path: Option<Path<String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, GatewayError> {
    let fail = GatewayError::openai;
    let (session, req): (_, ChatRequest) = gateway
        .request(path.as_ref(), &headers, &body)
        .map_err(fail)?;
    let n = req.n.unwrap_or(1);
    if n != 1 {
        return Err(fail(ApiError::invalid(format!(
            "n: the gateway answers one choice per call (each call is one turn of the trajectory), got {n}"
        ))));
    }
    if req.top_logprobs.unwrap_or(0) > 0 {
        gateway.count_ignored(&session, &["top_logprobs".to_owned()]);
    }
    let _ = req.parallel_tool_calls;
    let tools =
        chat_tools(&gateway, &session, req.tools, req.tool_choice.as_ref()).map_err(fail)?;
    let messages = normalise_messages(req.messages).map_err(fail)?;
    let max_tokens = req.max_completion_tokens.or(req.max_tokens);
    if max_tokens == Some(0) {
        return Err(fail(ApiError::invalid("max_tokens: must be ≥ 1, got 0")));
    }
    let call = ChatCall {
        api: "chat",
        messages,
        tools,
        stop: stop_list(req.stop),
        max_tokens,
        sent_sampling: sent_sampling(req.temperature, req.top_p, req.top_k, req.seed),
        request: serde_json::from_slice(&body).unwrap_or(Value::Null),
    };
    let logprobs = req.logprobs == Some(true);
    let id = format!("chatcmpl-{}", crate::new_rid());
    let model = gateway.model_name.clone();
    if req.stream != Some(true) {
        let reply = session.call(call, &mut |_, _| true).await.map_err(fail)?;
        return Ok(Json(completion(&gateway, &id, &model, &reply, logprobs)).into_response());
    }
    let include_usage = req
        .stream_options
        .as_ref()
        .and_then(|o| o["include_usage"].as_bool())
        .unwrap_or(false);
    let has_tools = call.tools.is_some();
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        let chunk = |delta: Value, lp: Option<Value>, finish: Option<&str>| {
            json!({"id": id, "object": "chat.completion.chunk", "created": unix_now(), "model": model,
                   "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}]})
        };
        try_send_json(
            &tx,
            &chunk(json!({"role": "assistant", "content": ""}), None, None),
        );
        let mut text = TextStream::new(true, has_tools);
        let tokenizer = gateway.tokenizer.clone();
        let result = session
            .call(call, &mut |token, log_prob| {
                let piece = text.push(&tokenizer, token);
                let lp = logprobs.then(|| token_logprobs(&tokenizer, &[token], &[log_prob]));
                if piece.is_empty() && lp.is_none() {
                    return !tx.is_closed();
                }
                try_send_json(&tx, &chunk(json!({"content": piece}), lp, None))
            })
            .await;
        match result {
            Ok(reply) => {
                if !reply.tool_calls.is_empty() {
                    let calls = tool_calls::indexed(&reply.tool_calls);
                    send_json(&tx, &chunk(json!({"tool_calls": calls}), None, None)).await;
                } else if !text.rest().is_empty() {
                    send_json(&tx, &chunk(json!({"content": text.rest()}), None, None)).await;
                }
                send_json(&tx, &chunk(json!({}), None, Some(reply.finish_reason()))).await;
                if include_usage {
                    let usage = usage_chunk(
                        &id,
                        "chat.completion.chunk",
                        &model,
                        reply.prompt_tokens,
                        reply.tokens.len(),
                    );
                    send_json(&tx, &usage).await;
                }
            }
            Err(err) => send_json(&tx, &err.stream_chunk()).await,
        }
        let _ = tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
    });
    Ok(Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx)).into_response())
}

/// The whole `chat.completion` object of a reply.
fn completion(
    gateway: &Gateway,
    id: &str,
    model: &str,
    reply: &ChatReply,
    logprobs: bool,
) -> Value {
    let lp = logprobs.then(|| token_logprobs(&gateway.tokenizer, &reply.tokens, &reply.log_probs));
    let completion_tokens = reply.tokens.len();
    json!({
        "id": id, "object": "chat.completion", "created": unix_now(), "model": model,
        "choices": [{"index": 0, "message": reply.message, "logprobs": lp, "finish_reason": reply.finish_reason()}],
        "usage": {"prompt_tokens": reply.prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": reply.prompt_tokens + completion_tokens},
    })
}
