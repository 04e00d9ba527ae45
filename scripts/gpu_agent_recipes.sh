#!/usr/bin/env bash
# The agent recipes on a GPU, each on its generated data: a small Qwen2-architecture model
# warm-started by `ooze sft` on demonstrations recorded from the recipe's own agent (bf16), then
# `ooze train` on the recipe's TOML for ROLLOUTS rollouts with held-out evaluation at the start
# and the end.
#   search_r1       search over a BM25 corpus of made-up facts (held-out questions: unseen facts)
#   retool          Python-tool arithmetic (multi-step expressions)
#   multi_agent     solvers → rewriters → selector, every call a trained sibling
#   memagent        chunked reading with an overwritten memory; eval at 1, 2, 4, 8× the length
#   agentflow       planner trained; executor, verifier, generator, judge frozen (the SFT model)
#   tool_orchestra  orchestrator over two experts warm-started on the recorded expert
#                   conversations: `small` (tiny model, few steps, cheap) and `large` (small
#                   model, more steps, 15× the price)
#   tau_retail      a store's agent with a simulated customer (the SFT model, frozen, plays it);
#                   32 scenarios × 8 per step, all 256 conversations at once (the seed's shape);
#                   the effective concurrency per step is in the metrics (concurrency/*) and
#                   RUN/activity/
# The demonstrations come from `ooze recipe-data RECIPE … --demonstrations --recipe TOML --model
# MODEL`: the recipe's agent runs every training row with the agent type's oracle writing the
# turns (see each oracle's docs for the habits it mixes), rendered with the model's template.
# multi_agent, agentflow and tool_orchestra get two-number sums (`--task addition`); retool gets
# multi-step expressions, which need its Python tool. TASK=arithmetic|addition sets one task.
# Every seed of every recipe runs at once (one GPU holds them all); each run's log is
# OUT/RECIPE/seed-S/log, its metrics OUT/RECIPE/seed-S/grpo/metrics.jsonl, and a line per run
# reports held-out pass@1 at the start and the end, and the times.
# Per recipe, the settings docs/recipes/agent-recipes-gpu.md reports (the policy's size, SFT
# steps and learning rate, data size, and settings for both the recording and the run):
#   search_r1, retool, agentflow, tool_orchestra: small model, 1500 SFT steps at 2e-3
#   multi_agent: medium model (25M), 3000 SFT steps at 5e-4, agent.solvers=2, 2 samples per
#                held-out problem (4 for the others)
#   memagent: medium model (25M), 3500 SFT steps at 5e-4, 20000 training documents of 300 words,
#             chunks of 256 tokens
#   tau_retail: medium model (25M), 3000 SFT steps at 5e-4, 5000 scenarios, EVAL_ROWS held-out
#               stores
# Usage: scripts/gpu_agent_recipes.sh OUT_DIR RECIPE...
#        (env, overriding every recipe's setting: OOZE, SEEDS="0 1 2", ROLLOUTS=20, LR=1e-4,
#         EVAL_INTERVAL=ROLLOUTS (rollouts between held-out evaluations),
#         SFT_STEPS, SFT_LR, SIZE (the policy's `init-model --size`), N (problems; memagent:
#         documents), EVAL_ROWS=100 held-out rows per memagent length and tau_retail's held-out
#         stores, SETS="K=V …" more
#         settings for the recording and the run, DEVICE=cuda; a seed sets the models'
#         initialisation, the SFT order and the RL sampling; the data is the same for every seed)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu_agent_recipes.sh OUT_DIR RECIPE...}
shift
ooze=${OOZE:-target/release/ooze}
seeds=${SEEDS:-0 1 2}
rollouts=${ROLLOUTS:-20}
lr=${LR:-1e-4}
device=${DEVICE:-cuda}
eval_rows=${EVAL_ROWS:-100}
eval_interval=${EVAL_INTERVAL:-$rollouts}

