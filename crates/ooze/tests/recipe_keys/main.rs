//! No recipe key is inert. The audit serialises resolved recipes (one per reward type, agent type
//! and optional section) and flattens them to dotted key paths: every path the parser accepts
//! needs a row in the table (`cases.rs`, `agent_cases.rs`), so a key added later without one fails
//! here. Each row then runs `ooze train` on the CPU with a tiny random model against its base run
//! (the shared base recipe and the row's base settings) and checks that the key's non-default value
//! changes what the run does: a metric, the saved samples or prompts, the weights, the run
//! directory, the log, or a refusal that names the key.
//!
//! `RECIPE_KEYS_ONLY=A,B` runs only the rows with a key containing A or B (to work on a few);
//! `RECIPE_KEYS_KEEP=1` keeps the runs' directory (its path is printed) to compare them by hand.

#[path = "../common/mod.rs"]
mod common;

mod agent_cases;
mod cases;
mod harness;

use cases::{Case, Obs};
use harness::{Env, Out};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Adds `value`'s leaves under `prefix` to `out`; a tagged section (`reward`, `agent`) writes its
/// own keys as `section(TYPE).key`, the helpers' table `helpers.NAME.key`, eval sets
/// `eval.datasets[].key`.
fn flatten(prefix: &str, value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) if prefix == "helpers" => {
            for v in map.values() {
                flatten("helpers.NAME", v, out);
            }
        }
        Value::Object(map) => {
            let tag = map
                .get("type")
                .and_then(Value::as_str)
                .filter(|_| prefix == "reward" || prefix == "agent");
            for (k, v) in map {
                let path = match (prefix, tag) {
                    ("", _) => k.clone(),
                    (_, Some(t)) if k != "type" => format!("{prefix}({t}).{k}"),
                    _ => format!("{prefix}.{k}"),
                };
                flatten(&path, v, out);
            }
        }
        Value::Array(items) if items.iter().any(Value::is_object) => {
            for v in items {
                flatten(&format!("{prefix}[]"), v, out);
            }
        }
        _ => {
            out.insert(prefix.to_owned());
        }
    }
}

/// Every key path of the resolved recipes: defaults, each reward and agent type, the optional
/// sections filled.
fn accepted_keys() -> BTreeSet<String> {
    let min = "[model]\npath = \"m\"\n[data]\ntask = \"addition\"\n";
    let mut variants: Vec<Vec<&str>> = vec![
        vec![
            "algorithm.advantage.estimator=\"ppo\"",
            "critic.lr=1e-4",
            "algorithm.advantage.opd_coef=1",
            "teacher.path=\"t\"",
            "algorithm.loss.importance={level = \"token\", mode = \"mask\"}",
            "eval.datasets=[{name = \"e\", task = \"addition\"}]",
        ],
        vec!["agent={type = \"search_r1\", corpus = \"c\", format_reward = {}}"],
        vec!["agent.type=\"retool\""],
        vec!["agent.type=\"multi_agent\""],
        vec!["agent.type=\"memagent\""],
        vec![
            "agent.type=\"agentflow\"",
            "helpers.executor={policy = true}",
            "helpers.verifier={policy = true}",
            "helpers.generator={policy = true}",
            "helpers.judge={policy = true}",
        ],
        vec!["agent.type=\"tool_orchestra\"", "helpers.x={policy = true}"],
        vec!["agent={type = \"command\", command = [\"p\"], env = {NAME = \"v\"}}"],
        vec!["agent.type=\"terminal\""],
        vec!["agent.type=\"tau_retail\"", "helpers.user={policy = true}"],
    ];
    for reward in [
        "reward={type = \"task\"}",
        "reward={type = \"math\"}",
        "reward={type = \"exact_match\"}",
        "reward={type = \"f1\"}",
        "reward={type = \"regex\", pattern = \"x\"}",
        "reward={type = \"contains\"}",
        "reward={type = \"function\", name = \"x\"}",
        "reward={type = \"group_function\", name = \"x\"}",
        "reward={type = \"python\", path = \"x.py:f\"}",
        "reward={type = \"remote\", url = \"http://x\"}",
    ] {
        variants.push(vec![reward]);
    }
    let mut keys = BTreeSet::new();
    for sets in variants {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let recipe = ooze_run::Recipe::parse(min, Path::new("audit.toml"), &sets)
            .unwrap_or_else(|e| panic!("{sets:?}: {e}"));
        flatten("", &serde_json::to_value(&recipe).unwrap(), &mut keys);
    }
    // A path that is the prefix of others is the section itself (`critic` as null by default).
    let all = keys.clone();
    keys.retain(|k| {
        !all.iter().any(|o| {
            o.len() > k.len()
                && o.starts_with(k.as_str())
                && matches!(&o[k.len()..k.len() + 1], "." | "[" | "(")
        })
    });
    keys
}

