//! Stage *prepare*: everything a run needs before its first rollout — the device, the tokenizer,
//! the training prompts and held-out eval sets, the policy, the trainer (with the frozen reference
//! when a KL coefficient is set, the critic of `estimator = "ppo"` — `[critic]`, or the policy's
//! weights with a fresh value head — and the distillation teacher of `advantage.opd_coef`, a model
//! in process or a `/generate` endpoint), the restored state of a resumed run, and the engine,
//! sized from the free memory once helper models are loaded.

use crate::agents::{
    agent_context_len, agent_rollout, build_helpers, load_helper_models, LoadedHelper,
};
use crate::engine_processes::{EngineLaunch, EngineProcesses};
use crate::eval::EvalSet;
use crate::metrics_log::MetricsLog;
use crate::ranks::RunRanks;
use crate::recipe::{Mode, Recipe};
use crate::run::Run;
use anyhow::{bail, Context};
use ooze_algo::Estimator;
use ooze_engine::{EngineConfig, Sampling, SamplingParams, StopStrings};
use ooze_model::{Decoder, PagedKv, Tokenizer};
use ooze_rollout::data::{self, DataConfig, PromptOrder};
use ooze_rollout::manager::RolloutSettings;
use ooze_rollout::prompts::{prepare, task_rows, PromptFormat, PromptItem};
use ooze_rollout::scorer::Registry;
use ooze_torch::tch::{Device, Kind};
use ooze_torch::{DeviceSpec, DtypeSpec};
use ooze_train::memory;
use ooze_train::{Critic, CriticConfig, Schedule, Teacher, Trainer, TrainerConfig};
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

