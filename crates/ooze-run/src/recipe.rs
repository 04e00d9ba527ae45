//! Recipes: the TOML file `ooze train` runs. Sections `model`, `data`, `rollout`, `reward`,
//! `algorithm`, `trainer`, `critic`, `teacher`, `eval`, `logging`, `agent`, `helpers`; every key
//! has a default (documented here and in
//! `docs/recipes/README.md`) except `model.path` and the data source; unknown keys and values are
//! errors that name the key and what is allowed. `--set section.key=value` overrides a key (the
//! value is TOML: `--set rollout.temperature=0.7`, `--set data.task='"countdown"'` or a bare word).
//! The resolved recipe, defaults filled in, is written to the run directory as `recipe.toml`.

use ooze_algo::{AdvantageConfig, Aggregation, LossConfig};
use ooze_rollout::scorer::RewardConfig;
use ooze_rollout::Task;
use ooze_train::{Decay, OptimizerConfig, Sharding};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

mod agent;
mod models;
mod rollout;
pub use agent::{
    AgentLimitsSection, AgentSection, AgentflowSection, CommandSection, FormatRewardSection,
    MemagentSection, MultiAgentSection, RetoolSection, SearchR1Section, TauRetailSection,
    TerminalSection, ToolOrchestraSection,
};
pub use models::{CriticSection, TeacherSection};
pub use rollout::{AsyncBounds, EngineApi, RolloutMode, RolloutSection, StalePolicy, WeightSync};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Recipe {
    pub model: ModelSection,
    pub data: DataSection,
    pub rollout: RolloutSection,
    pub reward: RewardConfig,
    pub algorithm: AlgorithmSection,
    pub trainer: TrainerSection,
    pub eval: EvalSection,
    pub logging: LoggingSection,
    #[serde(deserialize_with = "agent::deserialize_section")]
    pub agent: AgentSection,
    /// `[critic]`: the PPO critic (`estimator = "ppo"`; absent: the defaults).
    pub critic: Option<CriticSection>,
    /// `[teacher]`: the on-policy distillation teacher (`algorithm.advantage.opd_coef`).
    pub teacher: Option<TeacherSection>,
    /// `[helpers.NAME]`: fixed models the agent calls by name (judge, executor, experts).
    pub helpers: std::collections::BTreeMap<String, HelperSection>,
}

/// `[helpers.NAME]`: one fixed helper model. Exactly one source: `path` (a Hugging Face model
/// directory, run by its own engine in this process), `url` (an OpenAI-compatible server's base
/// URL, e.g. `http://127.0.0.1:30000/v1`), or `policy = true` (the policy's own engine, used as a
/// fixed model: its calls are never trained).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HelperSection {
    pub path: Option<PathBuf>,
    pub url: Option<String>,
    pub policy: bool,
    /// The `model` field sent to `url` (default: the first model the server lists at `/models`).
    pub model: Option<String>,
    /// An environment variable holding the API key sent to `url` as a bearer token.
    pub api_key_env: Option<String>,
    /// 0 = greedy.
    pub temperature: f64,
    /// New tokens per call at most.
    pub max_tokens: usize,
    /// Per call (the execution's deadline applies too).
    pub timeout_secs: f64,
    /// US dollars per million tokens, for cost-aware rewards (tool_orchestra).
    pub price_per_million_tokens: f64,
    /// What it is good at; shown to the policy where the agent lists models as tools.
    pub description: String,
    /// `path` helpers: sequences its engine runs at once.
    pub slots: i64,
}

impl Default for HelperSection {
    fn default() -> Self {
        HelperSection {
            path: None,
            url: None,
            policy: false,
            model: None,
            api_key_env: None,
            temperature: 0.0,
            max_tokens: 512,
            timeout_secs: 120.0,
            price_per_million_tokens: 0.0,
            description: String::new(),
            slots: 16,
        }
    }
}

/// `[model]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// The policy to train: a Hugging Face model directory (required).
    pub path: PathBuf,
    /// `auto` (the first GPU if there is one), `cpu`, `cuda`, `cuda:N`.
    pub device: String,
    /// `auto` (bf16 on a GPU, fp32 on the CPU), `fp32` or `bf16`.
    pub dtype: String,
    /// The frozen reference for KL terms (default: the policy's starting weights; loaded only when
    /// a KL coefficient is set).
    pub reference: Option<PathBuf>,
}

