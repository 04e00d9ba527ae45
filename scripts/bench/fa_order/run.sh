#!/usr/bin/env bash
# FlashAttention-order decode attention against PyTorch's FlashAttention-2 forward (bitwise) and
# against split attention (speed), on one GPU. check.py says what is compared and timed.
# Usage: run.sh   (needs nvcc, PyTorch with CUDA, an sm_90 GPU)
# Builds every variant of the kernel's two open choices (see fa_order_attention.cu):
# FAO_UNFUSED_EXP 0/1 and FAO_RECIPROCAL 0/1 (the kernel's defaults: 1 and 0, the only pair
# that equals FlashAttention-2 bitwise), and split attention for comparison; then times the chosen
# variants (FAO_TIME, comma-separated, default u1_r0) against split attention.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
shim=$here/../../../crates/ooze-torch/shim
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
out=${FAO_BUILD_DIR:-$(mktemp -d)}
mkdir -p "$out"
flags=(-O3 -lineinfo -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90,code=sm_90 -I "$shim")
for unfused in 0 1; do
  for rcp in 0 1; do
    "$nvcc" "${flags[@]}" -DFAO_UNFUSED_EXP=$unfused -DFAO_RECIPROCAL=$rcp \
      "$shim/fa_order_attention.cu" -o "$out/fao_u${unfused}_r${rcp}.so" &
  done
done
# Pipeline depths forced (FAO_SLOTS="3 4 6", say): variants s3, s4, s6 beside the launcher's own
# choice (u1_r0), checked bitwise like the others and timed when FAO_TIME names them.
for slots in ${FAO_SLOTS:-}; do
  "$nvcc" "${flags[@]}" -DFAO_FORCE_SLOTS="$slots" "$shim/fa_order_attention.cu" \
    -o "$out/fao_s$slots.so" &
done
"$nvcc" "${flags[@]}" "$shim/attention.cu" -o "$out/split.so" &
wait
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 "$here/check.py" "$out" "$@"
python3 "$here/check.py" "$out" --time
