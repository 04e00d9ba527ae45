//! Shared fixtures of the ooze-model integration tests: where the Python references are, where the
//! official tokenizer files are, and how to run the reference Python.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

/// Reference values written by scripts/reference/make_references.py (scripts/test.sh runs it).
pub fn reference_dir() -> PathBuf {
    let dir = std::env::var_os("OOZE_REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/reference"));
    assert!(
        dir.join("chat_cases.json").exists(),
        "reference values missing in {}; run scripts/test.sh, or `.venv/bin/python scripts/reference/make_references.py {}`",
        dir.display(),
        dir.display()
    );
    dir
}

/// The official tokenizer files that scripts/setup.sh fetches and checks against their pinned
/// hashes (scripts/fetch_tokenizers.py): `$OOZE_HF_DATA`, else `.cache/hf` in the repository.
pub fn hf_data_dir() -> PathBuf {
    let dir = std::env::var_os("OOZE_HF_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".cache/hf"));
    for family in ["qwen2.5", "qwen3", "llama3.1"] {
        assert!(
            dir.join(family).join("tokenizer.json").exists(),
            "official tokenizer files missing in {}; run scripts/setup.sh (or `python3 scripts/fetch_tokenizers.py {}`)",
            dir.join(family).display(),
            dir.display()
        );
    }
    dir
}

/// The Python that has torch and transformers (the repository's .venv unless OOZE_PYTHON is set).
pub fn python() -> Command {
    let exe = std::env::var_os("OOZE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin/python"));
    let mut cmd = Command::new(exe);
    cmd.env("PYTHONUNBUFFERED", "1");
    cmd
}

/// Runs a reference script and panics with its output if it fails.
pub fn run_python(script: &str, args: &[&Path]) {
    let out = python()
        .arg(workspace_root().join("scripts/reference").join(script))
        .args(args)
        .output()
        .expect("starting the reference Python");
    assert!(
        out.status.success(),
        "{script} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn max_abs_diff(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y).abs())
        .fold(0.0, f64::max)
}

pub fn f64s(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

pub fn u32s(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}
