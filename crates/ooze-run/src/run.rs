//! The RL loop, colocated on one device: the engine and the trainer hold the same bf16 (or fp32)
//! parameter tensors ([`ooze_model::Decoder::share`]), so the optimizer step is the engine's weight
//! update (no copy; the engine is only told the version changed). Each rollout:
//!
//! 1. evaluation when due (at the start and every `eval.interval` rollouts);
//! 2. generate `rollout.batch_size` prompts × `n_samples_per_prompt`, score them, drop filtered
//!    groups and over-sample until the batch is full;
//! 3. free the engine's KV memory, then train: `global_batch_size` samples per optimizer step,
//!    whole prompt groups per step, `logp_old` and advantages computed once under the rollout's
//!    weights;
//! 4. tell the engine its weights changed; log; checkpoint every `trainer.save_interval`.
//!
//! Everything random is a function of the recipe's seeds and the run's counters, which checkpoints
//! save: a resumed run takes the same steps as an uninterrupted one.

use crate::agents::{agent_context_len, agent_rollout, build_helpers, load_helper_models};
use crate::eval::{evaluate, EvalResult, EvalSet};
use crate::metrics_log::MetricsLog;
use crate::progress::Progress;
use crate::recipe::{Mode, Recipe};
use anyhow::{bail, Context};
use ooze_engine::{EngineConfig, EngineHandle, Sampling, SamplingParams, StopStrings};
use ooze_model::{Decoder, SlotCache, Tokenizer};
use ooze_rollout::data::{self, DataConfig, Position, PromptOrder};
use ooze_rollout::manager::{fill_batch, Batch, Group, RolloutSettings};
use ooze_rollout::prompts::{prepare, task_rows, PromptFormat, PromptItem};
use ooze_rollout::scorer::{Registry, RewardConfig, Scorer};
use ooze_torch::tch::{Device, Kind};
use ooze_torch::{DeviceSpec, DtypeSpec};
use ooze_train::{checkpoint, Schedule, StepMetrics, TrainSample, Trainer, TrainerConfig};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// The run's counters: what a checkpoint saves besides the trainer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    /// Rollouts completed.
    pub rollout: u64,
    /// The next prompt draw's group number (sampling seeds derive from it).
    pub next_group: u64,
    /// Where the prompt order is.
    pub position: Position,
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub run_dir: PathBuf,
    pub state: RunState,
    /// Eval results at the start (if evaluated then) and at the end.
    pub first_eval: Vec<EvalResult>,
    pub last_eval: Vec<EvalResult>,
    pub report: Option<PathBuf>,
}

/// The run directory a recipe file writes to: `logging.run_dir`, or `runs/<file stem>`.
pub fn run_dir_for(recipe: &Recipe, recipe_path: &Path) -> PathBuf {
    recipe.logging.run_dir.clone().unwrap_or_else(|| {
        Path::new("runs").join(
            recipe_path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "run".into()),
        )
    })
}

fn sampling(params: SamplingParams, section: &str) -> anyhow::Result<Sampling> {
    params.validate().map_err(|e| {
        anyhow::anyhow!(
            "{section}: {}",
            e.to_string().trim_start_matches("sampling_params.")
        )
    })
}

fn rollout_state_path(run_dir: &Path) -> PathBuf {
    run_dir.join("rollout_state.json")
}

fn task_items(task: ooze_rollout::Task, n: usize, seed: u64) -> Vec<ooze_rollout::data::PromptRow> {
    task_rows(task.generate(n, seed))
}