impl Run {
    /// Prepares the run in `run_dir` (continuing it with `resume`).
    pub(crate) fn prepare(
        recipe: Recipe,
        run_dir: &Path,
        resume: bool,
        registry: &Registry,
        ranks: Option<RunRanks>,
    ) -> anyhow::Result<Run> {
        let started = Instant::now();
        let first = ranks.as_ref().is_none_or(|r| r.rank() == 0);
        check_rank_shares(&recipe, ranks.as_ref())?;
        crate::checkpoint::refuse_to_overwrite(run_dir, resume)?;
        if first {
            write_run_dir(&recipe, run_dir)?;
        }

        let (device, kind) = device_and_kind(&recipe)?;
        // A rank computes on its own device (its GPU under NCCL, the CPU under Gloo).
        let device = ranks.as_ref().map_or(device, |r| r.device);
        let model_path = &recipe.model.path;
        if recipe.rollout.deterministic {
            deterministic_numerics(model_path, device, kind)?;
        }
        let tokenizer = Arc::new(Tokenizer::load(model_path).with_context(|| {
            format!(
                "model.path: loading the tokenizer in {}",
                model_path.display()
            )
        })?);
        let prompts = training_prompts(&recipe, &tokenizer)?;
        let scorer = crate::reward::train_scorer(&recipe, registry)?;
        let evals = eval_sets(&recipe, &tokenizer, &prompts, registry)?;
        let mut settings = rollout_settings(&recipe)?;

        // The engine: slots long enough for the longest prompt and response (an agent's
        // conversations included), as many as fit.
        let slot_len = slot_len(&recipe, &prompts, &evals);
        // Engines outside the trainer (rollout.gpus, rollout.engines): rank 0 drives them alone.
        let external = recipe.rollout.outside_engines();
        let engine_processes =
            start_engine_processes(&recipe, ranks.as_ref(), (device, kind), slot_len, run_dir)?;
        let shard_over = sharding(&recipe, ranks.as_ref(), device, kind, slot_len, external)?;
        let policy = load_model(model_path, "model.path", device, kind)?;
        let (vocab, model_eos) = (
            policy.config.vocab_size,
            policy.config.eos_token_ids.clone(),
        );
        // The embedded engine: beside a sharded trainer it needs its own whole copy; otherwise it
        // shares the trainer's tensors (an optimizer step is its weight update). None with
        // external engines.
        let engine_decoder = match (external, &shard_over) {
            (true, _) => None,
            (false, Some(_)) => Some(load_model(model_path, "model.path", device, kind)?),
            (false, None) => Some(policy.share()),
        };
        let engine_weights = engine_decoder
            .as_ref()
            .filter(|_| shard_over.is_some())
            .map(Decoder::share);
        let mut trainer = build_trainer(&recipe, policy, device, kind, shard_over)?;
        let state = crate::checkpoint::restore(&recipe, run_dir, resume, trainer.as_mut())?;
        if let (Some(r), Some(t)) = (&ranks, trainer.as_mut()) {
            if !t.is_sharded() {
                t.set_process_group(r.group.clone())?;
            }
        }
        let order = PromptOrder::new(
            prompts.len(),
            recipe.data.seed,
            recipe.data.shuffle,
            state.position,
        );

        // Helpers with weights of their own are loaded first: their weights are then out of the
        // free memory measured below, and their caches are taken out of the policy's share.
        let (helper_models, helper_cache) = helper_models_first(&recipe, device, kind, slot_len)?;
        settings.agent = agent_rollout(&recipe, slot_len as usize, Some(run_dir))?;
        // A resumed run's engine continues the weight versions from the trainer's step.
        let version = trainer.as_ref().map_or(0, |t| t.step());
        let engine = match engine_decoder {
            Some(engine_decoder) => Some({
                let slots = engine_slots(
                    &recipe,
                    &settings,
                    &evals,
                    &engine_decoder,
                    (device, kind),
                    slot_len,
                    helper_cache,
                )?;
                let eos = ooze_model::config::load_generation_eos(model_path)?
                    .unwrap_or_else(|| model_eos.clone());
                eprintln!("engine: {slots} sequences × {slot_len} tokens");
                ooze_engine::start(
                    engine_decoder,
                    Some(tokenizer.clone()),
                    EngineConfig::new(slots, slot_len, eos).with_initial_weight_version(version),
                )
            }),
            None if first => Some(external_engines(
                &recipe,
                engine_processes.as_ref(),
                slot_len,
                vocab,
                version,
                device,
            )?),
            None => None,
        };
        if let (Some(agent), Some(engine)) = (settings.agent.as_mut(), &engine) {
            agent.helpers = build_helpers(&recipe, helper_models, engine, &tokenizer, slot_len)?;
        }
        // Rollouts, agents, the agent gateway and helper calls run here: half the CPUs (2 to
        // 8), the rest left to the trainer and the agents' own processes.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(runtime_workers())
            .enable_all()
            .build()?;
        let log = first
            .then(|| open_metrics(&recipe, run_dir, &state))
            .transpose()?;
        Ok(Run {
            recipe,
            run_dir: run_dir.to_owned(),
            started,
            tokenizer,
            prompts: Arc::new(prompts),
            order,
            evals,
            scorer,
            settings,
            trainer,
            engine,
            engine_weights,
            external_engines: external,
            engine_processes,
            runtime,
            log,
            ranks,
            state,
            first_eval: Vec::new(),
            last_eval: Vec::new(),
        })
    }
}

/// Worker threads of a run's async runtime: half the CPUs this process may use, 2 to 8.
fn runtime_workers() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get() / 2)
        .clamp(2, 8)
}

/// Creates the run directory and saves the resolved recipe in it (rank 0).
fn write_run_dir(recipe: &Recipe, run_dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    ooze_train::checkpoint::write_atomic(
        &run_dir.join("recipe.toml"),
        recipe.to_toml().as_bytes(),
    )?;
    Ok(())
}

