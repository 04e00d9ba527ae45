//! `ooze sft` on several CPU ranks (Gloo), as a user starts them: `--nproc-per-node 2` and the
//! wheel's own `torchrun --no-python` take the one-process steps (losses within 1e-5, the same
//! held-out loss and final weights); a two-rank run resumed from its checkpoint logs exactly the
//! losses of an uninterrupted one; a rank that fails ends the job with its name.

use ooze_torch::tch::{Kind, Tensor};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn ooze() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ooze"));
    cmd.stdin(Stdio::null());
    cmd
}

fn setup(dir: &Path) {
    let status = ooze()
        .args([
            "init-model",
            "--family",
            "qwen2",
            "--tokenizer-vocab",
            "300",
        ])
        .arg(dir.join("model"))
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let lines: Vec<String> = (0..120)
        .map(|i| {
            let (a, b) = (i * 7 % 10, i * 3 % 10);
            serde_json::json!({"messages": [
                {"role": "user", "content": format!("{a}+{b}")},
                {"role": "assistant", "content": format!("{}", a + b)},
            ]})
            .to_string()
        })
        .collect();
    std::fs::write(dir.join("train.jsonl"), lines.join("\n")).unwrap();
}

/// `ooze sft` arguments for run directory `out` of `steps` steps, constant learning rate.
fn sft_args(dir: &Path, out: &str, steps: u32) -> Vec<String> {
    let mut a: Vec<String> = [
        "sft",
        "--device",
        "cpu",
        "--batch-size",
        "12",
        "--lr",
        "1e-3",
        "--decay",
        "constant",
        "--save-every",
        "3",
        "--eval-every",
        "3",
        "--eval-fraction",
        "0.1",
        // Several micro-batches per rank.
        "--micro-batch-tokens",
        "64",
    ]
    .map(String::from)
    .to_vec();
    a.extend(["--max-steps".into(), steps.to_string()]);
    for (flag, path) in [
        ("--model", dir.join("model")),
        ("--data", dir.join("train.jsonl")),
        ("--out", dir.join(out)),
    ] {
        a.push(flag.into());
        a.push(path.display().to_string());
    }
    a
}

fn ok(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn metrics(run: &Path) -> Vec<Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The step losses and held-out losses of a run, in order.
fn losses(run: &Path) -> Vec<f64> {
    metrics(run)
        .iter()
        .flat_map(|m| {
            ["loss", "eval_loss", "eval_loss_before"]
                .iter()
                .filter_map(|k| m[*k].as_f64())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn weights(run: &Path) -> Vec<(String, Tensor)> {
    let mut w = Tensor::read_safetensors(run.join("final-model/model.safetensors")).unwrap();
    w.sort_by(|a, b| a.0.cmp(&b.0));
    w
}

fn weight_diff(a: &Path, b: &Path) -> f64 {
    weights(a)
        .iter()
        .zip(weights(b))
        .map(|((na, ta), (nb, tb))| {
            assert_eq!(na, &nb);
            (ta.to_kind(Kind::Double) - tb.to_kind(Kind::Double))
                .abs()
                .max()
                .double_value(&[])
        })
        .fold(0.0, f64::max)
}

fn torchrun() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = std::env::var_os("OOZE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".venv/bin/python"));
    python.with_file_name("torchrun")
}

#[test]
fn two_ranks_by_flag_and_by_torchrun_take_the_one_process_steps() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d);
    ok(
        ooze().args(sft_args(d, "one", 6)).output().unwrap(),
        "one process",
    );
    let flag = ok(
        ooze()
            .args(sft_args(d, "flag", 6))
            .args(["--nproc-per-node", "2"])
            .output()
            .unwrap(),
        "--nproc-per-node 2",
    );
    let log = String::from_utf8_lossy(&flag.stderr);
    assert!(log.contains("ranks: 2 joined over Gloo"), "{log}");
    // torchrun serves the rendezvous store itself (TORCHELASTIC_USE_AGENT_STORE).
    ok(
        Command::new(torchrun())
            .args([
                "--nproc-per-node",
                "2",
                "--no-python",
                env!("CARGO_BIN_EXE_ooze"),
            ])
            .args(sft_args(d, "torchrun", 6))
            .stdin(Stdio::null())
            .output()
            .expect("starting torchrun (run scripts/setup.sh)"),
        "torchrun --nproc-per-node 2",
    );
    let one = losses(&d.join("one"));
    assert_eq!(one.len(), 9, "6 steps and 3 held-out losses: {one:?}");
    for run in ["flag", "torchrun"] {
        let many = losses(&d.join(run));
        assert_eq!(many.len(), one.len());
        for (a, b) in one.iter().zip(&many) {
            assert!((a - b).abs() < 1e-5, "{run}: {many:?} against {one:?}");
        }
        let w = weight_diff(&d.join("one"), &d.join(run));
        assert!(w < 1e-5, "{run}: final weights differ by {w}");
        let settings = std::fs::read_to_string(d.join(run).join("sft_config.json")).unwrap();
        assert!(settings.contains("\"ranks\": 2"), "{settings}");
    }
    // The steps moved the weights (equal final weights are not both untouched).
    let moved = Tensor::read_safetensors(d.join("model/model.safetensors")).unwrap();
    let start: f64 = moved
        .iter()
        .map(|(_, t)| t.abs().sum(Kind::Double).double_value(&[]))
        .sum();
    let end: f64 = weights(&d.join("one"))
        .iter()
        .map(|(_, t)| t.abs().sum(Kind::Double).double_value(&[]))
        .sum();
    assert!((start - end).abs() > 1e-3, "{start} {end}");
}

#[test]
fn a_two_rank_run_resumed_from_its_checkpoint_takes_the_same_steps() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d);
    let two = |out: &str, steps: u32, resume: bool, sharding: &str| {
        let mut cmd = ooze();
        cmd.args(sft_args(d, out, steps))
            .args(["--nproc-per-node", "2", "--sharding", sharding]);
        if resume {
            cmd.arg("--resume");
        }
        ok(cmd.output().unwrap(), out);
    };
    let step_losses =
        |m: &[Value]| -> Vec<f64> { m.iter().filter_map(|l| l["loss"].as_f64()).collect() };
    // Whole on every rank, and sharded (each rank writing its optimizer shard in the background).
    for sharding in ["replicated", "sharded"] {
        let (whole, split) = (format!("whole-{sharding}"), format!("split-{sharding}"));
        two(&whole, 6, false, sharding);
        two(&split, 3, false, sharding);
        two(&split, 6, true, sharding);
        let (a, b) = (metrics(&d.join(&whole)), metrics(&d.join(&split)));
        assert_eq!(step_losses(&a), step_losses(&b), "{sharding}");
        assert_eq!(step_losses(&a).len(), 6);
        assert_eq!(
            weight_diff(&d.join(&whole), &d.join(&split)),
            0.0,
            "{sharding}"
        );
    }
    assert!(d
        .join("split-sharded/checkpoint-000006/optimizer-rank-00001-of-00002")
        .exists());
    let sharded = losses(&d.join("whole-sharded"));
    let replicated = losses(&d.join("whole-replicated"));
    for (a, b) in sharded.iter().zip(&replicated) {
        assert!(
            (a - b).abs() < 1e-5,
            "sharded {sharded:?} against {replicated:?}"
        );
    }
}

