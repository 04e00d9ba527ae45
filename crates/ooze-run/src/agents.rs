//! The recipe's `[agent]` and `[helpers]` sections turned into the running agent and its helper
//! models.

use crate::recipe::{
    AgentLimitsSection, AgentSection, AgentflowSection, CommandSection, HelperSection,
    MemagentSection, MultiAgentSection, Recipe, RetoolSection, SearchR1Section, TauRetailSection,
    TerminalSection, ToolOrchestraSection,
};
use anyhow::Context;
use ooze_agents::command::{CommandAgent, CommandConfig, Network};
use ooze_agents::recipes::agentflow::{AgentflowAgent, AgentflowConfig};
use ooze_agents::recipes::memagent::{MemAgent, MemAgentConfig};
use ooze_agents::recipes::multi_agent::{MultiAgent, MultiAgentConfig};
use ooze_agents::recipes::retool::{RetoolAgent, RetoolConfig};
use ooze_agents::recipes::search_r1::{FormatReward, SearchR1Agent, SearchR1Config};
use ooze_agents::recipes::tool_orchestra::{OrchestraConfig, ToolOrchestraAgent};
use ooze_agents::sandbox::{Sandbox, SandboxLimits};
use ooze_agents::search::{Bm25Index, Searcher};
use ooze_engine::{EngineConfig, EngineHandle};
use ooze_model::{Decoder, PagedKv, Tokenizer};
use ooze_rollout::agent::{Agent, AgentLimits, AgentRollout};
use ooze_rollout::helpers::{Helper, HelperBackend, Helpers};
use ooze_rollout::http_client::JsonClient;
use ooze_server::gateway::session::Budget;
use ooze_torch::tch::{Device, Kind};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One `[agent]` type: its recipe checks, the context it needs, and how it is built. A new agent
/// type is a variant of [`AgentSection`] (with its section struct) and an impl of this trait.
pub trait AgentSpec {
    /// The `type` value, for messages.
    fn type_name(&self) -> &'static str;
    /// The limits every agent type has.
    fn limits(&self) -> AgentLimitsSection;
    /// Helpers the agent calls by fixed names: each needs a `[helpers.NAME]` section.
    fn required_helpers(&self) -> &[&str] {
        &[]
    }
    /// Checks what the types cannot (the limits and required helpers are checked by the recipe);
    /// errors name the key at fault.
    fn check(&self, _helpers: &BTreeMap<String, HelperSection>) -> Result<(), String> {
        Ok(())
    }
    /// Whether its conversations carry environment text inside the response (observation mask
    /// 1), which `algorithm.loss.observation_coef` trains on; agents that rebuild their prompts
    /// carry none.
    fn writes_observations(&self) -> bool {
        false
    }
    /// Tokens its conversations need beyond the longest dataset prompt: the engine's slot
    /// length is that prompt plus this. Agents that write their own prompts (memories, contexts,
    /// other calls' answers) need room for those too.
    fn context_len(&self) -> usize;
    /// The running agent (sandboxes started, corpora indexed).
    fn build(&self, ctx: &AgentBuildContext<'_>) -> anyhow::Result<Arc<dyn Agent>>;
}

/// What building an agent may read besides its own section.
pub struct AgentBuildContext<'a> {
    /// The recipe's `[helpers.NAME]` sections.
    pub helpers: &'a BTreeMap<String, HelperSection>,
    /// The run directory, where agents keep their logs (none for demonstrations).
    pub run_dir: Option<&'a Path>,
}

impl AgentSection {
    /// The agent type's behaviour; `None` without an agent.
    pub fn spec(&self) -> Option<&dyn AgentSpec> {
        match self {
            AgentSection::None => None,
            AgentSection::SearchR1(s) => Some(s),
            AgentSection::Retool(s) => Some(s),
            AgentSection::MultiAgent(s) => Some(s),
            AgentSection::Memagent(s) => Some(s),
            AgentSection::Agentflow(s) => Some(s),
            AgentSection::ToolOrchestra(s) => Some(s),
            AgentSection::Command(s) => Some(s),
            AgentSection::Terminal(s) => Some(s),
            AgentSection::TauRetail(s) => Some(s),
        }
    }
}

