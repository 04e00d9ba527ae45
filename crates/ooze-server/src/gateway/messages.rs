//! Anthropic Messages (`POST /v1/messages`) on a gateway session, for agents written against
//! Anthropic's API (the `anthropic` SDK, coding CLIs): `system`, `messages` with text, `tool_use`
//! and `tool_result` blocks, custom `tools`, `tool_choice`, `stop_sequences`, `max_tokens`, and
//! streaming as Anthropic's named events. Errors, the 401 of an unknown session included, are in
//! Anthropic's shape (`{"type": "error", "error": {"type", "message"}}`).
//!
//! The request becomes a [`ChatCall`] in OpenAI chat form and the reply a Message object
//! ([`convert`] says how). `temperature`, `top_p` and `top_k` are recorded, not applied;
//! `metadata`, `thinking`, `service_tier` and every other field are ignored and counted.
//!
//! Streaming sends `message_start`, then per content block `content_block_start`,
//! `content_block_delta` (`text_delta` as text is generated; a tool call's `input_json_delta`
//! once the turn is parsed) and `content_block_stop`, then `message_delta` (stop reason, usage)
//! and `message_stop`; an error after the stream began is an `error` event. `message_start`
//! waits for the first token, so a call refused before generating is an HTTP error.

pub mod convert;

use super::events::{Events, Pieces};
use super::session::{ChatCall, ChatReply};
use super::{chat::sent_sampling, Api, Gateway, GatewayError};
use crate::error::ApiError;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The fields the gateway reads; every other one is counted as ignored.
#[derive(Deserialize)]
pub struct MessagesRequest {
    messages: Vec<Value>,
    system: Option<Value>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    stop_sequences: Option<Vec<String>>,
    max_tokens: Option<usize>,
    stream: Option<bool>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
}

fn anthropic(error: ApiError) -> GatewayError {
    GatewayError {
        api: Api::Anthropic,
        error,
    }
}

/// The call a request makes, and its stop sequences.
fn chat_call(
    req: MessagesRequest,
    body: &Bytes,
    ignored: &mut Vec<String>,
) -> Result<(ChatCall, Vec<String>), ApiError> {
    let messages = convert::chat_messages(req.system.as_ref(), &req.messages, ignored)?;
    let messages = crate::openai::normalise_messages(messages)?;
    let declared = convert::function_tools(req.tools.as_deref().unwrap_or_default(), ignored)?;
    let tools = super::tools::call_tools(
        declared,
        req.tool_choice.as_ref(),
        ignored,
        convert::renders_tools,
    )?;
    if req.max_tokens == Some(0) {
        return Err(ApiError::invalid("max_tokens: must be ≥ 1, got 0"));
    }
    let stop: Vec<String> = req
        .stop_sequences
        .unwrap_or_default()
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect();
    let call = ChatCall {
        api: "messages",
        messages,
        tools,
        stop: stop.clone(),
        max_tokens: req.max_tokens,
        sent_sampling: sent_sampling(req.temperature, req.top_p, req.top_k, None),
        request: serde_json::from_slice(body).unwrap_or(Value::Null),
    };
    Ok((call, stop))
}

pub async fn messages(
    State(gateway): State<Arc<Gateway>>,
    path: Option<Path<String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, GatewayError> {
    let (session, req): (_, MessagesRequest) = gateway
        .request(path.as_ref(), &headers, &body)
        .map_err(anthropic)?;
    let stream = req.stream == Some(true);
    let mut ignored = Vec::new();
    let converted = chat_call(req, &body, &mut ignored);
    gateway.count_ignored(&session, &ignored);
    let (call, stop) = converted.map_err(anthropic)?;
    let id = format!("msg_{}", crate::new_rid());
    let model = gateway.model_name.clone();
    if !stream {
        let reply = session
            .call(call, &mut |_, _| true)
            .await
            .map_err(anthropic)?;
        return Ok(Json(convert::message(&id, &model, &reply, &stop)).into_response());
    }
    let (events, opening) = Events::new(false);
    let has_tools = call.tools.is_some();
    tokio::spawn(async move {
        let mut stream = MessageStream {
            events,
            pieces: Pieces::new(has_tools),
            text_open: false,
            id,
            model,
        };
        let prompt_tokens = AtomicUsize::new(0);
        let tokenizer = gateway.tokenizer.clone();
        let result = session
            .call_with_prompt(
                call,
                &mut |n| prompt_tokens.store(n, Ordering::Relaxed),
                &mut |token, _| {
                    stream.start(prompt_tokens.load(Ordering::Relaxed));
                    let piece = stream.pieces.push(&tokenizer, token);
                    stream.text(&piece);
                    !stream.events.is_closed()
                },
            )
            .await;
        match result {
            Ok(reply) => stream.finish(&reply, &stop),
            Err(error) => {
                if let Some(error) = stream.events.refuse(error) {
                    stream.events.send("error", anthropic(error).body());
                }
            }
        }
    });
    opening.response().await.map_err(anthropic)
}

/// A Message being streamed.
struct MessageStream {
    events: Events,
    pieces: Pieces,
    /// Whether content block 0, the text, has started.
    text_open: bool,
    id: String,
    model: String,
}

impl MessageStream {
    /// Opens the stream with `message_start`, once.
    fn start(&mut self, prompt_tokens: usize) {
        if self.events.is_open() {
            return;
        }
        self.events.open();
        let message = json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": 0},
        });
        self.events.send(
            "message_start",
            json!({"type": "message_start", "message": message}),
        );
    }

    /// Sends `piece` of the text block (starting it first).
    fn text(&mut self, piece: &str) {
        if piece.is_empty() {
            return;
        }
        self.open_text();
        self.events.send(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "text_delta", "text": piece}}),
        );
    }

    fn open_text(&mut self) {
        if !self.text_open {
            self.text_open = true;
            self.events.send(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0,
                       "content_block": {"type": "text", "text": ""}}),
            );
        }
    }

    /// The rest of the text, the tool calls, and the end of the message.
    fn finish(&mut self, reply: &ChatReply, stop_sequences: &[String]) {
        self.start(reply.prompt_tokens);
        let rest = self.pieces.rest(&reply.content);
        self.text(&rest);
        if convert::has_text_block(reply) {
            self.open_text();
        }
        let mut index = 0;
        if self.text_open {
            self.events.send(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            );
            index = 1;
        }
        for mut block in convert::tool_use_blocks(reply) {
            let input = std::mem::replace(&mut block["input"], json!({}));
            self.events.send(
                "content_block_start",
                json!({"type": "content_block_start", "index": index, "content_block": block}),
            );
            self.events.send(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                       "delta": {"type": "input_json_delta", "partial_json": input.to_string()}}),
            );
            self.events.send(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            );
            index += 1;
        }
        let (reason, sequence) = convert::stop_reason(reply, stop_sequences);
        self.events.send(
            "message_delta",
            json!({"type": "message_delta",
                   "delta": {"stop_reason": reason, "stop_sequence": sequence},
                   "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": reply.tokens.len()}}),
        );
        self.events
            .send("message_stop", json!({"type": "message_stop"}));
    }
}
