//! `[agent]`: a multi-turn agent per sample instead of one plain generation. `type` picks the agent
//! and each type has only its own keys, so a key of another type (`solvers` under `retool`) is an
//! error that names it. Every type shares three limits — `max_tokens_per_turn`,
//! `max_response_tokens`, `deadline_secs` — and all but multi_agent and memagent (whose structure
//! fixes their turns) a fourth, `max_turns`; they are written once in `agent_section!` (serde's
//! `flatten` cannot be combined with `deny_unknown_fields`) and read through `limits()`.
//!
//! What each type does with its keys (checks, context length, construction) is its
//! `crate::agents::AgentSpec` impl. A new type is one variant here and one impl there.

use serde::{Deserialize, Deserializer, Serialize};
use std::path::PathBuf;

/// `[agent]`: absent (or `type = "none"`) is one plain generation per sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentSection {
    #[default]
    None,
    SearchR1(SearchR1Section),
    Retool(RetoolSection),
    MultiAgent(MultiAgentSection),
    Memagent(MemagentSection),
    Agentflow(AgentflowSection),
    ToolOrchestra(ToolOrchestraSection),
    Command(CommandSection),
    Terminal(TerminalSection),
    TauRetail(TauRetailSection),
}

/// Reads `[agent]` (the recipe's `deserialize_with`): an empty section is no agent, and errors
/// name the key at fault with its section — `agent.solvers is not a key of agent.type =
/// "retool"` — where serde alone would say `unknown field `solvers``.
pub(super) fn deserialize_section<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<AgentSection, D::Error> {
    use serde::de::Error;
    let table = toml::Table::deserialize(deserializer)?;
    if table.is_empty() {
        return Ok(AgentSection::None);
    }
    let kind = match table.get("type") {
        Some(toml::Value::String(kind)) => kind.clone(),
        _ => {
            return Err(D::Error::custom(
                "agent.type is required: none, search_r1, retool, multi_agent, memagent, agentflow, tool_orchestra, command, terminal or tau_retail",
            ))
        }
    };
    AgentSection::deserialize(toml::Value::Table(table)).map_err(|e| {
        let message = e.message();
        let unknown = message
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split_once('`'));
        D::Error::custom(match unknown {
            Some((key, expected)) => format!(
                "agent.{key} is not a key of agent.type = \"{kind}\" ({})",
                expected.trim_start_matches(", ")
            ),
            None if message.starts_with("unknown variant") => format!("agent.type: {message}"),
            None => format!("[agent] (type = \"{kind}\"): {message}"),
        })
    })
}

/// `max_turns` where a type has no other default.
const DEFAULT_MAX_TURNS: usize = 4;

/// The limits of an agent type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AgentLimitsSection {
    /// Model turns per execution (agentflow: planner steps; tool_orchestra: orchestrator turns).
    /// `None` for the types whose turns are fixed by their structure (multi_agent: solve,
    /// rewrite, judge; memagent: one turn per chunk): they have no `max_turns` key.
    pub max_turns: Option<usize>,
    /// New tokens per turn.
    pub max_tokens_per_turn: usize,
    /// Response tokens (generated and appended) per conversation.
    pub max_response_tokens: usize,
    /// Wall clock per execution, tool calls included.
    pub deadline_secs: f64,
}

impl Default for AgentLimitsSection {
    fn default() -> Self {
        AgentLimitsSection {
            max_turns: Some(DEFAULT_MAX_TURNS),
            max_tokens_per_turn: 500,
            max_response_tokens: 4096,
            deadline_secs: 600.0,
        }
    }
}