/// An agent recipe's helper models with weights of their own, and the KV memory their caches
/// take for `slot_len`-token sequences.
fn helper_models_first(
    recipe: &Recipe,
    device: Device,
    kind: Kind,
    slot_len: i64,
) -> anyhow::Result<(Vec<LoadedHelper>, i64)> {
    if recipe.agent.spec().is_none() {
        return Ok((Vec::new(), 0));
    }
    let models = load_helper_models(recipe, device, kind)?;
    let cache = models.iter().map(|m| m.cache_bytes(slot_len, kind)).sum();
    Ok((models, cache))
}

/// The run's metrics log, keeping the lines of the rollouts a resumed run restored.
fn open_metrics(
    recipe: &Recipe,
    run_dir: &Path,
    state: &crate::run::RunState,
) -> anyhow::Result<MetricsLog> {
    MetricsLog::open(
        run_dir,
        crate::checkpoint::metrics_kept_through(state),
        recipe.logging.tensorboard,
    )
}

/// Turns on `rollout.deterministic` for this process (the trainer and an embedded engine).
fn deterministic_numerics(model: &Path, device: Device, kind: Kind) -> anyhow::Result<()> {
    let config = ooze_model::ModelConfig::load(model)
        .with_context(|| format!("model.path: reading {}", model.display()))?;
    ooze_model::enable_deterministic(&config, kind, device)
        .map_err(|e| anyhow::anyhow!("rollout.deterministic {e}"))
}

/// `model.device` and `model.dtype` resolved (`auto`: bf16 on a GPU, fp32 on the CPU).
fn device_and_kind(recipe: &Recipe) -> anyhow::Result<(Device, Kind)> {
    let device = recipe
        .model
        .device
        .parse::<DeviceSpec>()
        .and_then(DeviceSpec::resolve)
        .map_err(|e| anyhow::anyhow!("model.device: {e}"))?;
    let kind = match recipe.model.dtype.as_str() {
        "auto" if device.is_cuda() => Kind::BFloat16,
        "auto" => Kind::Float,
        other => other
            .parse::<DtypeSpec>()
            .map_err(|e| anyhow::anyhow!("model.dtype: {e} (or auto)"))?
            .kind(),
    };
    Ok((device, kind))
}

/// Loads a model directory named by recipe key `what`.
pub(crate) fn load_model(
    path: &Path,
    what: &str,
    device: Device,
    kind: Kind,
) -> anyhow::Result<Decoder> {
    let t = Instant::now();
    let decoder = Decoder::load(path, device, kind)
        .with_context(|| format!("{what}: loading {}", path.display()))?;
    eprintln!(
        "model: {} ({:.1}M parameters, {kind:?}) on {device:?} in {:.1}s",
        path.display(),
        decoder.config.num_parameters() as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );
    Ok(decoder)
}

/// The sampling of a recipe section, checked once.
pub(crate) fn sampling(params: SamplingParams, section: &str) -> anyhow::Result<Sampling> {
    params.validate().map_err(|e| {
        anyhow::anyhow!(
            "{section}: {}",
            e.to_string().trim_start_matches("sampling_params.")
        )
    })
}

pub(crate) fn data_config(recipe: &Recipe, path: &str) -> DataConfig {
    let d = &recipe.data;
    DataConfig {
        path: path.to_owned(),
        input_key: d.input_key.clone(),
        label_key: d.label_key.clone(),
        metadata_key: d.metadata_key.clone(),
        tools_key: d.tools_key.clone(),
        skip_bad_rows: d.skip_bad_rows,
        require_label: recipe.reward.needs_label(),
    }
}

pub(crate) fn prompt_format(recipe: &Recipe) -> PromptFormat {
    PromptFormat {
        apply_chat_template: recipe.data.apply_chat_template,
        system_prompt: recipe.data.system_prompt.clone(),
    }
}

fn task_items(task: ooze_rollout::Task, n: usize, seed: u64) -> Vec<data::PromptRow> {
    task_rows(task.generate(n, seed))
}

