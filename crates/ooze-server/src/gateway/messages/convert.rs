//! Anthropic Messages ↔ OpenAI chat form, as pure functions: a request's `system`, `messages`,
//! `tools` and `tool_choice` become a [`ChatCall`](super::super::session::ChatCall)'s messages and
//! tools, and a [`ChatReply`] becomes a Message object.
//!
//! - `system`: a string, or text blocks joined as they are (no separator), as the system message.
//! - A user message's text blocks are joined into a user message, its `tool_result` blocks become
//!   `tool` messages (`tool_call_id` = `tool_use_id`), in their order. An assistant message's text
//!   blocks are joined into its content and its `tool_use` blocks become `tool_calls` (arguments =
//!   `input`), so a turn the gateway generated and the client sent back unchanged is the reply's
//!   own message (same trimmed text, same calls) and keeps its exact tokens.
//! - `thinking` blocks, `cache_control`, `citations`, `is_error` and any other field of a block
//!   are ignored and counted (`messages.*.content.*.FIELD`); image, document and other blocks are
//!   a 400 naming `messages[i].content[j]`.
//! - `tools`: custom tools (`name`, `description`, `input_schema`) become function tools; server
//!   tools (a `type` such as `web_search_20250305`) are a 400 naming `tools[i].type`.
//!   `tool_choice` `none` renders the chat without tools; `any` and `tool` are not enforced (the
//!   policy's sampling is not constrained) and count as ignored.

use crate::error::ApiError;
use crate::gateway::session::ChatReply;
use crate::gateway::tools::{self, shown, ToolShape};
use crate::lenient_json::unknown_fields;
use ooze_core::FinishReason;
use serde_json::{json, Map, Value};

/// The text of `blocks` (`at` names them in errors, `path` in ignored-field names): a string, or a
/// list of text blocks joined as they are.
fn text_of(
    blocks: &Value,
    at: &str,
    path: &str,
    ignored: &mut Vec<String>,
) -> Result<String, ApiError> {
    match blocks {
        Value::String(s) => Ok(s.clone()),
        Value::Array(list) => {
            let mut text = String::new();
            for (k, block) in list.iter().enumerate() {
                let obj = block.as_object();
                match (
                    obj.and_then(|o| o.get("type")).and_then(Value::as_str),
                    obj.and_then(|o| o.get("text")).and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => {
                        text.push_str(t);
                        let obj = obj.expect("invariant: has a type");
                        unknown_fields(obj, &["type", "text"], &format!("{path}.*"), ignored);
                    }
                    _ => {
                        return Err(ApiError::invalid(format!(
                            "{at}[{k}]: expected a text block {{\"type\": \"text\", \"text\": \"…\"}} (only text is supported), got {}",
                            block
                        )))
                    }
                }
            }
            Ok(text)
        }
        other => Err(ApiError::invalid(format!(
            "{at}: expected a string or a list of text blocks, got {other}"
        ))),
    }
}

/// The chat messages of a request: `system` first, then each of `messages` converted.
pub fn chat_messages(
    system: Option<&Value>,
    messages: &[Value],
    ignored: &mut Vec<String>,
) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(messages.len() + 1);
    if let Some(system) = system.filter(|s| !s.is_null()) {
        let text = text_of(system, "system", "system", ignored)?;
        out.push(json!({"role": "system", "content": text}));
    }
    for (i, message) in messages.iter().enumerate() {
        convert_message(i, message, &mut out, ignored)?;
    }
    Ok(out)
}