/// Tokens an agent's conversations need beyond the longest dataset prompt (0 without an agent).
pub fn agent_context_len(a: &AgentSection) -> usize {
    a.spec().map_or(0, AgentSpec::context_len)
}

/// The context of agents that rebuild their prompt each turn from `max_turns` observations.
fn rebuilt_context_len(
    limits: AgentLimitsSection,
    max_turns: usize,
    max_observation_tokens: usize,
) -> usize {
    let rebuilt =
        (max_turns + 1) * (max_observation_tokens + 64) + limits.max_tokens_per_turn + 512;
    limits.max_response_tokens.max(rebuilt)
}

fn sandbox(timeout_secs: f64, memory_mb: u64, concurrency: usize) -> anyhow::Result<Sandbox> {
    anyhow::ensure!(
        timeout_secs.is_finite() && timeout_secs > 0.0,
        "agent.tool_timeout_secs: expected a positive number of seconds, got {timeout_secs}"
    );
    let sandbox = Sandbox::new(SandboxLimits {
        isolation: ooze_env::IsolationMode::from_env()?,
        wall: Duration::from_secs_f64(timeout_secs),
        memory_bytes: memory_mb << 20,
        concurrent: match concurrency {
            0 => SandboxLimits::default_concurrent(),
            n => n,
        },
        ..Default::default()
    })?;
    eprintln!(
        "agent: Python sandbox: {}; {} programs at once",
        sandbox.isolation(),
        sandbox.limits().concurrent
    );
    Ok(sandbox)
}

fn searcher(
    corpus: Option<&Path>,
    retrieval_url: Option<&str>,
) -> anyhow::Result<Option<Searcher>> {
    Ok(match (corpus, retrieval_url) {
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
            url: url.to_owned(),
            timeout: Duration::from_secs(30),
        }),
        (None, None) => None,
    })
}

impl AgentSpec for SearchR1Section {
    fn writes_observations(&self) -> bool {
        true
    }
    fn type_name(&self) -> &'static str {
        "search_r1"
    }
    fn limits(&self) -> AgentLimitsSection {
        self.limits()
    }
    fn check(&self, _helpers: &BTreeMap<String, HelperSection>) -> Result<(), String> {
        if self.corpus.is_some() == self.retrieval_url.is_some() {
            return Err("agent.type = \"search_r1\" needs exactly one of agent.corpus (a JSONL corpus to index) and agent.retrieval_url (a /retrieve service)".into());
        }
        Ok(())
    }
    fn context_len(&self) -> usize {
        self.max_response_tokens
    }
    fn build(&self, _ctx: &AgentBuildContext<'_>) -> anyhow::Result<Arc<dyn Agent>> {
        Ok(Arc::new(SearchR1Agent {
            searcher: searcher(self.corpus.as_deref(), self.retrieval_url.as_deref())?
                .expect("invariant: the recipe check requires a source"),
            config: SearchR1Config {
                max_turns: self.max_turns,
                topk: self.topk,
                max_observation_tokens: self.max_observation_tokens,
                format_reward: self.format_reward.as_ref().map(|f| FormatReward {
                    structure: f.structure,
                    final_format: f.final_format,
                    retrieval: f.retrieval,
                }),
            },
        }))
    }
}

impl AgentSpec for RetoolSection {
    fn writes_observations(&self) -> bool {
        true
    }
    fn type_name(&self) -> &'static str {
        "retool"
    }
    fn limits(&self) -> AgentLimitsSection {
        self.limits()
    }
    fn context_len(&self) -> usize {
        self.max_response_tokens
    }
    fn build(&self, _ctx: &AgentBuildContext<'_>) -> anyhow::Result<Arc<dyn Agent>> {
        Ok(Arc::new(RetoolAgent {
            sandbox: sandbox(
                self.tool_timeout_secs,
                self.tool_memory_mb,
                self.tool_concurrency,
            )?,
            config: RetoolConfig {
                max_turns: self.max_turns,
                max_observation_tokens: self.max_observation_tokens,
            },
        }))
    }
}