impl Default for ModelSection {
    fn default() -> Self {
        ModelSection {
            path: PathBuf::new(),
            device: "auto".into(),
            dtype: "auto".into(),
            reference: None,
        }
    }
}

/// `[data]`: the training prompts — a built-in task (`task`) or a JSONL file (`path`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataSection {
    /// A built-in synthetic task: `repeat`, `addition`, `arithmetic`, `countdown`, `string`.
    pub task: Option<Task>,
    /// Items generated for the task.
    pub task_size: usize,
    pub task_seed: u64,
    /// A JSONL prompt file, optionally sliced: `train.jsonl@[0:1000]`.
    pub path: Option<String>,
    pub input_key: String,
    pub label_key: String,
    pub metadata_key: Option<String>,
    pub tools_key: Option<String>,
    /// Skip (and count) rows without the input key instead of stopping.
    pub skip_bad_rows: bool,
    /// Render prompts with the model's chat template (with the generation prompt).
    pub apply_chat_template: bool,
    pub system_prompt: Option<String>,
    /// Longer prompts are left out (and counted).
    pub max_prompt_tokens: usize,
    pub shuffle: bool,
    /// Seed of the per-epoch shuffle.
    pub seed: u64,
}

impl Default for DataSection {
    fn default() -> Self {
        DataSection {
            task: None,
            task_size: 10_000,
            task_seed: 0,
            path: None,
            input_key: "prompt".into(),
            label_key: "label".into(),
            metadata_key: None,
            tools_key: None,
            skip_bad_rows: false,
            apply_chat_template: true,
            system_prompt: None,
            max_prompt_tokens: 1024,
            shuffle: true,
            seed: 42,
        }
    }
}

/// `[algorithm]`: `[algorithm.advantage]` (estimator, normalisation, KL in the reward),
/// `[algorithm.loss]` (policy loss, clipping, importance sampling, KL/entropy terms) and
/// `aggregation`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct AlgorithmSection {
    pub advantage: AdvantageConfig,
    pub loss: LossConfig,
    pub aggregation: Aggregation,
}

/// What a run does each rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Generate, score, train.
    #[default]
    Train,
    /// Generate and score only (saved rollouts, rewards, eval).
    RolloutOnly,
    /// Train on the rollouts another run saved (`trainer.replay_from`), generating nothing.
    Replay,
}

/// `[trainer]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainerSection {
    pub mode: Mode,
    /// The run directory whose `rollouts/` a replay trains on.
    pub replay_from: Option<PathBuf>,
    /// Samples per optimizer step (default: the whole rollout, one step); a multiple of
    /// `n_samples_per_prompt` dividing the rollout, so a prompt's samples share a step.
    pub global_batch_size: Option<usize>,
    pub lr: f64,
    pub warmup_steps: u64,
    pub decay: Decay,
    pub min_lr_ratio: f64,
    pub optimizer: OptimizerConfig,
    /// Token budget of one micro-batch.
    pub max_tokens_per_micro_batch: usize,
    pub recompute_activations: bool,
    /// How the ranks of a multi-GPU run hold the policy: `auto` (sharded when a whole copy per
    /// GPU does not fit the memory plan), `replicated` or `sharded` (ZeRO-3).
    pub sharding: Sharding,
    /// GPUs (ranks) the trainer runs on, one rank each, this machine's first ones: `ooze train`
    /// starts that many ranks itself. 0 = as launched (`--nproc-per-node`, torchrun; one process
    /// otherwise).
    pub gpus: usize,
    /// Checkpoint every N rollouts, and after the last (0: after the last only).
    pub save_interval: u64,
}

impl Default for TrainerSection {
    fn default() -> Self {
        TrainerSection {
            mode: Mode::Train,
            replay_from: None,
            global_batch_size: None,
            lr: 1e-6,
            warmup_steps: 0,
            decay: Decay::Constant,
            min_lr_ratio: 0.0,
            optimizer: OptimizerConfig::default(),
            max_tokens_per_micro_batch: 16_384,
            recompute_activations: false,
            sharding: Sharding::Auto,
            gpus: 0,
            save_interval: 10,
        }
    }
}

/// `[eval]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalSection {
    /// Evaluate every N rollouts (0 = only at the start and the end).
    pub interval: u64,
    pub at_start: bool,
    pub datasets: Vec<EvalDataset>,
}

impl Default for EvalSection {
    fn default() -> Self {
        EvalSection {
            interval: 10,
            at_start: true,
            datasets: Vec::new(),
        }
    }
}