/// Declares one agent type's section: the shared limits, then the type's own keys, each with its
/// default; `deny_unknown_fields` keeps other types' keys out. `NAME without max_turns { … }`
/// declares a type whose turns its structure fixes: `max_turns` is then not one of its keys.
macro_rules! agent_section {
    (
        @emit $($turns:ident)?;
        $(#[$meta:meta])*
        $name:ident {
            $( $(#[$field_meta:meta])* $field:ident : $ty:ty = $default:expr, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct $name {
            $(
                /// See [`AgentLimitsSection::max_turns`].
                pub $turns: usize,
            )?
            /// See [`AgentLimitsSection::max_tokens_per_turn`].
            pub max_tokens_per_turn: usize,
            /// See [`AgentLimitsSection::max_response_tokens`].
            pub max_response_tokens: usize,
            /// See [`AgentLimitsSection::deadline_secs`].
            pub deadline_secs: f64,
            $( $(#[$field_meta])* pub $field: $ty, )*
        }

        impl Default for $name {
            fn default() -> Self {
                let limits = AgentLimitsSection::default();
                $name {
                    $( $turns: DEFAULT_MAX_TURNS, )?
                    max_tokens_per_turn: limits.max_tokens_per_turn,
                    max_response_tokens: limits.max_response_tokens,
                    deadline_secs: limits.deadline_secs,
                    $( $field: $default, )*
                }
            }
        }

        impl $name {
            /// The limits of this agent type.
            pub fn limits(&self) -> AgentLimitsSection {
                AgentLimitsSection {
                    max_turns: None $( .or(Some(self.$turns)) )?,
                    max_tokens_per_turn: self.max_tokens_per_turn,
                    max_response_tokens: self.max_response_tokens,
                    deadline_secs: self.deadline_secs,
                }
            }
        }
    };
    ($(#[$meta:meta])* $name:ident without max_turns { $($body:tt)* }) => {
        agent_section! { @emit ; $(#[$meta])* $name { $($body)* } }
    };
    ($(#[$meta:meta])* $name:ident { $($body:tt)* }) => {
        agent_section! { @emit max_turns; $(#[$meta])* $name { $($body)* } }
    };
}

agent_section! {
    /// `type = "search_r1"`: search, then answer (Search-R1).
    SearchR1Section {
        /// A JSONL corpus (`{"id", "contents": "Title\ntext"}`) indexed with BM25 in this
        /// process…
        corpus: Option<PathBuf> = None,
        /// …or a Search-R1 `/retrieve` service (exactly one of the two).
        retrieval_url: Option<String> = None,
        /// Documents per search.
        topk: usize = 3,
        /// Observation tokens kept per tool call.
        max_observation_tokens: usize = 500,
        /// Search-R1's format-aware reward (absent: exact match only).
        format_reward: Option<FormatRewardSection> = None,
    }
}

agent_section! {
    /// `type = "retool"`: reasoning with a Python sandbox (ReTool).
    RetoolSection {
        /// Observation tokens kept per tool call.
        max_observation_tokens: usize = 500,
        /// The Python tool's wall clock per run.
        tool_timeout_secs: f64 = 10.0,
        /// The Python program's address space per run (its episode gets 64 MiB more).
        tool_memory_mb: u64 = 1024,
        /// Sandbox programs running at once across all executions (0: twice the CPUs, at least
        /// 4); more wait for a slot.
        tool_concurrency: usize = 0,
    }
}

agent_section! {
    /// `type = "multi_agent"`: solvers, rewriters and a judge from one policy (three turns).
    MultiAgentSection without max_turns {
        /// Parallel solvers (and as many rewriters).
        solvers: usize = 5,
    }
}

agent_section! {
    /// `type = "memagent"`: a long document read chunk by chunk into a memory (the memory's budget
    /// is `max_tokens_per_turn`); its turns are the document's chunks.
    MemagentSection without max_turns {
        /// Document tokens per chunk.
        chunk_tokens: usize = 5000,
    }
}

agent_section! {
    /// `type = "agentflow"`: a trained planner with fixed executor, verifier and generator helpers.
    AgentflowSection {
        /// Tokens of a tool's result kept in the planner's context.
        max_observation_tokens: usize = 500,
        /// The Python tool's wall clock per run.
        tool_timeout_secs: f64 = 10.0,
        /// The Python program's address space per run (its episode gets 64 MiB more).
        tool_memory_mb: u64 = 1024,
        /// Sandbox programs running at once across all executions (0: twice the CPUs, at least
        /// 4); more wait for a slot.
        tool_concurrency: usize = 0,
    }
}

agent_section! {
    /// `type = "tool_orchestra"`: an orchestrator calling tools and expert models, rewarded for
    /// being right at a low cost.
    ToolOrchestraSection {
        /// Observation tokens kept per tool call.
        max_observation_tokens: usize = 500,
        /// The Python tool's wall clock per run.
        tool_timeout_secs: f64 = 10.0,
        /// The Python program's address space per run (its episode gets 64 MiB more).
        tool_memory_mb: u64 = 1024,
        /// Sandbox programs running at once across all executions (0: twice the CPUs, at least
        /// 4); more wait for a slot.
        tool_concurrency: usize = 0,
        /// A JSONL corpus for the search tool…
        corpus: Option<PathBuf> = None,
        /// …or a Search-R1 `/retrieve` service (neither: no search tool).
        retrieval_url: Option<String> = None,
        /// Documents per search.
        topk: usize = 3,
        /// The helpers the orchestrator may call as experts (default: every helper but `judge`).
        experts: Vec<String> = Vec::new(),
        /// reward = correct − min(max_penalty, cost_weight · cost$ + latency_s /
        /// latency_scale_secs).
        cost_weight: f64 = 5.0,
        latency_scale_secs: f64 = 500.0,
        max_penalty: f64 = 0.8,
    }
}

agent_section! {
    /// `type = "command"`: the agent is a program (any language) that talks to the policy through
    /// the agent gateway's OpenAI and Anthropic endpoints; `max_turns` bounds its model calls,
    /// `max_response_tokens` the tokens generated over all of them, `deadline_secs` its wall
    /// clock.
    CommandSection {
        /// The program and its arguments, e.g. `["python3", "recipes/python_agent/agent.py"]`.
        command: Vec<String> = Vec::new(),
        /// Its working directory (default: where ooze runs).
        cwd: Option<PathBuf> = None,
        /// Environment variables set for it besides the gateway's.
        env: std::collections::BTreeMap<String, String> = Default::default(),
        /// Programs running at once (0: as many as the rollout runs executions).
        concurrency: usize = 0,
        /// Address space per process of the program, MiB (0: no limit).
        memory_mb: u64 = 0,
        /// What its network reaches: "gateway" (a network namespace of its own whose only way
        /// out is the agent gateway, where the kernel allows one) or "host".
        network: String = "gateway".to_owned(),
    }
}

agent_section! {
    /// `type = "terminal"`: the model works in a container episode of a task directory (the
    /// row's `task_dir`) through tool calls, and the task's tests give the reward
    /// (endless_terminals, echo, swe_lite).
    TerminalSection {
        /// Tokens of a tool's result kept.
        max_observation_tokens: usize = 512,
        /// Wall clock per shell command.
        command_timeout_secs: f64 = 30.0,
        /// `view` and `edit` file tools beside `bash` (coding tasks).
        file_tools: bool = false,
        /// Commands running at once across all executions (0: twice the CPUs, at least 4); more
        /// wait for a slot.
        tool_concurrency: usize = 0,
    }
}

agent_section! {
    /// `type = "tau_retail"`: a store's customer service agent with a simulated customer (the
    /// helper `user`) over a generated database (τ-bench's retail shape); the row's
    /// `scenario` holds the customer's hidden goal and the reward compares databases. The
    /// customer's replies are cut at `helpers.user.max_tokens`.
    TauRetailSection {
        /// Tokens of a tool's result kept.
        max_observation_tokens: usize = 512,
    }
}

/// `[agent.format_reward]` (search_r1): Search-R1's format-aware reward instead of plain exact
/// match. A response is well-formed when, after the prompt, it is a sequence of
/// `<think>…</think>` followed by `<search>…</search><information>…</information>` rounds, ending
/// in `<answer>…</answer>`, with only whitespace between the tags. Rewards: correct and
/// well-formed 1; correct but malformed `1 − structure`; wrong but well-formed `structure` (plus
/// `retrieval` when a retrieved block contains a gold answer); wrong and malformed but answered
/// `final`; no answer and malformed 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FormatRewardSection {
    pub structure: f64,
    pub final_format: f64,
    pub retrieval: f64,
}

impl Default for FormatRewardSection {
    fn default() -> Self {
        FormatRewardSection {
            structure: 0.2,
            final_format: 0.1,
            retrieval: 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recipe::tests::{parse, MIN};
    use crate::recipe::Recipe;
    use std::path::Path;

    #[test]
    fn agent_keys_belong_to_their_type() {
        let e = parse(
            &format!("{MIN}[agent]\ntype = \"retool\"\nsolvers = 5\n"),
            &[],
        )
        .unwrap_err();
        assert!(
            e.contains("agent.solvers is not a key of agent.type = \"retool\""),
            "{e}"
        );
        assert!(e.contains("`tool_timeout_secs`"), "{e}");
        let e = parse(MIN, &["agent.type=\"multi_agent\"", "agent.topk=2"]).unwrap_err();
        assert!(e.contains("agent.topk"), "{e}");
        let e = parse(MIN, &["agent.type=\"retol\""]).unwrap_err();
        assert!(
            e.contains("agent.type: unknown variant `retol`") && e.contains("`tool_orchestra`"),
            "{e}"
        );
        // multi_agent's and memagent's turns are fixed by their structure.
        for ty in ["multi_agent", "memagent"] {
            let e =
                parse(MIN, &[&format!("agent.type=\"{ty}\""), "agent.max_turns=2"]).unwrap_err();
            assert!(
                e.contains(&format!(
                    "agent.max_turns is not a key of agent.type = \"{ty}\""
                )),
                "{e}"
            );
        }
        let e = parse(MIN, &["agent.max_turns=2"]).unwrap_err();
        assert!(e.contains("agent.type is required"), "{e}");
        let e = parse(MIN, &["agent.type=\"memagent\"", "agent.chunk_tokens=0"]).unwrap_err();
        assert!(e.contains("agent.chunk_tokens must be at least 1"), "{e}");
        let e = parse(MIN, &["agent.type=\"search_r1\""]).unwrap_err();
        assert!(e.contains("exactly one of agent.corpus"), "{e}");
        let e = parse(
            MIN,
            &[
                "agent.type=\"tool_orchestra\"",
                "helpers.judge={policy = true}",
            ],
        )
        .unwrap_err();
        assert!(e.contains("needs expert models"), "{e}");

        // No section, an empty one, and `type = "none"` are no agent.
        for text in [
            MIN.to_owned(),
            format!("{MIN}[agent]\n"),
            format!("{MIN}[agent]\ntype = \"none\"\n"),
        ] {
            let r = parse(&text, &[]).unwrap();
            assert_eq!(r.agent, AgentSection::None);
            assert_eq!(crate::agents::agent_context_len(&r.agent), 0);
        }
    }

    #[test]
    fn agent_sections_round_trip_with_their_defaults() {
        let r = parse(MIN, &["agent.type=\"retool\"", "agent.max_turns=7"]).unwrap();
        let AgentSection::Retool(retool) = &r.agent else {
            panic!("{:?}", r.agent)
        };
        assert_eq!(retool.max_turns, 7);
        assert_eq!(retool.max_tokens_per_turn, 500);
        assert_eq!(retool.tool_memory_mb, 1024);
        assert_eq!(parse(&r.to_toml(), &[]).unwrap(), r);
        assert_eq!(crate::agents::agent_context_len(&r.agent), 4096);

        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../recipes");
        let mut types = Vec::new();
        for name in [
            "search_r1",
            "retool",
            "multi_agent",
            "memagent",
            "agentflow",
            "tool_orchestra",
        ] {
            let r = Recipe::load(&root.join(name).join("recipe.toml"), &[]).unwrap();
            let spec = r.agent.spec().unwrap();
            types.push(spec.type_name());
            assert_eq!(parse(&r.to_toml(), &[]).unwrap(), r, "{name}");
            // The engine's context: what each agent's prompts and answers need.
            // Values of the formulas before the per-type sections (the shipped recipes' keys).
            let expected = match name {
                "search_r1" | "retool" => 512,
                // 5 solvers' 128-token answers and a reply.
                "multi_agent" => 6 * 128 + 512,
                // The default 4096 response tokens exceed a chunk, a memory and a reply, and
                // the rebuilt contexts of agentflow and tool_orchestra.
                _ => 4096,
            };
            assert_eq!(
                crate::agents::agent_context_len(&r.agent),
                expected,
                "{name}"
            );
        }
        assert_eq!(
            types,
            [
                "search_r1",
                "retool",
                "multi_agent",
                "memagent",
                "agentflow",
                "tool_orchestra"
            ]
        );
        let r = parse(
            MIN,
            &[
                "agent.type=\"multi_agent\"",
                "agent.solvers=9",
                "agent.max_tokens_per_turn=1000",
            ],
        )
        .unwrap();
        assert_eq!(crate::agents::agent_context_len(&r.agent), 10 * 1000 + 512);
        let r = parse(
            MIN,
            &[
                "agent.type=\"agentflow\"",
                "agent.max_turns=20",
                "agent.max_observation_tokens=200",
                "agent.max_tokens_per_turn=100",
                "helpers.executor={policy = true}",
                "helpers.verifier={policy = true}",
                "helpers.generator={policy = true}",
                "helpers.judge={policy = true}",
            ],
        )
        .unwrap();
        assert_eq!(
            crate::agents::agent_context_len(&r.agent),
            21 * (200 + 64) + 100 + 512
        );
    }
}