impl AgentSpec for TerminalSection {
    fn writes_observations(&self) -> bool {
        true
    }
    fn type_name(&self) -> &'static str {
        "terminal"
    }
    fn limits(&self) -> AgentLimitsSection {
        self.limits()
    }
    fn check(&self, _helpers: &BTreeMap<String, HelperSection>) -> Result<(), String> {
        if !(self.command_timeout_secs.is_finite() && self.command_timeout_secs > 0.0) {
            return Err(format!(
                "agent.command_timeout_secs: expected a positive number of seconds, got {}",
                self.command_timeout_secs
            ));
        }
        Ok(())
    }
    fn context_len(&self) -> usize {
        self.max_response_tokens
    }
    fn build(&self, _ctx: &AgentBuildContext<'_>) -> anyhow::Result<Arc<dyn Agent>> {
        use ooze_agents::recipes::terminal::{episode_limits, TerminalAgent, TerminalConfig};
        let timeout = Duration::from_secs_f64(self.command_timeout_secs);
        let limits = episode_limits(timeout, self.tool_concurrency);
        let concurrent = limits.concurrent;
        let sandbox = ooze_env::Sandbox::new(ooze_env::IsolationMode::from_env()?, limits)?;
        eprintln!(
            "agent: terminal episodes: {}; tools: {}; {concurrent} commands at once, each stopped \
             after {} s",
            sandbox.isolation(),
            if self.file_tools {
                "bash, view, edit"
            } else {
                "bash"
            },
            self.command_timeout_secs
        );
        Ok(Arc::new(TerminalAgent::new(
            sandbox,
            ooze_env::ImageCache::default(),
            TerminalConfig {
                max_turns: self.max_turns,
                max_observation_tokens: self.max_observation_tokens,
                command_timeout: timeout,
                file_tools: self.file_tools,
            },
        )))
    }
}

impl AgentSpec for TauRetailSection {
    fn writes_observations(&self) -> bool {
        true
    }
    fn type_name(&self) -> &'static str {
        "tau_retail"
    }
    fn limits(&self) -> AgentLimitsSection {
        self.limits()
    }
    fn required_helpers(&self) -> &[&str] {
        &[ooze_agents::recipes::tau_retail::USER]
    }
    fn context_len(&self) -> usize {
        self.max_response_tokens
    }
    fn build(&self, _ctx: &AgentBuildContext<'_>) -> anyhow::Result<Arc<dyn Agent>> {
        use ooze_agents::recipes::tau_retail::{TauRetailAgent, TauRetailConfig};
        Ok(Arc::new(TauRetailAgent {
            config: TauRetailConfig {
                max_turns: self.max_turns,
                max_observation_tokens: self.max_observation_tokens,
            },
        }))
    }
}

impl AgentSpec for MultiAgentSection {
    fn type_name(&self) -> &'static str {
        "multi_agent"
    }
    fn limits(&self) -> AgentLimitsSection {
        self.limits()
    }
    fn check(&self, _helpers: &BTreeMap<String, HelperSection>) -> Result<(), String> {
        if self.solvers == 0 {
            return Err("agent.solvers must be at least 1".into());
        }
        Ok(())
    }
    fn context_len(&self) -> usize {
        // Every solver's answer in one prompt, and a reply.
        let turn = self.max_tokens_per_turn;
        self.max_response_tokens
            .max((self.solvers + 1) * turn + 512)
    }
    fn build(&self, _ctx: &AgentBuildContext<'_>) -> anyhow::Result<Arc<dyn Agent>> {
        Ok(Arc::new(MultiAgent {
            config: MultiAgentConfig {
                solvers: self.solvers,
            },
        }))
    }
}