/// The training prompts of `data.task` or `data.path` (none for a replay).
fn training_prompts(recipe: &Recipe, tokenizer: &Tokenizer) -> anyhow::Result<Vec<PromptItem>> {
    let d = &recipe.data;
    let format = prompt_format(recipe);
    let (prompts, origin) = match (&d.task, &d.path) {
        (Some(task), _) => {
            let origin = format!("data.task {}", serde_json::to_string(task)?);
            let (items, too_long) = prepare(
                task_items(*task, d.task_size, d.task_seed),
                tokenizer,
                &format,
                d.max_prompt_tokens,
                &origin,
            )
            .map_err(anyhow::Error::msg)?;
            eprintln!(
                "data: {} {origin} prompts ({too_long} over data.max_prompt_tokens left out)",
                items.len()
            );
            (items, origin)
        }
        (None, Some(path)) => {
            let loaded = data::load(&data_config(recipe, path))?;
            let (items, too_long) =
                prepare(loaded.rows, tokenizer, &format, d.max_prompt_tokens, path)
                    .map_err(anyhow::Error::msg)?;
            let label = if recipe.reward.needs_label() {
                format!(" or `{}`", d.label_key)
            } else {
                String::new()
            };
            eprintln!(
                "data: {} prompts from {path} ({} rows without `{}`{label} skipped, {too_long} over data.max_prompt_tokens left out)",
                items.len(),
                loaded.skipped,
                d.input_key,
            );
            (items, path.clone())
        }
        (None, None) => (Vec::new(), String::new()),
    };
    if prompts.is_empty() && recipe.trainer.mode != Mode::Replay {
        bail!("{origin}: no prompts left to train on");
    }
    Ok(prompts)
}

/// What makes a row the same task as another: its prompt, its label and its metadata less the
/// rows' bookkeeping (`index`, `split`). Agents whose prompt is the same for every task (a
/// simulated customer's hidden goal, in `tau_retail`) differ by their metadata.
fn task_key(p: &PromptItem) -> String {
    let mut metadata = p.metadata.clone();
    if let Some(m) = metadata.as_object_mut() {
        m.remove("index");
        m.remove("split");
    }
    format!("{}\u{0}{}\u{0}{metadata}", p.text, p.label)
}

/// The held-out eval sets: their prompts less those in the training set (the same task:
/// [`task_key`]), each with its scorer and sampling.
fn eval_sets(
    recipe: &Recipe,
    tokenizer: &Tokenizer,
    train: &[PromptItem],
    registry: &Registry,
) -> anyhow::Result<Vec<EvalSet>> {
    let d = &recipe.data;
    let format = prompt_format(recipe);
    let train_tasks: HashSet<String> = train.iter().map(task_key).collect();
    let mut evals = Vec::new();
    for (i, e) in recipe.eval.datasets.iter().enumerate() {
        let at = format!("eval.datasets[{i}] ({})", e.name);
        let (rows, task) = match (&e.task, &e.path) {
            (Some(task), _) => (task_items(*task, e.task_size, e.task_seed), Some(*task)),
            (None, Some(path)) => (data::load(&data_config(recipe, path))?.rows, d.task),
            _ => unreachable!("the recipe check requires one source"),
        };
        let (items, too_long) = prepare(rows, tokenizer, &format, d.max_prompt_tokens, &at)
            .map_err(anyhow::Error::msg)?;
        let before = items.len();
        let prompts: Vec<PromptItem> = items
            .into_iter()
            .filter(|p| !train_tasks.contains(&task_key(p)))
            .collect();
        eprintln!(
            "eval {}: {} held-out prompts ({} also in the training set and {too_long} too long left out)",
            e.name,
            prompts.len(),
            before - prompts.len()
        );
        if prompts.is_empty() {
            bail!("{at}: no held-out prompts left");
        }
        let r = &recipe.rollout;
        evals.push(EvalSet {
            name: e.name.clone(),
            prompts,
            scorer: crate::reward::eval_scorer(recipe, task, registry, &at)?,
            n_samples: e.n_samples,
            sampling: sampling(
                SamplingParams {
                    temperature: Some(e.temperature),
                    top_p: Some(e.top_p),
                    max_new_tokens: Some(e.max_new_tokens.unwrap_or(r.max_new_tokens)),
                    stop: (!r.stop.is_empty()).then(|| StopStrings::Many(r.stop.clone())),
                    ..Default::default()
                },
                &at,
            )?,
            pass_k: e.pass_k.clone(),
        });
    }
    Ok(evals)
}

