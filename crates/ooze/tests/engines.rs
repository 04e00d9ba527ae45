//! An RL run on external engines (`rollout.engines`): two `ooze serve` processes, one killed while
//! a rollout is generating on it, a third added to the engines file mid-run. The run finishes,
//! every rollout has all its groups and no aborted sample, and the engines in the rotation hold
//! the latest weights.

mod common;

use ooze_rollout::http_client::JsonClient;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What an engine reports: requests running now and its weight version.
fn engine_info(base: &str) -> Option<(u64, u64)> {
    let info = JsonClient::new(Duration::from_secs(3))
        .get(&format!("{base}/get_server_info"), None)
        .ok()?;
    let e = &info["engine"];
    Some((e["running"].as_u64()?, e["weight_version"].as_u64()?))
}

fn metrics(run: &Path) -> Vec<Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|m: &Value| m["rollout"].as_u64() > Some(0))
        .collect()
}

#[test]
fn an_rl_run_on_two_serve_engines_survives_one_being_killed_mid_rollout() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = d.join("model");
    common::ooze_ok(&[
        "init-model",
        "--family",
        "qwen2",
        "--size",
        "tiny",
        model.to_str().unwrap(),
    ]);
    // Few sequences at once: a rollout spends seconds generating, so the kill lands inside one.
    let serve = || common::serve(&model, &["--context-len", "512", "--max-running", "4"]);
    let ((a, url_a), (b, url_b)) = (serve(), serve());
    let base = |url: &str| url.trim_end_matches("/v1").to_owned();
    let (base_a, base_b) = (base(&url_a), base(&url_b));
    let engines_file = d.join("engines.txt");
    std::fs::write(&engines_file, "").unwrap();
    let run = d.join("run");
    let recipe = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../recipes/addition-cpu.toml");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ooze"))
        .arg("train")
        .arg(recipe)
        .args(["--set", &format!("model.path=\"{}\"", model.display())])
        .args(["--set", &format!("logging.run_dir=\"{}\"", run.display())])
        .args([
            "--set",
            &format!("rollout.engines=[\"{base_a}\", \"{base_b}\"]"),
        ])
        .args([
            "--set",
            &format!("rollout.engines_file=\"{}\"", engines_file.display()),
        ])
        .args(["--set", "rollout.num_rollouts=4"])
        .args(["--set", "rollout.batch_size=16"])
        .args(["--set", "eval.interval=0"])
        .args(["--set", "eval.at_start=false"])
        .args(["--set", "logging.progress=false"])
        .args(["--set", "algorithm.loss.entropy_coef=0.01"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let log = log.clone();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut l = log.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        })
    };
    // Once rollout 1 is done, wait for engine B to be generating rollout 2, and kill it.
    let started = Instant::now();
    while metrics(&run).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "no rollout: {}",
            log.lock().unwrap()
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended: {}",
            log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut running_on_b = false;
    while !running_on_b && started.elapsed() < Duration::from_secs(300) {
        running_on_b = engine_info(&base_b).is_some_and(|(running, _)| running > 0);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(running_on_b, "engine B never ran a request of rollout 2");
    drop(b);
    // A third engine joins through the engines file.
    let (c, url_c) = serve();
    let base_c = base(&url_c);
    std::fs::write(&engines_file, format!("{base_c}\n")).unwrap();
    let status = child.wait().unwrap();
    reader.join().unwrap();
    let log = log.lock().unwrap().clone();
    assert!(status.success(), "{log}");
    assert!(
        log.contains(&format!("router: engine {base_b} is out of the rotation")),
        "{log}"
    );
    assert!(
        log.contains(&format!("router: engine {base_c} is in the rotation")),
        "{log}"
    );
    // Every rollout has all 16 groups of 8, none cut short by the kill.
    let lines = metrics(&run);
    assert_eq!(lines.len(), 4, "{log}");
    for m in &lines {
        assert_eq!(m["rollout/generated_groups"], 16, "{m}");
        assert_eq!(m["rollout/samples"], 128, "{m}");
    }
    for k in 1..=4 {
        let saved =
            std::fs::read_to_string(run.join(format!("rollouts/rollout-{k:06}.jsonl"))).unwrap();
        assert_eq!(saved.lines().count(), 16);
        assert!(
            !saved.contains("\"abort\""),
            "rollout {k} has an aborted sample"
        );
    }
    // The engines in the rotation loaded every step's weights (4 steps, one update each).
    let (_, version_a) = engine_info(&base_a).unwrap();
    let (_, version_c) = engine_info(&base_c).unwrap();
    assert_eq!(version_a, 4);
    assert!(
        version_c >= 1,
        "the engine that joined loaded the weights before its first request"
    );
    assert!(run.join("weights").read_dir().unwrap().count() <= 2);
    drop((a, c));
}

