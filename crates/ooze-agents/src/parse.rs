//! Reading actions out of model text. Three forms:
//! - Qwen/Hermes tool calls: `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (arguments may
//!   also be a JSON string holding the object, as some models write them);
//! - XML-tag actions: `<search>query</search>`, `<answer>…</answer>`, `<command>…</command>`;
//! - fenced code blocks: ```` ```python … ``` ````.
//!
//! Malformed actions are not errors of the program: they come back as [`Malformed`] with a message
//! meant for the model (what was wrong and what is expected), which agents append as the
//! observation.

use ooze_model::tool_calls::{self as model_tool_calls, RawToolCall, ToolCallError, EXPECTED};
use serde_json::Value;

/// A tool call as the model wrote it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: serde_json::Map<String, Value>,
}

/// What was wrong with an action, worded for the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Every `<tool_call>` block in `text`, in order, each parsed or explained (the blocks are read by
/// [`ooze_model::tool_calls`]; here the arguments must be an object).
pub fn tool_calls(text: &str) -> Vec<Result<ToolCall, Malformed>> {
    model_tool_calls::tool_calls(text)
        .into_iter()
        .map(|block| {
            let call = block.map_err(|e| Malformed(e.to_string()))?;
            agent_call(call)
        })
        .collect()
}

fn agent_call(call: RawToolCall) -> Result<ToolCall, Malformed> {
    let RawToolCall { name, arguments } = call;
    if name.trim().is_empty() {
        return Err(Malformed(ToolCallError::NameNotString.to_string()));
    }
    let not_object = || {
        Malformed(format!(
            "\"arguments\" of {name} must be a JSON object; {EXPECTED}"
        ))
    };
    let arguments = match arguments {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(a)) => a,
        // Some models write the arguments object as a JSON string.
        Some(Value::String(s)) => match serde_json::from_str::<Value>(&s) {
            Ok(Value::Object(a)) => a,
            _ => return Err(not_object()),
        },
        Some(_) => return Err(not_object()),
    };
    Ok(ToolCall { name, arguments })
}

impl ToolCall {
    /// The string argument `key`, or what is wrong.
    pub fn string_argument(&self, key: &str) -> Result<&str, Malformed> {
        match self.arguments.get(key) {
            Some(Value::String(s)) => Ok(s),
            Some(_) => Err(Malformed(format!(
                "argument \"{key}\" of {} must be a string",
                self.name
            ))),
            None => Err(Malformed(format!(
                "{} needs the argument \"{key}\"",
                self.name
            ))),
        }
    }
}

/// The first of `tags` that `text` uses as an action, with its content: the earliest opening tag
/// whose closing tag follows. An opening tag left unclosed is malformed.
pub fn tag_action<'a>(
    text: &'a str,
    tags: &[&'a str],
) -> Option<Result<(&'a str, &'a str), Malformed>> {
    let mut first: Option<(usize, &str)> = None;
    for &tag in tags {
        if let Some(at) = text.find(&format!("<{tag}>")) {
            if first.is_none_or(|(f, _)| at < f) {
                first = Some((at, tag));
            }
        }
    }
    let (at, tag) = first?;
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let body = &text[at + open.len()..];
    Some(match body.find(&close) {
        Some(end) => Ok((tag, body[..end].trim())),
        None => Err(Malformed(format!("{open} was not closed with {close}"))),
    })
}

/// The content of the last `<tag>…</tag>` in `text`.
pub fn last_tag<'a>(text: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let start = text.rfind(&open)? + open.len();
    let end = text[start..].find(&close)?;
    Some(text[start..start + end].trim())
}

