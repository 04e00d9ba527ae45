#!/usr/bin/env bash
# The GPU recipe: a small Qwen2-architecture model trained from scratch by `ooze sft` on `addition`
# demonstrations (30% with a wrong answer), then RL from that one warm start
# (recipes/addition-gpu.toml) with each estimator named: `grpo` (the recipe as it is), `grpo128`
# (GRPO in four optimizer steps of 128 samples per rollout, as PPO takes) and `ppo` (a critic from
# the policy's weights with a fresh value head, two critic-only steps). Each run prints the held-out
# pass@1 before and after, and its step time split.
# Usage: scripts/gpu_recipe.sh [OUT_DIR [ESTIMATOR ...]]
#   (default: target/gpu-recipe grpo; needs a CUDA GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/gpu-recipe}
shift || true
estimators=("${@:-grpo}")
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
echo "gpu recipe: sft $((sft_done - start)) s"
for estimator in "${estimators[@]}"; do
  case $estimator in
    grpo) sets=() ;;
    grpo128) sets=(--set trainer.global_batch_size=128) ;;
    ppo) sets=(--set 'algorithm.advantage.estimator="ppo"' --set trainer.global_batch_size=128
               --set critic.lr=${CRITIC_LR:-1e-3} --set critic.warmup_steps=2) ;;
    *) echo "unknown estimator $estimator (grpo, grpo128, ppo)" >&2; exit 2 ;;
  esac
  t=$(date +%s)
  $ooze train recipes/addition-gpu.toml --set "model.path=\"$out/sft/final-model\"" \
    --set "logging.run_dir=\"$out/$estimator\"" "${sets[@]}"
  echo "gpu recipe: $estimator $(( $(date +%s) - t )) s"
done
