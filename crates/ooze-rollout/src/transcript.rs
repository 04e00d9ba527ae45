//! Token-exact samples from the calls of an agent ooze does not run itself (a program talking to
//! the agent gateway): each call brings a whole chat history, and the [`Transcript`] turns the
//! calls of one execution into samples that hold exactly the tokens the policy saw and sampled.
//!
//! - **Rendering.** A call's messages are rendered with the policy's chat template (its tools
//!   included). Assistant messages that are turns this transcript generated are not rendered from
//!   their text: their generated token ids are put in their place (the template's text around
//!   them is rendered as usual), so a tool call the model wrote as `{"name":"f"}` stays those
//!   tokens even though the agent sends it back as structured `tool_calls`. An assistant message
//!   that matches no generated turn (the agent edited it, or wrote it itself) is rendered from its
//!   text and counted in [`Call::retokenized_turns`].
//! - **Growing or branching.** When the call's prompt tokens extend a conversation's tokens (its
//!   earlier prompt, generated turns and whatever came between), that conversation grows: the new
//!   tokens join it with loss mask 0, the generated ones with mask 1 and the engine's log-probs.
//!   Otherwise (a context reset, a compaction, a sub-agent, another system prompt) the call starts
//!   a new conversation: a sibling sample of the same execution.
//! - **Concurrency.** A conversation is taken out while its call generates ([`Transcript::begin`]
//!   … [`Transcript::finish`]); a second call made meanwhile cannot extend it (its tokens are not
//!   there yet) and starts a sibling.

use crate::agent::{AgentContext, AgentError, Conversation, Turn};
use ooze_core::{FinishReason, Sample, StopMatch};
use serde_json::Value;

/// An assistant message reduced to what the model wrote: its text (trimmed) and its tool calls
/// (name and arguments as JSON). Two messages the same here are the same turn.
#[derive(Debug, Clone, PartialEq)]
struct Shown {
    content: String,
    calls: Vec<(String, Value)>,
}

impl Shown {
    /// `message` in OpenAI chat form (`content` a string or null, `tool_calls[i].function` with
    /// `name` and `arguments` as an object or a JSON string).
    fn of(message: &Value) -> Shown {
        let calls = message["tool_calls"]
            .as_array()
            .map(|calls| {
                calls
                    .iter()
                    .map(|c| {
                        let f = &c["function"];
                        let args = match &f["arguments"] {
                            Value::String(s) => {
                                serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone()))
                            }
                            Value::Null => Value::Object(Default::default()),
                            other => other.clone(),
                        };
                        (f["name"].as_str().unwrap_or("").to_owned(), args)
                    })
                    .collect()
            })
            .unwrap_or_default();
        Shown {
            content: message["content"].as_str().unwrap_or("").trim().to_owned(),
            calls,
        }
    }
}

/// A turn the policy generated in this transcript.
#[derive(Debug, Clone)]
struct GeneratedTurn {
    shown: Shown,
    /// The tokens the engine sampled (the end-of-turn token included when the model ended it).
    ids: Vec<u32>,
    /// What the template adds after the content to close a turn the model did not end itself
    /// (cut at the token limit or at a stop string); empty when it did.
    closing: Vec<u32>,
}

/// One call in progress: the conversation it generates on, taken out of the transcript.
#[derive(Debug)]
pub struct Call {
    slot: usize,
    pub conversation: Conversation,
    /// The prompt's length in tokens.
    pub prompt_tokens: usize,
    /// The call grew an existing conversation (false: it started one).
    pub extended: bool,
    /// Assistant messages of the call rendered from their text (not turns generated here).
    pub retokenized_turns: usize,
}

/// The conversations of one execution driven from outside, and the turns generated in them.
#[derive(Debug, Default)]
pub struct Transcript {
    /// Conversations in the order they started; `None` while a call generates on it.
    slots: Vec<Option<Conversation>>,
    turns: Vec<GeneratedTurn>,
}

impl Transcript {
    /// Renders `messages` (OpenAI chat form, already checked) and picks the conversation the call
    /// generates on: the latest one whose tokens the prompt extends, else a new one.
    pub fn begin(
        &mut self,
        ctx: &AgentContext,
        messages: Vec<Value>,
        tools: Option<Vec<Value>>,
    ) -> Result<Call, AgentError> {
        let (prompt, retokenized_turns) = match self.render_exact(ctx, &messages, &tools) {
            Ok(exact) => exact,
            // A template that renders earlier turns differently once later ones follow (Qwen3
            // drops old reasoning) cannot splice generated turns in: the history is rendered
            // from its text, which no conversation's tokens are a prefix of.
            Err(AgentError::Template(_)) => self.render_text(ctx, &messages, &tools)?,
            Err(e) => return Err(e),
        };
        let extends = |c: &Conversation| {
            c.tools == tools
                && prompt.len() > c.sample.tokens.len()
                && prompt.starts_with(&c.sample.tokens)
        };
        let found = (0..self.slots.len())
            .rev()
            .find(|&i| self.slots[i].as_ref().is_some_and(extends));
        let prompt_tokens = prompt.len();
        let (slot, conversation, extended) = match found {
            Some(slot) => {
                let mut conv = self.slots[slot].take().expect("checked");
                conv.sample
                    .push_context(&prompt[conv.sample.tokens.len()..]);
                conv.messages = messages;
                conv.open_turn = false;
                (slot, conv, true)
            }
            None => {
                self.slots.push(None);
                let conv = ctx.start_tokens(messages, tools, prompt);
                (self.slots.len() - 1, conv, false)
            }
        };
        Ok(Call {
            slot,
            conversation,
            prompt_tokens,
            extended,
            retokenized_turns,
        })
    }

