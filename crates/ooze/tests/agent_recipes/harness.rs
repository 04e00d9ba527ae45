//! The harness of the agent recipes' CPU tests: a recipe's data, a warm start and two RL steps
//! through `ooze train`, and the checks its saved trajectories must pass.

use crate::common::ooze_ok as ooze;
use serde_json::Value;
use std::path::{Path, PathBuf};

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs of equal mask values: (start, end, mask).
pub fn runs(mask: &[u64]) -> Vec<(usize, usize, u64)> {
    let mut out: Vec<(usize, usize, u64)> = Vec::new();
    for (i, &m) in mask.iter().enumerate() {
        match out.last_mut() {
            Some(r) if r.2 == m => r.1 = i + 1,
            _ => out.push((i, i + 1, m)),
        }
    }
    out
}

/// What a recipe run left: the run directory, the metrics lines and the tokenizer.
pub struct Run {
    pub dir: PathBuf,
    /// The generated data and demonstrations.
    pub data: PathBuf,
    pub metrics: Vec<Value>,
    pub tokenizer: ooze_model::Tokenizer,
    /// Whether the run evaluated before its first rollout too (see [`eval_at_start`]).
    pub eval_at_start: bool,
    pub _tmp: tempfile::TempDir,
}

/// The `--takes` of `recipe-data` arguments (1 without it).
fn takes(data_args: &[&str]) -> usize {
    data_args
        .iter()
        .position(|a| *a == "--takes")
        .map_or(1, |i| data_args[i + 1].parse().unwrap())
}

/// Held-out prompts evaluated at the end of a run (and at its start, see [`eval_at_start`]): the
/// checks need eval to run through the agent, not a precise pass rate, and a tenth of 400 rows
/// (40 prompts × 2 samples, twice) took most of a container recipe's training time on a CI
/// machine.
const EVAL_PROMPTS: usize = 8;

/// Whether a recipe's run evaluates before its first rollout as well as after its last (two
/// samples a prompt). Not the container recipes nor tau_retail: each of their eval samples is an
/// episode (a container, or a conversation with the customer model), the slowest part of their
/// runs; the eval after the last rollout, one sample a prompt, still goes through the agent.
fn eval_at_start(recipe: &str) -> bool {
    !matches!(
        recipe,
        "swe_lite" | "echo" | "endless_terminals" | "tau_retail"
    )
}

/// Rewrites a JSONL file with only its first `n` rows.
fn keep_first_rows(path: &Path, n: usize) {
    let text = std::fs::read_to_string(path).unwrap();
    let kept: String = text.lines().take(n).map(|l| format!("{l}\n")).collect();
    std::fs::write(path, kept).unwrap();
}

/// Generates `recipe`'s data, warm-starts a tiny model on its demonstrations, and trains two
/// rollouts of 4 prompts × 4 executions with `extra` settings, reading the `.jsonl` or the
/// `.parquet` splits (`ext`); a JSONL test split is cut to its first [`EVAL_PROMPTS`] rows.
pub fn run_recipe(recipe: &str, ext: &str, extra: &[String]) -> Run {
    run_recipe_with(recipe, ext, &[], extra, |_| Vec::new())
}

