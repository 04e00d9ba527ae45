#!/usr/bin/env bash
# Split attention, build against build, on one GPU (bench.cu says what is measured).
# Usage: run.sh [shape filter]   with BUILDS="name=dir name=dir …" (default: this tree's kernel
# alone), each dir holding an attention.cu and the headers it includes (common.cuh, and from
# 400677f on attention_common.cuh); the first build is the reference that the others must equal
# bitwise. A past commit's kernel as a build:
#   d=$(mktemp -d); for f in attention.cu common.cuh attention_common.cuh; do
#     git show REV:crates/ooze-torch/shim/$f > $d/$f 2>/dev/null; done
# Needs nvcc (CUDA 12 or later) and an sm_90 GPU.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
builds=${BUILDS:-"tree=$here/../../../crates/ooze-torch/shim"}
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
out=$(mktemp -d)
flags=(-O3 -std=c++17 -gencode=arch=compute_90,code=sm_90)
decls="" list="" objects=()
for b in $builds; do
  name=${b%%=*} dir=${b#*=}
  "$nvcc" "${flags[@]}" -I "$dir" "-Dooze_launch_split_attention=${name}_launch" \
    "-Dooze_attention_splits=${name}_splits" -c "$dir/attention.cu" -o "$out/$name.o" &
  objects+=("$out/$name.o")
  decls="$decls DECLARE_BUILD(${name}_launch)"
  list="$list${list:+, }{\"$name\", ${name}_launch}"
done
wait
printf '#define BUILD_DECLS %s\n#define BUILD_LIST %s\n' "$decls" "$list" > "$out/builds.h"
"$nvcc" "${flags[@]}" -include "$out/builds.h" "$here/bench.cu" "${objects[@]}" -o "$out/bench"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
"$out/bench" "$@"
