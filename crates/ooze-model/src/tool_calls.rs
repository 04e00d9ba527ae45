//! Tool calls in generated text, in the Qwen/Hermes convention the chat templates use:
//! `<tool_call>{"name": …, "arguments": {…}}</tool_call>` blocks (some models write `parameters`
//! instead of `arguments`, or the arguments object as a JSON string).
//!
//! [`tool_calls`] reads every block in order into the call's name and its arguments as written;
//! what each caller accepts as arguments is its own: the OpenAI-compatible server passes them on
//! as a string, agents need an object. Errors are worded for the model, which agents show it.

use serde_json::Value;

/// The opening tag of a tool call.
pub const OPEN: &str = "<tool_call>";
/// The closing tag of a tool call.
pub const CLOSE: &str = "</tool_call>";
/// What a tool call should look like, for error messages shown to the model.
pub const EXPECTED: &str = r#"write {"name": "<tool name>", "arguments": {...}}"#;

/// A tool call as the model wrote it.
#[derive(Debug, Clone, PartialEq)]
pub struct RawToolCall {
    pub name: String,
    /// `arguments` (or else `parameters`) as written, if either is there.
    pub arguments: Option<Value>,
}

/// Why a `<tool_call>` block is not a tool call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolCallError {
    /// An opening tag with no closing tag after it (the last block of the text).
    #[error("a {OPEN} was not closed with {CLOSE}")]
    Unclosed,
    #[error("the tool call is not valid JSON ({0}); {EXPECTED}")]
    NotJson(String),
    #[error("the tool call must be a JSON object; {EXPECTED}")]
    NotObject,
    #[error("the tool call has no \"name\"; {EXPECTED}")]
    NoName,
    #[error("\"name\" must be a string; {EXPECTED}")]
    NameNotString,
}

/// Every `<tool_call>` block in `text`, in order, each parsed or explained. An unclosed block ends
/// the list.
pub fn tool_calls(text: &str) -> Vec<Result<RawToolCall, ToolCallError>> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        let body_start = start + OPEN.len();
        let Some(len) = rest[body_start..].find(CLOSE) else {
            out.push(Err(ToolCallError::Unclosed));
            break;
        };
        out.push(parse_call(rest[body_start..body_start + len].trim()));
        rest = &rest[body_start + len + CLOSE.len()..];
    }
    out
}

fn parse_call(body: &str) -> Result<RawToolCall, ToolCallError> {
    let value: Value =
        serde_json::from_str(body).map_err(|e| ToolCallError::NotJson(e.to_string()))?;
    let Value::Object(mut object) = value else {
        return Err(ToolCallError::NotObject);
    };
    let name = match object.remove("name") {
        Some(Value::String(name)) => name,
        Some(_) => return Err(ToolCallError::NameNotString),
        None => return Err(ToolCallError::NoName),
    };
    let arguments = object
        .remove("arguments")
        .or_else(|| object.remove("parameters"));
    Ok(RawToolCall { name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn blocks_in_order_with_arguments_as_written() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\
            <tool_call>{\"name\": \"b\", \"parameters\": \"{}\"}</tool_call> then <tool_call>{\"name\": \"c\"}</tool_call>";
        let calls: Vec<RawToolCall> = tool_calls(text).into_iter().map(Result::unwrap).collect();
        assert_eq!(
            calls,
            [
                RawToolCall {
                    name: "a".into(),
                    arguments: Some(json!({"x": 1}))
                },
                RawToolCall {
                    name: "b".into(),
                    arguments: Some(json!("{}"))
                },
                RawToolCall {
                    name: "c".into(),
                    arguments: None
                },
            ]
        );
        assert!(tool_calls("no calls").is_empty());
    }

    #[test]
    fn malformed_blocks_say_why() {
        let cases = [
            ("<tool_call>{\"name\": </tool_call>", "not valid JSON"),
            ("<tool_call>[1]</tool_call>", "must be a JSON object"),
            ("<tool_call>{}</tool_call>", "has no \"name\""),
            (
                "<tool_call>{\"name\": 3}</tool_call>",
                "\"name\" must be a string",
            ),
        ];
        for (text, expect) in cases {
            let e = tool_calls(text).remove(0).unwrap_err();
            assert!(e.to_string().contains(expect), "{text}: {e}");
            assert!(e.to_string().ends_with(EXPECTED), "{e}");
        }
        let blocks = tool_calls("<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{\"name\"");
        assert_eq!(blocks.len(), 2);
        assert!(blocks[0].is_ok());
        assert_eq!(blocks[1], Err(ToolCallError::Unclosed));
        assert_eq!(
            ToolCallError::Unclosed.to_string(),
            "a <tool_call> was not closed with </tool_call>"
        );
    }
}
