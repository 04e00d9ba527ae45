//! Asynchronous rollouts (`rollout.mode = "async"`) as a user runs them with `ooze train`, on the
//! CPU with a tiny random model: under an agent program with random tool delays and a long tail
//! of turns, no trained token is ever staler than `rollout.max_staleness`, every token records the
//! weight version that drew it, and every group drawn is trained once or still pending at the
//! end; stale tokens can be masked instead of their groups dropped; a run killed after a
//! checkpoint resumes without losing or repeating a group.

mod common;

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// An agent with a long tail: 1 to 8 turns (most of them few, as drawn from the session id), and
/// between turns a "tool" that sleeps 0 to 150 ms. Standard library only.
const LONG_TAIL_AGENT: &str = r#"
import json, os, random, sys, time, urllib.request
task = json.loads(sys.stdin.readline())
rng = random.Random(os.environ["OOZE_SESSION_ID"])
turns = min(8, 1 + int(rng.expovariate(0.5)))
messages = [{"role": "user", "content": task["prompt"]}]
for turn in range(turns):
    body = {"model": "policy", "messages": messages, "max_tokens": 6}
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "Content-Type": "application/json"})
    reply = json.load(urllib.request.urlopen(request))
    messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
    time.sleep(rng.uniform(0.0, 0.15))
    messages.append({"role": "user", "content": "tool result %d" % rng.randrange(100)})
text = messages[-2]["content"]
print(json.dumps({"reward": float(any(c.isdigit() for c in text)), "metrics": {"turns": turns}}))
"#;

fn plain_recipe(model: &Path, run: &Path, extra: &str) -> String {
    format!(
        r#"
[model]
path = {model:?}
device = "cpu"
[data]
task = "addition"
task_size = 500
[rollout]
num_rollouts = 6
batch_size = 4
n_samples_per_prompt = 4
max_new_tokens = 12
mode = "async"
max_staleness = 1
over_provision = 1.0
[reward]
type = "regex"
pattern = "[0-9]"
[trainer]
lr = 1e-3
save_interval = 1
global_batch_size = 8
[logging]
run_dir = {run:?}
{extra}
"#
    )
}

