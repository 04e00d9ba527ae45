//! Agents as programs (`[agent] type = "command"`) trained through the agent gateway, as a user
//! runs them with `ooze train`: a program that misbehaves in every way (hangs, crashes, prints
//! garbage, leaves children behind) is killed and scored 0 without stalling the step, and the
//! shipped Python agent (recipes/python_agent, the real `openai` package) trains end to end.

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn python() -> PathBuf {
    std::env::var_os("OOZE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv/bin/python"))
}

/// Prompts with labels, one per line.
fn write_prompts(path: &Path, n: usize) {
    let rows: Vec<String> = (0..n)
        .map(|i| serde_json::json!({"prompt": format!("What is {i} + {i}?"), "label": (2 * i).to_string()}).to_string())
        .collect();
    std::fs::write(path, rows.join("\n") + "\n").unwrap();
}

/// The samples of every rollout record of a run.
fn samples(run: &Path) -> Vec<Value> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(run.join("rollouts")).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for line in text.lines() {
            let group: Value = serde_json::from_str(line).unwrap();
            out.extend(group["samples"].as_array().unwrap().iter().cloned());
        }
    }
    out
}

/// Processes whose environment holds `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.parse::<u32>().ok()?;
            let env = std::fs::read(format!("/proc/{name}/environ")).ok()?;
            env.split(|&b| b == 0)
                .any(|v| v == marker.as_bytes())
                .then_some(name)
        })
        .collect()
}

/// One program, five behaviours by sample index: 0 answers; 1 hangs after a call; 2 crashes
/// after a call; 3 prints garbage as its last line; 4 answers but leaves a child in a session of
/// its own (escaping the process group) sleeping. It talks to the gateway with the standard
/// library only: any program that speaks HTTP is an agent.
const MISBEHAVING: &str = r#"
import json, os, subprocess, sys, time, urllib.request
task = json.loads(sys.stdin.readline())
body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": task["prompt"]}], "max_tokens": 4}
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps(body).encode(), headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
reply = json.load(urllib.request.urlopen(request))
text = reply["choices"][0]["message"]["content"]
kind = task["index"]
if kind == 1:
    time.sleep(3600)
if kind == 2:
    print("crashing on purpose", file=sys.stderr)
    sys.exit(3)
if kind == 3:
    print("\x00\x01 not json {")
    sys.exit(0)
if kind == 4:
    subprocess.Popen(["sleep", "3600"], start_new_session=True)
print(json.dumps({"answer": text, "reward": 0.5, "metrics": {"kind": kind}}))
"#;

/// A one-rollout recipe running `python3 program` as the agent (`agent`: more `[agent]` keys),
/// `(batch_size, n_samples_per_prompt)`, math reward, into `run`.
fn command_recipe(
    model: &Path,
    data: &Path,
    program: &Path,
    agent: &str,
    (batch, n): (usize, usize),
    run: &Path,
) -> String {
    format!(
        r#"
[model]
path = {model:?}
device = "cpu"
[data]
path = {data:?}
input_key = "prompt"
label_key = "label"
[agent]
type = "command"
command = ["python3", {program:?}]
{agent}
[rollout]
num_rollouts = 1
batch_size = {batch}
n_samples_per_prompt = {n}
[reward]
type = "math"
[logging]
run_dir = {run:?}
"#
    )
}

