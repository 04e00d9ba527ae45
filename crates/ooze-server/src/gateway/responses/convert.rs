//! OpenAI Responses ↔ OpenAI chat form, as pure functions: a request's `input`, `tools` and
//! `tool_choice` become a [`ChatCall`](super::super::session::ChatCall)'s messages and tools, and
//! a [`ChatReply`] becomes a Response object's `output` items.
//!
//! - `input`: a string is one user message. Items: messages (`role` user, assistant, system or
//!   developer; `content` a string or `input_text` / `output_text` parts joined as they are),
//!   `function_call` (`call_id`, `name`, `arguments`) and `function_call_output` (`call_id`,
//!   `output`). Consecutive `function_call` items are one assistant message with several
//!   `tool_calls`, and an assistant message item just before them is that message's content: the
//!   output items of a reply, sent back, are the reply's own message again (same trimmed text,
//!   same calls), so its turn keeps its exact tokens. `reasoning` items are ignored and counted;
//!   other items (hosted tools' calls, item references) and image, file or audio parts are a 400
//!   naming `input[i]…`. Fields of an item the gateway does not act on (`id`, `status`,
//!   `annotations`) are counted as ignored (`input.*.FIELD`).
//! - `tools`: function tools (`name`, `description`, `parameters`) become chat tools; `strict` is
//!   ignored and counted; hosted tools (`web_search`, `file_search`, …) are a 400 naming
//!   `tools[i].type`. `tool_choice` `none` renders the chat without tools; `required` and a named
//!   function are not enforced and count as ignored.

use crate::error::ApiError;
use crate::gateway::session::ChatReply;
use crate::gateway::tools::{self, shown, ToolShape};
use crate::lenient_json::unknown_fields;
use ooze_core::FinishReason;
use serde_json::{json, Value};

/// The text of a message's `content` or a call output (`at` names it in errors, `path` in
/// ignored-field names): a string, or text parts joined as they are.
fn text_of(
    content: &Value,
    at: &str,
    path: &str,
    ignored: &mut Vec<String>,
) -> Result<String, ApiError> {
    let parts = match content {
        Value::String(s) => return Ok(s.clone()),
        Value::Array(parts) => parts,
        other => {
            return Err(ApiError::invalid(format!(
                "{at}: expected a string or a list of text parts, got {other}"
            )))
        }
    };
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        let obj = part.as_object();
        let kind = obj.and_then(|o| o.get("type")).and_then(Value::as_str);
        let key = if kind == Some("refusal") {
            "refusal"
        } else {
            "text"
        };
        match (kind, obj.and_then(|o| o.get(key)).and_then(Value::as_str)) {
            (Some("input_text" | "output_text" | "refusal"), Some(t)) => {
                text.push_str(t);
                let obj = obj.expect("invariant: has a type");
                unknown_fields(obj, &["type", key], &format!("{path}.*"), ignored);
            }
            _ => {
                return Err(ApiError::invalid(format!(
                    "{at}[{j}]: expected a text part {{\"type\": \"input_text\", \"text\": \"…\"}} (only text is supported), got {part}"
                )))
            }
        }
    }
    Ok(text)
}

/// Roles a message item may have; `developer` is the chat template's `system`.
const ROLES: [&str; 4] = ["user", "assistant", "system", "developer"];

