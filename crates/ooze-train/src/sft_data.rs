//! Chat JSONL for supervised fine-tuning: one conversation per line,
//! `{"messages": [{"role": …, "content": …}, …], "tools": [...]?}`. Each conversation is rendered
//! with the model's chat template and tokenised; the loss mask covers exactly the tokens of the
//! assistant messages (the template's own spans), so prompts, system and tool text are not trained.

use crate::TrainError;
use ooze_core::Sample;
use ooze_model::{RenderOptions, Tokenizer};
use std::path::Path;

/// What loading found.
pub struct ChatData {
    pub samples: Vec<Sample>,
    /// Conversations longer than the limit, left out.
    pub too_long: usize,
}

/// Loads `path`; conversations of more than `max_tokens` tokens are skipped and counted.
pub fn load_chat_jsonl(
    path: &Path,
    tokenizer: &Tokenizer,
    max_tokens: usize,
) -> Result<ChatData, TrainError> {
    let text = std::fs::read_to_string(path).map_err(|source| TrainError::Io {
        action: "read",
        path: path.to_owned(),
        source,
    })?;
    let mut data = ChatData {
        samples: Vec::new(),
        too_long: 0,
    };
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let fail = |message: String| TrainError::Data {
            file: path.to_owned(),
            line: i + 1,
            message,
        };
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| fail(format!("not valid JSON: {e}")))?;
        let messages = value
            .get("messages")
            .and_then(|m| m.as_array())
            .ok_or_else(|| fail("expected an object with a `messages` list".into()))?;
        for (k, m) in messages.iter().enumerate() {
            if !m.get("role").is_some_and(|r| r.is_string()) {
                return Err(fail(format!(
                    "messages[{k}] must be an object with a string `role`"
                )));
            }
        }
        let tools = match value.get("tools") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::Array(list)) => Some(list.clone()),
            Some(_) => return Err(fail("`tools` must be a list of tool schemas".into())),
        };
        let options = RenderOptions {
            add_generation_prompt: false,
            tools,
            kwargs: Default::default(),
        };
        let template = tokenizer
            .chat_template(options.tools.is_some())
            .map_err(|e| fail(e.to_string()))?;
        let rendered = template
            .render(messages, &options)
            .map_err(|e| fail(e.to_string()))?;
        let spans = template
            .assistant_spans(messages, &options)
            .map_err(|e| fail(e.to_string()))?;
        if spans.is_empty() {
            return Err(fail("no assistant message to train on".into()));
        }
        let encoding = tokenizer
            .encode_with_offsets(&rendered, false)
            .map_err(|e| fail(e.to_string()))?;
        if encoding.ids.len() > max_tokens {
            data.too_long += 1;
            continue;
        }
        let mut trained = vec![0u8; encoding.ids.len()];
        for s in &spans {
            for t in Tokenizer::token_range(&encoding.offsets, s.start, s.end) {
                trained[t] = 1;
            }
        }
        let prompt_len = trained.iter().position(|&m| m > 0).unwrap_or(0).max(1);
        let mut sample = Sample::demonstration(encoding.ids, trained.split_off(prompt_len));
        sample.group = i as u64;
        data.samples.push(sample);
    }
    Ok(data)
}