#[test]
fn misbehaving_agent_programs_are_killed_and_scored_zero() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::tiny_model(dir.path());
    let data = dir.path().join("train.jsonl");
    write_prompts(&data, 4);
    let program = dir.path().join("agent.py");
    std::fs::write(&program, MISBEHAVING).unwrap();
    let run = dir.path().join("run");
    // Every process of this run's programs carries this variable (the recipe's env).
    let marker = format!("OOZE_TEST_MARK={}", std::process::id());
    let agent = format!(
        "env = {{ OOZE_TEST_MARK = \"{}\" }}\nmax_turns = 2\nmax_tokens_per_turn = 4\ndeadline_secs = 4",
        std::process::id()
    );
    let recipe = command_recipe(&model, &data, &program, &agent, (1, 5), &run);
    let recipe_path = dir.path().join("recipe.toml");
    std::fs::write(&recipe_path, recipe).unwrap();
    common::ooze_ok(&["train", recipe_path.to_str().unwrap()]);

    let samples = samples(&run);
    let by_index = |i: u64| {
        samples
            .iter()
            .find(|s| s["index"] == i)
            .unwrap_or_else(|| panic!("no sample of execution {i}: {samples:?}"))
    };
    // 0 and 4 answered with their own reward; 3's garbage line is no result, so [reward]
    // judged its last assistant text (a random model's: wrong).
    for i in [0, 4] {
        assert_eq!(by_index(i)["reward"], 0.5, "{}", by_index(i));
        assert_eq!(by_index(i)["trained"], true);
    }
    assert_eq!(by_index(3)["reward"], 0.0, "{}", by_index(3));
    assert_eq!(by_index(3)["agent_metrics"]["result_line"], 0.0);
    assert!(by_index(3)["loss_mask"]
        .as_array()
        .unwrap()
        .contains(&1.into()));
    // 1 (hung) and 2 (crashed) failed with reward 0, saying why.
    let error = |i: u64| by_index(i)["error"].as_str().unwrap_or_default().to_owned();
    assert!(error(1).contains("deadline"), "{}", by_index(1));
    assert!(
        error(2).contains("status 3") && error(2).contains("crashing on purpose"),
        "{}",
        by_index(2)
    );
    for i in [1, 2] {
        assert_eq!(by_index(i)["reward"], 0.0);
        assert_eq!(by_index(i)["trained"], false);
    }
    // Nothing is left behind: not the hung program, not the escaped child.
    assert_eq!(processes_with(&marker), Vec::<String>::new());
    // Logs: each execution's stderr, each session's calls.
    let stderr = std::fs::read_to_string(run.join("agent/g0-s2.stderr")).unwrap();
    assert!(stderr.contains("crashing on purpose"), "{stderr}");
    let calls = std::fs::read_to_string(run.join("gateway/g0-s0.jsonl")).unwrap();
    let call: Value = serde_json::from_str(calls.lines().next().unwrap()).unwrap();
    assert_eq!(call["request"]["model"], "gpt-4o-mini");
    assert_eq!(
        call["tokens"].as_array().unwrap().len(),
        call["log_probs"].as_array().unwrap().len()
    );
}

/// An agent that calls the gateway, then tries another port of the host (`$HOST_PORT`, a listener
/// of the test): it reports whether it got through.
const NETWORK_PROBE: &str = r#"
import json, os, socket, sys, urllib.request
task = json.loads(sys.stdin.readline())
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": task["prompt"]}], "max_tokens": 2}).encode()
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
text = json.load(urllib.request.urlopen(request, timeout=60))["choices"][0]["message"]["content"]
try:
    socket.create_connection(("127.0.0.1", int(os.environ["HOST_PORT"])), timeout=5).close()
    reached = 1
except OSError:
    reached = 0
print(json.dumps({"answer": text, "metrics": {"reached_host": reached}}))
"#;

