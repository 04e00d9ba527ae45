//! Tool calls in generated text: `<tool_call>{"name": …, "arguments": {…}}</tool_call>` blocks (the
//! Qwen/Hermes convention ooze's templates also use) become OpenAI `tool_calls`; the text before the
//! first block is the message content. A block that is not valid JSON stays in the content.

use serde_json::{json, Value};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// Content and tool calls parsed from a completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    pub content: String,
    pub tool_calls: Vec<Value>,
}

pub fn parse(text: &str, id_prefix: &str) -> Parsed {
    let Some(first) = text.find(OPEN) else {
        return Parsed {
            content: text.to_owned(),
            tool_calls: Vec::new(),
        };
    };
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    while let Some(start) = rest.find(OPEN) {
        let body_start = start + OPEN.len();
        let Some(len) = rest[body_start..].find(CLOSE) else {
            break;
        };
        let body = rest[body_start..body_start + len].trim();
        match serde_json::from_str::<Value>(body) {
            Ok(Value::Object(call)) if call.get("name").is_some_and(Value::is_string) => {
                let arguments = match call.get("arguments").or_else(|| call.get("parameters")) {
                    Some(Value::String(s)) => s.clone(),
                    Some(v) => v.to_string(),
                    None => "{}".to_owned(),
                };
                calls.push(json!({
                    "id": format!("{id_prefix}_{}", calls.len()),
                    "type": "function",
                    "function": {"name": call["name"], "arguments": arguments},
                }));
            }
            _ => {
                return Parsed {
                    content: text.to_owned(),
                    tool_calls: Vec::new(),
                }
            }
        }
        rest = &rest[body_start + len + CLOSE.len()..];
    }
    if calls.is_empty() {
        return Parsed {
            content: text.to_owned(),
            tool_calls: Vec::new(),
        };
    }
    Parsed {
        content: text[..first].trim_end().to_owned(),
        tool_calls: calls,
    }
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
    fn holds_back_a_possible_tag() {
        assert_eq!(safe_content_len("hello <tool"), 6);
        assert_eq!(safe_content_len("hello <tool_call>{"), 6);
        assert_eq!(safe_content_len("a < b"), 5);
        assert_eq!(safe_content_len("x<"), 1);
    }
}
