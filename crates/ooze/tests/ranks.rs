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
    let two = |out: &str, steps: u32, resume: bool| {
        let mut cmd = ooze();
        cmd.args(sft_args(d, out, steps))
            .args(["--nproc-per-node", "2"]);
        if resume {
            cmd.arg("--resume");
        }
        ok(cmd.output().unwrap(), out);
    };
    two("whole", 6, false);
    two("split", 3, false);
    two("split", 6, true);
    let (whole, split) = (metrics(&d.join("whole")), metrics(&d.join("split")));
    let step_losses =
        |m: &[Value]| -> Vec<f64> { m.iter().filter_map(|l| l["loss"].as_f64()).collect() };
    assert_eq!(step_losses(&whole), step_losses(&split));
    assert_eq!(step_losses(&whole).len(), 6);
    assert_eq!(weight_diff(&d.join("whole"), &d.join("split")), 0.0);
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