/// The same run with the weights broadcast over a process group (SGLang's
/// `init_weights_update_group` / `update_weights_from_distributed`, Gloo between CPU processes):
/// the engines' log-probs match the trainer's after every update, and when one engine is killed
/// the next update forms the group again without it.
#[test]
fn weights_broadcast_over_a_process_group_reach_every_engine_and_survive_one_leaving() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = d.join("model");
    common::ooze_ok(&[
        "init-model",
        "--family",
        "qwen2",
        "--size",
        "tiny",
        model.to_str().unwrap(),
    ]);
    let serve = || common::serve(&model, &["--context-len", "512", "--max-running", "4"]);
    let ((a, url_a), (b, url_b)) = (serve(), serve());
    let base = |url: &str| url.trim_end_matches("/v1").to_owned();
    let (base_a, base_b) = (base(&url_a), base(&url_b));
    let run = d.join("run");
    let recipe = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../recipes/addition-cpu.toml");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ooze"))
        .arg("train")
        .arg(recipe)
        .args(["--set", &format!("model.path=\"{}\"", model.display())])
        .args(["--set", &format!("logging.run_dir=\"{}\"", run.display())])
        .args([
            "--set",
            &format!("rollout.engines=[\"{base_a}\", \"{base_b}\"]"),
        ])
        .args(["--set", "rollout.weight_sync=\"distributed\""])
        .args(["--set", "rollout.num_rollouts=4"])
        .args(["--set", "rollout.batch_size=16"])
        .args(["--set", "eval.interval=0"])
        .args(["--set", "eval.at_start=false"])
        .args(["--set", "logging.progress=false"])
        .args(["--set", "algorithm.loss.entropy_coef=0.01"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let log = log.clone();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut l = log.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        })
    };
    // After the second update, engine B leaves.
    let started = Instant::now();
    while metrics(&run).len() < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "{}",
            log.lock().unwrap()
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended: {}",
            log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, b_version) = engine_info(&base_b).unwrap();
    drop(b);
    let status = child.wait().unwrap();
    reader.join().unwrap();
    let log = log.lock().unwrap().clone();
    assert!(status.success(), "{log}");
    assert!(
        b_version >= 1,
        "engine B took a broadcast update before it left"
    );
    let lines = metrics(&run);
    assert_eq!(lines.len(), 4, "{log}");
    for m in &lines {
        assert_eq!(m["rollout/samples"], 128, "{m}");
        // The engines generated with the trainer's exact weights (a stale engine is 0.1 off).
        let diff = m["train/mismatch_mean"].as_f64().unwrap();
        assert!(
            diff < 1e-4,
            "engine and trainer log-probs differ by {diff}: {m}"
        );
    }
    // Engine A took all four updates over the group (re-formed without B for the last ones).
    assert_eq!(engine_info(&base_a).unwrap().1, 4, "{log}");
    assert!(!run.join("weights").exists(), "no weights written to disk");
    drop(a);
}