impl AgentSpec for MemagentSection {
    fn type_name(&self) -> &'static str {
        "memagent"
    }
    fn limits(&self) -> AgentLimitsSection {
        self.limits()
    }
    fn check(&self, _helpers: &BTreeMap<String, HelperSection>) -> Result<(), String> {
        if self.chunk_tokens == 0 {
            return Err("agent.chunk_tokens must be at least 1".into());
        }
        Ok(())
    }
    fn context_len(&self) -> usize {
        // A chunk, the memory and a reply.
        let turn = self.max_tokens_per_turn;
        self.max_response_tokens
            .max(self.chunk_tokens + 2 * turn + 512)
    }
    fn build(&self, _ctx: &AgentBuildContext<'_>) -> anyhow::Result<Arc<dyn Agent>> {
        Ok(Arc::new(MemAgent {
            config: MemAgentConfig {
                chunk_tokens: self.chunk_tokens,
            },
        }))
    }
}

impl AgentSpec for AgentflowSection {
    fn type_name(&self) -> &'static str {
        "agentflow"
    }
    fn limits(&self) -> AgentLimitsSection {
        self.limits()
    }
    fn required_helpers(&self) -> &[&str] {
        &["executor", "verifier", "generator", "judge"]
    }
    fn context_len(&self) -> usize {
        rebuilt_context_len(self.limits(), self.max_turns, self.max_observation_tokens)
    }
    fn build(&self, _ctx: &AgentBuildContext<'_>) -> anyhow::Result<Arc<dyn Agent>> {
        Ok(Arc::new(AgentflowAgent {
            sandbox: sandbox(
                self.tool_timeout_secs,
                self.tool_memory_mb,
                self.tool_concurrency,
            )?,
            config: AgentflowConfig {
                max_steps: self.max_turns,
                max_result_tokens: self.max_observation_tokens,
                helper_tokens: self.max_tokens_per_turn,
            },
        }))
    }
}

impl ToolOrchestraSection {
    /// `experts`, or every helper but `judge` when it is empty.
    fn expert_names(&self, helpers: &BTreeMap<String, HelperSection>) -> Vec<String> {
        if self.experts.is_empty() {
            helpers
                .keys()
                .filter(|name| *name != "judge")
                .cloned()
                .collect()
        } else {
            self.experts.clone()
        }
    }
}

impl AgentSpec for ToolOrchestraSection {
    fn type_name(&self) -> &'static str {
        "tool_orchestra"
    }
    fn limits(&self) -> AgentLimitsSection {
        self.limits()
    }
    fn check(&self, helpers: &BTreeMap<String, HelperSection>) -> Result<(), String> {
        for name in &self.experts {
            if !helpers.contains_key(name) {
                return Err(format!(
                    "agent.experts names \"{name}\", which has no [helpers.{name}] section"
                ));
            }
        }
        if self.expert_names(helpers).is_empty() {
            return Err("agent.type = \"tool_orchestra\" needs expert models: add [helpers.NAME] sections (and optionally agent.experts)".into());
        }
        Ok(())
    }
    fn context_len(&self) -> usize {
        rebuilt_context_len(self.limits(), self.max_turns, self.max_observation_tokens)
    }
    fn build(&self, ctx: &AgentBuildContext<'_>) -> anyhow::Result<Arc<dyn Agent>> {
        Ok(Arc::new(ToolOrchestraAgent::new(
            sandbox(
                self.tool_timeout_secs,
                self.tool_memory_mb,
                self.tool_concurrency,
            )?,
            searcher(self.corpus.as_deref(), self.retrieval_url.as_deref())?,
            OrchestraConfig {
                max_turns: self.max_turns,
                experts: self.expert_names(ctx.helpers),
                cost_weight: self.cost_weight,
                latency_scale_secs: self.latency_scale_secs,
                max_penalty: self.max_penalty,
                expert_tokens: self.max_tokens_per_turn,
                max_observation_tokens: self.max_observation_tokens,
                topk: self.topk,
            },
        )))
    }
}

