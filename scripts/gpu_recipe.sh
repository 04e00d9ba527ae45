#!/usr/bin/env bash
# The GPU recipe: a small Qwen2-architecture model trained from scratch by `ooze sft` on `addition`
# demonstrations (30% with a wrong answer), then GRPO (recipes/addition-gpu.toml). Prints the
# held-out pass@1 of the SFT model and after GRPO, and the step time split.
# Usage: scripts/gpu_recipe.sh [OUT_DIR]   (default: target/gpu-recipe; needs a CUDA GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/gpu-recipe}
ooze=${OOZE:-target/release/ooze}
rm -rf "$out"
mkdir -p "$out"
start=$(date +%s)
$ooze init-model --family qwen2 --size small "$out/model"
$ooze task addition "$out/sft.jsonl" --n 100000 --demonstrations --error-rate 0.3 --seed 0
$ooze sft --model "$out/model" --data "$out/sft.jsonl" --out "$out/sft" --device cuda --dtype bf16 \
  --batch-size 256 --lr 3e-3 --warmup-steps 20 --max-steps 1500 --min-lr-ratio 0.1 \
  --eval-every 250 --save-every 100000 --eval-fraction 0.01 2>&1 | grep -v "^sft: step [0-9]*/[0-9]* loss" || true
sft_done=$(date +%s)
$ooze train recipes/addition-gpu.toml --set "model.path=\"$out/sft/final-model\"" --set "logging.run_dir=\"$out/grpo\""
end=$(date +%s)
echo "gpu recipe: sft $((sft_done - start)) s, grpo $((end - sft_done)) s, total $((end - start)) s"