# The recipe's settings (above), then the environment's: sets size, sft_steps, sft_lr, n, extra.
settings() { # RECIPE
  size=small sft_steps=1500 sft_lr=2e-3 n=5000 eval_n=4 extra=()
  case $1 in
    multi_agent) size=medium sft_steps=3000 sft_lr=5e-4 eval_n=2 extra=(--set agent.solvers=2) ;;
    memagent) size=medium sft_steps=3500 sft_lr=5e-4 n=20000 extra=(--set agent.chunk_tokens=256) ;;
    tau_retail) size=medium sft_steps=3000 sft_lr=5e-4 ;;
  esac
  size=${SIZE:-$size} sft_steps=${SFT_STEPS:-$sft_steps} sft_lr=${SFT_LR:-$sft_lr} n=${N:-$n}
  local kv
  for kv in ${SETS:-}; do extra+=(--set "$kv"); done
}

sft() { # MODEL_DIR DATA OUT STEPS SEED
  $ooze sft --model "$1" --data "$2" --out "$3" --device "$device" --dtype "$([ "$device" = cpu ] && echo fp32 || echo bf16)" --batch-size 64 \
    --lr "$sft_lr" --warmup-steps 20 --max-steps "$4" --eval-every 100000 --save-every 100000 --seed "$5" 2>&1 |
    grep -v "^sft: step [0-9]*/[0-9]* loss" || true
}

eval_set() { # NAME PATH N_SAMPLES
  echo "{name = \"$1\", path = \"$2\", n_samples = $3, pass_k = [1]}"
}

# One recipe's data, SFT and GRPO for one seed, in DIR.
run_one() { # RECIPE SEED DIR DATA
  local recipe=$1 seed=$2 dir=$3 data=$4
  local start sft_done end size sft_steps sft_lr n eval_n extra
  settings "$recipe"
  start=$(date +%s)
  local sets=("${extra[@]}") record=(--recipe "recipes/$recipe/recipe.toml" "${extra[@]}")
  case $recipe in
    memagent)
      local evals="" w
      for w in 300 600 1200 2400; do
        evals="$evals$(eval_set "words_$w" "$data/eval_$w.jsonl" 2), "
      done
      sets+=(--set "eval.datasets=[${evals%, }]")
      ;;
    search_r1)
      sets+=(--set "eval.datasets=[$(eval_set test "$data/test.parquet" "$eval_n")]"
        --set "agent.corpus=\"$data/corpus.jsonl\"")
      ;;
    tau_retail) sets+=(--set "eval.datasets=[$(eval_set test "$data/eval.jsonl" "$eval_n")]") ;;
    *) sets+=(--set "eval.datasets=[$(eval_set test "$data/test.parquet" "$eval_n")]") ;;
  esac
  $ooze init-model --seed "$seed" --family qwen2 --size "$size" "$dir/model" >/dev/null
  # The demonstrations are rendered with the model's template, so each seed records its own
  # (the same conversations: the oracle and the data do not depend on the seed).
  local demos="$dir/demos"
  mkdir -p "$demos"
  local -a data_args
  case $recipe in
    memagent) data_args=(--n "$n" --words 300) ;;
    search_r1 | tau_retail) data_args=(--n "$n") ;;
    retool) data_args=(--n "$n" --task "${TASK:-arithmetic}") ;;
    *) data_args=(--n "$n" --task "${TASK:-addition}") ;;
  esac
  $ooze recipe-data "$recipe" "$demos" "${data_args[@]}" --demonstrations "${record[@]}" \
    --model "$dir/model"
  sft "$dir/model" "$demos/sft.jsonl" "$dir/sft" "$sft_steps" "$seed"
  case $recipe in
    agentflow)
      local h
      for h in executor verifier generator judge; do
        sets+=(--set "helpers.$h.path=\"$dir/sft/final-model\"")
      done
      ;;
    tau_retail) sets+=(--set "helpers.user.path=\"$dir/sft/final-model\"") ;;
    tool_orchestra)
      $ooze init-model --seed "$seed" --family qwen2 --size tiny "$dir/experts/small-init" >/dev/null
      sft "$dir/experts/small-init" "$demos/experts.jsonl" "$dir/experts/small" $((sft_steps * 3 / 8)) "$seed"
      $ooze init-model --seed "$seed" --family qwen2 --size small "$dir/experts/large-init" >/dev/null
      sft "$dir/experts/large-init" "$demos/experts.jsonl" "$dir/experts/large" $((sft_steps * 5 / 2)) "$seed"
      sets+=(--set "helpers.small.path=\"$dir/experts/small/final-model\""
        --set "helpers.large.path=\"$dir/experts/large/final-model\"")
      ;;
  esac
  sft_done=$(date +%s)
  local ext=parquet
  [ "$recipe" = tau_retail ] && ext=jsonl
  $ooze train "recipes/$recipe/recipe.toml" \
    --set "model.path=\"$dir/sft/final-model\"" --set "data.path=\"$data/train.$ext\"" \
    --set "logging.run_dir=\"$dir/grpo\"" --set "rollout.num_rollouts=$rollouts" \
    --set "eval.interval=$eval_interval" --set "trainer.lr=$lr" --set trainer.save_interval=1000 \
    --set logging.progress=false --set "model.device=\"$device\"" \
    --set "rollout.seed=$((1234 + seed))" --set "data.seed=$((42 + seed))" "${sets[@]}"
  end=$(date +%s)
  echo "gpu $recipe seed $seed: data and sft $((sft_done - start)) s, grpo $((end - sft_done)) s"
}