/// `[[eval.datasets]]`: a held-out set with its own sampling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalDataset {
    pub name: String,
    /// A built-in task (items generated with `task_seed`; items also in the training set are left
    /// out) or a JSONL `path` read with the data section's keys.
    pub task: Option<Task>,
    pub task_size: usize,
    pub task_seed: u64,
    pub path: Option<String>,
    pub n_samples: usize,
    pub temperature: f64,
    pub top_p: f64,
    /// Default: the rollout's.
    pub max_new_tokens: Option<usize>,
    /// The k of pass@k reported (each at most `n_samples`).
    pub pass_k: Vec<usize>,
}

impl Default for EvalDataset {
    fn default() -> Self {
        EvalDataset {
            name: "eval".into(),
            task: None,
            task_size: 256,
            task_seed: 1_000_003,
            path: None,
            n_samples: 1,
            temperature: 1.0,
            top_p: 1.0,
            max_new_tokens: None,
            pass_k: vec![1],
        }
    }
}

/// `[logging]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoggingSection {
    /// The run directory (default: `runs/<recipe file name>`).
    pub run_dir: Option<PathBuf>,
    /// TensorBoard event files in `RUN/tensorboard/`.
    pub tensorboard: bool,
    /// Every rollout's groups in `RUN/rollouts/rollout-NNNNNN.jsonl` (needed for replay).
    pub save_rollouts: bool,
    /// `RUN/report.html` at the end.
    pub report: bool,
    /// Progress bars (on a terminal) or a line per rollout.
    pub progress: bool,
}

impl Default for LoggingSection {
    fn default() -> Self {
        LoggingSection {
            run_dir: None,
            tensorboard: true,
            save_rollouts: true,
            report: true,
            progress: true,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RecipeError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("--set {0}: {1}")]
    Set(String, String),
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// Sets `dotted = value` in `table` (the value parsed as TOML, or taken as a string when it is a
/// bare word; a table, array or quoted string must parse).
fn set_key(table: &mut toml::Table, assignment: &str) -> Result<(), RecipeError> {
    let bad = |m: &str| RecipeError::Set(assignment.to_owned(), m.to_owned());
    let (key, raw) = assignment
        .split_once('=')
        .ok_or_else(|| bad("expected section.key=value"))?;
    let key = key.trim();
    let value: toml::Value = match format!("v = {raw}").parse::<toml::Table>() {
        Ok(mut t) => t.remove("v").expect("invariant: parsed `v = …`"),
        // A table, array or quoted string that does not parse is a mistake, not a bare word.
        Err(e) if raw.trim_start().starts_with(['{', '[', '"', '\'']) => {
            return Err(bad(&format!(
                "the value is not valid TOML: {}",
                e.message().trim_end()
            )))
        }
        Err(_) => toml::Value::String(raw.to_owned()),
    };
    let parts: Vec<&str> = key.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(bad("expected section.key=value"));
    }
    let mut node = table;
    for part in &parts[..parts.len() - 1] {
        let entry = node
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        node = entry
            .as_table_mut()
            .ok_or_else(|| bad(&format!("`{part}` is not a section")))?;
    }
    node.insert(parts[parts.len() - 1].to_owned(), value);
    Ok(())
}

impl Recipe {
    /// Compiles the reward's patterns, so a bad one is refused naming its key.
    fn check_reward(&self) -> Result<(), String> {
        use ooze_rollout::reward::Reward;
        match &self.reward {
            RewardConfig::Math { answer_pattern } => Reward::math(answer_pattern.as_deref())
                .map(drop)
                .map_err(|e| format!("reward.answer_pattern: {e}")),
            RewardConfig::Regex { pattern } => Reward::regex(pattern)
                .map(drop)
                .map_err(|e| format!("reward.pattern: {e}")),
            _ => Ok(()),
        }
    }

    /// Reads `path`, applies `sets` (`section.key=value`) and checks the result.
    pub fn load(path: &Path, sets: &[String]) -> Result<Recipe, RecipeError> {
        let text = std::fs::read_to_string(path).map_err(|source| RecipeError::Read {
            path: path.to_owned(),
            source,
        })?;
        Recipe::parse(&text, path, sets)
    }