#[test]
fn a_failing_rank_ends_the_job_and_a_launched_rank_refuses_to_launch() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d);
    let mut args = sft_args(d, "bad", 2);
    let data = args.iter().position(|a| a == "--data").unwrap();
    args[data + 1] = d.join("missing.jsonl").display().to_string();
    let out = ooze()
        .args(&args)
        .args(["--nproc-per-node", "2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("missing.jsonl"), "{log}");
    assert!(log.contains("of 2 failed"), "{log}");

    let out = ooze()
        .args(sft_args(d, "nested", 2))
        .args(["--nproc-per-node", "2"])
        .envs([("WORLD_SIZE", "2"), ("RANK", "0")])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("already a rank of a launched job (WORLD_SIZE=2)"),
        "{log}"
    );
}

/// `ooze train` of the CPU demo's recipe for 2 rollouts of 8 prompts × 8, with an entropy bonus,
/// in `run`.
fn train(d: &Path, run: &str, extra: &[&str]) -> Output {
    let recipe = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../recipes/addition-cpu.toml");
    let mut cmd = ooze();
    cmd.arg("train").arg(recipe);
    for kv in [
        format!("model.path=\"{}\"", d.join("sft/final-model").display()),
        format!("logging.run_dir=\"{}\"", d.join(run).display()),
        "rollout.num_rollouts=2".into(),
        "rollout.batch_size=8".into(),
        "eval.interval=2".into(),
        "logging.progress=false".into(),
        // A gradient even where a group's rewards are all equal: every step moves the weights.
        "algorithm.loss.entropy_coef=0.01".into(),
    ] {
        cmd.args(["--set", &kv]);
    }
    ok(cmd.args(extra).output().unwrap(), run)
}

/// One saved group: its number, its prompt's line, its first sample's seed, its responses.
type SavedGroup = (u64, u64, u64, Vec<Value>);

/// Each rollout's groups, as saved.
fn rollouts(run: &Path) -> Vec<Vec<SavedGroup>> {
    (1..=2)
        .map(|k| {
            std::fs::read_to_string(run.join(format!("rollouts/rollout-{k:06}.jsonl")))
                .unwrap()
                .lines()
                .map(|l| {
                    let g: Value = serde_json::from_str(l).unwrap();
                    let samples = g["samples"].as_array().unwrap();
                    (
                        g["group"].as_u64().unwrap(),
                        g["prompt"]["source_line"].as_u64().unwrap(),
                        samples[0]["seed"].as_u64().unwrap(),
                        samples.iter().map(|s| s["response_ids"].clone()).collect(),
                    )
                })
                .collect()
        })
        .collect()
}