/// The `[rollout]` section as the manager's settings (the agent is added with the engine).
fn rollout_settings(recipe: &Recipe) -> anyhow::Result<RolloutSettings> {
    let r = &recipe.rollout;
    let rollout_sampling = sampling(
        SamplingParams {
            temperature: Some(r.temperature),
            top_p: Some(r.top_p),
            top_k: Some(r.top_k),
            max_new_tokens: Some(r.max_new_tokens),
            stop: (!r.stop.is_empty()).then(|| StopStrings::Many(r.stop.clone())),
            ..Default::default()
        },
        "rollout",
    )?;
    Ok(RolloutSettings {
        n_samples_per_prompt: r.n_samples_per_prompt,
        sampling: rollout_sampling,
        concurrency: r.concurrency,
        seed: r.seed,
        dynamic_sampling: r.dynamic_sampling,
        min_reward_std: r.min_reward_std,
        drop_truncated_groups: r.drop_truncated_groups,
        mask_truncated: r.mask_truncated,
        over_sampling_batch_size: r.over_sampling_batch_size.unwrap_or(r.batch_size),
        max_rounds: r.max_rounds,
        agent: None,
    })
}

/// Tokens per engine slot: the longest prompt plus the longest response (or agent conversation).
fn slot_len(recipe: &Recipe, prompts: &[PromptItem], evals: &[EvalSet]) -> i64 {
    let r = &recipe.rollout;
    let max_new = evals
        .iter()
        .map(|e| e.sampling.max_new_tokens)
        .chain([r.max_new_tokens])
        .max()
        .unwrap_or(r.max_new_tokens);
    let longest_prompt = prompts
        .iter()
        .chain(evals.iter().flat_map(|e| &e.prompts))
        .map(|p| p.input_ids.len())
        .max()
        .unwrap_or(1);
    // An agent's conversations: their own prompts and responses (observations included).
    let agent_context = agent_context_len(&recipe.agent);
    EngineConfig::aligned_context_len((longest_prompt + max_new.max(agent_context)) as i64)
}

/// Sequences the policy's engine runs at once: `rollout.max_running`, or what fits in
/// `rollout.mem_fraction` of the free GPU memory less the helpers' caches (64 on the CPU), never
/// more than the run ever has in flight.
fn engine_slots(
    recipe: &Recipe,
    settings: &RolloutSettings,
    evals: &[EvalSet],
    decoder: &Decoder,
    (device, kind): (Device, Kind),
    slot_len: i64,
    helper_cache: i64,
) -> anyhow::Result<i64> {
    let r = &recipe.rollout;
    let needed = evals
        .iter()
        .map(|e| e.prompts.len() * e.n_samples)
        .chain([r.batch_size.max(settings.over_sampling_batch_size) * r.n_samples_per_prompt])
        .max()
        .unwrap_or(1)
        .min(r.concurrency) as i64;
    Ok(match (r.max_running, device) {
        (Some(n), _) => n,
        (None, Device::Cuda(i)) => {
            let (free, _) =
                ooze_torch::cuda_driver::memory_info(i).context("querying free GPU memory")?;
            let per_slot = PagedKv::bytes_per_token(&decoder.config, kind) * slot_len;
            let share = (free as f64 * r.mem_fraction) as i64 - helper_cache;
            if helper_cache > 0 && share < per_slot {
                bail!(
                    "GPU memory: {:.1} GiB free × rollout.mem_fraction {} leaves no room for one \
                     policy sequence of {slot_len} tokens once the helpers' caches ({:.1} GiB) are \
                     counted; lower helpers.*.slots or raise rollout.mem_fraction",
                    free as f64 / f64::from(1 << 30),
                    r.mem_fraction,
                    helper_cache as f64 / f64::from(1 << 30)
                );
            }
            (share / per_slot).clamp(1, 1024).min(needed)
        }
        (None, _) => 64.min(needed),
    })
}