/// `agent.network = "gateway"` (the default): where the kernel gives a network namespace (as root,
/// or through a user namespace), the program reaches the gateway and no other port of the host;
/// `"host"` reaches both.
#[test]
fn agent_programs_reach_the_gateway_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::tiny_model(dir.path());
    let data = dir.path().join("train.jsonl");
    write_prompts(&data, 2);
    let program = dir.path().join("agent.py");
    std::fs::write(&program, NETWORK_PROBE).unwrap();
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = host.local_addr().unwrap().port();
    let run_with = |network: &str| {
        let run = dir.path().join(format!("run-{network}"));
        let agent = format!(
            "env = {{ HOST_PORT = \"{port}\" }}\nnetwork = \"{network}\"\nmax_tokens_per_turn = 2"
        );
        let recipe = command_recipe(&model, &data, &program, &agent, (2, 2), &run);
        let path = dir.path().join(format!("{network}.toml"));
        std::fs::write(&path, recipe).unwrap();
        common::ooze_ok(&["train", path.to_str().unwrap()]);
        let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
        let step: Value = serde_json::from_str(metrics.lines().next().unwrap()).unwrap();
        assert_eq!(step["agent/failed_frac"], 0.0, "{step}");
        assert_eq!(step["agent/gateway/calls"], 1.0, "{step}");
        (
            step["agent/network_jailed"].as_f64().unwrap(),
            step["agent/reached_host"].as_f64().unwrap(),
        )
    };
    let (jailed, reached) = run_with("gateway");
    // Root can always make a network namespace (CI runs as root).
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .unwrap()
        .stdout
        == b"0\n";
    assert!(
        !root || jailed == 1.0,
        "root, yet the program was not jailed"
    );
    if jailed == 1.0 {
        assert_eq!(
            reached, 0.0,
            "a jailed program reached another port of the host"
        );
    } else {
        eprintln!(
            "this kernel gives no network namespace here: the program used the host's network"
        );
        assert_eq!(reached, 1.0);
    }
    assert_eq!(run_with("host"), (0.0, 1.0));
}

/// `ooze train` on the shipped recipe `recipes/NAME` for one rollout of 2 prompts × 2
/// executions, on a random model and the recipe's own generated data, with `sets`; returns the
/// run directory. Every execution's calls must be recorded as samples, token-exactly.
fn train_shipped_recipe(dir: &Path, name: &str, sets: &[String]) -> PathBuf {
    let model = common::tiny_model(dir);
    let data = dir.join("data");
    let made = std::process::Command::new(python())
        .arg(root().join(format!("recipes/{name}/make_data.py")))
        .arg(&data)
        .args(["--n", "50", "--test", "4"])
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let run = dir.join("run");
    let agent = root().join(format!("recipes/{name}/agent.py"));
    let recipe = root().join(format!("recipes/{name}/recipe.toml"));
    let mut args: Vec<String> = vec!["train".into(), recipe.to_str().unwrap().into()];
    let mut set = |key: &str, value: String| {
        args.push("--set".into());
        args.push(format!("{key}={value}"));
    };
    set("model.path", format!("{model:?}"));
    set("model.device", "\"cpu\"".into());
    set("data.path", format!("{:?}", data.join("train.jsonl")));
    set(
        "agent.command",
        format!("[{:?}, {agent:?}]", python().to_str().unwrap()),
    );
    set(
        "eval.datasets",
        format!(
            "[{{name = \"test\", path = {:?}, n_samples = 1}}]",
            data.join("test.jsonl")
        ),
    );
    set("eval.interval", "1".into());
    set("rollout.num_rollouts", "1".into());
    set("rollout.batch_size", "2".into());
    set("rollout.n_samples_per_prompt", "2".into());
    set("logging.run_dir", format!("{run:?}"));
    for s in sets {
        args.push("--set".into());
        args.push(s.clone());
    }
    common::ooze_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let samples = samples(&run);
    assert!(!samples.is_empty());
    for s in &samples {
        assert_eq!(s["error"], Value::Null, "{s}");
        let m = &s["agent_metrics"];
        assert!(m["gateway/calls"].as_f64().unwrap() >= 1.0, "{s}");
        assert_eq!(m["gateway/retokenized_turns"], 0.0, "{s}");
        assert_eq!(m["result_line"], 1.0, "{s}");
        let mask = s["loss_mask"].as_array().unwrap();
        assert_eq!(mask.len(), s["log_probs"].as_array().unwrap().len());
        assert!(mask.contains(&1.into()));
    }
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert!(metrics.contains("agent/gateway/calls"), "{metrics}");
    run
}

/// recipes/python_agent's agent (the `openai` package, a tool loop) through `ooze train`.
#[test]
fn the_python_agent_recipe_trains_through_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    train_shipped_recipe(dir.path(), "python_agent", &[]);
}