    /// Ends `call` after its turn: the conversation goes back, and the turn is remembered as
    /// `shown` (the assistant message the caller was given, OpenAI chat form) so that a later
    /// call sending it back gets its exact tokens.
    pub fn finish(
        &mut self,
        ctx: &AgentContext,
        call: Call,
        turn: &Turn,
        shown: &Value,
    ) -> Result<(), AgentError> {
        let conv = call.conversation;
        let tokens = &conv.sample.tokens;
        let ids = tokens[tokens.len() - turn.tokens..].to_vec();
        let closed = matches!(
            turn.finish,
            FinishReason::Stop {
                matched: StopMatch::Token(_)
            }
        );
        let closing = if closed || ids.is_empty() {
            Vec::new()
        } else {
            ctx.encode(&ctx.turn_closing(&conv)?)?
        };
        if !ids.is_empty() {
            self.turns.push(GeneratedTurn {
                shown: Shown::of(shown),
                ids,
                closing,
            });
        }
        self.slots[call.slot] = Some(conv);
        Ok(())
    }

    /// Ends `call` without a turn (its generation failed): the conversation goes back as it was
    /// before the call's own tokens, if it had earlier turns.
    pub fn abandon(&mut self, call: Call) {
        if call.extended || call.conversation.turns > 0 {
            self.slots[call.slot] = Some(call.conversation);
        }
    }

    /// The conversations with at least one generated turn, in the order they started.
    pub fn into_samples(self) -> Vec<Sample> {
        self.slots
            .into_iter()
            .flatten()
            .filter(|c| c.turns > 0)
            .map(|c| c.sample)
            .collect()
    }

    /// Copies of the samples [`Transcript::into_samples`] would give now (conversations a call
    /// is generating on are left out).
    pub fn samples_so_far(&self) -> Vec<Sample> {
        self.slots
            .iter()
            .flatten()
            .filter(|c| c.turns > 0)
            .map(|c| c.sample.clone())
            .collect()
    }

    /// Conversations started so far, and turns generated.
    pub fn counts(&self) -> (usize, usize) {
        (self.slots.len(), self.turns.len())
    }

    /// The latest generated turn `message` is (an assistant message in OpenAI chat form).
    fn generated(&self, message: &Value) -> Option<&GeneratedTurn> {
        let shown = Shown::of(message);
        self.turns.iter().rev().find(|t| t.shown == shown)
    }

    /// The prompt tokens of `messages`: the template's text tokenised, with generated turns'
    /// own tokens spliced in. Also the number of assistant messages rendered from text.
    fn render_exact(
        &self,
        ctx: &AgentContext,
        messages: &[Value],
        tools: &Option<Vec<Value>>,
    ) -> Result<(Vec<u32>, usize), AgentError> {
        let template = ctx.template(tools)?;
        let options = ctx.render_options(tools, true);
        let segment = |done: usize, upto: usize| -> Result<String, AgentError> {
            if done == 0 {
                template.render(&messages[..upto], &options)
            } else {
                template.continuation(&messages[..done], &messages[done..upto], &options)
            }
            .map_err(|e| AgentError::Template(e.to_string()))
        };
        let mut tokens = Vec::new();
        let (mut done, mut retokenized) = (0, 0);
        for (i, message) in messages.iter().enumerate() {
            if message["role"] != "assistant" {
                continue;
            }
            // A history that opens with an assistant message has no prompt to put it after.
            match self.generated(message).filter(|_| i > 0) {
                Some(turn) => {
                    tokens.extend(ctx.encode(&segment(done, i)?)?);
                    tokens.extend_from_slice(&turn.ids);
                    tokens.extend_from_slice(&turn.closing);
                    done = i + 1;
                }
                None => retokenized += 1,
            }
        }
        tokens.extend(ctx.encode(&segment(done, messages.len())?)?);
        Ok((tokens, retokenized))
    }

    /// The prompt tokens of `messages` rendered from their text; every assistant message counts
    /// as retokenised.
    fn render_text(
        &self,
        ctx: &AgentContext,
        messages: &[Value],
        tools: &Option<Vec<Value>>,
    ) -> Result<(Vec<u32>, usize), AgentError> {
        let text = ctx
            .template(tools)?
            .render(messages, &ctx.render_options(tools, true))
            .map_err(|e| AgentError::Template(e.to_string()))?;
        let assistants = messages.iter().filter(|m| m["role"] == "assistant").count();
        Ok((ctx.encode(&text)?, assistants))
    }
}
