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
use std::sync::{Arc, Mutex};
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

/// The run logged all four rollouts whole, each generated with the trainer's exact weights
/// (engine and trainer log-probs agree; a stale engine is 0.1 off).
fn assert_four_fresh_rollouts(run: &Path, log: &str) {
    let lines = metrics(run);
    assert_eq!(lines.len(), 4, "{log}");
    for m in &lines {
        assert_eq!(m["rollout/samples"], 128, "{m}");
        let diff = m["train/mismatch_mean"].as_f64().unwrap();
        assert!(
            diff < 1e-4,
            "engine and trainer log-probs differ by {diff}: {m}"
        );
    }
}

/// A tiny model and two `ooze serve` engines on it (few sequences at once: a rollout spends
/// seconds generating, so a kill lands inside one), with their base URLs.
struct Setup {
    dir: tempfile::TempDir,
    model: std::path::PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let model = common::tiny_model(dir.path());
        Setup { dir, model }
    }

    fn serve(&self) -> (common::Server, String) {
        let (server, url) =
            common::serve(&self.model, &["--context-len", "512", "--max-running", "4"]);
        (server, url.trim_end_matches("/v1").to_owned())
    }

    /// `ooze train` of the CPU demo's recipe for 4 rollouts of 16 prompts × 8 on `engines`,
    /// with an entropy bonus (every step moves the weights) and `extra` settings; its stderr is
    /// collected as it comes.
    fn train(&self, engines: &[&str], extra: &[String]) -> Training {
        let run = self.dir.path().join("run");
        let recipe = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../recipes/addition-cpu.toml");
        let engines: Vec<String> = engines.iter().map(|e| format!("\"{e}\"")).collect();
        let mut sets = vec![
            format!("model.path=\"{}\"", self.model.display()),
            format!("logging.run_dir=\"{}\"", run.display()),
            format!("rollout.engines=[{}]", engines.join(", ")),
            "rollout.num_rollouts=4".into(),
            "rollout.batch_size=16".into(),
            "eval.interval=0".into(),
            "eval.at_start=false".into(),
            "logging.progress=false".into(),
            "algorithm.loss.entropy_coef=0.01".into(),
        ];
        sets.extend(extra.iter().cloned());
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ooze"));
        cmd.arg("train").arg(recipe);
        for s in &sets {
            cmd.args(["--set", s]);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(String::new()));
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
        Training {
            child,
            log,
            reader,
            run,
        }
    }
}

/// A running `ooze train`.
struct Training {
    child: std::process::Child,
    log: Arc<Mutex<String>>,
    reader: std::thread::JoinHandle<()>,
    run: std::path::PathBuf,
}