/// Runs (or, with `resume`, continues) the recipe in `run_dir`.
pub fn run(
    recipe: Recipe,
    run_dir: &Path,
    resume: bool,
    registry: &Registry,
) -> anyhow::Result<RunSummary> {
    let started = Instant::now();
    let mode = recipe.trainer.mode;
    let latest = checkpoint::latest(run_dir)?;
    let rollout_only_state = rollout_state_path(run_dir);
    let has_progress = latest.is_some() || rollout_only_state.exists();
    if has_progress && !resume {
        bail!(
            "{} already holds a run; continue it with `ooze train --resume {}`, or set logging.run_dir to a new directory",
            run_dir.display(),
            run_dir.display()
        );
    }
    std::fs::create_dir_all(run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    checkpoint::write_atomic(&run_dir.join("recipe.toml"), recipe.to_toml().as_bytes())?;

    // Device and models.
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
    let model_path = recipe.model.path.clone();
    let tokenizer = Arc::new(Tokenizer::load(&model_path).with_context(|| {
        format!(
            "model.path: loading the tokenizer in {}",
            model_path.display()
        )
    })?);

    // Prompts.
    let format = PromptFormat {
        apply_chat_template: recipe.data.apply_chat_template,
        system_prompt: recipe.data.system_prompt.clone(),
    };
    let d = &recipe.data;
    let data_config = |path: &str| DataConfig {
        path: path.to_owned(),
        input_key: d.input_key.clone(),
        label_key: d.label_key.clone(),
        metadata_key: d.metadata_key.clone(),
        tools_key: d.tools_key.clone(),
        skip_bad_rows: d.skip_bad_rows,
    };
    let (train_prompts, origin) = match (&d.task, &d.path) {
        (Some(task), _) => {
            let origin = format!("data.task {}", serde_json::to_string(task)?);
            let (items, too_long) = prepare(
                task_items(*task, d.task_size, d.task_seed),
                &tokenizer,
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
            let loaded = data::load(&data_config(path))?;
            let (items, too_long) =
                prepare(loaded.rows, &tokenizer, &format, d.max_prompt_tokens, path)
                    .map_err(anyhow::Error::msg)?;
            eprintln!(
                "data: {} prompts from {path} ({} rows without `{}` skipped, {too_long} over data.max_prompt_tokens left out)",
                items.len(),
                loaded.skipped,
                d.input_key
            );
            (items, path.clone())
        }
        (None, None) => (Vec::new(), String::new()),
    };
    if train_prompts.is_empty() && mode != Mode::Replay {
        bail!("{origin}: no prompts left to train on");
    }
    let scorer = if mode == Mode::Replay {
        None
    } else {
        Some(Scorer::new(&recipe.reward, d.task, registry).map_err(anyhow::Error::msg)?)
    };

    // Eval sets: held out from the training prompts.
    let train_texts: HashSet<&str> = train_prompts.iter().map(|p| p.text.as_str()).collect();
    let mut evals = Vec::new();
    for (i, e) in recipe.eval.datasets.iter().enumerate() {
        let at = format!("eval.datasets[{i}] ({})", e.name);
        let (rows, task) = match (&e.task, &e.path) {
            (Some(task), _) => (task_items(*task, e.task_size, e.task_seed), Some(*task)),
            (None, Some(path)) => (data::load(&data_config(path))?.rows, d.task),
            _ => unreachable!("the recipe check requires one source"),
        };
        let (items, too_long) = prepare(rows, &tokenizer, &format, d.max_prompt_tokens, &at)
            .map_err(anyhow::Error::msg)?;
        let before = items.len();
        let prompts: Vec<PromptItem> = items
            .into_iter()
            .filter(|p| !train_texts.contains(p.text.as_str()))
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
        let reward = match (&recipe.reward, task) {
            (RewardConfig::Task, Some(t)) => Scorer::Task(t),
            (config, task) => {
                Scorer::new(config, task, registry).map_err(|m| anyhow::anyhow!("{at}: {m}"))?
            }
        };
        evals.push(EvalSet {
            name: e.name.clone(),
            prompts,
            scorer: reward,
            n_samples: e.n_samples,
            sampling: sampling(
                SamplingParams {
                    temperature: Some(e.temperature),
                    top_p: Some(e.top_p),
                    max_new_tokens: Some(e.max_new_tokens.unwrap_or(recipe.rollout.max_new_tokens)),
                    stop: (!recipe.rollout.stop.is_empty())
                        .then(|| StopStrings::Many(recipe.rollout.stop.clone())),
                    ..Default::default()
                },
                &at,
            )?,
            pass_k: e.pass_k.clone(),
        });
    }

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
    let settings = RolloutSettings {
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
    };
    let mut settings = settings;

    // The policy, the trainer and the engine over the same tensors.
    let load = |path: &Path, what: &str| -> anyhow::Result<Decoder> {
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
    };
    let policy = load(&model_path, "model.path")?;
    let engine_decoder = policy.share();
    let steps_per_rollout =
        (r.batch_size * r.n_samples_per_prompt / recipe.global_batch_size()) as u64;
    let mut trainer = if mode == Mode::RolloutOnly {
        None
    } else {
        let a = &recipe.algorithm;
        let needs_reference = a.advantage.kl_coef != 0.0 || a.loss.kl_loss_coef != 0.0;
        let reference = if needs_reference {
            Some(load(
                recipe.model.reference.as_ref().unwrap_or(&model_path),
                "model.reference",
            )?)
        } else {
            None
        };
        let t = &recipe.trainer;
        let config = TrainerConfig {
            optimizer: t.optimizer.clone(),
            schedule: Schedule {
                lr: t.lr,
                warmup_steps: t.warmup_steps,
                decay: t.decay,
                total_steps: (recipe.rollout.num_rollouts * steps_per_rollout)
                    .max(t.warmup_steps + 1),
                min_lr_ratio: t.min_lr_ratio,
            },
            max_tokens_per_micro_batch: t.max_tokens_per_micro_batch,
            temperature: r.temperature,
            advantage: a.advantage.clone(),
            loss: a.loss.clone(),
            aggregation: a.aggregation,
            recompute_activations: t.recompute_activations,
        };
        Some(Trainer::new(policy, reference, config).map_err(|e| anyhow::anyhow!("trainer: {e}"))?)
    };

    // Restore.
    let mut state = RunState::default();
    if resume {
        if let (Some(dir), Some(trainer)) = (&latest, trainer.as_mut()) {
            let extra = checkpoint::load(dir, trainer)?;
            state = serde_json::from_value(extra)
                .with_context(|| format!("{}: the run state is unreadable", dir.display()))?;
            eprintln!(
                "resumed from {} after rollout {}",
                dir.display(),
                state.rollout
            );
        } else if mode == Mode::RolloutOnly && rollout_only_state.exists() {
            let text = std::fs::read_to_string(&rollout_only_state)?;
            state = serde_json::from_str(&text)
                .with_context(|| format!("{}: unreadable", rollout_only_state.display()))?;
            eprintln!("resumed rollout-only run after rollout {}", state.rollout);
        } else {
            eprintln!(
                "nothing to resume in {}; starting from the beginning",
                run_dir.display()
            );
        }
    }
    let mut order = PromptOrder::new(
        train_prompts.len(),
        recipe.data.seed,
        recipe.data.shuffle,
        state.position,
    );

    // The engine.
    let max_new = evals
        .iter()
        .map(|e| e.sampling.max_new_tokens)
        .chain([r.max_new_tokens])
        .max()
        .unwrap_or(r.max_new_tokens);
    let longest_prompt = train_prompts
        .iter()
        .chain(evals.iter().flat_map(|e| &e.prompts))
        .map(|p| p.input_ids.len())
        .max()
        .unwrap_or(1);
    // An agent's conversations: their own prompts and responses (observations included).
    let agent_context = agent_context_len(&recipe.agent);
    let slot_len =
        EngineConfig::aligned_slot_len((longest_prompt + max_new.max(agent_context)) as i64);
    let needed = evals
        .iter()
        .map(|e| e.prompts.len() * e.n_samples)
        .chain([r.batch_size.max(settings.over_sampling_batch_size) * r.n_samples_per_prompt])
        .max()
        .unwrap_or(1)
        .min(r.concurrency) as i64;
    // Helpers with weights of their own are loaded first: their weights are then out of the free
    // memory measured below, and their caches are taken out of the policy's share.
    let helper_models = if recipe.agent.spec().is_none() {
        Vec::new()
    } else {
        load_helper_models(&recipe, device, kind)?
    };
    let helper_cache: i64 = helper_models
        .iter()
        .map(|m| m.cache_bytes(slot_len, kind))
        .sum();
    let slots = match (r.max_running, device) {
        (Some(n), _) => n,
        (None, Device::Cuda(i)) => {
            let (free, _) =
                ooze_torch::cuda_driver::memory_info(i).context("querying free GPU memory")?;
            let per_slot = SlotCache::bytes_per_token(&engine_decoder.config, kind) * slot_len;
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
    };
    let eos = ooze_model::config::load_generation_eos(&model_path)?
        .unwrap_or_else(|| engine_decoder.config.eos_token_ids.clone());
    eprintln!("engine: {slots} sequences × {slot_len} tokens");
    settings.agent = agent_rollout(&recipe, slot_len as usize)?;
    let engine = ooze_engine::start(
        engine_decoder,
        Some(tokenizer.clone()),
        EngineConfig::new(slots, slot_len, eos),
    );
    if let Some(agent) = settings.agent.as_mut() {
        agent.helpers = build_helpers(&recipe, helper_models, &engine, &tokenizer, slot_len)?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;

    let mut log = MetricsLog::open(run_dir, state.rollout, recipe.logging.tensorboard)?;
    let eval_seed = r.seed ^ 0xe7a1;
    let run_evals = |engine: &EngineHandle| -> anyhow::Result<Vec<EvalResult>> {
        let mut out = Vec::new();
        for set in &evals {
            let t = Instant::now();
            let result = runtime.block_on(evaluate(
                engine,
                &tokenizer,
                set,
                r.concurrency,
                eval_seed,
                settings.agent.as_ref(),
            ))?;
            eprintln!(
                "eval {}: {} ({} prompts × {}, {:.1}s)",
                set.name,
                result
                    .pass_at
                    .iter()
                    .map(|(k, v)| format!("pass@{k} {:.3}", v))
                    .collect::<Vec<_>>()
                    .join(", "),
                set.prompts.len(),
                set.n_samples,
                t.elapsed().as_secs_f64()
            );
            out.push(result);
        }
        Ok(out)
    };
    let eval_line = |results: &[EvalResult], line: &mut Map<String, Value>| {
        for e in results {
            for (k, v) in &e.pass_at {
                line.insert(format!("eval/{}/pass@{k}", e.name), json!(v));
            }
            line.insert(
                format!("eval/{}/response_len", e.name),
                json!(e.mean_response_tokens),
            );
        }
    };

    let mut first_eval = Vec::new();
    let mut last_eval = Vec::new();
    if state.rollout == 0 && recipe.eval.at_start && !evals.is_empty() {
        first_eval = run_evals(&engine)?;
        let mut line = Map::new();
        line.insert("rollout".into(), json!(0));
        eval_line(&first_eval, &mut line);
        log.write(&line)?;
        last_eval = first_eval.clone();
    }

    let total = recipe.rollout.num_rollouts;
    let rollouts_dir = run_dir.join("rollouts");
    while state.rollout < total {
        let index = state.rollout + 1;
        let t_rollout = Instant::now();
        let batch = if mode == Mode::Replay {
            read_rollout(recipe.trainer.replay_from.as_ref().expect("checked"), index)?
        } else {
            let progress = Progress::new(
                format!("rollout {index}/{total}"),
                r.batch_size * r.n_samples_per_prompt,
                recipe.logging.progress,
            );
            let mut next_group = state.next_group;
            let mut next = |k: usize| -> Vec<(u64, PromptItem)> {
                order
                    .take(k)
                    .into_iter()
                    .map(|i| {
                        next_group += 1;
                        (next_group - 1, train_prompts[i].clone())
                    })
                    .collect()
            };
            let batch = runtime.block_on(fill_batch(
                &engine,
                &tokenizer,
                scorer.as_ref().expect("not a replay"),
                r.batch_size,
                &settings,
                &mut next,
                &|| progress.tick(),
            ))?;
            progress.finish();
            state.next_group = next_group;
            state.position = order.position();
            batch
        };
        let rollout_seconds = t_rollout.elapsed().as_secs_f64();
        if recipe.logging.save_rollouts && mode != Mode::Replay {
            write_rollout(&rollouts_dir, index, &batch)?;
        }
        let mut line = rollout_line(index, &batch, rollout_seconds);

        // Train on whole steps of whole groups.
        let (mut train_seconds, mut sync_seconds) = (0.0, 0.0);
        if let Some(trainer) = trainer.as_mut() {
            let t_sync = Instant::now();
            runtime.block_on(engine.release_memory())?;
            sync_seconds += t_sync.elapsed().as_secs_f64();
            let g = recipe.global_batch_size();
            let n = r.n_samples_per_prompt;
            let usable_groups = batch.groups.len() / (g / n) * (g / n);
            if usable_groups < batch.groups.len() {
                eprintln!(
                    "rollout {index}: {} groups do not fill a step of {g} samples and are left out",
                    batch.groups.len() - usable_groups
                );
            }
            let samples = train_samples(&batch.groups[..usable_groups], n);
            if !samples.is_empty() {
                let t_train = Instant::now();
                // Each step: g / n whole groups (an agent's siblings stay with their group).
                let groups_per_step = g / n;
                let step_sizes: Vec<usize> = batch.groups[..usable_groups]
                    .chunks(groups_per_step)
                    .map(|chunk| {
                        chunk
                            .iter()
                            .flat_map(|gr| &gr.samples)
                            .filter(|s| !s.response_ids.is_empty())
                            .count()
                    })
                    .filter(|&k| k > 0)
                    .collect();
                let steps = trainer.rl_steps(&samples, &step_sizes)?;
                train_seconds = t_train.elapsed().as_secs_f64();
                train_line(&steps, &mut line);
                let t_sync = Instant::now();
                runtime.block_on(engine.weights_updated_in_place())?;
                sync_seconds += t_sync.elapsed().as_secs_f64();
            }
            line.insert("step".into(), json!(trainer.step()));
        }
        line.insert("time/rollout".into(), json!(rollout_seconds));
        line.insert("time/train".into(), json!(train_seconds));
        line.insert("time/weight_sync".into(), json!(sync_seconds));
        state.rollout = index;

        let interval = recipe.eval.interval;
        if !evals.is_empty() && (index == total || (interval > 0 && index % interval == 0)) {
            last_eval = run_evals(&engine)?;
            eval_line(&last_eval, &mut line);
        }
        if recipe.logging.progress {
            eprintln!("{}", summary_text(&line, total));
        }
        log.write(&line)?;

        // Checkpoint.
        let save = index == total || index % recipe.trainer.save_interval.max(1) == 0;
        if let Some(trainer) = trainer.as_ref() {
            if save {
                let t = Instant::now();
                let dir =
                    checkpoint::save(run_dir, &model_path, trainer, serde_json::to_value(state)?)?;
                eprintln!(
                    "checkpoint: {} ({:.1}s)",
                    dir.display(),
                    t.elapsed().as_secs_f64()
                );
            }
        } else {
            checkpoint::write_atomic(
                &rollout_only_state,
                serde_json::to_string(&state)?.as_bytes(),
            )?;
        }
    }
    runtime.block_on(engine.shutdown());
    if let Some(trainer) = trainer.as_ref() {
        checkpoint::save_final_model(run_dir, &model_path, trainer)?;
    }
    let report = if recipe.logging.report {
        let path = crate::report::write_report(run_dir)?;
        eprintln!("report: {}", path.display());
        Some(path)
    } else {
        None
    };
    eprintln!(
        "done: {} rollouts in {:.1}s",
        state.rollout,
        started.elapsed().as_secs_f64()
    );
    Ok(RunSummary {
        run_dir: run_dir.to_owned(),
        state,
        first_eval,
        last_eval,
        report,
    })
}

/// The trainer's samples of `groups`, siblings adjacent, with unique rollout ids.
pub fn train_samples(groups: &[Group], n: usize) -> Vec<TrainSample> {
    groups
        .iter()
        .flat_map(|g| {
            g.samples
                .iter()
                .filter(|s| !s.response_ids.is_empty())
                .map(move |s| {
                    let prompt = s.prompt_ids.as_deref().unwrap_or(&g.prompt.input_ids);
                    let trained = if s.trained { 1.0 } else { 0.0 };
                    TrainSample {
                        tokens: [prompt, &s.response_ids[..]].concat(),
                        prompt_len: prompt.len(),
                        // Agent samples: the policy's own tokens only (tool and template tokens 0).
                        loss_mask: match &s.loss_mask {
                            Some(mask) => mask.iter().map(|&m| m as f32 * trained).collect(),
                            None => vec![trained; s.response_ids.len()],
                        },
                        rollout_log_probs: Some(s.log_probs.clone()),
                        reward: s.reward,
                        group: g.group,
                        rollout: g.group * n as u64 + s.index as u64,
                        observation_mask: None,
                    }
                })
        })
        .collect()
}

fn rollout_file(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("rollout-{index:06}.jsonl"))
}

/// Saves a rollout's groups, one JSON object per line (atomically).
fn write_rollout(dir: &Path, index: u64, batch: &Batch) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut body = String::new();
    for g in &batch.groups {
        body.push_str(&serde_json::to_string(g)?);
        body.push('\n');
    }
    checkpoint::write_atomic(&rollout_file(dir, index), body.as_bytes())?;
    Ok(())
}

/// Reads a saved rollout for replay.
fn read_rollout(run_dir: &Path, index: u64) -> anyhow::Result<Batch> {
    let path = rollout_file(&run_dir.join("rollouts"), index);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "trainer.replay_from: reading {} (was the run saved with logging.save_rollouts?)",
            path.display()
        )
    })?;
    let groups = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str::<Group>(l)
                .with_context(|| format!("{}:{}: not a saved rollout group", path.display(), i + 1))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Batch {
        generated_groups: groups.len(),
        groups,
        ..Default::default()
    })
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        0.0
    } else {
        s / n as f64
    }
}