/// The chat messages of `input` (absent: none).
pub fn chat_messages(
    input: Option<&Value>,
    ignored: &mut Vec<String>,
) -> Result<Vec<Value>, ApiError> {
    let items = match input {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => return Ok(vec![json!({"role": "user", "content": s})]),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "input: expected a string or a list of items, got {other}"
            )))
        }
    };
    let mut out: Vec<Value> = Vec::with_capacity(items.len());
    // Whether the last message is an assistant message that the next function_call joins.
    let mut joinable = false;
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let Some(obj) = item.as_object() else {
            return Err(ApiError::invalid(format!(
                "{at}: expected an item object, got {item}"
            )));
        };
        let string = |name: &str| {
            obj.get(name).and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid(format!(
                    "{at}.{name}: expected a string, got {}",
                    shown(obj.get(name))
                ))
            })
        };
        let kind = match obj.get("type") {
            None if obj.contains_key("role") => "message",
            Some(Value::String(t)) => t.as_str(),
            other => {
                return Err(ApiError::invalid(format!(
                    "{at}.type: expected a string, got {}",
                    shown(other)
                )))
            }
        };
        match kind {
            "message" => {
                let role = match obj.get("role").and_then(Value::as_str) {
                    Some(r) if ROLES.contains(&r) => r,
                    _ => {
                        return Err(ApiError::invalid(format!(
                            "{at}.role: expected \"user\", \"assistant\", \"system\" or \"developer\", got {}",
                            shown(obj.get("role"))
                        )))
                    }
                };
                let content = obj.get("content").ok_or_else(|| {
                    ApiError::invalid(format!("{at}.content: expected a string or a list of text parts, got nothing"))
                })?;
                let text = text_of(content, &format!("{at}.content"), "input.*.content", ignored)?;
                unknown_fields(obj, &["type", "role", "content"], "input.*", ignored);
                out.push(json!({"role": role, "content": text}));
                joinable = role == "assistant";
            }
            "function_call" => {
                let (call_id, arguments) = (string("call_id")?, string("arguments")?);
                let name = string("name")?;
                if name.is_empty() {
                    return Err(ApiError::invalid(format!("{at}.name: expected a non-empty string, got \"\"")));
                }
                unknown_fields(obj, &["type", "call_id", "name", "arguments"], "input.*", ignored);
                let call = json!({"id": call_id, "type": "function",
                                  "function": {"name": name, "arguments": arguments}});
                match out.last_mut().filter(|_| joinable) {
                    Some(message) => {
                        if message["content"] == "" {
                            message["content"] = Value::Null;
                        }
                        match message["tool_calls"].as_array_mut() {
                            Some(calls) => calls.push(call),
                            None => message["tool_calls"] = json!([call]),
                        }
                    }
                    None => out.push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
                }
                joinable = true;
            }
            "function_call_output" => {
                let call_id = string("call_id")?;
                let output = obj.get("output").ok_or_else(|| {
                    ApiError::invalid(format!("{at}.output: expected a string or a list of text parts, got nothing"))
                })?;
                let text = text_of(output, &format!("{at}.output"), "input.*.output", ignored)?;
                unknown_fields(obj, &["type", "call_id", "output"], "input.*", ignored);
                out.push(json!({"role": "tool", "tool_call_id": call_id, "content": text}));
                joinable = false;
            }
            "reasoning" => ignored.push("input.*.reasoning".to_owned()),
            other => {
                return Err(ApiError::invalid(format!(
                    "{at}.type: \"{other}\" items are not supported; the gateway takes message, function_call and function_call_output items (reasoning is ignored)"
                )))
            }
        }
    }
    Ok(out)
}

/// How the Responses API spells a tool: `"type": "function"`, its schema (optional) in
/// `parameters`.
const TOOL: ToolShape = ToolShape {
    what: "a function tool {\"type\": \"function\", \"name\", …}",
    check_type: |i, kind| {
        match kind.and_then(Value::as_str) {
        Some("function") => Ok(()),
        Some(other) => Err(ApiError::invalid(format!(
            "tools[{i}].type: \"{other}\" is a hosted tool; the gateway serves only function tools, which the agent runs itself"
        ))),
        None => Err(ApiError::invalid(format!(
            "tools[{i}].type: expected \"function\", got {}",
            shown(kind)
        ))),
    }
    },
    schema_key: "parameters",
    schema_required: false,
};

/// `tools` as chat tools.
pub fn function_tools(tools: &[Value], ignored: &mut Vec<String>) -> Result<Vec<Value>, ApiError> {
    tools::function_tools(tools, &TOOL, ignored)
}

/// Checks `tool_choice` against the tools' `names`; whether the chat is rendered with its tools
/// (not for `none`). `required`, a named function and `allowed_tools` are not enforced and count
/// as ignored.
pub fn renders_tools(
    choice: &Value,
    names: &[&str],
    ignored: &mut Vec<String>,
) -> Result<bool, ApiError> {
    let kind = choice
        .as_str()
        .or_else(|| choice.get("type").and_then(Value::as_str));
    match kind {
        Some("auto") => Ok(true),
        Some("none") => Ok(false),
        Some("required" | "allowed_tools") => {
            ignored.push("tool_choice".to_owned());
            Ok(true)
        }
        Some("function") if choice.is_object() => {
            tools::named_choice(choice.get("name"), names, ignored)
        }
        _ => Err(ApiError::invalid(format!(
            "tool_choice: expected \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"name\": …}}, got {choice}"
        ))),
    }
}

/// A Response's `status`, and its `incomplete_details`.
pub fn status(reply: &ChatReply) -> (&'static str, Value) {
    match reply.finish {
        _ if !reply.tool_calls.is_empty() => ("completed", Value::Null),
        FinishReason::Length => ("incomplete", json!({"reason": "max_output_tokens"})),
        // The session closed or its deadline passed while the call generated.
        FinishReason::Abort => ("cancelled", Value::Null),
        FinishReason::Stop { .. } => ("completed", Value::Null),
    }
}