impl Training {
    /// Waits until the run has logged `n` rollouts.
    fn wait_for_rollouts(&mut self, n: usize) {
        let started = Instant::now();
        while metrics(&self.run).len() < n {
            assert!(
                started.elapsed() < Duration::from_secs(300),
                "no rollout {n}: {}",
                self.log.lock().unwrap()
            );
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "the run ended: {}",
                self.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the run to end; it must succeed. Returns its log.
    fn finish(mut self) -> String {
        let status = self.child.wait().unwrap();
        self.reader.join().unwrap();
        let log = self.log.lock().unwrap().clone();
        assert!(status.success(), "{log}");
        log
    }
}

#[test]
fn an_rl_run_on_two_serve_engines_survives_one_being_killed_mid_rollout() {
    let setup = Setup::new();
    let ((a, base_a), (b, base_b)) = (setup.serve(), setup.serve());
    let engines_file = setup.dir.path().join("engines.txt");
    std::fs::write(&engines_file, "").unwrap();
    let mut training = setup.train(
        &[&base_a, &base_b],
        &[format!(
            "rollout.engines_file=\"{}\"",
            engines_file.display()
        )],
    );
    // Once rollout 1 is done, wait for engine B to be generating rollout 2, and kill it.
    training.wait_for_rollouts(1);
    let started = Instant::now();
    let mut running_on_b = false;
    while !running_on_b && started.elapsed() < Duration::from_secs(300) {
        running_on_b = engine_info(&base_b).is_some_and(|(running, _)| running > 0);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(running_on_b, "engine B never ran a request of rollout 2");
    drop(b);
    // A third engine joins through the engines file.
    let (c, base_c) = setup.serve();
    std::fs::write(&engines_file, format!("{base_c}\n")).unwrap();
    let run = training.run.clone();
    let log = training.finish();
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
    let setup = Setup::new();
    let ((a, base_a), (b, base_b)) = (setup.serve(), setup.serve());
    let mut training = setup.train(
        &[&base_a, &base_b],
        &["rollout.weight_sync=\"distributed\"".into()],
    );
    // After the second update, engine B leaves.
    training.wait_for_rollouts(2);
    let (_, b_version) = engine_info(&base_b).unwrap();
    drop(b);
    let run = training.run.clone();
    let log = training.finish();
    assert!(
        b_version >= 1,
        "engine B took a broadcast update before it left"
    );
    assert_four_fresh_rollouts(&run, &log);
    // Engine A took all four updates over the group (formed again without B for the last ones).
    assert_eq!(engine_info(&base_a).unwrap().1, 4, "{log}");
    assert!(!run.join("weights").exists(), "no weights written to disk");
    drop(a);
}

/// Disaggregated on one machine: `trainer.gpus = 2` and `rollout.gpus = 2` (CPU processes here):
/// `ooze train` starts two trainer ranks itself, rank 0 starts two `ooze serve` engines, generates
/// every rollout over them and broadcasts every step's weights to both (`weight_sync = auto`);
/// the ranks train on the exchanged groups. When the run ends, its engines are gone.
#[test]
fn a_run_starts_its_own_engines_beside_two_trainer_ranks_and_stops_them() {
    let setup = Setup::new();
    let training = setup.train(
        &[],
        &[
            "trainer.gpus=2".into(),
            "rollout.gpus=2".into(),
            "rollout.max_running=4".into(),
        ],
    );
    let run = training.run.clone();
    let log = training.finish();
    assert!(log.contains("ranks: 2 joined over Gloo"), "{log}");
    assert!(log.contains("engines: 2 ready"), "{log}");
    assert_four_fresh_rollouts(&run, &log);
    for i in 0..2 {
        let engine_log = std::fs::read_to_string(run.join(format!("engines/engine-{i}.log")))
            .unwrap_or_else(|e| panic!("engine {i}'s log: {e}"));
        assert!(
            engine_log.contains("weights version 4: ") && engine_log.contains("from group"),
            "engine {i} took every update over the group: {engine_log}"
        );
        assert!(
            engine_log.contains("ooze serve: shutting down"),
            "{engine_log}"
        );
    }
    assert!(!run.join("weights").exists(), "no weights written to disk");
    assert!(run.join("final-model/model.safetensors").exists(), "{log}");
}

/// Asynchronous rollouts beside several trainer ranks: rank 0 keeps groups generating on the
/// run's own engine while both ranks train on the exchanged groups, and the engine takes every
/// step's weights over the group. Every step trains whole groups, none staler than the bound,
/// and groups in flight at an update go on under the new weights.
#[test]
fn asynchronous_rollouts_feed_two_trainer_ranks_within_the_staleness_bound() {
    let setup = Setup::new();
    let training = setup.train(
        &[],
        &[
            "trainer.gpus=2".into(),
            "rollout.gpus=1".into(),
            "rollout.mode=\"async\"".into(),
            "rollout.max_staleness=1".into(),
        ],
    );
    let run = training.run.clone();
    let log = training.finish();
    assert!(log.contains("ranks: 2 joined over Gloo"), "{log}");
    assert!(log.contains("rollout: \"async\""), "{log}");
    let lines = metrics(&run);
    assert_eq!(lines.len(), 4, "{log}");
    for (i, m) in lines.iter().enumerate() {
        assert_eq!(m["rollout/samples"], 128, "{m}");
        assert_eq!(m["async/policy_version"], i as u64, "{m}");
        assert!(m["async/staleness_max"].as_u64().unwrap() <= 1, "{m}");
    }
    let partial: u64 = lines
        .iter()
        .map(|m| m["async/partial_samples"].as_u64().unwrap())
        .sum();
    let started: u64 = lines
        .iter()
        .map(|m| m["async/started_groups"].as_u64().unwrap())
        .sum();
    assert!(
        started > 4 * 16,
        "groups beyond the steps' own were in flight: {started}"
    );
    let engine_log = std::fs::read_to_string(run.join("engines/engine-0.log")).unwrap();
    assert!(
        engine_log.contains("weights version 4: "),
        "the engine took every update: {engine_log}"
    );
    assert!(partial > 0, "no sample went on across a weight update");
    assert!(run.join("final-model/model.safetensors").exists(), "{log}");
}

/// The same run over vLLM's API (`rollout.engine_api = "vllm"`): generation through
/// `/v1/completions` with token ids (`return_token_ids`, `logprobs`), new weights through
/// `/collective_rpc` `reload_weights` and `/reset_prefix_cache` — what a vLLM server started with
/// `VLLM_SERVER_DEV_MODE=1` answers, and what `ooze serve` answers too. The engines' log-probs
/// match the trainer's after every update.
#[test]
fn a_run_over_vllms_api_generates_by_completions_and_reloads_weights_from_disk() {
    let setup = Setup::new();
    let ((a, base_a), (b, base_b)) = (setup.serve(), setup.serve());
    let training = setup.train(&[&base_a, &base_b], &["rollout.engine_api=\"vllm\"".into()]);
    let run = training.run.clone();
    let log = training.finish();
    assert!(log.contains("(vLLM's API)"), "{log}");
    assert_four_fresh_rollouts(&run, &log);
    for (server, base) in [(&a, &base_a), (&b, &base_b)] {
        assert_eq!(engine_info(base).unwrap().1, 4, "{base}: {log}");
        let served = server.log();
        assert!(
            served.contains("weights version 4: reloaded") && !served.contains(": loaded "),
            "{base} took the weights through /collective_rpc: {served}"
        );
    }
    for k in 1..=4 {
        let saved =
            std::fs::read_to_string(run.join(format!("rollouts/rollout-{k:06}.jsonl"))).unwrap();
        assert!(
            !saved.contains("\"abort\""),
            "rollout {k} has an aborted sample"
        );
    }
    assert!(run.join("weights").exists(), "weights went by disk");
    drop((a, b));
}
