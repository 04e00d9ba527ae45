#!/usr/bin/env bash
# The terminal recipes on a GPU, as scripts/gpu_agent_recipes.sh runs the other agent recipes: a
# small Qwen2-architecture model warm-started by `ooze sft` on demonstrations recorded from the
# recipe's own agent (bf16), then `ooze train` on the recipe's TOML for ROLLOUTS rollouts with
# held-out evaluation at the start and the end.
#   endless_terminals  generated terminal tasks (37 families), PPO with a critic
#   echo               the same tasks, GRPO plus the observation loss (lambda 0.05)
#   swe_lite           generated Python packages with an injected bug (21 bugs), GRPO
# Every step runs container episodes (`ooze_env`): the tasks' image must be in the image cache
# ($OOZE_IMAGE_CACHE; `ooze env build recipes/endless_terminals/image.toml` builds it, or carry
# a built one: both recipes use it), and `bwrap` must be on PATH.
# The demonstrations come from `ooze recipe-data RECIPE … --demonstrations --recipe TOML --model
# MODEL --takes TAKES`: the terminal agent runs every training task TAKES times with TerminalOracle
# writing the turns (the reference solution, or a look at /work and a premature "Done."; with 2
# takes each task is shown both ways). DEMOS=DIR reuses DIR/RECIPE/sft.jsonl recorded earlier
# by the same command (here or on another machine) for every seed: demonstrations are text, and
# the recording model's tokenizer only decides where an observation longer than
# agent.max_observation_tokens is cut.
# RL trains on tasks the warm start never saw (the data's other seed), so the policy's habit on
# them is not one it memorised in SFT; the held-out tasks are new to both.
# Every seed of every recipe runs at once; each run's log is OUT/RECIPE/seed-S/log, its metrics
# OUT/RECIPE/seed-S/rl/metrics.jsonl, and a line per run reports held-out pass@1 at every
# evaluation and the step time split into generation, tool execution and training (see summary()).
# Usage: scripts/gpu_terminal_recipes.sh OUT_DIR RECIPE...
#        (env: OOZE, SEEDS="0 1", ROLLOUTS=20, LR=1e-4, SFT_STEPS=1500, SFT_LR=2e-3, SIZE=small,
#         N (demonstrated and RL tasks each; endless_terminals and echo 2000, swe_lite 1000),
#         BATCH (prompts per rollout, 8 samples each; endless_terminals and echo 16, swe_lite 8),
#         TEST=64 held-out tasks evaluated with EVAL_N=4 samples each every EVAL_INTERVAL=10
#         rollouts, TAKES=2, DEMOS, SETS="K=V …" more settings for the recording and the run,
#         ESTIMATOR=grpo to run endless_terminals with GRPO instead of its PPO,
#         DEVICE=cuda; a seed sets the model's initialisation, the SFT order and the RL
#         sampling; the tasks are the same for every seed)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu_terminal_recipes.sh OUT_DIR RECIPE...}
shift
ooze=${OOZE:-target/release/ooze}
seeds=${SEEDS:-0 1}
rollouts=${ROLLOUTS:-20}
lr=${LR:-1e-4}
device=${DEVICE:-cuda}
size=${SIZE:-small}
sft_steps=${SFT_STEPS:-1500}
sft_lr=${SFT_LR:-2e-3}
test_n=${TEST:-64}
eval_n=${EVAL_N:-4}
eval_interval=${EVAL_INTERVAL:-10}
takes=${TAKES:-2}
extra=()
for kv in ${SETS:-}; do extra+=(--set "$kv"); done

# One recipe's demonstrations, SFT and RL for one seed, in DIR.
run_one() { # RECIPE SEED DIR DATA N BATCH
  local recipe=$1 seed=$2 dir=$3 data=$4 n=$5 batch=$6 start sft_done end
  local toml="recipes/$recipe/recipe.toml"
  if [ "${ESTIMATOR:-}" = grpo ] && [ "$recipe" = endless_terminals ]; then
    # The recipe with GRPO in place of PPO: no critic, no GAE settings.
    sed -e '/^\[critic\]/,/^$/d' -e '/^gamma =/d' -e '/^lambda =/d' \
      -e 's/^estimator = "ppo"/estimator = "grpo"/' "$toml" >"$dir/recipe.toml"
    toml="$dir/recipe.toml"
  fi
  start=$(date +%s)
  $ooze init-model --seed "$seed" --family qwen2 --size "$size" "$dir/model" >/dev/null
  # Recorded with this seed's tokenizer (observations are cut in tokens), on the tasks of data
  # seed 0 (DATA's are seed 1's).
  local demos="$dir/demos/sft.jsonl"
  if [ -n "${DEMOS:-}" ]; then
    demos="$DEMOS/$recipe/sft.jsonl"
  else
    $ooze recipe-data "$recipe" "$dir/demos" --n "$n" --seed 0 --demonstrations --recipe "$toml" \
      --model "$dir/model" --takes "$takes" "${extra[@]}"
  fi
  $ooze sft --model "$dir/model" --data "$demos" --out "$dir/sft" \
    --device "$device" --dtype "$([ "$device" = cpu ] && echo fp32 || echo bf16)" \
    --batch-size 64 --lr "$sft_lr" --warmup-steps 20 --max-steps "$sft_steps" \
    --eval-every 100000 --save-every 100000 --seed "$seed" 2>&1 |
    grep -v "^sft: step [0-9]*/[0-9]* loss" || true
  sft_done=$(date +%s)
  $ooze train "$toml" \
    --set "model.path=\"$dir/sft/final-model\"" --set "data.path=\"$data/train.jsonl\"" \
    --set "eval.datasets=[{name = \"test\", path = \"$data/eval.jsonl\", n_samples = $eval_n, pass_k = [1]}]" \
    --set "logging.run_dir=\"$dir/rl\"" --set "rollout.num_rollouts=$rollouts" \
    --set "rollout.batch_size=$batch" --set rollout.n_samples_per_prompt=8 \
    --set "eval.interval=$eval_interval" --set "trainer.lr=$lr" --set trainer.save_interval=1000 \
    --set logging.progress=false --set "model.device=\"$device\"" \
    --set "rollout.seed=$((1234 + seed))" --set "data.seed=$((42 + seed))" "${extra[@]}"
  end=$(date +%s)
  echo "gpu $recipe seed $seed: demonstrations and sft $((sft_done - start)) s, rl $((end - sft_done)) s"
}

