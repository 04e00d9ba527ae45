# Source this file: `. scripts/torch-env.sh`. It points the dynamic loader at the torch/lib of a
# PyTorch 2.11 install, so an ooze binary built on one machine runs on another that has PyTorch 2.11
# (for example a GPU machine with its own CUDA build of torch). It prefers the repository's .venv,
# then $OOZE_PYTHON, then python3 on PATH. Building also needs it: torch-sys asks that Python where
# libtorch lives.
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
export LIBTORCH_USE_PYTORCH=1
export OOZE_TORCH_LIB="${_ooze_torch_lib%%:*}"
unset _ooze_root _ooze_python _ooze_torch_lib