/// The rollout's own numbers.
fn rollout_line(index: u64, batch: &Batch, seconds: f64) -> Map<String, Value> {
    let samples: Vec<_> = batch.groups.iter().flat_map(|g| &g.samples).collect();
    // One reward per execution: an agent's siblings count once.
    let rewards: Vec<f64> = batch.groups.iter().flat_map(|g| g.rewards()).collect();
    let m = mean(rewards.iter().copied());
    let std = mean(rewards.iter().map(|r| (r - m) * (r - m))).sqrt();
    let lens: Vec<f64> = samples
        .iter()
        .map(|s| s.response_ids.len() as f64)
        .collect();
    let tokens: f64 = lens.iter().sum();
    let mut line = Map::new();
    line.insert("rollout".into(), json!(index));
    line.insert("reward/mean".into(), json!(m));
    line.insert("reward/std".into(), json!(std));
    line.insert(
        "reward/positive_frac".into(),
        json!(mean(rewards.iter().map(|&r| (r > 0.0) as u8 as f64))),
    );
    line.insert("rollout/samples".into(), json!(samples.len()));
    line.insert(
        "rollout/response_len_mean".into(),
        json!(mean(lens.iter().copied())),
    );
    line.insert(
        "rollout/response_len_max".into(),
        json!(lens.iter().cloned().fold(0.0, f64::max)),
    );
    line.insert(
        "rollout/truncated_frac".into(),
        json!(mean(samples.iter().map(
            |s| (s.finish == ooze_core::FinishReason::Length) as u8 as f64
        ))),
    );
    line.insert(
        "rollout/generated_groups".into(),
        json!(batch.generated_groups),
    );
    line.insert("rollout/rounds".into(), json!(batch.rounds));
    // Agent counts, averaged over executions (turns, tool calls, …), and failed executions.
    let executions: Vec<_> = samples.iter().filter(|s| s.sibling == 0).collect();
    let mut agent: std::collections::BTreeMap<&str, f64> = Default::default();
    for s in &executions {
        for (k, v) in &s.agent_metrics {
            *agent.entry(k.as_str()).or_default() += v;
        }
    }
    for (k, sum) in agent {
        line.insert(format!("agent/{k}"), json!(sum / executions.len() as f64));
    }
    if samples
        .iter()
        .any(|s| s.loss_mask.is_some() || s.error.is_some())
    {
        line.insert(
            "agent/failed_frac".into(),
            json!(mean(
                executions.iter().map(|s| s.error.is_some() as u8 as f64)
            )),
        );
        line.insert(
            "agent/samples_per_execution".into(),
            json!(samples.len() as f64 / executions.len().max(1) as f64),
        );
    }
    for (reason, count) in &batch.dropped {
        line.insert(format!("rollout/dropped_{reason}"), json!(count));
    }
    if seconds > 0.0 {
        line.insert("rollout/tokens_per_s".into(), json!(tokens / seconds));
    }
    line
}

