//! Demonstrations recorded from the agent's own code. An [`Oracle`] writes every turn by rule,
//! knowing the task's answer, in place of the policy's engine and of every helper model; the agent
//! runs as in a rollout (its prompts, memories, tool calls and tool outputs are the real ones), and
//! each conversation it held is recorded as chat messages for `ooze sft`. So the demonstrations
//! show every turn exactly as the agent renders it, and they cannot drift from the agent when its
//! prompts change.

use crate::agent::{Agent, AgentContext, AgentError, AgentLimits};
use crate::helpers::Helpers;
use crate::prompts::PromptItem;
use ooze_model::Tokenizer;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Who a scripted reply is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller<'a> {
    /// The policy: its conversation so far (the last message may be its own open turn, which the
    /// reply continues).
    Policy,
    /// The helper model of that name, asked `messages`.
    Helper(&'a str),
}

/// Writes turns by rule for one prompt (it knows the prompt's answer).
pub trait Oracle: Send + Sync {
    /// The reply to `messages`. A policy reply that stops at one of the turn's stop strings ends
    /// with it (the turn stays open, as the engine leaves it); any other reply ends the turn.
    fn reply(&self, caller: Caller<'_>, messages: &[Value]) -> Result<String, String>;
}

/// One recorded conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct Demonstration {
    /// `policy`, or the helper's name.
    pub caller: String,
    /// The chat messages with the replies, as `ooze sft` reads them (`{"messages": …}`).
    pub messages: Vec<Value>,
}

/// The conversations of one execution, by the order they started in.
#[derive(Debug, Default)]
pub struct Recording(Mutex<BTreeMap<u64, Demonstration>>);

impl Recording {
    /// Records (or updates, as it grows) conversation `id`.
    pub(crate) fn put(&self, id: u64, caller: &str, messages: &[Value]) {
        self.0.lock().expect("never poisoned").insert(
            id,
            Demonstration {
                caller: caller.to_owned(),
                messages: messages.to_vec(),
            },
        );
    }

    fn take(&self) -> Vec<Demonstration> {
        std::mem::take(&mut *self.0.lock().expect("never poisoned"))
            .into_values()
            .collect()
    }
}

/// Runs `agent` once on `prompt` with `oracle` writing every turn and answering for `helpers`
/// (their names, prices and descriptions as the recipe sets them; [`HelperBackend::Scripted`]);
/// returns the conversations it held, policy and helpers, in the order they started. Tools run
/// for real.
///
/// [`HelperBackend::Scripted`]: crate::helpers::HelperBackend::Scripted
pub async fn demonstrate(
    agent: &dyn Agent,
    oracle: Arc<dyn Oracle>,
    tokenizer: &Arc<Tokenizer>,
    limits: &AgentLimits,
    helpers: Helpers,
    prompt: &PromptItem,
) -> Result<Vec<Demonstration>, AgentError> {
    let recording = Arc::new(Recording::default());
    let mut ctx =
        AgentContext::scripted(tokenizer.clone(), limits.clone(), oracle, recording.clone())
            .with_helpers(helpers);
    agent.run(&mut ctx, prompt).await?;
    Ok(recording.take())
}
