//! OpenAI Responses (`POST /v1/responses`) on a gateway session, for agents written against the
//! newer OpenAI API (the `openai` SDK's `client.responses`, the OpenAI Agents SDK): `input` as a
//! string or items, `instructions`, function `tools`, `tool_choice`, `previous_response_id`,
//! `max_output_tokens`, and streaming as the Responses event sequence.
//!
//! The request becomes a [`ChatCall`] in OpenAI chat form and the reply a Response object
//! ([`convert`] says how). `instructions` is the system message, first; `previous_response_id`
//! puts the conversation that response ended (its input items and its output, not its
//! instructions) before `input`. Those conversations are kept by the session only (the last
//! [`RESPONSES_KEPT`](super::session::RESPONSES_KEPT)), whatever `store` says; an id it does not
//! keep is a 400. `temperature` and `top_p` are recorded, not applied; `store`, `reasoning`,
//! `include`, `metadata`, `truncation`, `text` and every other field are ignored and counted.
//!
//! A reply is `completed`, `incomplete` (`max_output_tokens`: cut at a token limit) or, when its
//! session closed or ran out of time while it generated, `cancelled`. Streaming sends
//! `response.created` and `response.in_progress` (once the first token is there: a call refused
//! before generating is an HTTP error), the message item's `output_item.added`,
//! `content_part.added` and `output_text.delta` as text is generated, then its `.done` events,
//! each function call's item with `function_call_arguments.delta`/`.done` once the turn is
//! parsed, and `response.completed` (`response.incomplete` otherwise) with the whole Response;
//! every event has its `sequence_number`. An error after the stream began is `response.failed`.

pub mod convert;

use super::events::{Events, Pieces};
use super::session::{ChatCall, ChatReply, Session};
use super::{chat::sent_sampling, Gateway, GatewayError};
use crate::error::ApiError;
use crate::openai::unix_now;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// The fields the gateway reads; every other one is counted as ignored.
#[derive(Deserialize)]
pub struct ResponsesRequest {
    input: Option<Value>,
    instructions: Option<String>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    previous_response_id: Option<String>,
    max_output_tokens: Option<usize>,
    stream: Option<bool>,
    temperature: Option<f64>,
    top_p: Option<f64>,
}

/// What a Response object repeats of its request.
struct Echo {
    instructions: Option<String>,
    tools: Vec<Value>,
    tool_choice: Value,
    parallel_tool_calls: bool,
    temperature: Option<f64>,
    top_p: Option<f64>,
    max_output_tokens: Option<usize>,
    previous_response_id: Option<String>,
}

/// One Response: its id, when it was made, and what it repeats of its request.
struct Head {
    id: String,
    model: String,
    created_at: u64,
    echo: Echo,
}

impl Head {
    /// The Response object with `status`, `output` and `usage`.
    fn object(&self, status: &str, output: Vec<Value>, usage: Value, incomplete: Value) -> Value {
        let e = &self.echo;
        json!({
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "background": false, "error": null, "incomplete_details": incomplete,
            "instructions": e.instructions, "max_output_tokens": e.max_output_tokens,
            "model": self.model, "output": output, "parallel_tool_calls": e.parallel_tool_calls,
            "previous_response_id": e.previous_response_id, "reasoning": null,
            "temperature": e.temperature, "text": {"format": {"type": "text"}},
            "tool_choice": e.tool_choice, "tools": e.tools, "top_p": e.top_p,
            "truncation": "disabled", "usage": usage, "user": null, "metadata": {},
        })
    }

    /// The finished Response of `reply`.
    fn finished(&self, reply: &ChatReply) -> Value {
        let (status, incomplete) = convert::status(reply);
        let output = convert::output(&self.id, reply);
        self.object(status, output, convert::usage(reply), incomplete)
    }
}