/// Ids of a Response's output items, from its own id `resp_X`: `msg_X` for the message and
/// `fc_X_i` for the `i`-th function call.
pub fn item_ids(response_id: &str) -> (String, impl Fn(usize) -> String) {
    let x = response_id
        .strip_prefix("resp_")
        .unwrap_or(response_id)
        .to_owned();
    (format!("msg_{x}"), move |i| format!("fc_{x}_{i}"))
}

/// Whether a reply's output has a message item: when it has text, or nothing else.
pub fn has_message(reply: &ChatReply) -> bool {
    !reply.content.is_empty() || reply.tool_calls.is_empty()
}

/// The `output_text` part of `text`.
pub fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// The message item of `text`.
pub fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" {
        json!([])
    } else {
        json!([text_part(text)])
    };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

/// The `i`-th function call item of a reply (`arguments` as generated, a JSON string).
pub fn call_item(reply: &ChatReply, i: usize, id: &str, status: &str) -> Value {
    let call = &reply.tool_calls[i];
    let arguments = if status == "in_progress" {
        ""
    } else {
        call["function"]["arguments"].as_str().unwrap_or("{}")
    };
    json!({"type": "function_call", "id": id, "call_id": call["id"], "name": call["function"]["name"],
           "arguments": arguments, "status": status})
}

/// A reply's output items, finished.
pub fn output(response_id: &str, reply: &ChatReply) -> Vec<Value> {
    let (message_id, call_id) = item_ids(response_id);
    let item_status = match status(reply).0 {
        "completed" => "completed",
        _ => "incomplete",
    };
    let mut items = Vec::with_capacity(reply.tool_calls.len() + 1);
    if has_message(reply) {
        items.push(message_item(&message_id, &reply.content, item_status));
    }
    for i in 0..reply.tool_calls.len() {
        items.push(call_item(reply, i, &call_id(i), "completed"));
    }
    items
}

