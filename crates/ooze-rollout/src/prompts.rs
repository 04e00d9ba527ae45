//! Prompts ready for the engine: dataset rows or generated task items turned into token ids, with
//! the model's chat template applied (and an optional system prompt) or as raw text.

use crate::data::{PromptInput, PromptRow};
use crate::tasks::TaskItem;
use ooze_model::{RenderOptions, Tokenizer};
use serde_json::{json, Value};

/// How a row's input becomes the prompt text.
#[derive(Debug, Clone, Default)]
pub struct PromptFormat {
    /// Render the input as a chat (a text input becomes one user message) with the generation
    /// prompt; otherwise a text input is used as it is.
    pub apply_chat_template: bool,
    /// Put before the messages as a `system` message (unless the row has one).
    pub system_prompt: Option<String>,
}

/// One prompt the engine can run.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PromptItem {
    /// Where it came from: the 1-based line of a dataset file, or the task item's number.
    pub source_line: usize,
    /// The rendered prompt.
    pub text: String,
    pub input_ids: Vec<u32>,
    pub label: String,
    pub metadata: Value,
    /// The chat messages `text` was rendered from (the system prompt included); empty for a raw
    /// text prompt (`data.apply_chat_template = false`). Not part of a rollout record: `text`
    /// and `input_ids` are what was generated from.
    #[serde(skip)]
    pub messages: Vec<Value>,
    /// The row's tools (OpenAI function form), if it has any: handed to agent programs with the
    /// task. Not part of a rollout record.
    #[serde(skip)]
    pub tools: Option<Vec<Value>>,
}

/// Task items as rows (line = item number).
pub fn task_rows(items: Vec<TaskItem>) -> Vec<PromptRow> {
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| PromptRow {
            line: i + 1,
            input: PromptInput::Text(item.prompt),
            label: item.label,
            metadata: Value::Null,
            tools: None,
        })
        .collect()
}

/// The prompt text of `row` under `format`.
pub fn render(
    row: &PromptRow,
    tokenizer: &Tokenizer,
    format: &PromptFormat,
) -> Result<String, String> {
    render_with_messages(row, tokenizer, format).map(|(text, _)| text)
}

/// [`render`], and the chat messages it rendered (none for a raw text prompt).
fn render_with_messages(
    row: &PromptRow,
    tokenizer: &Tokenizer,
    format: &PromptFormat,
) -> Result<(String, Vec<Value>), String> {
    let messages: Vec<Value> = match (&row.input, format.apply_chat_template) {
        (PromptInput::Text(text), false) => return Ok((text.clone(), Vec::new())),
        (PromptInput::Messages(_), false) => {
            return Err(
                "the input is a list of chat messages; set data.apply_chat_template = true".into(),
            )
        }
        (PromptInput::Text(text), true) => vec![json!({"role": "user", "content": text})],
        (PromptInput::Messages(m), true) => m.clone(),
    };
    let has_system = messages
        .first()
        .is_some_and(|m| m.get("role").and_then(Value::as_str) == Some("system"));
    let messages = match (&format.system_prompt, has_system) {
        (Some(system), false) => std::iter::once(json!({"role": "system", "content": system}))
            .chain(messages)
            .collect(),
        _ => messages,
    };
    let template = tokenizer
        .chat_template(row.tools.is_some())
        .map_err(|e| e.to_string())?;
    let text = template
        .render(
            &messages,
            &RenderOptions {
                add_generation_prompt: true,
                tools: row.tools.clone(),
                ..Default::default()
            },
        )
        .map_err(|e| e.to_string())?;
    Ok((text, messages))
}

/// Turns rows into prompts; rows longer than `max_prompt_tokens` are left out and counted.
/// `origin` names the source in errors (a file or a task).
pub fn prepare(
    rows: Vec<PromptRow>,
    tokenizer: &Tokenizer,
    format: &PromptFormat,
    max_prompt_tokens: usize,
    origin: &str,
) -> Result<(Vec<PromptItem>, usize), String> {
    let mut items = Vec::with_capacity(rows.len());
    let mut too_long = 0;
    for row in rows {
        let (text, messages) = render_with_messages(&row, tokenizer, format)
            .map_err(|e| format!("{origin}:{}: {e}", row.line))?;
        let input_ids = tokenizer
            .encode(&text, false)
            .map_err(|e| format!("{origin}:{}: {e}", row.line))?;
        if input_ids.is_empty() {
            return Err(format!("{origin}:{}: the prompt is empty", row.line));
        }
        if input_ids.len() > max_prompt_tokens {
            too_long += 1;
            continue;
        }
        items.push(PromptItem {
            source_line: row.line,
            text,
            input_ids,
            label: row.label,
            metadata: row.metadata,
            messages,
            tools: row.tools,
        });
    }
    Ok((items, too_long))
}