/// The call a request makes, and the conversation before its reply (without the instructions).
fn chat_call(
    session: &Session,
    req: &ResponsesRequest,
    body: &Bytes,
    ignored: &mut Vec<String>,
) -> Result<(ChatCall, Vec<Value>), ApiError> {
    let mut history = match &req.previous_response_id {
        Some(id) => session.response_conversation(id).ok_or_else(|| {
            ApiError::invalid(format!(
                "previous_response_id: this session has no response {id} (responses are kept by the session that made them, the last {})",
                super::session::RESPONSES_KEPT
            ))
        })?,
        None => Vec::new(),
    };
    history.extend(convert::chat_messages(req.input.as_ref(), ignored)?);
    if history.is_empty() {
        return Err(ApiError::invalid(
            "input: expected a string or a list of items (or a previous_response_id), got nothing",
        ));
    }
    let history = crate::openai::normalise_messages(history)
        .map_err(|e| ApiError::invalid(format!("input, as chat messages: {}", e.message)))?;
    let declared = convert::function_tools(req.tools.as_deref().unwrap_or_default(), ignored)?;
    let tools = super::tools::call_tools(
        declared,
        req.tool_choice.as_ref(),
        ignored,
        convert::renders_tools,
    )?;
    if req.max_output_tokens == Some(0) {
        return Err(ApiError::invalid("max_output_tokens: must be ≥ 1, got 0"));
    }
    let mut messages = Vec::with_capacity(history.len() + 1);
    if let Some(instructions) = &req.instructions {
        messages.push(json!({"role": "system", "content": instructions}));
    }
    messages.extend(history.iter().cloned());
    let call = ChatCall {
        api: "responses",
        messages,
        tools,
        stop: Vec::new(),
        max_tokens: req.max_output_tokens,
        sent_sampling: sent_sampling(req.temperature, req.top_p, None, None),
        request: serde_json::from_slice(body).unwrap_or(Value::Null),
    };
    Ok((call, history))
}

