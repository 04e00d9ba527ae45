#!/usr/bin/env bash
# The long-tail agent workload (recipes/long_tail), synchronous against asynchronous RL from one
# warm start: the recipe's data (make_data.py), a small Qwen2-architecture model with a tokenizer
# trained on the demonstrations, warm-started by `ooze sft`, then `ooze train` once per mode with
# everything else equal. With SPLIT=1 (the default on GPUs) each run puts its trainer on GPU 0 and
# its engine on GPU 1 (trainer.gpus = 1, rollout.gpus = 1: weights broadcast over NCCL).
# Each run's metrics are OUT/MODE/metrics.jsonl; a line per run gives trained samples per second
# and the reward of its first and last five rollouts.
# Usage: scripts/gpu_long_tail.sh OUT_DIR [MODE ...]   (modes: sync, one_step_off, async, and
#        async+mask: stale tokens masked, not their groups dropped; default: sync async)
#        (env: OOZE, PYTHON=python3, DEVICE=cuda, SIZE=small, SFT_STEPS=1500, ROLLOUTS=30,
#         SPLIT=1 on cuda / 0 on cpu, SETS="K=V …", LATENCY="0.2 1.0" seconds per lookup)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu_long_tail.sh OUT_DIR [MODE ...]}
shift
modes=("${@:-sync}")
[ $# -gt 0 ] || modes=(sync async)
ooze=${OOZE:-target/release/ooze}
python=${PYTHON:-python3}
device=${DEVICE:-cuda}
size=${SIZE:-small}
steps=${SFT_STEPS:-1500}
rollouts=${ROLLOUTS:-30}
split=${SPLIT:-$([ "$device" = cuda ] && echo 1 || echo 0)}
read -r min_latency max_latency <<<"${LATENCY:-0.2 1.0}"
export LONG_TAIL_MIN_LATENCY=$min_latency LONG_TAIL_MAX_LATENCY=$max_latency
dtype=$([ "$device" = cpu ] && echo fp32 || echo bf16)
extra=()
for kv in ${SETS:-}; do extra+=(--set "$kv"); done
[ "$split" = 1 ] && extra+=(--set trainer.gpus=1 --set rollout.gpus=1)

mkdir -p "$out"
if [ ! -d "$out/sft/final-model" ]; then
  start=$(date +%s)
  "$python" recipes/long_tail/make_data.py "$out/data"
  $ooze init-model --family qwen2 --size "$size" --tokenizer-corpus "$out/data/sft.jsonl" \
    "$out/model" >/dev/null
  $ooze sft --model "$out/model" --data "$out/data/sft.jsonl" --out "$out/sft" \
    --device "$device" --dtype "$dtype" --batch-size 64 --lr 2e-3 --warmup-steps 20 \
    --max-steps "$steps" --eval-every 100000 --save-every 100000 >"$out/sft.log" 2>&1 \
    || { tail -20 "$out/sft.log"; exit 1; }
  echo "long tail: warm start in $(( $(date +%s) - start )) s ($(grep -o 'held-out [0-9.]*' "$out/sft.log" | tail -1))"
fi
for name in "${modes[@]}"; do
  mode=${name%+mask}
  sets=("${extra[@]}")
  [ "$mode" != "$name" ] && sets+=(--set 'rollout.stale="mask"')
  rm -rf "${out:?}/$name"
  start=$(date +%s)
  $ooze train recipes/long_tail/recipe.toml --set "model.path=\"$out/sft/final-model\"" \
    --set "model.device=\"$device\"" --set "model.dtype=\"$dtype\"" \
    --set "data.path=\"$out/data/train.jsonl\"" \
    --set "agent.command=[\"$python\", \"recipes/long_tail/agent.py\"]" \
    --set "rollout.mode=\"$mode\"" --set "rollout.num_rollouts=$rollouts" \
    --set "logging.run_dir=\"$out/$name\"" --set logging.progress=false "${sets[@]}" \
    >"$out/$name.log" 2>&1 || { rc=$?; tail -30 "$out/$name.log"; echo "ooze train exited with $rc"; exit 1; }
  "$python" - "$out/$name/metrics.jsonl" "$name" "$(( $(date +%s) - start ))" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
lines = [l for l in lines if "train/loss" in l]
# From the end of the first step to the end of the last: start-up (loading, engines) left out.
samples = sum(l["rollout/samples"] for l in lines[1:])
wall = lines[-1]["time/elapsed"] - lines[0]["time/elapsed"]
first = [l["reward/mean"] for l in lines[:5]]
last = [l["reward/mean"] for l in lines[-5:]]
stale = max(l.get("async/staleness_max", 0) for l in lines)
dropped = sum(l.get("rollout/dropped_stale", 0) for l in lines)
masked = sum(l.get("async/masked_tokens", 0) for l in lines)
print(f"long tail {sys.argv[2]}: {len(lines)} steps; after the first, {samples} samples in "
      f"{wall:.1f} s ({samples / wall:.2f} trained samples/s; {sys.argv[3]} s in all), reward "
      f"{sum(first) / len(first):.3f} -> {sum(last) / len(last):.3f}, staleness max {stale}, "
      f"stale groups dropped {dropped}, stale tokens masked {masked}")
PY
done