/// Every saved rollout's groups: rollout index → groups (a killed run may have left the
/// temporary file of an atomic write beside them; it is not a rollout).
fn rollouts(run: &Path) -> BTreeMap<u64, Vec<Value>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(run.join("rollouts")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let Some(index) = name
            .strip_prefix("rollout-")
            .and_then(|n| n.strip_suffix(".jsonl"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        let text = std::fs::read_to_string(&path).unwrap();
        let groups = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        out.insert(index, groups);
    }
    out
}

fn metrics(run: &Path) -> Vec<serde_json::Map<String, Value>> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The weight version of each of a sample's response tokens that the policy drew.
fn trained_versions(sample: &Value) -> Vec<u64> {
    let mask: Vec<u64> = sample["loss_mask"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_u64().unwrap())
        .collect();
    match sample.get("token_versions") {
        Some(v) => v
            .as_array()
            .unwrap()
            .iter()
            .zip(&mask)
            .filter(|(_, &m)| m == 1)
            .map(|(v, _)| v.as_u64().unwrap())
            .collect(),
        // One version for the whole response.
        None if mask.contains(&1) => vec![sample["weight_version"].as_u64().unwrap()],
        None => Vec::new(),
    }
}

/// The groups a run state names as started and not trained.
fn unfinished(state: &Value) -> BTreeSet<u64> {
    state["unfinished"]
        .as_array()
        .map(|u| u.iter().map(|u| u["group"].as_u64().unwrap()).collect())
        .unwrap_or_default()
}

/// The run's state in its newest checkpoint (`unfinished` groups, where the order is).
fn last_state(run: &Path) -> Value {
    let latest = std::fs::read_to_string(run.join("latest")).unwrap();
    let text = std::fs::read_to_string(run.join(latest.trim()).join("trainer_state.json")).unwrap();
    let state: Value = serde_json::from_str(&text).unwrap();
    state["extra"].clone()
}

/// Checks the bound on every trained token, and that each group drawn is trained exactly once or
/// still pending (dropped groups are counted in the metrics, and there are none here unless
/// stale). Each rollout's metrics name the weight version it trained.
fn check_bound_and_accounting(run: &Path, max_staleness: u64) -> usize {
    let rollouts = rollouts(run);
    let lines = metrics(run);
    let trained_at: BTreeMap<u64, u64> = lines
        .iter()
        .filter(|l| l.contains_key("async/policy_version"))
        .map(|l| {
            (
                l["rollout"].as_u64().unwrap(),
                l["async/policy_version"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut trained = BTreeSet::new();
    let mut partial = 0;
    for (&index, groups) in &rollouts {
        assert_eq!(groups.len(), 4, "rollout {index} trains a whole step");
        let version = trained_at[&index];
        for g in groups {
            let number = g["group"].as_u64().unwrap();
            assert!(trained.insert(number), "group {number} trained twice");
            for s in g["samples"].as_array().unwrap() {
                let versions = trained_versions(s);
                for &v in &versions {
                    assert!(v <= version, "a token from the future: {v} > {version}");
                    assert!(
                        version - v <= max_staleness,
                        "rollout {index}: a token of version {v} trained at {version}"
                    );
                }
                if versions.first() != versions.last() {
                    partial += 1;
                }
            }
        }
    }
    let stale: u64 = lines
        .iter()
        .filter_map(|l| l.get("rollout/dropped_stale").and_then(Value::as_u64))
        .sum();
    for l in lines.iter().filter(|l| l.contains_key("train/loss")) {
        assert!(l["async/staleness_max"].as_u64().unwrap() <= max_staleness);
        assert!(l.contains_key("async/engine_busy") && l.contains_key("time/elapsed"));
    }
    let state = last_state(run);
    let pending = unfinished(&state);
    assert!(
        trained.is_disjoint(&pending),
        "a trained group still pending"
    );
    let drawn = state["next_group"].as_u64().unwrap();
    let missing = drawn - (trained.len() + pending.len()) as u64;
    assert_eq!(
        missing, stale,
        "every group drawn is trained, pending, or dropped as stale"
    );
    partial
}

#[test]
fn staleness_stays_bounded_under_random_tool_delays() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::tiny_model(dir.path());
    let data = dir.path().join("train.jsonl");
    let rows: Vec<String> = (0..40)
        .map(|i| {
            serde_json::json!({"prompt": format!("What is {i} + 1?"), "label": (i + 1).to_string()})
                .to_string()
        })
        .collect();
    std::fs::write(&data, rows.join("\n") + "\n").unwrap();
    let program = dir.path().join("agent.py");
    std::fs::write(&program, LONG_TAIL_AGENT).unwrap();
    let run = dir.path().join("run");
    let recipe = plain_recipe(&model, &run, "")
        .replace(
            "[data]\ntask = \"addition\"\ntask_size = 500\n",
            &format!("[data]\npath = {data:?}\ninput_key = \"prompt\"\nlabel_key = \"label\"\n"),
        )
        .replace(
            "[reward]\ntype = \"regex\"\npattern = \"[0-9]\"\n",
            &format!(
                "[agent]\ntype = \"command\"\ncommand = [\"python3\", {program:?}]\nmax_turns = 8\nmax_tokens_per_turn = 6\ndeadline_secs = 60\n[reward]\ntype = \"math\"\n"
            ),
        );
    let path = dir.path().join("recipe.toml");
    std::fs::write(&path, recipe).unwrap();
    common::ooze_ok(&["train", path.to_str().unwrap()]);
    let partial = check_bound_and_accounting(&run, 1);
    // Trajectories of up to 8 turns with tool delays outlive a step: their later turns are
    // drawn under newer weights than their first.
    assert!(partial > 0, "no trajectory spanned a weight update");
    let lines = metrics(&run);
    let turns: Vec<f64> = lines
        .iter()
        .filter_map(|l| l.get("agent/turns").and_then(Value::as_f64))
        .collect();
    assert_eq!(turns.len(), 6);
}

#[test]
fn a_killed_async_run_resumes_without_losing_or_repeating_a_group() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::tiny_model(dir.path());
    let run = dir.path().join("run");
    let path = dir.path().join("recipe.toml");
    std::fs::write(&path, plain_recipe(&model, &run, "")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ooze"))
        .arg("train")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed once its second checkpoint is complete: groups are in flight then.
    let started = Instant::now();
    loop {
        let latest = std::fs::read_to_string(run.join("latest")).unwrap_or_default();
        if latest.trim() >= "checkpoint-000004" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no checkpoint appeared"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let at_kill = last_state(&run);
    let in_flight = unfinished(&at_kill);
    assert!(
        !in_flight.is_empty(),
        "the checkpoint names the groups in flight: {at_kill}"
    );
    common::ooze_ok(&["train", "--resume", run.to_str().unwrap()]);
    check_bound_and_accounting(&run, 1);
    // The groups in flight at the checkpoint were started again, not lost: each is trained in a
    // later rollout or still pending at the end.
    let checkpointed = at_kill["rollout"].as_u64().unwrap();
    let later: BTreeSet<u64> = rollouts(&run)
        .range(checkpointed + 1..)
        .flat_map(|(_, groups)| groups.iter().map(|g| g["group"].as_u64().unwrap()))
        .collect();
    let pending = unfinished(&last_state(&run));
    let stale: u64 = metrics(&run)
        .iter()
        .filter(|l| l["rollout"].as_u64().unwrap_or(0) > checkpointed)
        .filter_map(|l| l.get("rollout/dropped_stale").and_then(Value::as_u64))
        .sum();
    let lost = in_flight
        .iter()
        .filter(|g| !later.contains(g) && !pending.contains(g))
        .count() as u64;
    assert!(
        lost <= stale,
        "{lost} groups in flight at the checkpoint were neither trained nor pending after it"
    );
}

/// A run with `max_staleness` 0 and `stale = POLICY` (groups started a version early go stale),
/// checked for the bound and the accounting; its run directory.
fn run_going_stale(dir: &Path, policy: &str) -> std::path::PathBuf {
    let model = common::tiny_model(dir);
    let run = dir.join("run");
    let path = dir.join("recipe.toml");
    let recipe = plain_recipe(&model, &run, "").replace(
        "max_staleness = 1\n",
        &format!("max_staleness = 0\nstale = \"{policy}\"\n"),
    );
    std::fs::write(&path, recipe).unwrap();
    common::ooze_ok(&["train", path.to_str().unwrap()]);
    // No trained token is older than the weights it trains; each group is trained once (a
    // regenerated one under its own number), pending, or dropped as stale.
    check_bound_and_accounting(&run, 0);
    run
}

/// `key` summed over the run's metrics lines.
fn total(run: &Path, key: &str) -> u64 {
    metrics(run)
        .iter()
        .filter_map(|l| l.get(key).and_then(Value::as_u64))
        .sum()
}

#[test]
fn stale_tokens_can_be_masked_instead_of_dropping_their_groups() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_going_stale(dir.path(), "mask");
    assert!(metrics(&run)
        .iter()
        .all(|l| !l.contains_key("rollout/dropped_stale")));
    assert!(
        total(&run, "async/masked_tokens") > 0,
        "groups started a version early had tokens to mask"
    );
}

#[test]
fn stale_groups_can_be_regenerated_under_the_current_weights() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_going_stale(dir.path(), "regenerate");
    assert!(
        total(&run, "async/regenerated_groups") > 0,
        "groups started a version early were started again"
    );
}
