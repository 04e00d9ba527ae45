#!/usr/bin/env bash
# The main job on the embedded default, no GPU or server needed: sets up, builds ooze, creates a
# tiny Qwen2-family model (random weights, tokenizer trained on ooze's generated corpus, real HF
# format), renders a chat prompt, generates from it and scores the result.
# Usage: scripts/demo.sh [OUT_DIR]   (default: target/demo)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/demo}
scripts/setup.sh
. scripts/torch-env.sh
cargo build --release -p ooze
ooze=target/release/ooze
$ooze info
$ooze init-model --family qwen2 --size tiny "$out/model"
echo '[{"role": "system", "content": "You are a math tutor."}, {"role": "user", "content": "Question: Alice has 3 apples and buys 4 more. How many?"}]' > "$out/messages.json"
echo "== chat prompt, rendered by the model's template"
$ooze render --model "$out/model" --messages "$out/messages.json" --add-generation-prompt | head -c 400; echo
echo "== generation (random weights: expect gibberish; training comes next)"
$ooze generate --model "$out/model" --prompt "Question: Alice has 3 apples and buys 4 more. How many?" --chat --max-new-tokens 32 --seed 1
echo '{"id": "demo", "text": "Question: Alice has 3 apples and buys 4 more. The answer is 7."}' > "$out/score.jsonl"
echo "== per-token log-probs"
$ooze score --model "$out/model" --input "$out/score.jsonl" --entropy | head -c 600; echo
