//! Tool calls in generated text: `<tool_call>{"name": …, "arguments": {…}}</tool_call>` blocks (the
//! Qwen/Hermes convention ooze's templates also use, read by [`ooze_model::tool_calls`]) become
//! OpenAI `tool_calls`; the text before the first block is the message content. A block that is not
//! a tool call leaves the whole text as content.
//!
//! Also the checks on a request's `tools` and `tool_choice` (OpenAI's shapes), so that a bad tool
//! is a 400 naming `tools[i].field` rather than an error deep inside the chat template.

use ooze_model::tool_calls::{tool_calls, ToolCallError, OPEN};
use serde_json::{json, Value};

/// Content and tool calls parsed from a completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    pub content: String,
    pub tool_calls: Vec<Value>,
}

pub fn parse(text: &str, id_prefix: &str) -> Parsed {
    let as_text = || Parsed {
        content: text.to_owned(),
        tool_calls: Vec::new(),
    };
    let Some(first) = text.find(OPEN) else {
        return as_text();
    };
    let mut calls = Vec::new();
    for block in tool_calls(text) {
        let call = match block {
            Ok(call) => call,
            // An unclosed block (still being written, or cut at the token limit) ends the calls.
            Err(ToolCallError::Unclosed) => break,
            Err(_) => return as_text(),
        };
        // Arguments go on as the OpenAI string: a string as written, other JSON serialised.
        let arguments = match call.arguments {
            Some(Value::String(s)) => s,
            Some(v) => v.to_string(),
            None => "{}".to_owned(),
        };
        calls.push(json!({
            "id": format!("{id_prefix}_{}", calls.len()),
            "type": "function",
            "function": {"name": call.name, "arguments": arguments},
        }));
    }
    if calls.is_empty() {
        return as_text();
    }
    Parsed {
        content: text[..first].trim_end().to_owned(),
        tool_calls: calls,
    }
}

/// Tool calls as a stream's delta carries them: each with its `index`.
pub fn indexed(calls: &[Value]) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut c = c.clone();
            c["index"] = json!(i);
            c
        })
        .collect()
}

/// How much of `text` can be streamed as content without risking part of a tool-call block: all
/// of it before an opening tag, minus any tail that could be the start of one.
pub fn safe_content_len(text: &str) -> usize {
    if let Some(pos) = text.find(OPEN) {
        return pos;
    }
    let held = (1..OPEN.len())
        .rev()
        .find(|&n| text.ends_with(&OPEN[..n]))
        .unwrap_or(0);
    text.len() - held
}

/// Checks `tools`: each `{"type": "function", "function": {"name", "description"?, "parameters"?}}`
/// with a non-empty, distinct name and `parameters` a JSON-schema object. The error names
/// `tools[i].field` and what was expected.
pub fn check_tools(tools: &[Value]) -> Result<(), String> {
    let mut names: Vec<&str> = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let bad = |field: &str, expected: &str, got: Option<&Value>| {
            let got = got.map_or("nothing".to_owned(), Value::to_string);
            format!("tools[{i}]{field}: expected {expected}, got {got}")
        };
        if !tool.is_object() {
            return Err(bad(
                "",
                "an object {\"type\": \"function\", \"function\": {…}}",
                Some(tool),
            ));
        }
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad(".type", "\"function\"", tool.get("type")));
        }
        let Some(function) = tool.get("function").filter(|f| f.is_object()) else {
            return Err(bad(
                ".function",
                "an object with `name` and optional `description` and `parameters`",
                tool.get("function"),
            ));
        };
        let name = match function.get("name").and_then(Value::as_str) {
            Some(n) if !n.trim().is_empty() => n,
            _ => {
                return Err(bad(
                    ".function.name",
                    "a non-empty string",
                    function.get("name"),
                ))
            }
        };
        if let Some(j) = names.iter().position(|&n| n == name) {
            return Err(format!(
                "tools[{i}].function.name: \"{name}\" is already the name of tools[{j}]"
            ));
        }
        names.push(name);
        if function
            .get("description")
            .is_some_and(|d| !d.is_string() && !d.is_null())
        {
            return Err(bad(
                ".function.description",
                "a string",
                function.get("description"),
            ));
        }
        if function.get("parameters").is_some_and(|p| !p.is_object()) {
            return Err(bad(
                ".function.parameters",
                "a JSON schema object",
                function.get("parameters"),
            ));
        }
    }
    Ok(())
}

/// Checks `tool_choice`: `"none"`, `"auto"`, `"required"`, or `{"type": "function", "function":
/// {"name"}}` naming one of `tools`.
pub fn check_tool_choice(choice: &Value, tools: &[Value]) -> Result<(), String> {
    let expected = "tool_choice: expected \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}";
    match choice {
        Value::String(s) if ["none", "auto", "required"].contains(&s.as_str()) => Ok(()),
        Value::Object(obj) if obj.get("type").and_then(Value::as_str) == Some("function") => {
            let Some(name) = choice.pointer("/function/name").and_then(Value::as_str) else {
                return Err(format!(
                    "tool_choice.function.name: expected a string, got {}",
                    choice.pointer("/function/name").unwrap_or(&Value::Null)
                ));
            };
            if tools
                .iter()
                .any(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(name))
            {
                Ok(())
            } else {
                Err(format!(
                    "tool_choice.function.name: \"{name}\" is not among the request's tools"
                ))
            }
        }
        other => Err(format!("{expected}, got {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_calls_and_content() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>{\"name\": \"f\", \"arguments\": \"{}\"}</tool_call>";
        let p = parse(text, "call_x");
        assert_eq!(p.content, "Let me check.");
        assert_eq!(p.tool_calls.len(), 2);
        assert_eq!(p.tool_calls[0]["function"]["name"], "get_weather");
        assert_eq!(
            p.tool_calls[0]["function"]["arguments"],
            "{\"city\":\"Oslo\"}"
        );
        assert_eq!(p.tool_calls[1]["id"], "call_x_1");
        assert_eq!(p.tool_calls[1]["function"]["arguments"], "{}");
    }

    #[test]
    fn invalid_blocks_stay_text() {
        for text in [
            "plain",
            "<tool_call>{not json}</tool_call>",
            "<tool_call>{\"name\": 1}</tool_call>",
            "<tool_call>{\"name\": \"f\"}",
        ] {
            let p = parse(text, "c");
            assert_eq!(
                (p.content.as_str(), p.tool_calls.len()),
                (text, 0),
                "{text}"
            );
        }
    }

    #[test]
    fn an_unclosed_block_ends_the_calls() {
        let p = parse(
            "a <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call><tool_call>{\"na",
            "c",
        );
        assert_eq!(p.content, "a");
        assert_eq!(p.tool_calls.len(), 1);
        assert_eq!(p.tool_calls[0]["function"]["arguments"], "{}");
    }

    #[test]
    fn holds_back_a_possible_tag() {
        assert_eq!(safe_content_len("hello <tool"), 6);
        assert_eq!(safe_content_len("hello <tool_call>{"), 6);
        assert_eq!(safe_content_len("a < b"), 5);
        assert_eq!(safe_content_len("x<"), 1);
    }
}
