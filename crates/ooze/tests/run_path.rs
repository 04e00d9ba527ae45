//! The built binary runs in a clean environment (no LD_LIBRARY_PATH, no virtualenv, a minimal PATH):
//! it finds libtorch, and with a CUDA build of PyTorch libtorch_cuda and the CUDA runtime, through the
//! run paths crates/ooze/build.rs records, so `cargo build` alone gives a working `ooze`.

use serde_json::Value;
use std::process::{Command, Output};

fn clean(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ooze"))
        .args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .envs(env.iter().copied())
        .output()
        .expect("run ooze")
}

#[test]
fn info_runs_without_the_loader_environment() {
    let out = clean(&["info", "--json"], &[]);
    assert!(
        out.status.success(),
        "ooze info --json failed in a clean environment:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).expect("info --json is JSON");
    assert_eq!(json["torch_version"], "2.11.0");
}

/// The dynamic loader's view (what `ldd` prints): every library is found, and libtorch_cuda is
/// loaded whenever the torch/lib the binary found has it (linked with --no-as-needed: PyTorch
/// registers its CUDA kernels in that library's static initialisers).
#[test]
fn every_library_resolves_through_the_run_path() {
    let out = clean(&[], &[("LD_TRACE_LOADED_OBJECTS", "1")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("not found"), "unresolved libraries:\n{text}");
    let path_of = |name: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(name))
            .and_then(|l| l.split("=>").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .map(std::path::PathBuf::from)
    };
    let torch_cpu =
        path_of("libtorch_cpu.so").unwrap_or_else(|| panic!("libtorch_cpu not loaded:\n{text}"));
    let torch_lib = torch_cpu.parent().expect("torch/lib");
    if torch_lib.join("libtorch_cuda.so").exists() {
        assert!(
            path_of("libtorch_cuda.so").is_some(),
            "{} has libtorch_cuda.so but the binary does not load it:\n{text}",
            torch_lib.display()
        );
    }
}