/// [`run_recipe`] with more `recipe-data` arguments, and `before_train` called with the SFT model
/// directory before training (to start services the recipe points at); it returns more settings.
pub fn run_recipe_with(
    recipe: &str,
    ext: &str,
    data_args: &[&str],
    extra: &[String],
    before_train: impl FnOnce(&Path) -> Vec<String>,
) -> Run {
    let tmp = tempfile::tempdir().unwrap();
    let path = |name: &str| tmp.path().join(name);
    let (data, sft, run) = (path("data"), path("sft"), path("grpo"));
    // tau_retail's conversations are several times longer (a policy document, JSON records):
    // fewer steps warm it up enough to call tools and talk to the customer.
    let steps = crate::common::SftSteps {
        steps: if recipe == "tau_retail" { 50 } else { 120 },
        ..crate::common::SftSteps::DEFAULT
    };
    let rows = match recipe {
        "tau_retail" => 100,
        // Each demonstration is an episode in a container (its commands and tests): 80 of them
        // (swe_lite's 160 took 231 s to record, 80 took 71 s). The warm start's steps do not
        // depend on the count (120 steps of 16 show each of 80 about 24 times), and the RL
        // steps' 8 prompts come from the same generated tasks.
        "swe_lite" | "echo" | "endless_terminals" => 80 / takes(data_args),
        // As many recorded episodes as 400 rows once, whatever `--takes`.
        _ => 400 / takes(data_args),
    };
    crate::common::agent_warm_start(recipe, tmp.path(), rows, steps, data_args, &|_| {});
    if ext == "jsonl" {
        keep_first_rows(&data.join("test.jsonl"), EVAL_PROMPTS);
    }
    let file =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../recipes/{recipe}/recipe.toml"));
    let set = |k: &str, v: &Path| format!("{k}=\"{}\"", v.display());
    let mut args: Vec<String> = vec!["train".into(), s(&file).into()];
    let mut settings = vec![
        set("model.path", &sft.join("final-model")),
        "model.device=\"cpu\"".into(),
        set("data.path", &data.join(format!("train.{ext}"))),
        set("logging.run_dir", &run),
        "rollout.num_rollouts=2".into(),
        "rollout.batch_size=4".into(),
        "rollout.n_samples_per_prompt=4".into(),
        "logging.progress=false".into(),
        format!("eval.at_start={}", eval_at_start(recipe)),
        // One sample of each held-out prompt where an eval sample is an episode (the recipes
        // that evaluate only at the end): the check is that eval goes through the agent.
        format!(
            "eval.datasets=[{{name = \"test\", path = \"{}\", {}}}]",
            data.join(format!("test.{ext}")).display(),
            if eval_at_start(recipe) {
                "n_samples = 2, pass_k = [1, 2]"
            } else {
                "n_samples = 1, pass_k = [1]"
            }
        ),
    ];
    let model_dir = sft.join("final-model");
    settings.extend(extra.iter().map(|e| {
        e.replace("{data}", s(&data))
            .replace("{model}", s(&model_dir))
    }));
    settings.extend(before_train(&model_dir));
    // The last setting wins, an override from `extra` included.
    let at_start = settings
        .iter()
        .rev()
        .find_map(|kv| kv.strip_prefix("eval.at_start="))
        .is_none_or(|v| v == "true");
    for kv in settings {
        args.push("--set".into());
        args.push(kv);
    }
    ooze(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let tokenizer = ooze_model::Tokenizer::load(&sft.join("final-model")).unwrap();
    Run {
        dir: run,
        data,
        metrics,
        tokenizer,
        eval_at_start: at_start,
        _tmp: tmp,
    }
}

/// Checks every saved trajectory of `run`; `appended_ok` judges each masked (appended) span and
/// `stop_tag` is the tag the model's turn before a tool observation must end with. Returns the
/// number of tool observations seen.
pub fn check_trajectories(
    run: &Run,
    appended_ok: &dyn Fn(&str) -> bool,
    observation: &str,
    stop_tag: &str,
) -> usize {
    // Two RL steps; eval through the agent (at the start where the run asked for it) and at the
    // end; the engine's log-probs match the trainer's on every trained token (the same tokens,
    // not re-tokenised).
    let last = run.metrics.last().unwrap();
    assert_eq!(last["step"], 2, "{last}");
    let first = &run.metrics[0];
    assert_eq!(first["rollout"] == 0, run.eval_at_start, "{first}");
    if run.eval_at_start {
        assert!(first["eval/test/pass@2"].is_number(), "{first}");
    }
    assert!(last["eval/test/pass@1"].is_number(), "{last}");
    for m in run
        .metrics
        .iter()
        .filter(|m| m["rollout"].as_u64() > Some(0))
    {
        assert!(m["agent/turns"].as_f64().unwrap() >= 1.0, "{m}");
        assert!(m["train/mismatch_max"].as_f64().unwrap() < 1e-4, "{m}");
    }
    let decode = |ids: &[u64]| {
        let ids: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
        run.tokenizer.decode(&ids, false).unwrap()
    };
    let numbers = |v: &Value| -> Vec<u64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };
    let (mut observations, mut samples) = (0, 0);
    for k in 1..=2 {
        let text = std::fs::read_to_string(run.dir.join(format!("rollouts/rollout-{k:06}.jsonl")))
            .unwrap();
        for line in text.lines() {
            let group: Value = serde_json::from_str(line).unwrap();
            let mut indices: Vec<u64> = Vec::new();
            for sample in group["samples"].as_array().unwrap() {
                samples += 1;
                indices.push(sample["index"].as_u64().unwrap());
                let ids = numbers(&sample["response_ids"]);
                let mask = numbers(&sample["loss_mask"]);
                let logp: Vec<f64> = sample["log_probs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap())
                    .collect();
                assert_eq!((mask.len(), logp.len()), (ids.len(), ids.len()));
                // Mask 1 exactly where the engine sampled (a log-prob), 0 on appended text.
                for (m, lp) in mask.iter().zip(&logp) {
                    assert_eq!(*m == 1, *lp != 0.0, "{sample}");
                }
                let r = runs(&mask);
                for (j, &(a, b, m)) in r.iter().enumerate() {
                    if m == 1 {
                        continue;
                    }
                    let appended = decode(&ids[a..b]);
                    assert!(appended_ok(&appended), "appended: {appended:?}");
                    // The model's turn before a tool observation ended at its stop tag: the tag
                    // completes in the turn's last token, so no trained token follows it.
                    if appended.contains(observation) && !appended.contains("Error: no tool call") {
                        observations += 1;
                        let (ta, tb, _) = r[j - 1];
                        assert!(
                            decode(&ids[ta..tb]).contains(stop_tag),
                            "{}",
                            decode(&ids[ta..tb])
                        );
                        assert!(!decode(&ids[ta..tb - 1]).contains(stop_tag));
                    }
                }
            }
            indices.sort_unstable();
            assert_eq!(
                indices,
                vec![0, 1, 2, 3],
                "one sample per execution, each once"
            );
        }
    }
    assert_eq!(samples, 2 * 4 * 4);
    observations
}

/// The saved trajectories of an agent that writes its own conversations (every response token the
/// model's): per execution, its siblings — numbered 0..k, one rollout index — and their
/// rewards. Checks that every token is trained with the engine's log-prob, that the
/// trainer saw the engine's very tokens, and that each rollout's logged reward counts every
/// execution once (the mean over executions of their samples' mean).
pub fn executions(run: &Run) -> Vec<Vec<Value>> {
    let mut out = Vec::new();
    for k in 1..=2u64 {
        let text = std::fs::read_to_string(run.dir.join(format!("rollouts/rollout-{k:06}.jsonl")))
            .unwrap();
        let mut per_execution_rewards = Vec::new();
        for line in text.lines() {
            let group: Value = serde_json::from_str(line).unwrap();
            let mut by_index: std::collections::BTreeMap<u64, Vec<Value>> = Default::default();
            for sample in group["samples"].as_array().unwrap() {
                by_index
                    .entry(sample["index"].as_u64().unwrap())
                    .or_default()
                    .push(sample.clone());
            }
            assert_eq!(
                by_index.keys().copied().collect::<Vec<_>>(),
                vec![0, 1, 2, 3]
            );
            for (_, siblings) in by_index {
                let numbers: Vec<u64> = siblings
                    .iter()
                    .map(|s| s["sibling"].as_u64().unwrap_or(0))
                    .collect();
                assert_eq!(numbers, (0..siblings.len() as u64).collect::<Vec<_>>());
                for sample in &siblings {
                    assert!(sample["error"].is_null(), "{}", sample["error"]);
                    let ids = sample["response_ids"].as_array().unwrap();
                    let mask = sample["loss_mask"].as_array().unwrap();
                    let logp = sample["log_probs"].as_array().unwrap();
                    assert_eq!((mask.len(), logp.len()), (ids.len(), ids.len()));
                    for (m, lp) in mask.iter().zip(logp) {
                        assert_eq!(m.as_u64(), Some(1), "{sample}");
                        assert!(lp.as_f64().unwrap() < 0.0 || ids.len() == 1, "{sample}");
                    }
                }
                let rewards: Vec<f64> = siblings
                    .iter()
                    .map(|s| s["reward"].as_f64().unwrap())
                    .collect();
                per_execution_rewards.push(rewards.iter().sum::<f64>() / rewards.len() as f64);
                out.push(siblings);
            }
        }
        let line = run
            .metrics
            .iter()
            .find(|m| m["rollout"].as_u64() == Some(k))
            .unwrap();
        let mean = per_execution_rewards.iter().sum::<f64>() / per_execution_rewards.len() as f64;
        assert!(
            (line["reward/mean"].as_f64().unwrap() - mean).abs() < 1e-9,
            "{line} vs {mean}"
        );
        assert!(
            line["train/mismatch_max"].as_f64().unwrap() < 1e-4,
            "{line}"
        );
        let per = line["agent/samples_per_execution"].as_f64().unwrap();
        assert!(per >= 1.0, "{line}");
    }
    assert_eq!(out.len(), 2 * 4 * 4);
    assert_eq!(run.metrics.last().unwrap()["step"], 2);
    out
}

pub fn rewards(siblings: &[Value]) -> Vec<f64> {
    siblings
        .iter()
        .map(|s| s["reward"].as_f64().unwrap())
        .collect()
}

/// A prompt line with every run of digits as `#`: numbers are values, not shape (tool_orchestra's
/// prompt carries each expert's latency as measured in the run, 0.0 s or 0.1 s by the machine's load).
fn numbers_masked(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    for c in line.chars() {
        if !c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('#') {
            out.push('#');
        }
    }
    out
}

/// The shape of a rendered prompt: each line (numbers masked) kept where it is one of the
/// demonstrations' common lines (in at least 5% of their prompts), else its label (`Problem:`,
/// `Step #:`) and `*` where the label is common, else `*`; what follows a masked line, up to the
/// next kept one, is part of it.
pub fn shape(text: &str, common: &std::collections::HashSet<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in text.lines().map(numbers_masked) {
        let line = line.as_str();
        let label = line.split_once(':').map(|(l, _)| format!("{l}:"));
        let shown = if common.contains(line) {
            line.to_owned()
        } else if let Some(l) = label.filter(|l| common.contains(l)) {
            format!("{l}*")
        } else if out.last().is_some_and(|l| l.ends_with('*')) {
            continue;
        } else {
            "*".to_owned()
        };
        out.push(shown);
    }
    out
}

/// Checks that every text of `seen` (from the rollouts) has the shape of one of `demonstrated`,
/// values masked; `what` names them in the failure.
pub fn shapes_are_demonstrated(demonstrated: &[String], seen: &[String], what: &str) {
    assert!(!demonstrated.is_empty(), "no demonstrated {what}");
    assert!(!seen.is_empty(), "no {what} in the rollouts");
    let mut counts: std::collections::HashMap<String, usize> = Default::default();
    for d in demonstrated {
        let mut once = std::collections::HashSet::new();
        for line in d.lines().map(numbers_masked) {
            let label = line.split_once(':').map(|(l, _)| format!("{l}:"));
            for key in std::iter::once(line.clone()).chain(label) {
                if once.insert(key.clone()) {
                    *counts.entry(key).or_default() += 1;
                }
            }
        }
    }
    let common = counts
        .into_iter()
        .filter(|(_, n)| *n * 20 >= demonstrated.len())
        .map(|(k, _)| k)
        .collect();
    let shapes: std::collections::HashSet<Vec<String>> =
        demonstrated.iter().map(|d| shape(d, &common)).collect();
    for text in seen {
        let s = shape(text, &common);
        assert!(
            shapes.contains(&s),
            "{what} with no demonstrated shape:\n{text}\nshape: {s:?}\ndemonstrated: {shapes:?}"
        );
    }
}

/// The `sft.jsonl` conversations of `run` whose last user message starts with `marker`.
pub fn demonstrations(run: &Run, marker: &str) -> Vec<Vec<Value>> {
    std::fs::read_to_string(run.data.join("sft.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["messages"]
                .as_array()
                .unwrap()
                .clone()
        })
        .filter(|m| {
            m.iter()
                .rev()
                .find(|m| m["role"] == "user")
                .is_some_and(|u| u["content"].as_str().is_some_and(|c| c.starts_with(marker)))
        })
        .collect()
}

/// Every saved sample of `run`'s two rollouts.
pub fn rollout_samples(run: &Run) -> Vec<(Value, Value)> {
    let mut out = Vec::new();
    for k in 1..=2 {
        let text = std::fs::read_to_string(run.dir.join(format!("rollouts/rollout-{k:06}.jsonl")))
            .unwrap();
        for line in text.lines() {
            let group: Value = serde_json::from_str(line).unwrap();
            for sample in group["samples"].as_array().unwrap() {
                out.push((group.clone(), sample.clone()));
            }
        }
    }
    out
}

pub fn token_ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// Checks that every turn prompt of `run`'s rollouts has the shape of a demonstrated one: the
/// `sft.jsonl` conversations whose last user message starts with `marker`, rendered with the
/// model's template as the agent renders them, values masked. Prompts holding `undemonstrated`
/// (feedback on a malformed action, which the demonstrations never write) are left out.
pub fn prompts_are_demonstrated(run: &Run, marker: &str, undemonstrated: &str) {
    let template = run.tokenizer.chat_template(false).unwrap();
    let options = ooze_model::RenderOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    let demonstrated: Vec<String> = demonstrations(run, marker)
        .iter()
        .map(|m| template.render(&m[..m.len() - 1], &options).unwrap())
        .collect();
    let seen: Vec<String> = rollout_samples(run)
        .iter()
        .map(|(group, sample)| {
            let ids = sample
                .get("prompt_ids")
                .filter(|v| !v.is_null())
                .unwrap_or(&group["prompt"]["input_ids"]);
            run.tokenizer.decode(&token_ids(ids), false).unwrap()
        })
        .filter(|p| undemonstrated.is_empty() || !p.contains(undemonstrated))
        .collect();
    shapes_are_demonstrated(&demonstrated, &seen, "a turn prompt");
}

/// For agents that append tool output inside the model's turn: checks that every appended block
/// of the rollouts (`open` … `close`) has the shape of one in the demonstrations' turns, except
/// the output of a failed call (holding `failed`), which the demonstrations never make.
pub fn observations_are_demonstrated(run: &Run, open: &str, close: &str, failed: &str) {
    let blocks = |text: &str| -> Vec<String> {
        text.split(open)
            .skip(1)
            .filter_map(|rest| {
                rest.split_once(close)
                    .map(|(inside, _)| format!("{open}{inside}{close}"))
            })
            .collect()
    };
    let demonstrated: Vec<String> = demonstrations(run, "")
        .iter()
        .flat_map(|m| blocks(m.last().unwrap()["content"].as_str().unwrap()))
        .collect();
    let mut seen = Vec::new();
    for (_, sample) in rollout_samples(run) {
        let ids = token_ids(&sample["response_ids"]);
        let mask = token_ids(&sample["loss_mask"]);
        for (a, b, m) in runs(&mask.iter().map(|&m| u64::from(m)).collect::<Vec<_>>()) {
            if m == 0 {
                let text = run.tokenizer.decode(&ids[a..b], false).unwrap();
                seen.extend(blocks(&text).into_iter().filter(|b| !b.contains(failed)));
            }
        }
    }
    shapes_are_demonstrated(&demonstrated, &seen, "a tool output");
}

/// The terminal recipes' trajectories: every appended span is a whole tool response, every model
/// turn before one ends at `</tool_call>`; the reward is the task verifier's (0 or 1) and the step
/// time is split into episode start, commands and verification.
pub fn check_terminal_run(run: &Run) -> usize {
    let ok = |t: &str| t.starts_with("\n<tool_response>\n") && t.ends_with("\n</tool_response>\n");
    let actions = check_trajectories(run, &ok, "<tool_response>", "</tool_call>");
    prompts_are_demonstrated(run, "", "");
    for m in run
        .metrics
        .iter()
        .filter(|m| m["rollout"].as_u64() > Some(0))
    {
        let r = m["reward/mean"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&r), "{m}");
        assert_eq!(
            m["agent/passed"].as_f64(),
            Some(r),
            "the reward is the verifier's: {m}"
        );
        for key in [
            "agent/episode_start_seconds",
            "agent/tool_seconds",
            "agent/verify_seconds",
        ] {
            assert!(m[key].as_f64().is_some_and(|s| s >= 0.0), "{key}: {m}");
        }
        assert!(m["agent/episode_memory_mib"].as_f64().unwrap() > 0.0, "{m}");
    }
    actions
}