/// The process group to shard the policy over, when the run trains on ranks and
/// `trainer.sharding` (or, `auto`, the memory plan) says so; the plan is checked against the GPU
/// before anything is loaded, and a run that cannot fit stops here saying what would.
fn sharding(
    recipe: &Recipe,
    ranks: Option<&RunRanks>,
    device: Device,
    kind: Kind,
    slot_len: i64,
    external_engines: bool,
) -> anyhow::Result<Option<Arc<ooze_torch::dist::ProcessGroup>>> {
    if recipe.trainer.mode == Mode::RolloutOnly {
        return Ok(None);
    }
    let config = ooze_model::ModelConfig::load(&recipe.model.path)
        .with_context(|| format!("model.path: {}", recipe.model.path.display()))?;
    let a = &recipe.algorithm;
    let inputs = memory::MemoryInputs {
        config: &config,
        value_bytes: memory::value_bytes(kind),
        ranks: ranks.map_or(1, |r| r.world_size() as u64),
        sharded: false,
        tokens_per_micro_batch: recipe.trainer.max_tokens_per_micro_batch as u64,
        recompute: recipe.trainer.recompute_activations,
        reference: a.advantage.kl_coef != 0.0 || a.loss.kl_loss_coef != 0.0,
        critic: a.advantage.estimator == Estimator::Ppo,
        engine_sequence_bytes: (!external_engines)
            .then(|| (PagedKv::bytes_per_token(&config, kind) * slot_len) as u64),
    };
    let gpu = memory::gpu_of(device);
    let sharded = memory::choose(
        recipe.trainer.sharding,
        &inputs,
        gpu.as_ref().map(|(c, n)| (*c, n.as_str())),
    )
    .map_err(|e| anyhow::anyhow!("trainer: {e}"))?;
    Ok(match ranks {
        Some(r) if sharded => {
            if r.rank() == 0 {
                eprintln!(
                    "trainer: sharded over {} ranks (parameters, gradients, masters and moments split)",
                    r.world_size()
                );
            }
            Some(r.group.clone())
        }
        _ => None,
    })
}

/// Each rank generates an equal share of a rollout's prompts.
fn check_rank_shares(recipe: &Recipe, ranks: Option<&RunRanks>) -> anyhow::Result<()> {
    if let Some(r) = ranks {
        let world = r.world_size();
        if !recipe.rollout.batch_size.is_multiple_of(world) {
            bail!(
                "rollout.batch_size = {} does not divide among {world} ranks: each generates an \
                 equal share of a rollout's prompts",
                recipe.rollout.batch_size
            );
        }
    }
    Ok(())
}

/// On rank 0, the engines of `rollout.gpus`, started on the GPUs after the trainer's.
fn start_engine_processes(
    recipe: &Recipe,
    ranks: Option<&RunRanks>,
    (device, kind): (Device, Kind),
    slot_len: i64,
    run_dir: &Path,
) -> anyhow::Result<Option<EngineProcesses>> {
    let trainer_gpus = trainer_gpus(recipe, ranks)?;
    let first = ranks.is_none_or(|r| r.rank() == 0);
    if recipe.rollout.gpus == 0 || !first {
        return Ok(None);
    }
    let launch = EngineLaunch {
        model: &recipe.model.path,
        device,
        kind,
        trainer_gpus,
        engines: recipe.rollout.gpus,
        slot_len,
        max_running: recipe.rollout.max_running,
        deterministic: recipe.rollout.deterministic,
    };
    Ok(Some(EngineProcesses::start(&launch, run_dir)?))
}

