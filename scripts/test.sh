#!/usr/bin/env bash
# The test command: sets up (scripts/setup.sh), checks formatting and lints, regenerates the
# PyTorch/transformers reference values, and runs every test with cargo-nextest (.config/nextest.toml).
# GPU tests are ignored here; run them with `cargo test -p ooze --test gpu -- --ignored` on a CUDA
# machine. Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's wall time, printed at the end for readers of CI logs.
names=() starts=()
phase() { names+=("$1"); starts+=("$SECONDS"); echo "== $1"; }
phase "setup"
scripts/setup.sh
. scripts/torch-env.sh
# Environment images are built once per checkout (by the first test that needs one) and kept here.
export OOZE_IMAGE_CACHE="$PWD/.cache/images"
# CI (.ci/run) compiles the C++ of clippy's check and of the test build once, through ccache.
if [ "${OOZE_CCACHE:-}" = 1 ] && command -v ccache >/dev/null; then
  export CC="ccache cc" CXX="ccache c++" CCACHE_DIR="$PWD/.cache/ccache"
fi
phase "cargo fmt --check"
cargo fmt --all -- --check
phase "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
phase "reference values (PyTorch + transformers)"
.venv/bin/python scripts/reference/make_references.py target/reference
phase "cargo test: build"
cargo test --workspace --no-run
phase "cargo test: run"
status=0
cargo nextest run --workspace 2>&1 | tee target/test.log || status=$?
# One summary line for readers of CI logs (nextest's: "N tests run: P passed, F failed, S skipped").
# Tests that could not start or timed out count as failed.
awk '/Summary \[/ { for (i = 2; i <= NF; i++) { if ($(i - 1) !~ /^[0-9]+$/) continue
    if ($i ~ /^passed/) p = $(i - 1); else if ($i ~ /^skipped/) s = $(i - 1)
    else if ($i ~ /^(failed|exec|timed)/) f += $(i - 1) } }
  END { printf "ooze tests: %d passed, %d failed, %d skipped\n", p, f, s }' target/test.log
starts+=("$SECONDS")
for i in "${!names[@]}"; do
  echo "time: ${names[i]}: $((starts[i + 1] - starts[i])) s"
done
echo "time: total: $SECONDS s"
exit "$status"
