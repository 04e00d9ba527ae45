//! Shared by the integration tests: `ooze serve` on a free port, and agent warm starts.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A running `ooze serve`, stopped when dropped.
#[allow(dead_code)] // not every test crate that shares this module serves
pub struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `ooze serve --model MODEL` on the CPU on a free port with `extra` flags; returns it with
/// its OpenAI base URL. Its log keeps being read, so the server never writes into a closed pipe.
#[allow(dead_code)]
pub fn serve(model: &Path, extra: &[&str]) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ooze"))
        .args(["serve", "--port", "0", "--device", "cpu"])
        .args(extra)
        .arg("--model")
        .arg(model)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let server = Server(child);
    let addr = loop {
        let line = lines.next().expect("ooze serve exited").unwrap();
        // "… listening on http://ADDR (at most N connections)"
        if let Some(addr) = line.split("on http://").nth(1) {
            break addr
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    (server, format!("http://{addr}/v1"))
}

/// Runs `ooze ARGS` (no stdin) and returns its output; fails the test, with its stderr, if it
/// fails.
#[allow(dead_code)] // not every test crate that shares this module runs the CLI this way
pub fn ooze_ok(args: &[&str]) -> std::process::Output {
    ooze_ok_with(args, &[])
}

/// [`ooze_ok`] with environment variables `envs` set.
#[allow(dead_code)]
pub fn ooze_ok_with(args: &[&str], envs: &[(&str, &str)]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_ooze"))
        .args(args)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ooze {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Warm-starts a tiny model for agent `recipe` in `dir`: `init-model` writes a tiny random Qwen2
/// into `dir/model`, `recipe-data` writes `n` prompts with worked trajectories (and `data_args`)
/// into `dir/data`, `edit` may rewrite the demonstrations (`dir/data/sft.jsonl`), and `ooze sft`
/// fine-tunes the model on them for 120 steps into `dir/sft`. Returns the fine-tuned model's
/// directory (`dir/sft/final-model`).
#[allow(dead_code)] // not every test crate that shares this module warm-starts an agent
pub fn agent_warm_start(
    recipe: &str,
    dir: &Path,
    n: usize,
    data_args: &[&str],
    edit: &dyn Fn(&Path),
) -> PathBuf {
    let ooze = |args: &[&str]| {
        ooze_ok(args);
    };
    let p = |name: &str| dir.join(name).display().to_string();
    let n = n.to_string();
    let model = p("model");
    ooze(&["init-model", "--family", "qwen2", "--size", "tiny", &model]);
    let mut data = vec!["recipe-data", recipe];
    let data_dir = p("data");
    data.extend([data_dir.as_str(), "--n", n.as_str(), "--demonstrations"]);
    // Recorded from the recipe's agent, rendered with this model's tokenizer and chat template.
    data.extend(["--model", model.as_str()]);
    data.extend_from_slice(data_args);
    ooze(&data);
    edit(&dir.join("data/sft.jsonl"));
    // One thread: the callers warm-start several agents at once on two cores.
    ooze_ok_with(
        &[
            "sft",
            "--model",
            &model,
            "--data",
            &p("data/sft.jsonl"),
            "--out",
            &p("sft"),
            "--device",
            "cpu",
            "--batch-size",
            "32",
            "--lr",
            "5e-3",
            "--warmup-steps",
            "10",
            "--max-steps",
            "120",
            "--save-every",
            "100000",
            "--eval-every",
            "100000",
        ],
        &[("OMP_NUM_THREADS", "1")],
    );
    dir.join("sft/final-model")
}
