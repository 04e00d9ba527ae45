//! An execution's calls to helper models (a child of `agent`): asked of the helper's own
//! endpoint, or of the oracle in a scripted context, and counted in the execution's usage.

use super::{AgentContext, AgentError, PolicySource};
use crate::activity::Phase;
use crate::helpers::{HelperReply, HelperUsage};
use crate::oracle::{Caller, Oracle, Recording};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

impl AgentContext {
    /// Asks helper `name` to answer `messages` (at most `max_tokens` new tokens, stopping at
    /// `stop`), within the execution's deadline. The call is not a training sample; its tokens,
    /// cost and time are added to [`AgentContext::helper_usage`].
    pub async fn ask_helper(
        &self,
        name: &str,
        messages: &[Value],
        max_tokens: usize,
        stop: &[&str],
    ) -> Result<HelperReply, AgentError> {
        if let PolicySource::Oracle { oracle, recording } = &self.policy {
            return self.scripted_helper(oracle.as_ref(), recording, name, messages, max_tokens);
        }
        let helper = self.helpers.get(name)?.clone();
        let waiting = self.activity.enter(Phase::Helper);
        let reply = helper
            .chat(
                messages,
                max_tokens,
                stop,
                self.next_seed(),
                self.deadline,
                &self.cancel,
            )
            .await?;
        drop(waiting);
        self.count_helper_call(name, &reply, helper.price_per_million_tokens);
        Ok(reply)
    }

    /// The oracle's reply to helper `name` (cut to its token limit, as a model's would be),
    /// recorded as a conversation of its own and counted in the usage at the helper's price.
    fn scripted_helper(
        &self,
        oracle: &dyn Oracle,
        recording: &Recording,
        name: &str,
        messages: &[Value],
        max_tokens: usize,
    ) -> Result<HelperReply, AgentError> {
        let helper = self.helpers.get(name).ok();
        let limit = helper.map_or(max_tokens, |h| max_tokens.min(h.max_tokens).max(1));
        let mut text = oracle
            .reply(Caller::Helper(name), messages)
            .map_err(AgentError::Agent)?;
        let mut tokens = self.encode(&text)?;
        if tokens.len() > limit {
            tokens.truncate(limit);
            text = self
                .tokenizer
                .decode(&tokens, false)
                .map_err(|e| AgentError::Tokenizer(e.to_string()))?;
        }
        let mut shown = messages.to_vec();
        shown.push(json!({"role": "assistant", "content": text}));
        let id = self.conversations.fetch_add(1, Ordering::Relaxed);
        recording.put(id, name, &shown);
        // The prompt's size as the policy's tokenizer counts its messages' text.
        let mut prompt_tokens = 0;
        for content in messages.iter().filter_map(|m| m["content"].as_str()) {
            prompt_tokens += self.encode(content)?.len();
        }
        let reply = HelperReply {
            text,
            prompt_tokens,
            completion_tokens: tokens.len(),
            latency: Duration::ZERO,
        };
        let price = helper.map_or(0.0, |h| h.price_per_million_tokens);
        self.count_helper_call(name, &reply, price);
        Ok(reply)
    }

    /// [`AgentContext::ask_helper`] with one user message, no stop strings.
    pub async fn prompt_helper(
        &self,
        name: &str,
        user: &str,
        max_tokens: usize,
    ) -> Result<HelperReply, AgentError> {
        let message = json!({"role": "user", "content": user});
        self.ask_helper(name, std::slice::from_ref(&message), max_tokens, &[])
            .await
    }

    /// Adds one call of helper `name` to the execution's usage.
    fn count_helper_call(&self, name: &str, reply: &HelperReply, price_per_million_tokens: f64) {
        let mut usage = self.helper_usage.lock().expect("never poisoned");
        let u = usage.entry(name.to_owned()).or_default();
        u.calls += 1;
        u.tokens += reply.prompt_tokens + reply.completion_tokens;
        u.cost += reply.cost(price_per_million_tokens);
        u.seconds += reply.latency.as_secs_f64();
    }

    /// Helper calls so far, by helper.
    pub fn helper_usage(&self) -> BTreeMap<String, HelperUsage> {
        self.helper_usage.lock().expect("never poisoned").clone()
    }
}