#[test]
fn every_accepted_key_has_a_behaviour_case() {
    let accepted = accepted_keys();
    let mut covered = BTreeSet::new();
    for case in cases::cases() {
        for k in case.keys {
            assert!(covered.insert(k.clone()), "key {k} has two rows");
        }
    }
    let missing: Vec<&String> = accepted.difference(&covered).collect();
    assert!(
        missing.is_empty(),
        "keys with no behaviour case: {missing:?}"
    );
    let stale: Vec<&String> = covered.difference(&accepted).collect();
    assert!(
        stale.is_empty(),
        "rows for keys the parser does not accept: {stale:?}"
    );
}

/// Runs `jobs` two at a time (the runs are single-threaded).
fn run_all(env: &Env, jobs: Vec<(String, Vec<String>)>) -> Vec<Out> {
    let next = AtomicUsize::new(0);
    let results: Mutex<BTreeMap<usize, Out>> = Mutex::default();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some((name, sets)) = jobs.get(i) else {
                    break;
                };
                let out = env.train(name, sets);
                results.lock().unwrap().insert(i, out);
            });
        }
    });
    results.into_inner().unwrap().into_values().collect()
}

/// Whether the case's run shows its key's effect against the base run; the reason when not.
fn shows(env: &Env, case: &Case, base: &Out, out: &Out) -> Result<(), String> {
    let needs_ok = |o: &Out, what: &str| {
        if o.ok {
            Ok(())
        } else {
            Err(format!("the {what} run failed:\n{}", o.stderr))
        }
    };
    match &case.obs {
        Obs::Fails(_) | Obs::Rescues(_) | Obs::Refused(_) => {}
        _ => {
            needs_ok(base, "base")?;
            needs_ok(out, "case")?;
        }
    }
    let differ = |a: Vec<Value>, b: Vec<Value>, what: &str| {
        if a != b {
            Ok(())
        } else {
            let shown = format!("{a:?}");
            let cut = shown
                .char_indices()
                .nth(300)
                .map_or(shown.len(), |(i, _)| i);
            Err(format!("{what} equal the base's: {}…", &shown[..cut]))
        }
    };
    match &case.obs {
        Obs::Metric(k) => differ(out.series(k), base.series(k), k),
        Obs::Responses => differ(out.responses(), base.responses(), "the saved samples"),
        Obs::Turns => differ(out.turns(), base.turns(), "the agent's turns"),
        Obs::MetricBeyond(k, tol) => {
            let (a, b) = (out.series(k), base.series(k));
            let apart = a.len() != b.len()
                || a.iter()
                    .zip(&b)
                    .any(|(x, y)| match (x.as_f64(), y.as_f64()) {
                        (Some(x), Some(y)) => (x - y).abs() > *tol,
                        _ => x != y,
                    });
            apart
                .then_some(())
                .ok_or(format!("{k} within {tol} of the base's: {a:?} vs {b:?}"))
        }
        Obs::Prompts => differ(out.prompts(), base.prompts(), "the saved prompts"),
        Obs::Weights => (out.weights != base.weights)
            .then_some(())
            .ok_or("the weights equal the base's".into()),
        Obs::Entry(e) => (out.entries.contains(*e) != base.entries.contains(*e))
            .then_some(())
            .ok_or(format!("{e}: {:?} vs {:?}", out.entries, base.entries)),
        Obs::Stderr(t) => (out.stderr.contains(t) && !base.stderr.contains(t))
            .then_some(())
            .ok_or(format!("`{t}` not only in the case's log:\n{}", out.stderr)),
        Obs::Fails(t) => {
            needs_ok(base, "base")?;
            (!out.ok && out.stderr.contains(t))
                .then_some(())
                .ok_or(format!("expected a failure naming `{t}`:\n{}", out.stderr))
        }
        Obs::Rescues(t) => {
            needs_ok(out, "case")?;
            (!base.ok && base.stderr.contains(t))
                .then_some(())
                .ok_or(format!(
                    "expected the base to fail naming `{t}`:\n{}",
                    base.stderr
                ))
        }
        Obs::Refused(t) => {
            let min = "[model]\npath = \"m\"\n[data]\ntask = \"addition\"\n";
            let sets: Vec<String> = case.sets.iter().map(|s| env.fill(s)).collect();
            match ooze_run::Recipe::parse(min, Path::new("r.toml"), &sets) {
                Err(e) if e.to_string().contains(t) => Ok(()),
                other => Err(format!("expected a refusal naming `{t}`, got {other:?}")),
            }
        }
        // The case's own rollout.seed would sample other responses; the replay trains the base's.
        Obs::Replays => (out.weights == base.weights)
            .then_some(())
            .ok_or("the replayed weights differ from the base's".into()),
        Obs::RunDir(d) => Path::new(&env.fill(d))
            .join("metrics.jsonl")
            .exists()
            .then_some(())
            .ok_or(format!("no metrics.jsonl in {d}")),
        Obs::Resource(_) => (out.response_ids() == base.response_ids()
            && out.prompts() == base.prompts())
        .then_some(())
        .ok_or("a resource knob changed what was sampled".into()),
    }
}

