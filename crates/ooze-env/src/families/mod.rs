//! Procedurally generated tasks: terminal task families (files and permissions, text and logs,
//! JSON/CSV/INI, archives, git, sqlite, services' configuration, processes), each a template with
//! randomised parameters that writes a task directory in the [`crate::task`] layout: the starting
//! state (`environment/setup.sh`), the instruction, a reference solution and a pytest check of
//! the final state.
//!
//! Every generated task is checked (in `tests/families.rs`): its reference solution earns reward
//! 1 and doing nothing earns 0.

pub mod coding;
mod config;
mod data;
mod files;
mod text;
mod vcs;

use crate::error::EnvError;
use ooze_core::rng::SplitMix64;
use std::path::{Path, PathBuf};

/// The image every generated terminal task names (the endless_terminals recipe's).
pub const TERMINAL_IMAGE: &str = include_str!("../../../../recipes/endless_terminals/image.toml");

/// One generated task before it is written out.
#[derive(Debug, Clone)]
pub struct Generated {
    pub instruction: String,
    /// Bash run as root in /work to make the starting state.
    pub setup: String,
    /// Bash that solves it.
    pub solution: String,
    /// The body of a pytest module checking the final state (`W` is `pathlib.Path("/work")`).
    pub checks: String,
}

/// A task template.
pub struct Family {
    pub name: &'static str,
    pub area: &'static str,
    pub generate: fn(&mut SplitMix64) -> Generated,
    /// A repository verified on a clean copy with the agent's diff (coding tasks).
    pub clean_copy: Option<&'static str>,
}

/// Every terminal family.
pub fn terminal_families() -> Vec<&'static Family> {
    let mut all: Vec<&'static Family> = Vec::new();
    all.extend(files::FAMILIES);
    all.extend(text::FAMILIES);
    all.extend(data::FAMILIES);
    all.extend(vcs::FAMILIES);
    all.extend(config::FAMILIES);
    all
}

const CHECK_PRELUDE: &str = "import csv, json, os, pathlib, sqlite3, stat, subprocess, tarfile, zipfile\n\
W = pathlib.Path('/work')\n\n\
def run(*args, cwd='/work'):\n    return subprocess.run(args, cwd=cwd, capture_output=True, text=True)\n\n";

const TEST_SH: &str = "#!/bin/bash\n\
# The verifier: the final state is checked by pytest; reward 1 when every check passes.\n\
cd /work\n\
python3 -m pytest -q -p no:cacheprovider /tests/test_state.py > /logs/verifier/pytest.log 2>&1\n\
status=$?\n\
tail -n 30 /logs/verifier/pytest.log\n\
if [ $status -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n";

/// Writes `generated` as a task directory `dir`.
pub fn write_task(
    dir: &Path,
    family: &Family,
    seed: u64,
    generated: &Generated,
) -> Result<(), EnvError> {
    let write = |rel: &str, text: &str| -> Result<(), EnvError> {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(EnvError::io(format!("creating {}", parent.display())))?;
        }
        ooze_core::atomic_file::write(&path, text.as_bytes()).map_err(|e| EnvError::Io {
            what: e.to_string(),
            source: std::io::Error::other("write failed"),
        })
    };
    write(
        "instruction.md",
        &format!("{}\n", generated.instruction.trim()),
    )?;
    // The seed is a string: TOML's integers stop at i64::MAX, task seeds are any u64.
    write(
        "task.toml",
        &format!(
            "version = \"1.0\"\n\n[metadata]\nfamily = \"{}\"\narea = \"{}\"\nseed = \"{seed}\"\n\n\
             [agent]\ntimeout_sec = 300.0\n\n[verifier]\ntimeout_sec = 60.0\n{}\n\
             [environment]\ncpus = 1\nmemory_mb = 512\nstorage_mb = 256\n",
            family.name,
            family.area,
            family
                .clean_copy
                .map_or(String::new(), |repo| format!("clean_copy = \"{repo}\"\n"))
        ),
    )?;
    write("environment/image.toml", TERMINAL_IMAGE)?;
    write(
        "environment/setup.sh",
        &format!("set -e\n{}\n", generated.setup.trim()),
    )?;
    write(
        "solution/solve.sh",
        &format!("set -e\n{}\n", generated.solution.trim()),
    )?;
    write("tests/test.sh", TEST_SH)?;
    write(
        "tests/test_state.py",
        &format!("{CHECK_PRELUDE}{}\n", generated.checks.trim()),
    )?;
    Ok(())
}

/// Every coding family (generated Python projects with an injected bug).
pub fn coding_families() -> Vec<&'static Family> {
    coding::FAMILIES.iter().collect()
}

/// Writes `count` tasks of `families` below `out` (`<family>-<n>`), cycling through them with one
/// seed stream; returns their directories.
pub fn write_tasks(
    out: &Path,
    families: &[&Family],
    count: usize,
    seed: u64,
) -> Result<Vec<PathBuf>, EnvError> {
    let mut dirs = Vec::new();
    for i in 0..count {
        let family = families[i % families.len()];
        let task_seed = seed
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(i as u64);
        let generated = (family.generate)(&mut SplitMix64::new(task_seed));
        let dir = out.join(format!("{}-{i:05}", family.name));
        write_task(&dir, family, task_seed, &generated)?;
        dirs.push(dir);
    }
    Ok(dirs)
}

/// [`write_tasks`] of every terminal family.
pub fn write_terminal_tasks(out: &Path, count: usize, seed: u64) -> Result<Vec<PathBuf>, EnvError> {
    write_tasks(out, &terminal_families(), count, seed)
}

// Shared vocabulary of the templates.

pub(crate) const WORDS: &[&str] = &[
    "alpha", "bravo", "cedar", "delta", "ember", "fjord", "glade", "harbor", "iris", "juniper",
    "kelp", "lumen", "maple", "nectar", "onyx", "pebble", "quartz", "raven", "sierra", "tundra",
    "umber", "violet", "willow", "xenon", "yarrow", "zephyr",
];

pub(crate) fn word(rng: &mut SplitMix64) -> &'static str {
    let picked: &&'static str = rng.pick(WORDS);
    picked
}

/// `n` distinct words.
pub(crate) fn words(rng: &mut SplitMix64, n: usize) -> Vec<&'static str> {
    let mut all = WORDS.to_vec();
    rng.shuffle(&mut all);
    all.truncate(n);
    all
}

pub(crate) fn num(rng: &mut SplitMix64, lo: i64, hi: i64) -> i64 {
    rng.range(lo, hi)
}

/// Python's repr of a string (for checks).
pub(crate) fn py(s: &str) -> String {
    serde_json::to_string(s).expect("invariant: strings serialize")
}

/// A bash here-document writing `text` to `path`.
pub(crate) fn file(path: &str, text: &str) -> String {
    format!("mkdir -p \"$(dirname {path})\"\ncat > {path} <<'OOZE_EOF'\n{text}\nOOZE_EOF\n")
}