/// The steps' numbers: means over the rollout's steps (maxima for maxima).
fn train_line(steps: &[StepMetrics], line: &mut Map<String, Value>) {
    let avg = |f: &dyn Fn(&StepMetrics) -> f64| mean(steps.iter().map(f));
    let avg_opt = |f: &dyn Fn(&StepMetrics) -> Option<f64>| {
        let v: Vec<f64> = steps.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| mean(v.into_iter()))
    };
    line.insert("train/steps".into(), json!(steps.len()));
    line.insert("train/loss".into(), json!(avg(&|s| s.loss)));
    line.insert("train/policy_loss".into(), json!(avg(&|s| s.policy_loss)));
    line.insert("train/entropy".into(), json!(avg(&|s| s.entropy)));
    line.insert("train/clipfrac".into(), json!(avg(&|s| s.clipfrac)));
    line.insert("train/approx_kl".into(), json!(avg(&|s| s.approx_kl)));
    line.insert("train/grad_norm".into(), json!(avg(&|s| s.grad_norm)));
    line.insert("train/lr".into(), json!(avg(&|s| s.lr)));
    line.insert(
        "train/tokens_per_s".into(),
        json!(avg(&|s| s.tokens_per_second)),
    );
    for (key, v) in [
        ("train/kl", avg_opt(&|s| s.kl)),
        ("train/mfu", avg_opt(&|s| s.mfu)),
        (
            "train/mismatch_mean",
            avg_opt(&|s| s.rollout_logp_diff_mean),
        ),
        ("train/importance_weight", avg_opt(&|s| s.importance_weight)),
    ] {
        if let Some(v) = v {
            line.insert(key.into(), json!(v));
        }
    }
    if let Some(max) = steps
        .iter()
        .filter_map(|s| s.rollout_logp_diff_max)
        .reduce(f64::max)
    {
        line.insert("train/mismatch_max".into(), json!(max));
    }
}

