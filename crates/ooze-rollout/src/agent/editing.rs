//! Editing a conversation between generations (a child of `agent`): environment text inside the
//! running assistant turn, new chat messages as exactly the tokens the template adds, and text cut
//! to a token budget.

use super::{AgentContext, AgentError, Conversation};
use serde_json::{json, Value};

impl AgentContext {
    /// Appends environment text inside the running assistant turn (loss mask 0, observation mask
    /// 1), tokenised on its own; the model continues the same turn after it.
    pub fn append_text(&self, conv: &mut Conversation, text: &str) -> Result<(), AgentError> {
        let ids = self.encode(text)?;
        conv.sample.push_observation(&ids);
        match conv.messages.last_mut() {
            Some(last) if conv.open_turn && last["role"] == "assistant" => {
                let content = last["content"].as_str().unwrap_or("").to_owned() + text;
                last["content"] = Value::String(content);
            }
            _ => {
                conv.messages
                    .push(json!({"role": "assistant", "content": text}));
                conv.open_turn = true;
            }
        }
        Ok(())
    }

    /// Closes the running assistant turn (if the model did not) and appends `message` (a `tool` or
    /// `user` message) as exactly the tokens the chat template adds to the conversation, ending
    /// with the generation prompt of the next assistant turn. Loss mask 0; the observation mask
    /// marks the tokens of the message's own text content (not the template's tokens around it).
    pub fn append_message(
        &self,
        conv: &mut Conversation,
        message: Value,
    ) -> Result<(), AgentError> {
        let mut delta = String::new();
        if conv.open_turn {
            delta.push_str(&self.turn_closing(conv)?);
        }
        let added = self.rendered_after(conv, &message)?;
        let content = self.content_span(conv, &message, &added)?.map(|r| {
            let offset = delta.len();
            r.start + offset..r.end + offset
        });
        delta.push_str(&added);
        let encoding = self
            .tokenizer
            .encode_with_offsets(&delta, false)
            .map_err(|e| AgentError::Tokenizer(e.to_string()))?;
        let observed = |&(start, end): &(usize, usize)| {
            content
                .as_ref()
                .is_some_and(|c| start >= c.start && end <= c.end && start < end)
        };
        let mut start = 0;
        while start < encoding.ids.len() {
            let kind = observed(&encoding.offsets[start]);
            let run = encoding.offsets[start..]
                .iter()
                .take_while(|o| observed(o) == kind)
                .count();
            let ids = &encoding.ids[start..start + run];
            if kind {
                conv.sample.push_observation(ids);
            } else {
                conv.sample.push_context(ids);
            }
            start += run;
        }
        conv.messages.push(message);
        conv.open_turn = false;
        Ok(())
    }

    /// What the template adds to the conversation for `message`, up to and including the next
    /// assistant turn's generation prompt.
    fn rendered_after(&self, conv: &Conversation, message: &Value) -> Result<String, AgentError> {
        self.template(&conv.tools)?
            .continuation(
                &conv.messages,
                std::slice::from_ref(message),
                &self.render_options(&conv.tools, true),
            )
            .map_err(Self::template_error)
    }

    /// Where `message`'s text content lies in `added` (the template's rendering of it after the
    /// conversation): the occurrence whose removal leaves the rendering of the same message with
    /// empty content. `None` when the content is not a string or the template does not render it
    /// verbatim (its tokens then count as template tokens, not observation).
    fn content_span(
        &self,
        conv: &Conversation,
        message: &Value,
        added: &str,
    ) -> Result<Option<std::ops::Range<usize>>, AgentError> {
        let Some(content) = message["content"].as_str().filter(|c| !c.is_empty()) else {
            return Ok(None);
        };
        let mut hollow = message.clone();
        hollow["content"] = Value::String(String::new());
        let without = self.rendered_after(conv, &hollow)?;
        Ok(added
            .match_indices(content)
            .map(|(at, _)| at..at + content.len())
            .find(|r| {
                without.len() + content.len() == added.len()
                    && added[..r.start] == without[..r.start]
                    && added[r.end..] == without[r.start..]
            }))
    }

    /// The text the template puts after an assistant message's content to close it (the
    /// end-of-turn token): what the model would have generated had it ended the turn itself.
    pub(crate) fn turn_closing(&self, conv: &Conversation) -> Result<String, AgentError> {
        let template = self.template(&conv.tools)?;
        let options = self.render_options(&conv.tools, false);
        let rendered = template
            .render(&conv.messages, &options)
            .map_err(Self::template_error)?;
        let span = template
            .assistant_spans(&conv.messages, &options)
            .map_err(Self::template_error)?
            .pop()
            .ok_or_else(|| AgentError::Template("no assistant turn to close".into()))?;
        let content = conv
            .messages
            .last()
            .and_then(|m| m["content"].as_str())
            .unwrap_or("");
        rendered[span.start..span.end]
            .strip_prefix(content)
            .map(str::to_owned)
            .ok_or_else(|| {
                AgentError::Template(
                    "the template does not render the assistant content verbatim, so the turn cannot be closed token-exactly".into(),
                )
            })
    }

    /// `text` cut to at most `max_tokens` tokens, with a note saying how much was cut.
    pub fn truncate(&self, text: &str, max_tokens: usize) -> Result<String, AgentError> {
        let encoding = self
            .tokenizer
            .encode_with_offsets(text, false)
            .map_err(|e| AgentError::Tokenizer(e.to_string()))?;
        if encoding.ids.len() <= max_tokens {
            return Ok(text.to_owned());
        }
        let end = encoding.offsets[max_tokens].0;
        Ok(format!(
            "{}\n[TRUNCATED: {} of {} tokens shown]",
            &text[..end],
            max_tokens,
            encoding.ids.len()
        ))
    }
}