    /// Parses recipe text (`origin` names it in errors).
    pub fn parse(text: &str, origin: &Path, sets: &[String]) -> Result<Recipe, RecipeError> {
        let parse_err = |message: String| RecipeError::Parse {
            path: origin.to_owned(),
            message,
        };
        let recipe: Recipe = if sets.is_empty() {
            // Straight from the text, so errors point at its lines.
            toml::from_str(text).map_err(|e| parse_err(e.to_string()))?
        } else {
            let mut table: toml::Table = text
                .parse()
                .map_err(|e: toml::de::Error| parse_err(e.to_string()))?;
            for s in sets {
                set_key(&mut table, s)?;
            }
            let edited = toml::to_string(&table).expect("invariant: a table serialises");
            toml::from_str(&edited).map_err(|e| parse_err(format!("after --set: {e}")))?
        };
        recipe.check().map_err(|message| RecipeError::Invalid {
            path: origin.to_owned(),
            message,
        })?;
        Ok(recipe)
    }

    /// The whole recipe with defaults, as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("invariant: a recipe serialises")
    }

    /// The critic's settings (the defaults without a `[critic]` section).
    pub fn critic_settings(&self) -> CriticSection {
        self.critic.clone().unwrap_or_default()
    }

    /// Samples per optimizer step.
    pub fn global_batch_size(&self) -> usize {
        self.trainer
            .global_batch_size
            .unwrap_or(self.rollout.batch_size * self.rollout.n_samples_per_prompt)
    }

    /// Checks what the types cannot.
    fn check(&self) -> Result<(), String> {
        if self.model.path.as_os_str().is_empty() {
            return Err("model.path is required (a Hugging Face model directory)".into());
        }
        self.check_algorithm()?;
        self.check_reward()?;
        for (name, h) in &self.helpers {
            let sources = h.path.is_some() as u8 + h.url.is_some() as u8 + h.policy as u8;
            if sources != 1 {
                return Err(format!("helpers.{name} needs exactly one source: path (a model directory), url (an OpenAI-compatible base URL) or policy = true"));
            }
            if h.max_tokens == 0 || h.timeout_secs <= 0.0 || h.slots < 1 {
                return Err(format!(
                    "helpers.{name}: max_tokens, timeout_secs and slots must be positive"
                ));
            }
            if !(h.temperature >= 0.0 && h.temperature.is_finite()) {
                return Err(format!(
                    "helpers.{name}.temperature must be ≥ 0 (0 = greedy), got {}",
                    h.temperature
                ));
            }
        }
        if let Some(spec) = self.agent.spec() {
            let limits = spec.limits();
            if limits.max_turns == Some(0)
                || limits.max_tokens_per_turn == 0
                || limits.deadline_secs <= 0.0
            {
                return Err("agent.max_turns, agent.max_tokens_per_turn and agent.deadline_secs must be positive".into());
            }
            for name in spec.required_helpers() {
                if !self.helpers.contains_key(*name) {
                    return Err(format!(
                        "agent.type = \"{}\" needs a [helpers.{name}] section (path, url or policy = true)",
                        spec.type_name()
                    ));
                }
            }
            spec.check(&self.helpers)?;
        }
        let d = &self.data;
        match (&d.task, &d.path) {
            (None, None) if self.trainer.mode != Mode::Replay => {
                return Err("the data section needs a source: data.task (repeat, addition, arithmetic, countdown, string) or data.path (a JSONL file)".into())
            }
            (Some(_), Some(_)) => {
                return Err("data.task and data.path are exclusive: choose one source".into())
            }
            _ => {}
        }
        let r = &self.rollout;
        for (key, v) in [
            ("rollout.batch_size", r.batch_size),
            ("rollout.n_samples_per_prompt", r.n_samples_per_prompt),
            ("rollout.max_new_tokens", r.max_new_tokens),
            ("rollout.concurrency", r.concurrency),
            ("data.max_prompt_tokens", d.max_prompt_tokens),
            (
                "trainer.max_tokens_per_micro_batch",
                self.trainer.max_tokens_per_micro_batch,
            ),
        ] {
            if v == 0 {
                return Err(format!("{key} must be at least 1"));
            }
        }
        if !(r.temperature >= 1e-5 && r.temperature.is_finite()) {
            return Err(format!(
                "rollout.temperature must be at least 1e-5 for RL (log-probs are of the sampling distribution, and the engine samples no colder), got {}",
                r.temperature
            ));
        }
        if r.deterministic && (self.model.device == "cpu" || self.model.dtype == "fp32") {
            return Err(format!(
                "rollout.deterministic needs a GPU in bf16 (ooze's kernels), but model.device = \"{}\" and model.dtype = \"{}\"",
                self.model.device, self.model.dtype
            ));
        }
        if !(r.mem_fraction > 0.0 && r.mem_fraction <= 1.0) {
            return Err(format!(
                "rollout.mem_fraction must be in (0, 1], got {}",
                r.mem_fraction
            ));
        }
        let rollout_samples = r.batch_size * r.n_samples_per_prompt;
        let g = self.global_batch_size();
        if g == 0 || !g.is_multiple_of(r.n_samples_per_prompt) || !rollout_samples.is_multiple_of(g)
        {
            return Err(format!(
                "trainer.global_batch_size must be a multiple of rollout.n_samples_per_prompt ({}) that divides the rollout's {rollout_samples} samples, got {g}",
                r.n_samples_per_prompt
            ));
        }
        r.check_engines()?;
        r.check_mode()?;
        if r.mode != RolloutMode::Sync && self.trainer.mode != Mode::Train {
            return Err(format!("rollout.mode = {} overlaps generation with training; trainer.mode = {} does not train on fresh rollouts (use rollout.mode = \"sync\")", quoted(&r.mode), quoted(&self.trainer.mode)));
        }
        if self.trainer.mode == Mode::Replay && r.gpus > 0 {
            return Err("rollout.gpus: a replay generates nothing (trainer.mode = \"replay\"); leave it at 0".into());
        }
        if self.trainer.mode == Mode::Replay && self.trainer.replay_from.is_none() {
            return Err("trainer.mode = \"replay\" needs trainer.replay_from (a run directory with rollouts/)".into());
        }
        self.check_inert_keys()?;
        let mut names = std::collections::HashSet::new();
        for (i, e) in self.eval.datasets.iter().enumerate() {
            let at = format!("eval.datasets[{i}] ({})", e.name);
            if !names.insert(e.name.clone()) {
                return Err(format!("{at}: the name is used twice"));
            }
            if e.task.is_some() == e.path.is_some() {
                return Err(format!("{at}: set exactly one of task and path"));
            }
            if e.n_samples == 0 {
                return Err(format!("{at}: n_samples must be at least 1"));
            }
            if let Some(&k) = e.pass_k.iter().find(|&&k| k == 0 || k > e.n_samples) {
                return Err(format!(
                    "{at}: pass_k {k} must be between 1 and n_samples ({})",
                    e.n_samples
                ));
            }
        }
        Ok(())
    }
}