# Held-out pass@1 per eval set at every evaluation of a run.
summary() { # RECIPE SEED METRICS
  python3 - "$@" <<'EOF'
import json, sys
recipe, seed, path = sys.argv[1:]
evals = [m for m in map(json.loads, open(path)) if any(k.startswith("eval/") for k in m)]
keys = sorted(k for k in evals[0] if k.startswith("eval/") and k.endswith("/pass@1"))
cells = [f"{k[5:-7]} " + " -> ".join(f"{m[k]:.3f}" for m in evals) for k in keys]
print(f"result {recipe} seed {seed}: " + ", ".join(cells))
steps = [m for m in map(json.loads, open(path)) if "concurrency/alive_max" in m]
if steps:
    mean = lambda k: sum(m[k] for m in steps) / len(steps)
    print(f"concurrency {recipe} seed {seed} (mean over {len(steps)} rollouts): alive "
          f"{mean('concurrency/alive_mean'):.1f} (max {mean('concurrency/alive_max'):.0f}), "
          f"generating median {mean('concurrency/generating_median'):.1f} mean "
          f"{mean('concurrency/generating_mean'):.1f} p90 {mean('concurrency/generating_p90'):.1f}, "
          f"waiting on helpers mean {mean('concurrency/helper_mean'):.1f}; "
          f"rollout {mean('time/rollout'):.1f} s, reward {steps[0]['reward/mean']:.3f} -> "
          f"{steps[-1]['reward/mean']:.3f}")
EOF
}

pids=()
for recipe in "$@"; do
  case $recipe in
    search_r1 | retool | multi_agent | memagent | agentflow | tool_orchestra | tau_retail) ;;
    *) echo "unknown recipe $recipe" >&2; exit 2 ;;
  esac
  settings "$recipe"
  data="$out/$recipe/data"
  rm -rf "${out:?}/$recipe"
  mkdir -p "$out/$recipe"
  # The train and test splits, shared by the seeds.
  case $recipe in
    memagent)
      $ooze recipe-data memagent "$data" --n "$n" --words 300
      for w in 300 600 1200 2400; do head -n "$eval_rows" "$data/test_$w.jsonl" >"$data/eval_$w.jsonl"; done
      ;;
    search_r1) $ooze recipe-data "$recipe" "$data" --n "$n" ;;
    tau_retail)
      $ooze recipe-data tau_retail "$data" --n "$n"
      head -n "$eval_rows" "$data/test.jsonl" >"$data/eval.jsonl"
      ;;
    retool) $ooze recipe-data retool "$data" --n "$n" --task "${TASK:-arithmetic}" ;;
    *) $ooze recipe-data "$recipe" "$data" --n "$n" --task "${TASK:-addition}" ;;
  esac
  for seed in $seeds; do
    dir="$out/$recipe/seed-$seed"
    mkdir -p "$dir"
    (run_one "$recipe" "$seed" "$dir" "$data" >"$dir/log" 2>&1 && tail -1 "$dir/log" &&
      summary "$recipe" "$seed" "$dir/grpo/metrics.jsonl" || echo "gpu $recipe seed $seed FAILED: see $dir/log") &
    pids+=($!)
  done
done
for pid in "${pids[@]}"; do wait "$pid"; done
