#!/usr/bin/env bash
# The Python-agent recipes on a GPU: each recipe's own data generator (make_data.py), a small
# Qwen2-architecture model warm-started by `ooze sft` on its demonstrations (bf16), then `ooze
# train` on the recipe's TOML for ROLLOUTS rollouts with held-out evaluation at the start and the
# end. The agents are real Python programs talking to the agent gateway:
#   python_agent  the `openai` package, a calculator tool loop (Chat Completions)
#   agents_sdk    the OpenAI Agents SDK, unmodified: Agent, @function_tool, Runner.run (Responses)
# Every seed of every recipe runs at once (one GPU holds them all); each run's log is
# OUT/RECIPE/seed-S/log, its metrics OUT/RECIPE/seed-S/grpo/metrics.jsonl, and a line per run
# reports held-out pass@1 at the start and the end, and the times.
# Usage: scripts/gpu_python_agents.sh OUT_DIR RECIPE...
#        (env: OOZE, PYTHON (with openai / openai-agents; default .venv/bin/python, else python3),
#         SEEDS="0 1", ROLLOUTS=20, LR=1e-4, SFT_STEPS (python_agent 1500, agents_sdk 2000),
#         WARM_STARTS (python_agent 1, agents_sdk 4), SFT_LR=2e-3, SIZE=small, N=5000
#         training questions, TEST=200 held-out questions, SETS="K=V …", DEVICE=cuda)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu_python_agents.sh OUT_DIR RECIPE...}
shift
ooze=${OOZE:-target/release/ooze}
python=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
seeds=${SEEDS:-0 1}
rollouts=${ROLLOUTS:-20}
lr=${LR:-1e-4}
device=${DEVICE:-cuda}
size=${SIZE:-small}
sft_lr=${SFT_LR:-2e-3}
n=${N:-5000}
test_n=${TEST:-200}
extra=()
for kv in ${SETS:-}; do extra+=(--set "$kv"); done

# The SFT warm start: WARM_STARTS models (seeds SEED, SEED+100, …) trained at once, the one with
# the lowest held-out SFT loss kept as DIR/sft. agents_sdk trains its tokenizer on its own
# demonstrations (rendered with the chat template) and takes the best of 4: a small model from
# scratch learns to copy the looked-up price only in some seeds (docs/recipes/python-agents-gpu.md).
warm_start() { # RECIPE SEED DIR DATA
  local recipe=$1 seed=$2 dir=$3 data=$4 steps count k s best="" best_loss="" loss corpus=()
  case $recipe in
    agents_sdk) steps=${SFT_STEPS:-2000} count=${WARM_STARTS:-4}
      corpus=(--tokenizer-corpus "$data/sft.jsonl") ;;
    *) steps=${SFT_STEPS:-1500} count=${WARM_STARTS:-1} ;;
  esac
  for ((k = 0; k < count; k++)); do
    s=$((seed + 100 * k))
    mkdir -p "$dir/warm-$s"
    ($ooze init-model --seed "$s" --family qwen2 --size "$size" "${corpus[@]}" \
       "$dir/warm-$s/model" >/dev/null &&
     $ooze sft --model "$dir/warm-$s/model" --data "$data/sft.jsonl" --out "$dir/warm-$s/sft" \
       --device "$device" --dtype "$([ "$device" = cpu ] && echo fp32 || echo bf16)" \
       --batch-size 64 --lr "$sft_lr" --warmup-steps 20 --max-steps "$steps" \
       --eval-every 100000 --save-every 100000 --seed "$s") >"$dir/warm-$s/log" 2>&1 &
  done
  wait
  for ((k = 0; k < count; k++)); do
    s=$((seed + 100 * k))
    loss=$(grep -o 'held-out [0-9.]*' "$dir/warm-$s/log" | tail -1 | cut -d' ' -f2 || true)
    [ -n "$loss" ] || { echo "warm start seed $s failed: see $dir/warm-$s/log"; tail -3 "$dir/warm-$s/log"; continue; }
    echo "warm start seed $s: held-out SFT loss $loss"
    if [ -z "$best" ] || awk "BEGIN { exit !($loss < $best_loss) }"; then best=$s best_loss=$loss; fi
  done
  [ -n "$best" ] || return 1
  echo "warm start: seed $best (held-out SFT loss $best_loss, $steps steps, best of $count)"
  mv "$dir/warm-$best/sft" "$dir/sft"
  if [ "$recipe" = agents_sdk ]; then
    echo "warm start copies: $(OOZE=$ooze PYTHON=$python DEVICE=$device \
      scripts/agents_sdk_copy_probe.sh "$dir/sft/final-model" "$data")"
  fi
}

