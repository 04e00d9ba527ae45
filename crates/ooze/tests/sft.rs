//! `ooze sft` as a user runs it: the held-out loss falls, a run killed with SIGKILL mid-way and
//! resumed logs exactly the losses of an uninterrupted run, and bad input names what is wrong.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn ooze() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ooze"))
}

/// Chat lines for a toy task: "a+b" answered with the sum.
fn chat_lines(n: usize) -> String {
    (0..n)
        .map(|i| {
            let (a, b) = (i * 7 % 10, i * 3 % 10);
            serde_json::json!({"messages": [
                {"role": "user", "content": format!("{a}+{b}")},
                {"role": "assistant", "content": format!("{}", a + b)},
            ]})
            .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
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
    std::fs::write(dir.join("train.jsonl"), chat_lines(400)).unwrap();
}

fn sft(dir: &Path, out: &str) -> Command {
    let mut cmd = ooze();
    cmd.args([
        "sft",
        "--device",
        "cpu",
        "--max-steps",
        "40",
        "--batch-size",
        "16",
    ])
    .args(["--lr", "3e-3", "--warmup-steps", "2", "--save-every", "1"])
    .args(["--eval-every", "10", "--eval-fraction", "0.1"])
    .arg("--model")
    .arg(dir.join("model"))
    .arg("--data")
    .arg(dir.join("train.jsonl"))
    .arg("--out")
    .arg(dir.join(out))
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    cmd
}

/// (step, loss) of every training step in a run's metrics, and the held-out losses.
fn losses(run: &Path) -> (Vec<(u64, f64)>, Vec<f64>) {
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let (mut steps, mut eval) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        if let Some(before) = v["eval_loss_before"].as_f64() {
            eval.push(before);
            continue;
        }
        steps.push((v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()));
        if let Some(e) = v["eval_loss"].as_f64() {
            eval.push(e);
        }
    }
    (steps, eval)
}

#[test]
fn sft_learns_and_a_killed_run_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path());
    assert!(sft(dir.path(), "straight").status().unwrap().success());
    let (straight, eval) = losses(&dir.path().join("straight"));
    assert_eq!(straight.len(), 40);
    assert!(
        eval.last().unwrap() < &(eval[0] * 0.7),
        "held-out loss did not fall: {eval:?}"
    );
    assert!(dir.path().join("straight/final-model/config.json").exists());

    // The same run, killed (SIGKILL) once a few checkpoints exist, then resumed.
    let run = dir.path().join("killed");
    let mut child = sft(dir.path(), "killed").spawn().unwrap();
    let started = Instant::now();
    loop {
        let at = std::fs::read_to_string(run.join("latest")).unwrap_or_default();
        if at.trim() >= "checkpoint-000003" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no checkpoint appeared"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let killed_at = std::fs::read_to_string(run.join("latest")).unwrap();
    assert!(
        killed_at.trim() < "checkpoint-000040",
        "the run finished before the kill; nothing was resumed"
    );
    let refused = sft(dir.path(), "killed").status().unwrap();
    assert!(!refused.success(), "an existing run needs --resume");
    assert!(sft(dir.path(), "killed")
        .arg("--resume")
        .status()
        .unwrap()
        .success());
    let (resumed, _) = losses(&run);
    assert_eq!(
        resumed, straight,
        "resumed run's losses differ ({killed_at})"
    );
}

#[test]
fn bad_data_names_the_line() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path());
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, format!("{}\n{{\"msgs\": []}}\n", chat_lines(1))).unwrap();
    let out = ooze()
        .args(["sft", "--device", "cpu", "--model"])
        .arg(dir.path().join("model"))
        .arg("--data")
        .arg(&bad)
        .arg("--out")
        .arg(dir.path().join("run"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.jsonl:2: expected an object with a `messages` list"),
        "{err}"
    );
}
