#!/usr/bin/env bash
# On-policy distillation on one GPU, the teacher (a small model SFT'd on addition) first behind
# `ooze serve` (teacher.url, SGLang /generate prompt log-probs), then in process (teacher.path), into
# the random-weight student with the same seeds: prints both runs' teacher-student gap, k3 KL and
# train-phase seconds per rollout. Usage: scripts/gpu_opd_teacher.sh [OUT_DIR]  (OOZE=path/to/ooze)
set -euo pipefail
O=${OOZE:-target/release/ooze}; D=${1:-target/gpu-opd}; rm -rf $D; mkdir -p $D
$O init-model --family qwen2 --size small $D/model > /dev/null
$O task addition $D/sft.jsonl --n 50000 --demonstrations --error-rate 0.3 --seed 0 > /dev/null
$O sft --model $D/model --data $D/sft.jsonl --out $D/sft --device cuda --dtype bf16 --batch-size 256 --lr 3e-3 \
  --warmup-steps 20 --max-steps 500 --min-lr-ratio 0.1 --eval-every 100000 --save-every 100000 --eval-fraction 0.01 2>&1 | tail -1
$O serve --model $D/sft/final-model --device cuda --dtype bf16 --port 30111 --mem-fraction 0.2 > $D/serve.log 2>&1 &
serve_pid=$!; trap 'kill $serve_pid 2>/dev/null' EXIT
for i in $(seq 1 60); do curl -s localhost:30111/health > /dev/null && break; sleep 1; done
common=(--set "model.path=\"$D/model\"" --set algorithm.advantage.opd_coef=1.0 --set rollout.num_rollouts=3
  --set eval.at_start=false --set 'eval.datasets=[]' --set logging.report=false --set logging.tensorboard=false --set trainer.lr=1e-3)
$O train recipes/addition-gpu.toml "${common[@]}" --set "logging.run_dir=\"$D/url\"" --set 'teacher.url="http://127.0.0.1:30111"' 2>&1 | grep -E "rollout [0-9]|teacher|done"
$O train recipes/addition-gpu.toml "${common[@]}" --set "logging.run_dir=\"$D/path\"" --set "teacher.path=\"$D/sft/final-model\"" 2>&1 | grep -E "rollout [0-9]|teacher|done"
OUT_DIR=$D python3 - <<'PY'
import json, os
out = os.environ["OUT_DIR"]
for run in ["url", "path"]:
    rows = [json.loads(l) for l in open(f"{out}/{run}/metrics.jsonl")]
    print(run, "gap", [round(r["train/teacher_logp_gap"], 4) for r in rows], "kl", [round(r["train/teacher_kl"], 4) for r in rows], "train s", [round(r["time/train"], 3) for r in rows])
PY