/// Appends message `i` in chat form: one message, or for a user message with tool results, a
/// `tool` message per result and a user message per run of text.
fn convert_message(
    i: usize,
    message: &Value,
    out: &mut Vec<Value>,
    ignored: &mut Vec<String>,
) -> Result<(), ApiError> {
    let bad = |field: &str, expected: &str, got: Option<&Value>| {
        ApiError::invalid(format!(
            "messages[{i}]{field}: expected {expected}, got {}",
            shown(got)
        ))
    };
    let Some(obj) = message.as_object() else {
        return Err(bad(
            "",
            "an object with `role` and `content`",
            Some(message),
        ));
    };
    unknown_fields(obj, &["role", "content"], "messages.*", ignored);
    let role = match obj.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant")) => r,
        _ => return Err(bad(".role", "\"user\" or \"assistant\"", obj.get("role"))),
    };
    let blocks = match obj.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        other => {
            return Err(bad(
                ".content",
                "a string or a list of content blocks",
                other,
            ))
        }
    };
    let mut text: Option<String> = None;
    let mut calls = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        let path = "messages.*.content.*";
        let Some(b) = block.as_object() else {
            return Err(ApiError::invalid(format!(
                "{at}: expected a content block object, got {block}"
            )));
        };
        let kind = b.get("type").and_then(Value::as_str).unwrap_or("");
        let field = |name: &str| b.get(name);
        match (kind, role) {
            ("text", _) => {
                let Some(t) = field("text").and_then(Value::as_str) else {
                    return Err(ApiError::invalid(format!(
                        "{at}.text: expected a string, got {}",
                        shown(field("text"))
                    )));
                };
                unknown_fields(b, &["type", "text"], path, ignored);
                text.get_or_insert_with(String::new).push_str(t);
            }
            ("tool_use", "assistant") => {
                calls.push(tool_call(b, &at)?);
                unknown_fields(b, &["type", "id", "name", "input"], path, ignored);
            }
            ("tool_result", "user") => {
                let Some(id) = field("tool_use_id").and_then(Value::as_str) else {
                    return Err(ApiError::invalid(format!(
                        "{at}.tool_use_id: expected a string, got {}",
                        shown(field("tool_use_id"))
                    )));
                };
                let content = match field("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => text_of(c, &format!("{at}.content"), &format!("{path}.content"), ignored)?,
                };
                // The chat form has no place for it: the result's own text says what failed.
                if field("is_error") == Some(&Value::Bool(true)) {
                    ignored.push(format!("{path}.is_error"));
                }
                unknown_fields(b, &["type", "tool_use_id", "content", "is_error"], path, ignored);
                if let Some(t) = text.take() {
                    out.push(json!({"role": "user", "content": t}));
                }
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            ("thinking" | "redacted_thinking", _) => ignored.push(format!("{path}.{kind}")),
            ("tool_use" | "tool_result", _) => {
                let belongs = if kind == "tool_use" { "assistant" } else { "user" };
                return Err(ApiError::invalid(format!(
                    "{at}: a {kind} block belongs in an {belongs} message, not a {role} one"
                )));
            }
            _ => {
                return Err(ApiError::invalid(format!(
                    "{at}: a {} block; the gateway supports only text (text, tool_use and tool_result blocks)",
                    shown(b.get("type"))
                )))
            }
        }
    }
    if role == "assistant" {
        let mut message = json!({"role": "assistant", "content": text.unwrap_or_default()});
        if !calls.is_empty() {
            if message["content"] == "" {
                message["content"] = Value::Null;
            }
            message["tool_calls"] = Value::Array(calls);
        }
        out.push(message);
    } else if let Some(t) = text {
        out.push(json!({"role": "user", "content": t}));
    } else if !blocks.iter().any(|b| b["type"] == "tool_result") {
        out.push(json!({"role": "user", "content": ""}));
    }
    Ok(())
}

/// A `tool_use` block as an OpenAI tool call: arguments are the `input` object (other JSON is
/// passed as its text, which the transcript reads back as the same JSON).
fn tool_call(block: &Map<String, Value>, at: &str) -> Result<Value, ApiError> {
    let string = |name: &str| {
        block
            .get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                ApiError::invalid(format!(
                    "{at}.{name}: expected a non-empty string, got {}",
                    shown(block.get(name))
                ))
            })
    };
    let (id, name) = (string("id")?, string("name")?);
    let arguments = match block.get("input") {
        None | Some(Value::Null) => json!({}),
        Some(input @ (Value::Object(_) | Value::String(_))) => input.clone(),
        Some(other) => Value::String(other.to_string()),
    };
    Ok(json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}))
}