/// recipes/agents_sdk: the OpenAI Agents SDK, unmodified (its Responses API calls), through
/// `ooze train`, scored by the recipe's Python reward. A random model's answers are wrong, so
/// the reward is checked on the saved answers by the same rule.
#[test]
fn the_agents_sdk_recipe_trains_through_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let reward = root().join("recipes/agents_sdk/reward.py");
    let run = train_shipped_recipe(
        dir.path(),
        "agents_sdk",
        &[format!(
            "reward.path=\"{}:price_correct\"",
            reward.display()
        )],
    );
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert!(metrics.contains("agent/gateway/calls"), "{metrics}");
    // The Agents SDK talks Responses: the session logs hold /v1/responses calls.
    let logs: Vec<_> = std::fs::read_dir(run.join("gateway"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    assert!(!logs.is_empty());
    assert!(
        logs.iter().all(|l| l.contains("\"api\":\"responses\"")),
        "{}",
        logs[0]
    );
}

/// An agent on the standard library alone: a call, then a barrier (a file per execution in
/// argv[1]; it waits until argv[2] are there, two minutes at most), then a second call in the same
/// conversation; it reports how many executions it saw at once.
const BARRIER_AGENT: &str = r#"
import json, os, sys, time, urllib.request
task = json.loads(sys.stdin.readline())
here, want = sys.argv[1], int(sys.argv[2])

def chat(messages):
    body = json.dumps({"model": "m", "messages": messages, "max_tokens": 4}).encode()
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(request, timeout=600))["choices"][0]["message"]["content"]

messages = [{"role": "user", "content": task["prompt"]}]
messages.append({"role": "assistant", "content": chat(messages)})
open(os.path.join(here, f"{task['group']}-{task['index']}"), "w").close()
deadline = time.time() + 120
while len(os.listdir(here)) < want and time.time() < deadline:
    time.sleep(0.05)
seen = len(os.listdir(here))
messages.append({"role": "user", "content": "Again."})
chat(messages)
print(json.dumps({"answer": "0", "metrics": {"seen_at_once": seen}}))
"#;

/// 256 agent programs at once, each holding its gateway session open across a barrier that only
/// opens when all 256 have made their first call: every execution finishes, with both calls in
/// its sample, and saw the other 255 running.
#[test]
fn two_hundred_fifty_six_agent_programs_at_once() {
    const N: usize = 256;
    let dir = tempfile::tempdir().unwrap();
    let model = common::tiny_model(dir.path());
    let data = dir.path().join("train.jsonl");
    write_prompts(&data, 32);
    let program = dir.path().join("agent.py");
    std::fs::write(&program, BARRIER_AGENT).unwrap();
    let barrier = dir.path().join("barrier");
    std::fs::create_dir(&barrier).unwrap();
    let run = dir.path().join("run");
    let recipe = format!(
        r#"
[model]
path = {model:?}
device = "cpu"
[data]
path = {data:?}
input_key = "prompt"
label_key = "label"
[agent]
type = "command"
command = ["python3", {program:?}, {barrier:?}, "{N}"]
max_turns = 2
max_tokens_per_turn = 4
deadline_secs = 300
[rollout]
num_rollouts = 1
batch_size = 32
n_samples_per_prompt = 8
max_new_tokens = 4
[reward]
type = "math"
[logging]
run_dir = {run:?}
tensorboard = false
report = false
progress = false
"#
    );
    let path = dir.path().join("recipe.toml");
    std::fs::write(&path, recipe).unwrap();
    common::ooze_ok(&["train", path.to_str().unwrap()]);
    let samples = samples(&run);
    for s in &samples {
        assert_eq!(s["error"], Value::Null, "{s}");
        let m = &s["agent_metrics"];
        assert_eq!(m["seen_at_once"], N as f64, "{s}");
        assert_eq!(m["gateway/calls"], 2.0, "{s}");
    }
    // An execution's first sample has no `sibling` field.
    let executions = samples
        .iter()
        .filter(|s| s.get("sibling").is_none())
        .count();
    assert_eq!(executions, N, "every execution left its sample");
    assert_eq!(std::fs::read_dir(&barrier).unwrap().count(), N);
}
