#!/usr/bin/env bash
# The agent recipes on a GPU, each on its generated data: a small Qwen2-architecture model
# warm-started by `ooze sft` on the recipe's demonstrations (bf16), then `ooze train` on the
# recipe's TOML for ROLLOUTS rollouts with held-out evaluation at the start and the end.
#   retool          Python-tool arithmetic
#   multi_agent     solvers → rewriters → selector, every call a trained sibling
#   memagent        chunked reading with an overwritten memory; eval at 1, 2, 4, 8× the length
#   agentflow       planner trained; executor, verifier, generator, judge frozen (the SFT model);
#                   its demonstrations are recorded from the recipe's agent with an oracle
#   tool_orchestra  orchestrator over two experts warm-started on expert demonstrations: `small`
#                   (tiny model, few steps, cheap) and `large` (small model, more steps, 15× the
#                   price); the orchestrator's demonstrations always call `small`
# The recipes whose models answer without a tool (multi_agent, agentflow's fixed modules,
# tool_orchestra's experts) get two-number sums (`--task addition`); retool gets multi-step
# expressions, which need its Python tool. TASK=arithmetic|addition sets one task for all.
# Each run's metrics are in OUT/NAME/grpo/metrics.jsonl; a line per recipe reports the times.
# Usage: scripts/gpu_agent_recipes.sh OUT_DIR RECIPE...
#        (env: OOZE, ROLLOUTS=20, LR=1e-4, SFT_STEPS=400, N=5000 problems, DEVICE=cuda,
#         SEED=0: the models' initialisation, the SFT order and the RL sampling; the data stays)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu_agent_recipes.sh OUT_DIR RECIPE...}
shift
ooze=${OOZE:-target/release/ooze}
rollouts=${ROLLOUTS:-20}
lr=${LR:-1e-4}
sft_steps=${SFT_STEPS:-400}
n=${N:-5000}
device=${DEVICE:-cuda}
seed=${SEED:-0}

sft() { # MODEL_DIR DATA OUT STEPS
  $ooze sft --model "$1" --data "$2" --out "$3" --device "$device" --dtype "$([ "$device" = cpu ] && echo fp32 || echo bf16)" --batch-size 64 \
    --lr 2e-3 --warmup-steps 20 --max-steps "$4" --eval-every 100000 --save-every 100000 --seed "$seed" 2>&1 |
    grep -v "^sft: step [0-9]*/[0-9]* loss" || true
}

eval_set() { # NAME PATH N_SAMPLES
  echo "{name = \"$1\", path = \"$2\", n_samples = $3, pass_k = [1]}"
}

for recipe in "$@"; do
  dir="$out/$recipe"
  rm -rf "$dir"
  mkdir -p "$dir"
  start=$(date +%s)
  sets=()
  case $recipe in
    memagent)
      $ooze recipe-data memagent "$dir/data" --n "$n" --words 300 --demonstrations
      evals=""
      for w in 300 600 1200 2400; do
        evals="$evals$(eval_set "words_$w" "$dir/data/test_$w.parquet" 2), "
      done
      sets+=(--set "eval.datasets=[${evals%, }]" --set agent.chunk_tokens=256)
      ;;
    retool | multi_agent | agentflow | tool_orchestra)
      task=${TASK:-$([ "$recipe" = retool ] && echo arithmetic || echo addition)}
      record=()
      if [ "$recipe" = agentflow ]; then
        # Recorded from the recipe's own agent, rendered with the model's chat template.
        $ooze init-model --seed "$seed" --family qwen2 --size small "$dir/model" >/dev/null
        record=(--recipe "recipes/$recipe/recipe.toml" --model "$dir/model")
      fi
      $ooze recipe-data "$recipe" "$dir/data" --n "$n" --task "$task" --demonstrations "${record[@]}"
      sets+=(--set "eval.datasets=[$(eval_set test "$dir/data/test.parquet" 4)]")
      ;;
    *) echo "unknown recipe $recipe" >&2; exit 2 ;;
  esac
  [ -d "$dir/model" ] || $ooze init-model --seed "$seed" --family qwen2 --size small "$dir/model" >/dev/null
  sft "$dir/model" "$dir/data/sft.jsonl" "$dir/sft" "$sft_steps"
  case $recipe in
    agentflow)
      for h in executor verifier generator judge; do
        sets+=(--set "helpers.$h.path=\"$dir/sft/final-model\"")
      done
      ;;
    tool_orchestra)
      $ooze init-model --seed "$seed" --family qwen2 --size tiny "$dir/experts/small-init" >/dev/null
      sft "$dir/experts/small-init" "$dir/data/experts.jsonl" "$dir/experts/small" $((sft_steps * 3 / 8))
      $ooze init-model --seed "$seed" --family qwen2 --size small "$dir/experts/large-init" >/dev/null
      sft "$dir/experts/large-init" "$dir/data/experts.jsonl" "$dir/experts/large" $((sft_steps * 5 / 2))
      sets+=(--set "helpers.small.path=\"$dir/experts/small/final-model\""
        --set "helpers.large.path=\"$dir/experts/large/final-model\"")
      ;;
  esac
  sft_done=$(date +%s)
  $ooze train "recipes/$recipe/recipe.toml" \
    --set "model.path=\"$dir/sft/final-model\"" --set "data.path=\"$dir/data/train.parquet\"" \
    --set "logging.run_dir=\"$dir/grpo\"" --set "rollout.num_rollouts=$rollouts" \
    --set "eval.interval=$rollouts" --set "trainer.lr=$lr" --set trainer.save_interval=1000 \
    --set logging.progress=false --set "model.device=\"$device\"" \
    --set "rollout.seed=$((1234 + seed))" --set "data.seed=$((42 + seed))" "${sets[@]}"
  end=$(date +%s)
  echo "gpu $recipe: data and sft $((sft_done - start)) s, grpo $((end - sft_done)) s"
done
