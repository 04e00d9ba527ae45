//! ooze's agent side: what model-written actions run against.
//!
//! - [`command`]: agents as programs, talking to the policy through the agent gateway;
//!   [`net_jail`]: their network namespace, whose only way out is the gateway.
//! - [`parse`]: tool calls, XML-tag actions and code blocks read out of model text; malformed
//!   ones explained for the model.
//! - [`recipes`]: the agents of the recipes (`search_r1`, `retool`, `multi_agent`, `memagent`,
//!   `agentflow`, `tool_orchestra`).
//! - [`retail`]: a τ-bench-style store with a simulated customer (the `tau_retail` recipe).
//! - [`sandbox`]: Python execution in an isolated, limited process.
//! - [`search`]: a BM25 index over a JSONL corpus, served with Search-R1's `/retrieve` API.

pub mod command;
pub mod net_jail;
pub mod parse;
pub mod recipes;
pub mod retail;
pub mod sandbox;
pub mod search;