#[test]
fn train_on_two_ranks_deals_the_prompts_and_trains_on_the_whole_rollout() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    setup(d);
    // A warm start that sometimes answers right, so the steps have advantages.
    ok(
        ooze()
            .args(["task", "addition"])
            .arg(d.join("add.jsonl"))
            .args(["--n", "2000", "--demonstrations"])
            .output()
            .unwrap(),
        "task",
    );
    let mut sft = ooze();
    sft.args([
        "sft",
        "--device",
        "cpu",
        "--batch-size",
        "64",
        "--lr",
        "5e-3",
    ])
    .args([
        "--max-steps",
        "60",
        "--eval-every",
        "1000",
        "--save-every",
        "1000",
    ])
    .arg("--model")
    .arg(d.join("model"))
    .arg("--data")
    .arg(d.join("add.jsonl"))
    .arg("--out")
    .arg(d.join("sft"));
    ok(sft.output().unwrap(), "sft");
    train(d, "one", &[]);
    let two = train(d, "two", &["--nproc-per-node", "2"]);
    let log = String::from_utf8_lossy(&two.stderr);
    assert!(log.contains("ranks: 2 joined over Gloo"), "{log}");
    // Rank 0 alone evaluates and writes.
    assert_eq!(log.matches("eval heldout: pass@1").count(), 2, "{log}");
    let (one, many) = (rollouts(&d.join("one")), rollouts(&d.join("two")));
    // The same prompts with the same group numbers and seeds, in the same order (dealt to the
    // two ranks, gathered back).
    let deal = |r: &[Vec<SavedGroup>]| -> Vec<Vec<(u64, u64, u64)>> {
        r.iter()
            .map(|g| g.iter().map(|(a, b, c, _)| (*a, *b, *c)).collect())
            .collect()
    };
    assert_eq!(deal(&one), deal(&many));
    assert_eq!(
        deal(&many)[1][0].0,
        8,
        "the second rollout continues the draws"
    );
    let lines = |run: &str| -> Vec<Value> {
        metrics(&d.join(run))
            .into_iter()
            .filter(|m| m["rollout"].as_u64() > Some(0))
            .collect()
    };
    let (m1, m2) = (lines("one"), lines("two"));
    assert_eq!(m2.len(), 2);
    for (a, b) in m1.iter().zip(&m2) {
        for key in ["rollout/samples", "train/steps", "step"] {
            assert_eq!(a[key], b[key], "{key}");
        }
    }
    // With the same responses (the engines' arithmetic agrees on these shapes), the steps are
    // the one process's.
    let same_responses = one
        .iter()
        .zip(&many)
        .all(|(a, b)| a.iter().zip(b).all(|(x, y)| x.3 == y.3));
    if same_responses {
        for (a, b) in m1.iter().zip(&m2) {
            for key in ["reward/mean", "train/loss", "train/grad_norm"] {
                let (x, y) = (a[key].as_f64().unwrap(), b[key].as_f64().unwrap());
                assert!((x - y).abs() < 1e-5, "{key}: {x} against {y}");
            }
        }
    }
    assert!(d.join("two/final-model/model.safetensors").exists());

    // Sharded (ZeRO-3) over the same two ranks: the same deal and, with the same responses, the
    // same steps; each rank wrote its optimizer shard, and the engine's own copy of the weights
    // was gathered into after each step (its log-probs match the trainer's in rollout 2 too).
    let sharded = train(
        d,
        "sharded",
        &[
            "--nproc-per-node",
            "2",
            "--set",
            "trainer.sharding=\"sharded\"",
        ],
    );
    let log = String::from_utf8_lossy(&sharded.stderr);
    assert!(log.contains("trainer: sharded over 2 ranks"), "{log}");
    let shards = rollouts(&d.join("sharded"));
    assert_eq!(deal(&one), deal(&shards));
    let m3 = lines("sharded");
    assert_eq!(m3.len(), 2);
    for m in &m3 {
        let diff = m["train/mismatch_mean"].as_f64().unwrap();
        assert!(
            diff < 1e-4,
            "engine and trainer log-probs differ by {diff}: {m}"
        );
        assert!(m["time/weight_sync"].as_f64().unwrap() > 0.0);
    }
    let same = one
        .iter()
        .zip(&shards)
        .all(|(a, b)| a.iter().zip(b).all(|(x, y)| x.3 == y.3));
    if same {
        for (a, b) in m1.iter().zip(&m3) {
            for key in ["reward/mean", "train/loss", "train/grad_norm"] {
                let (x, y) = (a[key].as_f64().unwrap(), b[key].as_f64().unwrap());
                assert!((x - y).abs() < 1e-5, "sharded {key}: {x} against {y}");
            }
        }
    }
    let checkpoint = d.join("sharded/checkpoint-000002");
    for part in [
        "optimizer-rank-00000-of-00002",
        "optimizer-rank-00001-of-00002",
        "model",
    ] {
        assert!(checkpoint.join(part).exists(), "{part}");
    }
    assert!(d.join("sharded/final-model/model.safetensors").exists());
}