# Held-out pass@1 at every evaluation, the training reward and the habit, and
# the mean step time split. The rollout's wall time is split in proportion to what its
# executions spent, per execution: waiting for the model's turns (agent/generate_seconds) and in
# the container (agent/episode_start_seconds + agent/tool_seconds + agent/verify_seconds);
# training is time/train + time/weight_sync.
summary() { # RECIPE SEED RUN_DIR
  python3 - "$@" <<'PY'
import glob, json, sys
recipe, seed, run = sys.argv[1:]
lines = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
evals = [m for m in lines if "eval/test/pass@1" in m]
steps = [m for m in lines if "reward/mean" in m and "time/train" in m]
def mean(f):
    return sum(f(m) for m in steps) / len(steps)
def ends(key):
    return " -> ".join(f"{m.get(key, float('nan')):.2f}" for m in (steps[0], steps[-1]))
def looks(path):
    # The weak habit: the first command is the oracle's look at /work.
    execs = [s for g in map(json.loads, open(path)) for s in g["samples"]]
    return sum('"command":"ls /work"}' in s["response"] for s in execs) / len(execs)
saved = sorted(glob.glob(f"{run}/rollouts/rollout-*.jsonl"))
gen = mean(lambda m: m["agent/generate_seconds"])
env = mean(lambda m: m["agent/episode_start_seconds"] + m["agent/tool_seconds"] + m["agent/verify_seconds"])
rollout = mean(lambda m: m["time/rollout"])
train = mean(lambda m: m["time/train"] + m.get("time/weight_sync", 0.0))
passes = " -> ".join(f"{m['eval/test/pass@1']:.3f}" for m in evals)
print(f"result {recipe} seed {seed}: held-out pass@1 {passes} ({len(steps)} steps); "
      f"train reward {ends('reward/mean')}; "
      f"looks and stops {looks(saved[0]):.2f} -> {looks(saved[-1]):.2f}; step {rollout + train:.1f} s = generation "
      f"{rollout * gen / (gen + env):.1f} + tool execution {rollout * env / (gen + env):.1f} + "
      f"training {train:.1f} (per execution: generation {gen:.2f} s, episode start "
      f"{mean(lambda m: m['agent/episode_start_seconds']):.3f}, commands "
      f"{mean(lambda m: m['agent/tool_seconds']):.3f}, verification "
      f"{mean(lambda m: m['agent/verify_seconds']):.3f})")
PY
}

pids=()
for recipe in "$@"; do
  case $recipe in
    endless_terminals | echo) n=${N:-2000} batch=${BATCH:-16} ;;
    swe_lite) n=${N:-1000} batch=${BATCH:-8} ;;
    *) echo "unknown recipe $recipe: endless_terminals, echo or swe_lite" >&2; exit 2 ;;
  esac
  data="$out/$recipe/data"
  rm -rf "${out:?}/$recipe"
  mkdir -p "$out/$recipe"
  # The RL tasks and rows, shared by the seeds; TEST held-out tasks are evaluated.
  $ooze recipe-data "$recipe" "$data" --n "$n" --seed 1
  head -n "$test_n" "$data/test.jsonl" >"$data/eval.jsonl"
  for seed in $seeds; do
    dir="$out/$recipe/seed-$seed"
    mkdir -p "$dir"
    (run_one "$recipe" "$seed" "$dir" "$data" "$n" "$batch" >"$dir/log" 2>&1 && tail -1 "$dir/log" &&
      summary "$recipe" "$seed" "$dir/rl" || echo "gpu $recipe seed $seed FAILED: see $dir/log") &
    pids+=($!)
  done
done
for pid in "${pids[@]}"; do wait "$pid"; done