/// A Response's `usage`.
pub fn usage(reply: &ChatReply) -> Value {
    let output = reply.tokens.len();
    json!({"input_tokens": reply.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
           "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
           "total_tokens": reply.prompt_tokens + output})
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::gateway::session::test_replies::{eos, reply};

    #[test]
    fn items_become_chat_messages() {
        let mut ignored = Vec::new();
        let input = json!([
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in "},
                                                           {"type": "input_text", "text": "Paris?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "20 C"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "noon"}]},
            {"type": "function_call", "call_id": "c3", "name": "get_time", "arguments": "{}"},
        ]);
        let out = chat_messages(Some(&input), &mut ignored).unwrap();
        assert_eq!(
            Value::Array(out),
            json!([
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "20 C"},
                {"role": "tool", "tool_call_id": "c2", "content": "noon"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c3", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
            ])
        );
        assert_eq!(
            ignored,
            [
                "input.*.reasoning",
                "input.*.content.*.annotations",
                "input.*.id",
                "input.*.status",
                "input.*.id"
            ]
        );
        let text = chat_messages(Some(&json!("Hi")), &mut ignored).unwrap();
        assert_eq!(text, [json!({"role": "user", "content": "Hi"})]);
        assert!(chat_messages(None, &mut ignored).unwrap().is_empty());
    }

    #[test]
    fn a_reply_sent_back_is_its_own_message() {
        for r in [
            reply("", &[("get_weather", "{\"city\":\"Paris\"}")], eos()),
            reply(
                "Let me look.",
                &[("a", "{}"), ("b", "{\"x\":[1,2]}")],
                eos(),
            ),
            reply("Hello there", &[], eos()),
        ] {
            let mut input = vec![json!({"role": "user", "content": "q"})];
            input.extend(output("resp_1", &r));
            let out = chat_messages(Some(&Value::Array(input)), &mut Vec::new()).unwrap();
            assert_eq!(out.len(), 2, "{out:?}");
            let back = &out[1];
            assert_eq!(
                back["content"].as_str().unwrap_or(""),
                r.message["content"].as_str().unwrap_or("")
            );
            assert_eq!(back["tool_calls"], r.message["tool_calls"]);
        }
    }

    #[test]
    fn unsupported_items_parts_and_tools_are_named() {
        for (input, expected) in [
            (
                json!([{"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_image", "image_url": "x"}]}]),
                "input[0].content[1]: expected a text part",
            ),
            (
                json!([{"type": "web_search_call", "id": "ws"}]),
                "input[0].type: \"web_search_call\" items are not supported",
            ),
            (
                json!([{"role": "tool", "content": "x"}]),
                "input[0].role: expected \"user\"",
            ),
            (
                json!([{"type": "function_call", "call_id": "c", "name": "f"}]),
                "input[0].arguments: expected a string, got nothing",
            ),
            (
                json!([{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_file"}]}]),
                "input[0].output[0]: expected a text part",
            ),
            (
                json!({"role": "user"}),
                "input: expected a string or a list",
            ),
        ] {
            let err = chat_messages(Some(&input), &mut Vec::new()).unwrap_err();
            assert!(err.message.starts_with(expected), "{}", err.message);
        }
        let mut ignored = Vec::new();
        let tools = json!([{"type": "function", "name": "get_weather", "description": "Weather", "strict": true,
                            "parameters": {"type": "object", "properties": {}}}]);
        let out = function_tools(tools.as_array().unwrap(), &mut ignored).unwrap();
        assert_eq!(
            out,
            [
                json!({"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                                                   "parameters": {"type": "object", "properties": {}}}})
            ]
        );
        assert!(crate::tool_calls::check_tools(&out).is_ok());
        assert_eq!(ignored, ["tools.*.strict"]);
        for (tools, expected) in [
            (
                json!([{"type": "web_search"}]),
                "tools[0].type: \"web_search\" is a hosted tool",
            ),
            (
                json!([{"type": "function", "name": ""}]),
                "tools[0].name: expected a non-empty string",
            ),
            (
                json!([{"type": "function", "name": "f", "parameters": []}]),
                "tools[0].parameters: expected a JSON schema object",
            ),
        ] {
            let err = function_tools(tools.as_array().unwrap(), &mut Vec::new()).unwrap_err();
            assert!(err.message.starts_with(expected), "{}", err.message);
        }
        let names = ["f"];
        let mut ignored = Vec::new();
        assert!(renders_tools(&json!("auto"), &names, &mut ignored).unwrap());
        assert!(!renders_tools(&json!("none"), &names, &mut ignored).unwrap());
        assert!(renders_tools(&json!("required"), &names, &mut ignored).unwrap());
        assert!(renders_tools(
            &json!({"type": "function", "name": "f"}),
            &names,
            &mut ignored
        )
        .unwrap());
        assert_eq!(ignored, ["tool_choice", "tool_choice"]);
        let err = renders_tools(
            &json!({"type": "function", "name": "g"}),
            &names,
            &mut ignored,
        )
        .unwrap_err();
        assert!(
            err.message.starts_with("tool_choice.name: \"g\""),
            "{}",
            err.message
        );
        assert!(
            renders_tools(&json!({"type": "web_search_preview"}), &names, &mut ignored).is_err()
        );
    }

    #[test]
    fn replies_as_output_items() {
        let calls = reply(
            "Let me see.",
            &[("get_weather", "{\"city\":\"Paris\"}"), ("f", "{}")],
            eos(),
        );
        assert_eq!(
            Value::Array(output("resp_abc", &calls)),
            json!([
                {"type": "message", "id": "msg_abc", "status": "completed", "role": "assistant",
                 "content": [{"type": "output_text", "text": "Let me see.", "annotations": [], "logprobs": []}]},
                {"type": "function_call", "id": "fc_abc_0", "call_id": "call_s_0_0", "name": "get_weather",
                 "arguments": "{\"city\":\"Paris\"}", "status": "completed"},
                {"type": "function_call", "id": "fc_abc_1", "call_id": "call_s_0_1", "name": "f",
                 "arguments": "{}", "status": "completed"},
            ])
        );
        assert_eq!(status(&calls), ("completed", Value::Null));
        let only_call = reply("", &[("f", "{}")], FinishReason::Length);
        assert_eq!(output("resp_1", &only_call).len(), 1);
        assert_eq!(status(&only_call).0, "completed");
        let cut = reply("abc", &[], FinishReason::Length);
        assert_eq!(
            status(&cut),
            ("incomplete", json!({"reason": "max_output_tokens"}))
        );
        assert_eq!(output("resp_1", &cut)[0]["status"], "incomplete");
        assert_eq!(status(&reply("", &[], FinishReason::Abort)).0, "cancelled");
        assert_eq!(
            output("resp_1", &reply("", &[], eos()))[0]["content"][0]["text"],
            ""
        );
        assert_eq!(usage(&cut)["total_tokens"], 10);
    }
}
