#!/usr/bin/env bash
# ooze on two GPUs of one host (docs/distributed.md; figures in docs/benchmarks.md):
#   1. 0.5B training from one GPU to two (data-parallel at the same batch per GPU, and sharded);
#   2. the 7B shape sharded over both GPUs (step, MFU, peak memory, the colocated engines' sync);
#   3. the 7B weights broadcast over NCCL from a trainer GPU to an `ooze serve` on the other;
#   4. 7B GRPO steps through `ooze train` on both GPUs, sharded (stopped after 3 rollouts: the
#      final checkpoint of a 7B run with its AdamW state is ~105 GB);
#   5. the README's commands as written: scripts/gpu_recipe.sh on one GPU, then the same recipe
#      sharded over two, then one trainer GPU beside one engine GPU.
# Random weights in the real shapes (`ooze init-model`), so rewards in step 4 are zero; the
# entropy bonus makes its steps move the weights. Usage: scripts/gpu_two_gpus.sh [OUT_DIR]
# (needs 2 CUDA GPUs; OOZE names the binary, default target/release/ooze).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/two-gpus}
ooze=${OOZE:-target/release/ooze}
mkdir -p "$out"
models=$out/models
mkdir -p "$models"
[ -d "$models/q05" ] || $ooze init-model --family qwen2 --size 0.5b --dtype bf16 "$models/q05"
[ -d "$models/q7" ] || $ooze init-model --family qwen2 --size 7b --dtype bf16 "$models/q7"
bench=($ooze bench train --dtype bf16 --device cuda --seq-len 2048)
echo "== 1. 0.5B: one GPU, then two"
"${bench[@]}" --model "$models/q05" --batch 8
"${bench[@]}" --model "$models/q05" --batch 16 --nproc-per-node 2 --sharding replicated
"${bench[@]}" --model "$models/q05" --batch 16
"${bench[@]}" --model "$models/q05" --batch 16 --nproc-per-node 2 --sharding sharded --sync
echo "== 2. 7B sharded over two GPUs"
$ooze bench train --model "$models/q7" --dtype bf16 --device cuda --batch 4 --seq-len 4096 \
  --nproc-per-node 2 --sharding sharded --sync --iters 4
echo "== 3. 7B weights over NCCL, GPU 0 -> an engine on GPU 1"
port=30011
CUDA_VISIBLE_DEVICES=1 $ooze serve --model "$models/q7" --dtype bf16 --device cuda --port $port \
  --context-len 4096 > "$out/serve-7b.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  if python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; then break; fi
  sleep 1
done
CUDA_VISIBLE_DEVICES=0 $ooze bench weight-sync --model "$models/q7" --dtype bf16 --device cuda \
  --engine http://127.0.0.1:$port --iters 4
kill $server; wait $server || true
echo "== 4. 7B GRPO, sharded over two GPUs"
run=$out/grpo-7b
rm -rf "$run"
setsid $ooze train recipes/addition-gpu.toml --nproc-per-node 2 --set "model.path=\"$models/q7\"" \
  --set 'trainer.sharding="sharded"' --set rollout.num_rollouts=4 --set rollout.batch_size=16 \
  --set eval.interval=0 --set eval.at_start=false --set 'eval.datasets=[]' \
  --set trainer.save_interval=0 --set algorithm.loss.entropy_coef=0.01 \
  --set "logging.run_dir=\"$run\"" > "$out/grpo-7b.log" 2>&1 &
trainer=$!
for _ in $(seq 1 600); do
  [ "$(cat "$run/metrics.jsonl" 2>/dev/null | wc -l)" -ge 3 ] && break
  kill -0 $trainer 2>/dev/null || break
  sleep 1
done
kill -- -$trainer 2>/dev/null || true
sleep 2
kill -9 -- -$trainer 2>/dev/null || true
grep "^rollout" "$out/grpo-7b.log" || { tail -20 "$out/grpo-7b.log"; exit 1; }
echo "== 5. the README's commands"
OOZE=$ooze scripts/gpu_recipe.sh
$ooze train recipes/addition-gpu.toml --nproc-per-node 2 --set trainer.sharding=\"sharded\" --set logging.run_dir=\"target/gpu-recipe/grpo-2gpu\"
$ooze train recipes/addition-gpu.toml --set trainer.gpus=1 --set rollout.gpus=1 --set logging.run_dir=\"target/gpu-recipe/grpo-split\"