/// The trainer's GPUs (ranks) on this machine, checked against `trainer.gpus`.
fn trainer_gpus(recipe: &Recipe, ranks: Option<&RunRanks>) -> anyhow::Result<usize> {
    let local = match std::env::var("LOCAL_WORLD_SIZE") {
        Ok(v) if ranks.is_some() => v.trim().parse::<usize>().ok(),
        _ => None,
    };
    let here = local.unwrap_or_else(|| ranks.map_or(1, RunRanks::world_size));
    let wanted = recipe.trainer.gpus;
    if wanted > 0 && wanted != here {
        bail!(
            "trainer.gpus = {wanted}, but the run has {here} trainer rank(s) on this machine: start \
             it with `ooze train` alone (it starts trainer.gpus ranks), or launch that many ranks"
        );
    }
    Ok(here)
}

/// The router over the engines outside the trainer: those the run started (`rollout.gpus`) or
/// `rollout.engines` (and `rollout.engines_file`).
fn external_engines(
    recipe: &Recipe,
    launched: Option<&EngineProcesses>,
    slot_len: i64,
    vocab: i64,
    version: u64,
    device: Device,
) -> anyhow::Result<ooze_engine::EngineHandle> {
    let r = &recipe.rollout;
    let mut engines = r.engines.clone();
    engines.extend(launched.map(EngineProcesses::urls).unwrap_or_default());
    let n = engines.len();
    let mut config = ooze_router::RouterConfig::new(engines, slot_len, vocab);
    config.engines_file = r.engines_file.clone();
    config.initial_weight_version = version;
    config.trainer_address = r.trainer_address.clone();
    config.api = r.engine_api;
    config.weight_backend = ooze_torch::dist::Backend::for_device(device);
    let engine = ooze_router::start(config)?;
    eprintln!(
        "engine: external, {n} engine(s){}{}; sequences up to {slot_len} tokens",
        r.engines_file
            .as_ref()
            .map(|f| format!(" and those listed in {}", f.display()))
            .unwrap_or_default(),
        if r.engine_api == crate::recipe::EngineApi::Vllm {
            " (vLLM's API)"
        } else {
            ""
        }
    );
    Ok(engine)
}

