//! The recipe's `[agent]` and `[helpers]` sections turned into the running agent and its helper
//! models.

use crate::recipe::{AgentKind, AgentSection, HelperSection, Recipe};
use anyhow::Context;
use ooze_agents::recipes::agentflow::{AgentflowAgent, AgentflowConfig};
use ooze_agents::recipes::memagent::{MemAgent, MemAgentConfig};
use ooze_agents::recipes::multi_agent::{MultiAgent, MultiAgentConfig};
use ooze_agents::recipes::retool::{RetoolAgent, RetoolConfig};
use ooze_agents::recipes::search_r1::{FormatReward, SearchR1Agent, SearchR1Config};
use ooze_agents::recipes::tool_orchestra::{OrchestraConfig, ToolOrchestraAgent};
use ooze_agents::sandbox::{Sandbox, SandboxLimits};
use ooze_agents::search::{Bm25Index, Searcher};
use ooze_engine::{EngineConfig, EngineHandle};
use ooze_model::{Decoder, SlotCache, Tokenizer};
use ooze_rollout::agent::{Agent, AgentLimits, AgentRollout};
use ooze_rollout::helpers::{Helper, HelperBackend, Helpers};
use ooze_torch::tch::{Device, Kind};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Tokens an agent's conversations need beyond the longest dataset prompt: the engine's slot
/// length is that prompt plus this. Agents that write their own prompts (memories, contexts,
/// other calls' answers) need room for those too.
pub fn agent_context_len(a: &AgentSection) -> usize {
    let turn = a.max_tokens_per_turn;
    let rebuilt = (a.max_turns + 1) * (a.max_observation_tokens + 64) + turn + 512;
    match a.kind {
        AgentKind::None => 0,
        AgentKind::SearchR1 | AgentKind::Retool => a.max_response_tokens,
        AgentKind::MultiAgent => a.max_response_tokens.max((a.solvers + 1) * turn + 512),
        AgentKind::Memagent => a.max_response_tokens.max(a.chunk_tokens + 2 * turn + 512),
        AgentKind::Agentflow | AgentKind::ToolOrchestra => a.max_response_tokens.max(rebuilt),
    }
}

fn sandbox(a: &AgentSection) -> anyhow::Result<Sandbox> {
    let sandbox = Sandbox::new(SandboxLimits {
        wall: Duration::from_secs_f64(a.tool_timeout_secs),
        cpu_seconds: a.tool_timeout_secs.ceil() as u64,
        memory_bytes: a.tool_memory_mb << 20,
        concurrent: match a.tool_concurrency {
            0 => SandboxLimits::default_concurrent(),
            n => n,
        },
        ..Default::default()
    })?;
    eprintln!(
        "agent: Python sandbox with {:?} isolation, {} programs at once",
        sandbox.isolation(),
        sandbox.limits().concurrent
    );
    Ok(sandbox)
}

fn searcher(a: &AgentSection) -> anyhow::Result<Option<Searcher>> {
    Ok(match (&a.corpus, &a.retrieval_url) {
        (Some(corpus), _) => {
            let t = Instant::now();
            let index = Bm25Index::from_jsonl(corpus)?;
            eprintln!(
                "agent: search over {} documents of {} (BM25, {:.1}s)",
                index.len(),
                corpus.display(),
                t.elapsed().as_secs_f64()
            );
            Some(Searcher::Local(Arc::new(index)))
        }
        (None, Some(url)) => Some(Searcher::Remote {
            url: url.clone(),
            timeout: Duration::from_secs(30),
        }),
        (None, None) => None,
    })
}

