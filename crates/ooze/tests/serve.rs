//! `ooze serve` as a user runs it, driven by the official `openai` Python package.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn openai_python_client_works_against_ooze_serve() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny-chat");
    let status = Command::new(env!("CARGO_BIN_EXE_ooze"))
        .args([
            "init-model",
            "--family",
            "qwen3",
            "--tokenizer-vocab",
            "500",
        ])
        .arg(&model)
        .status()
        .unwrap();
    assert!(status.success());
    let mut child = Command::new(env!("CARGO_BIN_EXE_ooze"))
        .args([
            "serve",
            "--port",
            "0",
            "--device",
            "cpu",
            "--context-len",
            "1024",
            "--max-running",
            "8",
            "--model",
        ])
        .arg(&model)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let server = Server(child);
    let mut url = None;
    for line in BufReader::new(stderr).lines() {
        let line = line.unwrap();
        if let Some(addr) = line.split("on http://").nth(1) {
            url = Some(format!("http://{}/v1", addr.trim()));
            break;
        }
    }
    let url = url.expect("ooze serve printed its address");
    let python = std::env::var_os("OOZE_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join(".venv/bin/python"));
    let out = Command::new(python)
        .arg(root.join("scripts/reference/openai_client_check.py"))
        .arg(&url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openai client check failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    drop(server);
}