impl CommandSection {
    fn network(&self) -> Result<Network, String> {
        match self.network.as_str() {
            "gateway" => Ok(Network::Gateway),
            "host" => Ok(Network::Host),
            other => Err(format!(
                "agent.network: expected \"gateway\" (the agent gateway only) or \"host\", got {other:?}"
            )),
        }
    }
}

impl AgentSpec for CommandSection {
    fn type_name(&self) -> &'static str {
        "command"
    }
    fn limits(&self) -> AgentLimitsSection {
        self.limits()
    }
    fn check(&self, _helpers: &BTreeMap<String, HelperSection>) -> Result<(), String> {
        self.network()?;
        match self.command.first() {
            None => Err("agent.command is required for agent.type = \"command\": the program and its arguments, e.g. [\"python3\", \"recipes/python_agent/agent.py\"]".into()),
            Some(p) if p.is_empty() => Err("agent.command[0]: the program name is empty".into()),
            Some(_) => Ok(()),
        }
    }
    fn context_len(&self) -> usize {
        self.max_response_tokens
    }
    fn build(&self, ctx: &AgentBuildContext<'_>) -> anyhow::Result<Arc<dyn Agent>> {
        let agent = CommandAgent::new(CommandConfig {
            command: self.command.clone(),
            cwd: self.cwd.clone(),
            env: self.env.clone(),
            concurrency: self.concurrency,
            budget: Budget {
                max_calls: Some(self.max_turns),
                max_tokens: Some(self.max_response_tokens),
            },
            memory_bytes: self.memory_mb << 20,
            log_dir: ctx.run_dir.map(Path::to_owned),
            network: self.network().map_err(anyhow::Error::msg)?,
        })
        .map_err(anyhow::Error::msg)?;
        eprintln!(
            "agent: the program {:?}, through the agent gateway",
            self.command
        );
        Ok(Arc::new(agent))
    }
}

/// The recipe's agent, if it has one (its helpers are added once the engines run); its logs go
/// under `run_dir`.
pub fn agent_rollout(
    recipe: &Recipe,
    max_context: usize,
    run_dir: Option<&Path>,
) -> anyhow::Result<Option<AgentRollout>> {
    let Some(spec) = recipe.agent.spec() else {
        return Ok(None);
    };
    let l = spec.limits();
    let limits = AgentLimits {
        max_tokens_per_turn: l.max_tokens_per_turn,
        max_response_tokens: l.max_response_tokens,
        max_context,
        deadline: Duration::from_secs_f64(l.deadline_secs),
    };
    let agent = spec.build(&AgentBuildContext {
        helpers: &recipe.helpers,
        run_dir,
    })?;
    Ok(Some(AgentRollout {
        agent,
        limits,
        grace: Duration::from_secs(10),
        helpers: Helpers::default(),
        activity: Default::default(),
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
        PagedKv::bytes_per_token(&self.decoder.config, kind) * slot_len * self.slots
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

/// The recipe's helpers with no models behind them, for demonstrations: an oracle answers each
/// ([`HelperBackend::Scripted`]); their names, limits, prices and descriptions are the recipe's.
pub fn scripted_helpers(recipe: &Recipe) -> Helpers {
    Helpers::new(recipe.helpers.iter().map(|(name, h)| Helper {
        name: name.clone(),
        backend: HelperBackend::Scripted,
        temperature: h.temperature,
        max_tokens: h.max_tokens,
        timeout: Duration::from_secs_f64(h.timeout_secs),
        price_per_million_tokens: h.price_per_million_tokens,
        description: h.description.clone(),
    }))
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
    let value = JsonClient::new(Duration::from_secs(30)).get(&url, api_key)?;
    value["data"][0]["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("GET {url}: no data[0].id in {value}"))
}
