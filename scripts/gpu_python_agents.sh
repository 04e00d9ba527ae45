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
#         SEEDS="0 1", ROLLOUTS=20, LR=1e-4, SFT_STEPS=1500, SFT_LR=2e-3, SIZE=small, N=5000
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
sft_steps=${SFT_STEPS:-1500}
sft_lr=${SFT_LR:-2e-3}
n=${N:-5000}
test_n=${TEST:-200}
extra=()
for kv in ${SETS:-}; do extra+=(--set "$kv"); done

run_one() { # RECIPE SEED DIR DATA
  local recipe=$1 seed=$2 dir=$3 data=$4 start sft_done end
  start=$(date +%s)
  $ooze init-model --seed "$seed" --family qwen2 --size "$size" "$dir/model" >/dev/null
  $ooze sft --model "$dir/model" --data "$data/sft.jsonl" --out "$dir/sft" --device "$device" \
    --dtype "$([ "$device" = cpu ] && echo fp32 || echo bf16)" --batch-size 64 --lr "$sft_lr" \
    --warmup-steps 20 --max-steps "$sft_steps" --eval-every 100000 --save-every 100000 \
    --seed "$seed" 2>&1 | grep -v "^sft: step [0-9]*/[0-9]* loss" || true
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
  echo "gpu $recipe seed $seed: sft $((sft_done - start)) s, grpo $((end - sft_done)) s"
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
tools = [m.get("agent/tool_calls", float("nan")) for m in (steps[0], steps[-1])]
print(f"result {recipe} seed {seed}: held-out pass@1 {first:.3f} -> {last:.3f}; "
      f"train reward {steps[0]['reward/mean']:.3f} -> {steps[-1]['reward/mean']:.3f}; "
      f"tool calls per execution {tools[0]:.2f} -> {tools[1]:.2f}")
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