/// The recipe's agent, if it has one (its helpers are added once the engines run).
pub fn agent_rollout(recipe: &Recipe, max_context: usize) -> anyhow::Result<Option<AgentRollout>> {
    let a = &recipe.agent;
    let limits = AgentLimits {
        max_tokens_per_turn: a.max_tokens_per_turn,
        max_response_tokens: a.max_response_tokens,
        max_context,
        deadline: Duration::from_secs_f64(a.deadline_secs),
    };
    let agent: Arc<dyn Agent> = match a.kind {
        AgentKind::None => return Ok(None),
        AgentKind::SearchR1 => Arc::new(SearchR1Agent {
            searcher: searcher(a)?.expect("invariant: the recipe check requires a source"),
            config: SearchR1Config {
                max_turns: a.max_turns,
                topk: a.topk,
                max_observation_tokens: a.max_observation_tokens,
                format_reward: a.format_reward.as_ref().map(|f| FormatReward {
                    structure: f.structure,
                    final_format: f.final_format,
                    retrieval: f.retrieval,
                }),
            },
        }),
        AgentKind::Retool => Arc::new(RetoolAgent {
            sandbox: sandbox(a)?,
            config: RetoolConfig {
                max_turns: a.max_turns,
                max_observation_tokens: a.max_observation_tokens,
            },
        }),
        AgentKind::MultiAgent => Arc::new(MultiAgent {
            config: MultiAgentConfig { solvers: a.solvers },
        }),
        AgentKind::Memagent => Arc::new(MemAgent {
            config: MemAgentConfig {
                chunk_tokens: a.chunk_tokens,
            },
        }),
        AgentKind::Agentflow => Arc::new(AgentflowAgent {
            sandbox: sandbox(a)?,
            config: AgentflowConfig {
                max_steps: a.max_turns,
                max_result_tokens: a.max_observation_tokens,
                helper_tokens: a.max_tokens_per_turn,
            },
        }),
        AgentKind::ToolOrchestra => {
            let experts = if a.experts.is_empty() {
                recipe
                    .helpers
                    .keys()
                    .filter(|name| *name != "judge")
                    .cloned()
                    .collect()
            } else {
                a.experts.clone()
            };
            anyhow::ensure!(
                !experts.is_empty(),
                "agent.type = \"tool_orchestra\" needs expert models: add [helpers.NAME] sections (and optionally agent.experts)"
            );
            Arc::new(ToolOrchestraAgent::new(
                sandbox(a)?,
                searcher(a)?,
                OrchestraConfig {
                    max_turns: a.max_turns,
                    experts,
                    cost_weight: a.cost_weight,
                    latency_scale_secs: a.latency_scale_secs,
                    max_penalty: a.max_penalty,
                    expert_tokens: a.max_tokens_per_turn,
                    max_observation_tokens: a.max_observation_tokens,
                    topk: a.topk,
                },
            ))
        }
    };
    Ok(Some(AgentRollout {
        agent,
        limits,
        grace: Duration::from_secs(10),
        helpers: Helpers::default(),
    }))
}

/// A `path` helper's weights, tokenizer and stop ids, loaded before the policy's engine is sized
/// so that its weights and its cache are counted out of the policy's memory.
pub struct LoadedHelper {
    name: String,
    decoder: Decoder,
    tokenizer: Arc<Tokenizer>,
    eos: Vec<u32>,
    slots: i64,
}

impl LoadedHelper {
    /// The key/value cache its engine will hold: `slots` sequences of `slot_len` tokens.
    pub fn cache_bytes(&self, slot_len: i64, kind: Kind) -> i64 {
        SlotCache::bytes_per_token(&self.decoder.config, kind) * slot_len * self.slots
    }
}

/// Loads every `path` helper of the recipe onto `device`.
pub fn load_helper_models(
    recipe: &Recipe,
    device: Device,
    kind: Kind,
) -> anyhow::Result<Vec<LoadedHelper>> {
    let mut loaded = Vec::new();
    for (name, h) in &recipe.helpers {
        let Some(path) = h.path.as_ref().filter(|_| !h.policy) else {
            continue;
        };
        let t = Instant::now();
        let decoder = Decoder::load(path, device, kind)
            .with_context(|| format!("helpers.{name}.path: loading {}", path.display()))?;
        let tokenizer = Arc::new(Tokenizer::load(path).with_context(|| {
            format!("helpers.{name}.path: the tokenizer of {}", path.display())
        })?);
        let eos = ooze_model::config::load_generation_eos(path)?
            .unwrap_or_else(|| decoder.config.eos_token_ids.clone());
        eprintln!(
            "helper {name}: {} ({:.1}M parameters), {:.1}s",
            path.display(),
            decoder.config.num_parameters() as f64 / 1e6,
            t.elapsed().as_secs_f64()
        );
        loaded.push(LoadedHelper {
            name: name.clone(),
            decoder,
            tokenizer,
            eos,
            slots: h.slots,
        });
    }
    Ok(loaded)
}