/// How the Messages API spells a tool: a custom tool (`type` absent or `"custom"`), its schema
/// in `input_schema`.
const TOOL: ToolShape = ToolShape {
    what: "a tool object {\"name\", \"input_schema\", …}",
    check_type: |i, kind| {
        match kind {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(t)) if t == "custom" => Ok(()),
        Some(other) => Err(ApiError::invalid(format!(
            "tools[{i}].type: {other} is a server tool; the gateway serves only custom tools (name, description, input_schema), which the agent runs itself"
        ))),
    }
    },
    schema_key: "input_schema",
    schema_required: true,
};

/// `tools` as chat tools.
pub fn function_tools(tools: &[Value], ignored: &mut Vec<String>) -> Result<Vec<Value>, ApiError> {
    tools::function_tools(tools, &TOOL, ignored)
}

/// Checks `tool_choice` against the tools' `names`; whether the chat is rendered with its tools
/// (not for `none`). `any` and `tool` cannot be enforced and count as ignored.
pub fn renders_tools(
    choice: &Value,
    names: &[&str],
    ignored: &mut Vec<String>,
) -> Result<bool, ApiError> {
    let Some(obj) = choice.as_object() else {
        return Err(ApiError::invalid(format!(
            "tool_choice: expected {{\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}}, got {choice}"
        )));
    };
    unknown_fields(obj, &["type", "name"], "tool_choice", ignored);
    match obj.get("type").and_then(Value::as_str) {
        Some("auto") => Ok(true),
        Some("none") => Ok(false),
        Some("any") => {
            ignored.push("tool_choice".to_owned());
            Ok(true)
        }
        Some("tool") => tools::named_choice(obj.get("name"), names, ignored),
        _ => Err(ApiError::invalid(format!(
            "tool_choice.type: expected \"auto\", \"any\", \"tool\" or \"none\", got {}",
            shown(obj.get("type"))
        ))),
    }
}

/// Anthropic's `stop_reason` of a reply, and the stop sequence it ended at (one of the request's
/// `stop_sequences`). A call aborted (its session closed, its deadline passed) says `end_turn`.
pub fn stop_reason(reply: &ChatReply, stop_sequences: &[String]) -> (&'static str, Option<String>) {
    if !reply.tool_calls.is_empty() {
        return ("tool_use", None);
    }
    match (&reply.finish, reply.stop_string()) {
        (_, Some(s)) if stop_sequences.iter().any(|q| q == s) => {
            ("stop_sequence", Some(s.to_owned()))
        }
        (FinishReason::Length, _) => ("max_tokens", None),
        _ => ("end_turn", None),
    }
}

/// The `tool_use` blocks of a reply (`input` the parsed arguments).
pub fn tool_use_blocks(reply: &ChatReply) -> Vec<Value> {
    reply
        .tool_calls
        .iter()
        .map(|call| {
            let arguments = call["function"]["arguments"].as_str().unwrap_or("{}");
            let input = serde_json::from_str(arguments)
                .unwrap_or_else(|_| Value::String(arguments.to_owned()));
            json!({"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": input})
        })
        .collect()
}

/// Whether the reply's content gets a text block: when it has text, or nothing else.
pub fn has_text_block(reply: &ChatReply) -> bool {
    !reply.content.is_empty() || reply.tool_calls.is_empty()
}