pub async fn responses(
    State(gateway): State<Arc<Gateway>>,
    path: Option<Path<String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, GatewayError> {
    let fail = GatewayError::openai;
    let (session, req): (_, ResponsesRequest) = gateway
        .request(path.as_ref(), &headers, &body)
        .map_err(fail)?;
    let mut ignored = Vec::new();
    let converted = chat_call(&session, &req, &body, &mut ignored);
    gateway.count_ignored(&session, &ignored);
    let (call, history) = converted.map_err(fail)?;
    let head = Head {
        id: format!("resp_{}", crate::new_rid()),
        model: gateway.model_name.clone(),
        created_at: unix_now(),
        echo: Echo {
            instructions: req.instructions,
            tools: req.tools.unwrap_or_default(),
            tool_choice: req.tool_choice.unwrap_or_else(|| json!("auto")),
            parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
            temperature: req.temperature,
            top_p: req.top_p,
            max_output_tokens: req.max_output_tokens,
            previous_response_id: req.previous_response_id,
        },
    };
    if req.stream != Some(true) {
        let reply = session.call(call, &mut |_, _| true).await.map_err(fail)?;
        remember(&session, &head, history, &reply);
        return Ok(Json(head.finished(&reply)).into_response());
    }
    let (events, opening) = Events::new(true);
    let has_tools = call.tools.is_some();
    tokio::spawn(async move {
        let mut stream = ResponseStream {
            events,
            pieces: Pieces::new(has_tools),
            message_open: false,
            head,
        };
        let tokenizer = gateway.tokenizer.clone();
        let result = session
            .call(call, &mut |token, _| {
                stream.start();
                let piece = stream.pieces.push(&tokenizer, token);
                stream.text(&piece);
                !stream.events.is_closed()
            })
            .await;
        match result {
            Ok(reply) => {
                remember(&session, &stream.head, history, &reply);
                stream.finish(&reply);
            }
            Err(error) => {
                if let Some(error) = stream.events.refuse(error) {
                    stream.fail(&error);
                }
            }
        }
    });
    opening.response().await.map_err(fail)
}

/// Keeps the conversation the reply ends, for a later `previous_response_id`.
fn remember(session: &Session, head: &Head, mut history: Vec<Value>, reply: &ChatReply) {
    history.push(reply.message.clone());
    session.remember_response(head.id.clone(), history);
}

/// A Response being streamed.
struct ResponseStream {
    events: Events,
    pieces: Pieces,
    /// Whether the message item (output 0) has been added.
    message_open: bool,
    head: Head,
}

impl ResponseStream {
    /// Opens the stream with `response.created` and `response.in_progress`, once.
    fn start(&mut self) {
        if self.events.is_open() {
            return;
        }
        self.events.open();
        let response = self
            .head
            .object("in_progress", Vec::new(), Value::Null, Value::Null);
        for kind in ["response.created", "response.in_progress"] {
            self.events
                .send(kind, json!({"type": kind, "response": response}));
        }
    }

    fn message_id(&self) -> String {
        convert::item_ids(&self.head.id).0
    }

    /// Adds the message item and its text part, once.
    fn open_message(&mut self) {
        if self.message_open {
            return;
        }
        self.message_open = true;
        let id = self.message_id();
        self.events.send(
            "response.output_item.added",
            json!({"type": "response.output_item.added", "output_index": 0,
                   "item": convert::message_item(&id, "", "in_progress")}),
        );
        self.events.send(
            "response.content_part.added",
            json!({"type": "response.content_part.added", "item_id": id, "output_index": 0,
                   "content_index": 0, "part": convert::text_part("")}),
        );
    }

    /// Sends `piece` of the message's text.
    fn text(&mut self, piece: &str) {
        if piece.is_empty() {
            return;
        }
        self.open_message();
        self.events.send(
            "response.output_text.delta",
            json!({"type": "response.output_text.delta", "item_id": self.message_id(),
                   "output_index": 0, "content_index": 0, "delta": piece, "logprobs": []}),
        );
    }

    /// The rest of the text, the function calls, and the whole Response.
    fn finish(&mut self, reply: &ChatReply) {
        self.start();
        let rest = self.pieces.rest(&reply.content);
        self.text(&rest);
        let response = self.head.finished(reply);
        let output = response["output"].as_array().cloned().unwrap_or_default();
        let mut index = 0;
        if convert::has_message(reply) {
            self.open_message();
            let (id, item) = (self.message_id(), &output[0]);
            let part = &item["content"][0];
            let with = |kind: &str, key: &str, value: &Value| json!({"type": kind, "item_id": id, "output_index": 0, "content_index": 0, key: value});
            let mut text_done = with("response.output_text.done", "text", &part["text"]);
            text_done["logprobs"] = json!([]);
            self.events.send("response.output_text.done", text_done);
            let part_done = with("response.content_part.done", "part", part);
            self.events.send("response.content_part.done", part_done);
            self.events.send(
                "response.output_item.done",
                json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
            );
            index = 1;
        }
        for (i, item) in output[index..].iter().enumerate() {
            let output_index = index + i;
            let added =
                convert::call_item(reply, i, item["id"].as_str().unwrap_or(""), "in_progress");
            self.events.send(
                "response.output_item.added",
                json!({"type": "response.output_item.added", "output_index": output_index, "item": added}),
            );
            self.events.send(
                "response.function_call_arguments.delta",
                json!({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                       "output_index": output_index, "delta": item["arguments"]}),
            );
            self.events.send(
                "response.function_call_arguments.done",
                json!({"type": "response.function_call_arguments.done", "item_id": item["id"],
                       "output_index": output_index, "name": item["name"], "arguments": item["arguments"]}),
            );
            self.events.send(
                "response.output_item.done",
                json!({"type": "response.output_item.done", "output_index": output_index, "item": item}),
            );
        }
        let kind = if response["status"] == "completed" {
            "response.completed"
        } else {
            "response.incomplete"
        };
        self.events
            .send(kind, json!({"type": kind, "response": response}));
    }

    /// Ends a stream that began with `response.failed`.
    fn fail(&mut self, error: &ApiError) {
        let mut response = self
            .head
            .object("failed", Vec::new(), Value::Null, Value::Null);
        response["error"] = json!({"code": "server_error", "message": error.message});
        self.events.send(
            "response.failed",
            json!({"type": "response.failed", "response": response}),
        );
    }
}