/// The last fenced code block in `text` whose language is one of `languages` (an untagged fence
/// counts when `languages` contains ""); an unclosed fence is malformed.
pub fn code_block<'a>(text: &'a str, languages: &[&str]) -> Option<Result<&'a str, Malformed>> {
    let mut found = None;
    let mut rest = 0;
    while let Some(open) = text[rest..].find("```") {
        let start = rest + open + 3;
        let line_end = text[start..].find('\n').map_or(text.len(), |i| start + i);
        let language = text[start..line_end].trim();
        let body_start = (line_end + 1).min(text.len());
        let Some(close) = text[body_start..].find("```") else {
            if languages.contains(&language) {
                found = Some(Err(Malformed(format!(
                    "the ```{language} block was not closed with ```"
                ))));
            }
            break;
        };
        if languages.contains(&language) {
            found = Some(Ok(&text[body_start..body_start + close]));
        }
        rest = body_start + close + 3;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hermes_tool_calls() {
        let text = r#"Let me run it.
<tool_call>
{"name": "code_interpreter", "arguments": {"code": "print(1)"}}
</tool_call>
<tool_call>{"name": "search", "arguments": "{\"query\": \"rivers\"}"}</tool_call>"#;
        let calls = tool_calls(text);
        assert_eq!(calls.len(), 2);
        let first = calls[0].as_ref().unwrap();
        assert_eq!(first.name, "code_interpreter");
        assert_eq!(first.string_argument("code").unwrap(), "print(1)");
        let second = calls[1].as_ref().unwrap();
        assert_eq!(second.arguments["query"], json!("rivers"));
        assert!(second
            .string_argument("code")
            .unwrap_err()
            .0
            .contains("needs the argument"));
    }

    #[test]
    fn malformed_tool_calls_explain_themselves() {
        let cases = [
            (
                "<tool_call>{\"name\": \"x\", </tool_call>",
                "not valid JSON",
            ),
            ("<tool_call>[1, 2]</tool_call>", "must be a JSON object"),
            (
                "<tool_call>{\"arguments\": {}}</tool_call>",
                "has no \"name\"",
            ),
            (
                "<tool_call>{\"name\": 3}</tool_call>",
                "\"name\" must be a string",
            ),
            (
                "<tool_call>{\"name\": \"x\", \"arguments\": 5}</tool_call>",
                "\"arguments\" of x",
            ),
            ("<tool_call>{\"name\": \"x\"}", "was not closed"),
        ];
        for (text, expect) in cases {
            let calls = tool_calls(text);
            let err = calls[0].as_ref().unwrap_err();
            assert!(err.0.contains(expect), "{text}: {err}");
        }
        assert!(tool_calls("no calls here").is_empty());
    }

    #[test]
    fn tag_actions() {
        let text = "<think>I should look.</think>\n<search> capital of France </search>";
        assert_eq!(
            tag_action(text, &["search", "answer"]).unwrap().unwrap(),
            ("search", "capital of France")
        );
        let text = "<answer>Paris</answer> then <search>x</search>";
        assert_eq!(
            tag_action(text, &["search", "answer"]).unwrap().unwrap().0,
            "answer"
        );
        assert!(tag_action("<search>open", &["search"])
            .unwrap()
            .unwrap_err()
            .0
            .contains("</search>"));
        assert!(tag_action("plain text", &["search", "answer"]).is_none());
        assert_eq!(
            last_tag("<answer>a</answer><answer> b </answer>", "answer"),
            Some("b")
        );
        assert_eq!(last_tag("<answer>a", "answer"), None);
    }

    #[test]
    fn code_blocks() {
        let text = "First:\n```python\nprint(1)\n```\nthen\n```python\nprint(2)\n```\n";
        assert_eq!(
            code_block(text, &["python", "py"]).unwrap().unwrap(),
            "print(2)\n"
        );
        assert!(code_block("```bash\nls\n```", &["python"]).is_none());
        assert!(code_block("```python\nprint(", &["python"])
            .unwrap()
            .is_err());
        assert_eq!(
            code_block("```\nx = 1\n```", &[""]).unwrap().unwrap(),
            "x = 1\n"
        );
    }
}