/// The whole Message object of a reply.
pub fn message(id: &str, model: &str, reply: &ChatReply, stop_sequences: &[String]) -> Value {
    let mut content = Vec::new();
    if has_text_block(reply) {
        content.push(json!({"type": "text", "text": reply.content}));
    }
    content.extend(tool_use_blocks(reply));
    let (reason, sequence) = stop_reason(reply, stop_sequences);
    json!({
        "id": id, "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": reason, "stop_sequence": sequence,
        "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": reply.tokens.len()},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ooze_core::StopMatch;

    use crate::gateway::session::test_replies::{eos, reply};

    #[test]
    fn blocks_become_chat_messages_in_order() {
        let mut ignored = Vec::new();
        let messages = json!([
            {"role": "user", "content": [
                {"type": "text", "text": "Weather in ", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "Paris?"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hm", "signature": "x"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "20 C", "is_error": false},
                {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true,
                 "content": [{"type": "text", "text": "no "}, {"type": "text", "text": "clock"}]},
                {"type": "text", "text": "Thanks"}]},
        ]);
        let system = json!([{"type": "text", "text": "Be brief.", "cache_control": {}}]);
        let out = chat_messages(Some(&system), messages.as_array().unwrap(), &mut ignored).unwrap();
        assert_eq!(
            Value::Array(out),
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                    {"id": "toolu_2", "type": "function", "function": {"name": "get_time", "arguments": {}}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "20 C"},
                {"role": "tool", "tool_call_id": "toolu_2", "content": "no clock"},
                {"role": "user", "content": "Thanks"},
            ])
        );
        assert_eq!(
            ignored,
            [
                "system.*.cache_control",
                "messages.*.content.*.cache_control",
                "messages.*.content.*.thinking",
                "messages.*.content.*.is_error",
            ]
        );
    }

    #[test]
    fn a_generated_turn_sent_back_is_the_reply_message() {
        for r in [
            reply("", &[("get_weather", "{\"city\":\"Paris\"}")], eos()),
            reply(
                "Let me look.",
                &[("a", "{}"), ("b", "{\"x\":[1,2]}")],
                eos(),
            ),
            reply("Hello there", &[], eos()),
        ] {
            let sent = json!([{"role": "user", "content": "q"},
                              {"role": "assistant", "content": message("msg_1", "m", &r, &[])["content"]}]);
            let out = chat_messages(None, sent.as_array().unwrap(), &mut Vec::new()).unwrap();
            let back = &out[1];
            assert_eq!(
                back["content"].as_str().unwrap_or(""),
                r.message["content"].as_str().unwrap_or("")
            );
            let calls = |m: &Value| -> Vec<(Value, Value)> {
                m["tool_calls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| {
                        let args = &c["function"]["arguments"];
                        let args = args
                            .as_str()
                            .map_or(args.clone(), |s| serde_json::from_str(s).unwrap());
                        (c["function"]["name"].clone(), args)
                    })
                    .collect()
            };
            assert_eq!(calls(back), calls(&r.message));
        }
    }

    #[test]
    fn unsupported_blocks_and_bad_fields_are_named() {
        let cases = [
            (
                json!([{"role": "user", "content": [{"type": "text", "text": "a"},
                {"type": "image", "source": {"type": "base64"}}]}]),
                "messages[0].content[1]: a \"image\" block; the gateway supports only text",
            ),
            (
                json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                "content": [{"type": "image"}]}]}]),
                "messages[0].content[0].content[0]: expected a text block",
            ),
            (
                json!([{"role": "system", "content": "x"}]),
                "messages[0].role: expected \"user\" or \"assistant\"",
            ),
            (
                json!([{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]),
                "messages[0].content[0]: a tool_use block belongs in an assistant message",
            ),
            (
                json!([{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "input": {}}]}]),
                "messages[0].content[0].name: expected a non-empty string",
            ),
            (
                json!([{"role": "user", "content": 3}]),
                "messages[0].content: expected a string or a list",
            ),
        ];
        for (messages, expected) in cases {
            let err =
                chat_messages(None, messages.as_array().unwrap(), &mut Vec::new()).unwrap_err();
            assert!(err.message.starts_with(expected), "{}", err.message);
            assert_eq!(err.code, "invalid_request");
        }
    }

    #[test]
    fn tools_and_tool_choice() {
        let mut ignored = Vec::new();
        let tools = json!([
            {"name": "get_weather", "description": "Weather", "cache_control": {"type": "ephemeral"},
             "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
            {"type": "custom", "name": "f", "input_schema": {"type": "object"}},
        ]);
        let out = function_tools(tools.as_array().unwrap(), &mut ignored).unwrap();
        assert_eq!(
            out[0],
            json!({"type": "function", "function": {"name": "get_weather", "description": "Weather",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
        );
        assert_eq!(
            out[1],
            json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})
        );
        assert!(crate::tool_calls::check_tools(&out).is_ok());
        assert_eq!(ignored, ["tools.*.cache_control"]);

        for (tools, expected) in [
            (
                json!([{"type": "web_search_20250305", "name": "web_search"}]),
                "tools[0].type: \"web_search_20250305\" is a server tool",
            ),
            (
                json!([{"name": "f"}]),
                "tools[0].input_schema: expected a JSON schema object, got nothing",
            ),
            (
                json!([{"name": "f", "input_schema": {}}, {"name": "f", "input_schema": {}}]),
                "tools[1].name: \"f\" is already",
            ),
        ] {
            let err = function_tools(tools.as_array().unwrap(), &mut Vec::new()).unwrap_err();
            assert!(err.message.starts_with(expected), "{}", err.message);
        }

        let names = ["get_weather", "f"];
        let mut ignored = Vec::new();
        assert!(renders_tools(
            &json!({"type": "auto", "disable_parallel_tool_use": true}),
            &names,
            &mut ignored
        )
        .unwrap());
        assert!(!renders_tools(&json!({"type": "none"}), &names, &mut ignored).unwrap());
        assert!(renders_tools(&json!({"type": "any"}), &names, &mut ignored).unwrap());
        assert!(
            renders_tools(&json!({"type": "tool", "name": "f"}), &names, &mut ignored).unwrap()
        );
        assert_eq!(
            ignored,
            [
                "tool_choice.disable_parallel_tool_use",
                "tool_choice",
                "tool_choice"
            ]
        );
        let err =
            renders_tools(&json!({"type": "tool", "name": "g"}), &names, &mut ignored).unwrap_err();
        assert!(
            err.message.starts_with("tool_choice.name: \"g\""),
            "{}",
            err.message
        );
        let err = renders_tools(&json!("auto"), &names, &mut ignored).unwrap_err();
        assert!(
            err.message.starts_with("tool_choice: expected"),
            "{}",
            err.message
        );
    }

    #[test]
    fn replies_as_message_objects() {
        let tool_use = message(
            "msg_1",
            "policy",
            &reply("", &[("get_weather", "{\"city\":\"Paris\"}")], eos()),
            &[],
        );
        assert_eq!(
            tool_use,
            json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "policy",
                   "content": [{"type": "tool_use", "id": "call_s_0_0", "name": "get_weather", "input": {"city": "Paris"}}],
                   "stop_reason": "tool_use", "stop_sequence": null,
                   "usage": {"input_tokens": 7, "output_tokens": 3}})
        );
        let both = message(
            "m",
            "p",
            &reply("Let me see.", &[("f", "{}")], FinishReason::Length),
            &[],
        );
        assert_eq!(
            both["content"][0],
            json!({"type": "text", "text": "Let me see."})
        );
        assert_eq!(both["content"][1]["type"], "tool_use");
        assert_eq!(both["stop_reason"], "tool_use");

        let cut = message("m", "p", &reply("abc", &[], FinishReason::Length), &[]);
        assert_eq!(
            (cut["stop_reason"].as_str(), &cut["content"]),
            (
                Some("max_tokens"),
                &json!([{"type": "text", "text": "abc"}])
            )
        );
        let stop = FinishReason::Stop {
            matched: StopMatch::Text("END".into()),
        };
        let at_stop = message(
            "m",
            "p",
            &reply("abc", &[], stop.clone()),
            &["END".to_owned()],
        );
        assert_eq!(
            (
                at_stop["stop_reason"].as_str(),
                at_stop["stop_sequence"].as_str()
            ),
            (Some("stop_sequence"), Some("END"))
        );
        let recipe_stop = message("m", "p", &reply("abc", &[], stop), &[]);
        assert_eq!(recipe_stop["stop_reason"], "end_turn");
        let empty = message("m", "p", &reply("", &[], eos()), &[]);
        assert_eq!(empty["content"], json!([{"type": "text", "text": ""}]));
        assert_eq!(empty["stop_reason"], "end_turn");
    }
}