/// One console line per rollout.
fn summary_text(line: &Map<String, Value>, total: u64) -> String {
    let f = |k: &str| line.get(k).and_then(Value::as_f64);
    let mut parts = vec![format!(
        "rollout {}/{total}",
        line.get("rollout").and_then(Value::as_u64).unwrap_or(0)
    )];
    if let Some(v) = f("reward/mean") {
        parts.push(format!("reward {v:.3}"));
    }
    if let Some(v) = f("rollout/response_len_mean") {
        parts.push(format!("len {v:.1}"));
    }
    if let Some(v) = f("rollout/dropped_zero_std") {
        parts.push(format!("dropped {v:.0}"));
    }
    if let Some(v) = f("train/loss") {
        parts.push(format!("loss {v:.4}"));
    }
    if let Some(v) = f("train/entropy") {
        parts.push(format!("entropy {v:.3}"));
    }
    if let Some(v) = f("train/mismatch_mean") {
        parts.push(format!("mismatch {v:.1e}"));
    }
    parts.push(format!(
        "{:.1}s gen + {:.1}s train",
        f("time/rollout").unwrap_or(0.0),
        f("time/train").unwrap_or(0.0)
    ));
    for (k, v) in line {
        if k.starts_with("eval/") && k.contains("pass@") {
            parts.push(format!("{} {:.3}", &k[5..], v.as_f64().unwrap_or(0.0)));
        }
    }
    parts.join(" · ")
}