/// A key's value as TOML writes it (`"async"`), for messages.
pub(crate) fn quoted<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `text` with `--set`s, the error as text (also for `recipe::agent`'s tests).
    pub(super) fn parse(text: &str, sets: &[&str]) -> Result<Recipe, String> {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        Recipe::parse(text, Path::new("r.toml"), &sets).map_err(|e| e.to_string())
    }

    pub(super) const MIN: &str = "[model]\npath = \"m\"\n[data]\ntask = \"arithmetic\"\n";

    #[test]
    fn defaults_fill_and_round_trip() {
        let r = parse(MIN, &[]).unwrap();
        assert_eq!(r.rollout.n_samples_per_prompt, 8);
        assert_eq!(r.global_batch_size(), 256);
        let again = parse(&r.to_toml(), &[]).unwrap();
        assert_eq!(r, again);
    }

    #[test]
    fn unknown_keys_and_values_name_what_is_allowed() {
        let e = parse(&format!("{MIN}[rollout]\ntemprature = 0.5\n"), &[]).unwrap_err();
        assert!(e.contains("unknown field `temprature`"), "{e}");
        assert!(e.contains("`temperature`"), "{e}");
        let e = parse(
            &format!("{MIN}[algorithm.advantage]\nestimator = \"grpp\"\n"),
            &[],
        )
        .unwrap_err();
        assert!(e.contains("unknown variant `grpp`"), "{e}");
        assert!(e.contains("`grpo`") && e.contains("`ppo`"), "{e}");
        let e = parse("[model]\npath = \"m\"\n[data]\ntask = \"sudoku\"\n", &[]).unwrap_err();
        assert!(
            e.contains("`repeat`, `addition`, `arithmetic`, `countdown`, `string`"),
            "{e}"
        );
        let e = parse(&format!("{MIN}[reward]\ntype = \"vibes\"\n"), &[]).unwrap_err();
        assert!(
            e.contains("unknown variant `vibes`") && e.contains("`remote`"),
            "{e}"
        );
        let e = parse(&format!("{MIN}[surprise]\nx = 1\n"), &[]).unwrap_err();
        assert!(e.contains("unknown field `surprise`"), "{e}");
    }

    #[test]
    fn set_overrides_and_checks() {
        let r = parse(
            MIN,
            &[
                "rollout.temperature=0.7",
                "trainer.lr=2e-5",
                "logging.run_dir=out/x",
                "data.system_prompt=Be brief.",
            ],
        )
        .unwrap();
        assert_eq!(r.rollout.temperature, 0.7);
        assert_eq!(r.trainer.lr, 2e-5);
        assert_eq!(r.logging.run_dir, Some(PathBuf::from("out/x")));
        assert_eq!(r.data.system_prompt.as_deref(), Some("Be brief."));
        let e = parse(MIN, &["rollout.tempreature=0.7"]).unwrap_err();
        assert!(e.contains("unknown field `tempreature`"), "{e}");
        let e = parse(MIN, &["trainer.global_batch_size=12"]).unwrap_err();
        assert!(
            e.contains("multiple of rollout.n_samples_per_prompt (8)"),
            "{e}"
        );
        let e = parse("[data]\ntask = \"string\"\n", &[]).unwrap_err();
        assert!(e.contains("model.path is required"), "{e}");
        let e = parse(MIN, &["reward={type = \"math\", answer_pattern = \"(\"}"]).unwrap_err();
        assert!(e.contains("reward.answer_pattern"), "{e}");
        let e = parse(MIN, &["reward={type = \"regex\", pattern = \"[\"}"]).unwrap_err();
        assert!(e.contains("reward.pattern"), "{e}");
        let e = parse(MIN, &["model.path.x=1"]).unwrap_err();
        assert!(e.contains("`path` is not a section"), "{e}");
        // A malformed table is named as such, not read as a string.
        let e = parse(MIN, &["rollout={max_new_tokens = 1, max_new_tokens = 2}"]).unwrap_err();
        assert!(
            e.starts_with("--set rollout=")
                && e.contains("not valid TOML")
                && e.contains("duplicate key"),
            "{e}"
        );
        let e = parse(MIN, &["rollout.stop=[\"a\""]).unwrap_err();
        assert!(e.contains("not valid TOML"), "{e}");
    }

    #[test]
    fn agent_and_helper_checks() {
        let e = parse(
            MIN,
            &["helpers.judge={path = \"m\", url = \"http://x/v1\"}"],
        )
        .unwrap_err();
        assert!(e.contains("helpers.judge needs exactly one source"), "{e}");
        let e = parse(MIN, &["helpers.judge={max_tokens = 4}"]).unwrap_err();
        assert!(e.contains("helpers.judge needs exactly one source"), "{e}");
        let e = parse(MIN, &["helpers.judge={policy = true, temperature = -1}"]).unwrap_err();
        assert!(e.contains("helpers.judge.temperature"), "{e}");
        let e = parse(
            MIN,
            &["agent.type=\"agentflow\"", "helpers.judge={policy = true}"],
        )
        .unwrap_err();
        assert!(e.contains("[helpers.executor]"), "{e}");
        let e = parse(
            MIN,
            &[
                "agent.type=\"retool\"",
                "agent.format_reward={structure = 0.2}",
            ],
        )
        .unwrap_err();
        assert!(e.contains("agent.format_reward"), "{e}");
        let e = parse(
            MIN,
            &["agent.type=\"tool_orchestra\"", "agent.experts=[\"big\"]"],
        )
        .unwrap_err();
        assert!(e.contains("[helpers.big]"), "{e}");
        let r = parse(
            MIN,
            &[
                "agent.type=\"search_r1\"",
                "agent.corpus=\"c.jsonl\"",
                "agent.format_reward={structure = 0.2}",
                "helpers.judge={url = \"http://127.0.0.1:1/v1\", model = \"m\"}",
            ],
        )
        .unwrap();
        let AgentSection::SearchR1(search) = &r.agent else {
            panic!("{:?}", r.agent)
        };
        let f = search.format_reward.clone().unwrap();
        assert_eq!((f.structure, f.final_format, f.retrieval), (0.2, 0.1, 0.0));
        assert_eq!(r.helpers["judge"].max_tokens, 512);
        // Every recipe shipped in recipes/ parses and passes the checks.
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../recipes");
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&root).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files.push(path.join("recipe.toml"));
            } else if path.extension().is_some_and(|e| e == "toml") {
                files.push(path);
            }
        }
        assert!(files.len() >= 8, "{files:?}");
        for file in files {
            Recipe::load(&file, &[]).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        }
    }
}