/// The recipe's helper models: `policy = true` ones over the policy's engine, `path` ones (already
/// loaded) each in an engine of their own (sequences of `slot_len` tokens), `url` ones as HTTP
/// clients.
pub fn build_helpers(
    recipe: &Recipe,
    loaded: Vec<LoadedHelper>,
    policy: &EngineHandle,
    policy_tokenizer: &Arc<Tokenizer>,
    slot_len: i64,
) -> anyhow::Result<Helpers> {
    let mut engines: HashMap<String, HelperBackend> = loaded
        .into_iter()
        .map(|m| {
            eprintln!(
                "helper {}: its own engine, {} sequences × {slot_len} tokens",
                m.name, m.slots
            );
            let engine = ooze_engine::start(
                m.decoder,
                Some(m.tokenizer.clone()),
                EngineConfig::new(m.slots, slot_len, m.eos),
            );
            let backend = HelperBackend::Engine {
                engine,
                tokenizer: m.tokenizer,
            };
            (m.name, backend)
        })
        .collect();
    let mut helpers = Vec::new();
    for (name, h) in &recipe.helpers {
        let backend = match engines.remove(name) {
            Some(engine) => engine,
            None => remote_or_policy(name, h, policy, policy_tokenizer)?,
        };
        helpers.push(Helper {
            name: name.clone(),
            backend,
            temperature: h.temperature,
            max_tokens: h.max_tokens,
            timeout: Duration::from_secs_f64(h.timeout_secs),
            price_per_million_tokens: h.price_per_million_tokens,
            description: h.description.clone(),
        });
    }
    Ok(Helpers::new(helpers))
}

fn remote_or_policy(
    name: &str,
    h: &HelperSection,
    policy: &EngineHandle,
    policy_tokenizer: &Arc<Tokenizer>,
) -> anyhow::Result<HelperBackend> {
    if h.policy {
        eprintln!("helper {name}: the policy's engine (untrained calls)");
        return Ok(HelperBackend::Engine {
            engine: policy.clone(),
            tokenizer: policy_tokenizer.clone(),
        });
    }
    let url = h
        .url
        .as_ref()
        .expect("invariant: the recipe check requires one source, and path helpers are loaded");
    let api_key = match &h.api_key_env {
        Some(var) => Some(std::env::var(var).with_context(|| {
            format!("helpers.{name}.api_key_env: the environment variable {var} is not set")
        })?),
        None => None,
    };
    let model = match &h.model {
        Some(m) => m.clone(),
        None => served_model(url, api_key.as_deref()).with_context(|| {
            format!("helpers.{name}: asking {url}/models which model it serves (set helpers.{name}.model to skip this)")
        })?,
    };
    eprintln!("helper {name}: {model} at {url}");
    Ok(HelperBackend::Http {
        base_url: url.clone(),
        model,
        api_key,
    })
}

/// The first model an OpenAI-compatible server lists at `GET {base_url}/models`.
fn served_model(base_url: &str, api_key: Option<&str>) -> anyhow::Result<String> {
    let url = format!("{}/models", base_url.trim_end_matches('/'));
    let agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .new_agent();
    let mut request = agent.get(&url);
    if let Some(key) = api_key {
        request = request.header("Authorization", &format!("Bearer {key}"));
    }
    let text = request
        .call()
        .map_err(|e| anyhow::anyhow!("GET {url}: {e}"))?
        .body_mut()
        .read_to_string()
        .map_err(|e| anyhow::anyhow!("GET {url}: {e}"))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("GET {url}: not JSON: {text}"))?;
    value["data"][0]["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("GET {url}: no data[0].id in {text}"))
}