#[test]
fn every_key_changes_what_a_run_does() {
    // Each stage's time goes to stderr (shown when the test fails, or with --no-capture).
    let clock = std::time::Instant::now();
    let env = Env::new();
    eprintln!(
        "set-up (models, warm starts, services): {:.0} s",
        clock.elapsed().as_secs_f64()
    );
    let only = std::env::var("RECIPE_KEYS_ONLY").unwrap_or_default();
    let mut cases = cases::cases();
    cases.retain(|c| {
        c.keys
            .iter()
            .any(|k| only.split(',').any(|part| k.contains(part)))
    });
    let mut bases: Vec<Vec<String>> = Vec::new();
    for c in &cases {
        if !bases.contains(&c.base) {
            bases.push(c.base.clone());
        }
    }
    let base_runs = run_all(
        &env,
        bases
            .iter()
            .enumerate()
            .map(|(i, b)| (format!("base-{i}"), b.clone()))
            .collect(),
    );
    eprintln!(
        "{} base runs: done at {:.0} s",
        bases.len(),
        clock.elapsed().as_secs_f64()
    );
    let base_of = |c: &Case| &base_runs[bases.iter().position(|b| *b == c.base).unwrap()];
    let jobs = cases
        .iter()
        .enumerate()
        .filter(|(_, c)| !matches!(c.obs, Obs::Refused(_)))
        .map(|(i, c)| {
            let base_run = base_of(c).dir.display().to_string();
            let sets = c
                .sets
                .iter()
                .map(|s| s.replace("{base_run}", &base_run))
                .collect();
            (i, (format!("case-{i}"), sets))
        })
        .collect::<Vec<_>>();
    let (indices, jobs): (Vec<usize>, Vec<_>) = jobs.into_iter().unzip();
    let outs = run_all(&env, jobs);
    eprintln!(
        "{} case runs: done at {:.0} s",
        outs.len(),
        clock.elapsed().as_secs_f64()
    );
    let mut by_case: BTreeMap<usize, Out> = indices.into_iter().zip(outs).collect();
    let mut failures = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let result = match &c.obs {
            Obs::Refused(_) => shows(&env, c, base_of(c), base_of(c)),
            Obs::Resource(effect) => {
                eprintln!("resource only: {:?}: {effect}", c.keys);
                shows(&env, c, base_of(c), &by_case.remove(&i).unwrap())
            }
            _ => shows(&env, c, base_of(c), &by_case.remove(&i).unwrap()),
        };
        if let Err(e) = result {
            failures.push(format!("{:?} ({:?}): {e}", c.keys, c.obs));
        }
    }
    assert!(
        failures.is_empty(),
        "{} keys show no effect:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