/// The recipe's trainer over `policy` (none in rollout-only mode), sharded over `shard_over`.
pub(crate) fn build_trainer(
    recipe: &Recipe,
    policy: ooze_model::Decoder,
    device: Device,
    kind: Kind,
    shard_over: Option<Arc<ooze_torch::dist::ProcessGroup>>,
) -> anyhow::Result<Option<Trainer>> {
    if recipe.trainer.mode == Mode::RolloutOnly {
        return Ok(None);
    }
    let a = &recipe.algorithm;
    let model_path = &recipe.model.path;
    let needs_reference = a.advantage.kl_coef != 0.0 || a.loss.kl_loss_coef != 0.0;
    let reference = if needs_reference {
        let path = recipe.model.reference.as_ref().unwrap_or(model_path);
        Some(load_model(path, "model.reference", device, kind)?)
    } else {
        None
    };
    let t = &recipe.trainer;
    let r = &recipe.rollout;
    let steps_per_rollout =
        (r.batch_size * r.n_samples_per_prompt / recipe.global_batch_size()) as u64;
    let schedule = |lr: f64| Schedule {
        lr,
        warmup_steps: t.warmup_steps,
        decay: t.decay,
        total_steps: (r.num_rollouts * steps_per_rollout).max(t.warmup_steps + 1),
        min_lr_ratio: t.min_lr_ratio,
    };
    let mut loss = a.loss.clone();
    let critic_settings = recipe.critic_settings();
    loss.value_clip = critic_settings.value_clip;
    let config = TrainerConfig {
        optimizer: t.optimizer.clone(),
        schedule: schedule(t.lr),
        max_tokens_per_micro_batch: t.max_tokens_per_micro_batch,
        temperature: r.temperature,
        advantage: a.advantage.clone(),
        loss,
        aggregation: a.aggregation,
        recompute_activations: t.recompute_activations,
        // Not a recipe key: supervised steps (warm starts, `ooze sft`) take the fastest
        // arithmetic, RL steps the engine's.
        sft_arithmetic: ooze_model::Arithmetic::Fastest,
    };
    let mut trainer = match shard_over {
        Some(group) => Trainer::sharded(policy, reference, config, group),
        None => Trainer::new(policy, reference, config),
    }
    .map_err(|e| anyhow::anyhow!("trainer: {e}"))?;
    if a.advantage.estimator == Estimator::Ppo {
        let c = &critic_settings;
        let path = c.path.as_ref().unwrap_or(model_path);
        let started = Instant::now();
        let critic = Critic::load(path, device, kind)
            .map_err(|e| anyhow::anyhow!("critic.path: loading {}: {e}", path.display()))?;
        eprintln!(
            "critic: {} ({}), lr {}, value clip {}, {} critic-only steps, in {:.1}s",
            path.display(),
            if c.path.is_some() {
                "its own weights"
            } else {
                "the policy's weights, fresh value head"
            },
            c.lr.unwrap_or(t.lr),
            c.value_clip,
            c.warmup_steps,
            started.elapsed().as_secs_f64()
        );
        trainer
            .set_critic(
                critic,
                CriticConfig {
                    schedule: schedule(c.lr.unwrap_or(t.lr)),
                    warmup_steps: c.warmup_steps,
                },
            )
            .map_err(|e| anyhow::anyhow!("critic: {e}"))?;
    }
    if a.advantage.opd_coef != 0.0 {
        let teacher = recipe
            .teacher
            .as_ref()
            .expect("invariant: the recipe check requires [teacher] with opd_coef");
        trainer.set_teacher(match (&teacher.path, &teacher.url) {
            (Some(path), _) => {
                Teacher::Model(Box::new(load_model(path, "teacher.path", device, kind)?))
            }
            (None, Some(url)) => {
                eprintln!("teacher: {url}/generate (prompt log-probs)");
                Teacher::Remote(Box::new(crate::teacher::GenerateEndpoint::new(
                    url,
                    teacher.timeout_secs,
                    teacher.concurrency,
                )))
            }
            (None, None) => unreachable!("the recipe check requires a [teacher] source"),
        });
    }
    Ok(Some(trainer))
}

#[cfg(test)]
mod tests {
    use super::task_key;
    use ooze_rollout::prompts::PromptItem;
    use serde_json::json;

    fn item(text: &str, metadata: serde_json::Value) -> PromptItem {
        PromptItem {
            source_line: 1,
            text: text.into(),
            input_ids: vec![1],
            label: "7".into(),
            metadata,
            messages: Vec::new(),
            tools: None,
        }
    }

    #[test]
    fn a_task_is_its_prompt_label_and_metadata_less_bookkeeping() {
        let a = item(
            "2+5?",
            json!({"index": 3, "split": "train", "problem": "2+5"}),
        );
        let b = item(
            "2+5?",
            json!({"index": 9, "split": "test", "problem": "2+5"}),
        );
        assert_eq!(task_key(&a), task_key(&b));
        // The same prompt for another hidden goal is another task.
        let c = item("policy", json!({"index": 1, "scenario": {"db_seed": 1}}));
        let d = item("policy", json!({"index": 1, "scenario": {"db_seed": 2}}));
        assert_ne!(task_key(&c), task_key(&d));
        assert_ne!(
            task_key(&a),
            task_key(&item("2+6?", json!({"problem": "2+5"})))
        );
    }
}
