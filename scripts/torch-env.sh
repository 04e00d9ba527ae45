# Source this file: `. scripts/torch-env.sh`. It points the dynamic loader at the torch/lib of a
# PyTorch 2.11 install, so an ooze binary built on one machine runs on another that has PyTorch 2.11
# (for example a GPU machine with its own CUDA build of torch): LD_LIBRARY_PATH wins over the run
# path the binary records. It prefers the repository's .venv, then $OOZE_PYTHON, then python3 on PATH.
# Building does not need it: cargo builds against .venv's torch through the link .cache/libtorch
# (.cargo/config.toml), which this file (and so scripts/setup.sh) keeps pointing at that torch.
# Without a .venv it exports LIBTORCH instead, so cargo builds against the torch of that Python.
_ooze_root=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)
if [ -x "$_ooze_root/.venv/bin/python" ]; then
  _ooze_python="$_ooze_root/.venv/bin/python"
  export VIRTUAL_ENV="$_ooze_root/.venv"
  export PATH="$VIRTUAL_ENV/bin:$PATH"
else
  _ooze_python=${OOZE_PYTHON:-python3}
fi
_ooze_torch_lib=$("$_ooze_python" - <<'PY'
import os, sys
try:
    import torch
except ImportError:
    sys.exit("torch-env: no PyTorch in this Python; run scripts/setup.sh or set OOZE_PYTHON")
version = torch.__version__.split("+")[0]
if version != "2.11.0":
    sys.exit(f"torch-env: ooze needs PyTorch 2.11.0, this Python has {torch.__version__}")
print(os.path.join(os.path.dirname(torch.__file__), "lib"))
PY
) || return 1 2>/dev/null || exit 1
# The CUDA runtime that torch's wheel depends on (ooze's C++ shim links it too).
if [ -d "$_ooze_torch_lib/../../nvidia/cu13/lib" ]; then
  _ooze_torch_lib="$_ooze_torch_lib:$(cd "$_ooze_torch_lib/../../nvidia/cu13/lib" && pwd)"
fi
export LD_LIBRARY_PATH="$_ooze_torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OOZE_TORCH_LIB="${_ooze_torch_lib%%:*}"
# With .venv, cargo sees the same settings as in a plain shell (so switching rebuilds nothing).
if [ -x "$_ooze_root/.venv/bin/python" ]; then
  _ooze_link=$("$_ooze_python" -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' \
    "${OOZE_TORCH_LIB%/lib}" "$_ooze_root/.cache")
  if [ "$(readlink "$_ooze_root/.cache/libtorch" 2>/dev/null)" != "$_ooze_link" ]; then
    mkdir -p "$_ooze_root/.cache" && ln -sfn "$_ooze_link" "$_ooze_root/.cache/libtorch" \
      && echo "torch-env: .cache/libtorch -> $_ooze_link" >&2
  fi
else
  export LIBTORCH="${OOZE_TORCH_LIB%/lib}"
fi
unset _ooze_root _ooze_python _ooze_torch_lib _ooze_link