run_one() { # RECIPE SEED DIR DATA
  local recipe=$1 seed=$2 dir=$3 data=$4 start sft_done end
  start=$(date +%s)
  warm_start "$recipe" "$seed" "$dir" "$data"
  sft_done=$(date +%s)
  $ooze train "recipes/$recipe/recipe.toml" \
    --set "model.path=\"$dir/sft/final-model\"" --set "data.path=\"$data/train.jsonl\"" \
    --set "agent.command=[\"$python\", \"recipes/$recipe/agent.py\"]" \
    --set "eval.datasets=[{name = \"test\", path = \"$data/test.jsonl\", n_samples = 4, pass_k = [1]}]" \
    --set "logging.run_dir=\"$dir/grpo\"" --set "rollout.num_rollouts=$rollouts" \
    --set "eval.interval=$rollouts" --set "trainer.lr=$lr" --set trainer.save_interval=1000 \
    --set logging.progress=false --set "model.device=\"$device\"" \
    --set "rollout.seed=$((1234 + seed))" --set "data.seed=$((42 + seed))" "${extra[@]}"
  end=$(date +%s)
  echo "gpu $recipe seed $seed: sft $((sft_done - start)) s, grpo $((end - sft_done)) s;" \
    "$(grep '^warm start' "$dir/log" | grep -v 'held-out SFT loss [0-9.]*$' | paste -sd ';' || true)"
}

# Held-out pass@1 and the agent's tool calls at the first and the last evaluation of a run.
summary() { # RECIPE SEED METRICS
  python3 - "$@" <<'PY'
import json, sys
recipe, seed, path = sys.argv[1:]
lines = [json.loads(l) for l in open(path)]
evals = [m for m in lines if "eval/test/pass@1" in m]
steps = [m for m in lines if "reward/mean" in m]
first, last = evals[0]["eval/test/pass@1"], evals[-1]["eval/test/pass@1"]
def ends(key):
    return " -> ".join(f"{m.get(key, float('nan')):.2f}" for m in (steps[0], steps[-1]))
found = f"; price found by the tool {ends('agent/found_price')}" if "agent/found_price" in steps[0] else ""
print(f"result {recipe} seed {seed}: held-out pass@1 {first:.3f} -> {last:.3f}; "
      f"train reward {ends('reward/mean')}; tool calls per execution {ends('agent/tool_calls')}"
      f"{found}; step {sum(m['time/rollout'] for m in steps) / len(steps):.1f} s")
PY
}

pids=()
for recipe in "$@"; do
  case $recipe in
    python_agent | agents_sdk) ;;
    *) echo "unknown recipe $recipe: python_agent or agents_sdk" >&2; exit 2 ;;
  esac
  data="$out/$recipe/data"
  rm -rf "${out:?}/$recipe"
  mkdir -p "$out/$recipe"
  "$python" "recipes/$recipe/make_data.py" "$data" --n "$n" --test "$test_n"
  for seed in $seeds; do
    dir="$out/$recipe/seed-$seed"
    mkdir -p "$dir"
    (run_one "$recipe" "$seed" "$dir" "$data" >"$dir/log" 2>&1 && tail -1 "$dir/log" &&
      summary "$recipe" "$seed" "$dir/grpo/metrics.jsonl" || echo "gpu $recipe seed $seed FAILED: see $dir/log") &
    pids+=($!)
  done
done
for pid in "${pids[@]}"; do wait "$pid"; done
