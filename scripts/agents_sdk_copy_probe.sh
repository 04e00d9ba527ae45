#!/usr/bin/env bash
# Does an agents_sdk warm start copy the price it looked up? For each held-out question of DATA,
# the demonstration that looks the price up (make_data.py's own, rendered by `ooze render`) is cut
# after the price and scored (`ooze score`); prints the mean probability, at temperature 1, of the
# price's two digits given everything before them (1/90 = 0.011 is a random answer) and how many
# questions exceed 0.5. docs/recipes/python-agents-gpu.md has the table this made.
# Usage: scripts/agents_sdk_copy_probe.sh MODEL_DIR DATA_DIR   (env: OOZE, PYTHON, DEVICE=auto)
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: scripts/agents_sdk_copy_probe.sh MODEL_DIR DATA_DIR}
data=${2:?usage: scripts/agents_sdk_copy_probe.sh MODEL_DIR DATA_DIR}
ooze=${OOZE:-target/release/ooze}
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" - "$ooze" "$model" "$data/test.jsonl" "$work" <<'PY'
import json, os, random, subprocess, sys
sys.path.insert(0, "recipes/agents_sdk")
from make_data import demonstration
ooze, model, test, work = sys.argv[1:]
with open(os.path.join(work, "probe.jsonl"), "w") as out:
    for line in open(test):
        row = json.loads(line)
        item = row["prompt"].split(" one ")[1].removesuffix(" cost?")
        demo = demonstration(random.Random(0), row["prompt"], item, row["metadata"]["prices"], 1.0)
        for name in ("messages", "tools"):
            with open(os.path.join(work, name + ".json"), "w") as f:
                json.dump(demo[name], f)
        text = json.loads(subprocess.run(
            [ooze, "render", "--model", model, "--messages", os.path.join(work, "messages.json"),
             "--tools", os.path.join(work, "tools.json")],
            check=True, capture_output=True, text=True).stdout)["text"]
        price = f"${row['label']}"
        out.write(json.dumps({"text": text[:text.rindex(price + ".") + len(price)]}) + "\n")
PY
"$ooze" score --model "$model" --input "$work/probe.jsonl" --output "$work/scores.jsonl" \
  --device "${DEVICE:-auto}" >/dev/null 2>"$work/score.log" || { cat "$work/score.log" >&2; exit 1; }
"$python" - "$work/scores.jsonl" <<'PY'
import json, math, sys
p = [math.exp(sum(json.loads(line)["log_probs"][-2:])) for line in open(sys.argv[1])]
print(f"P(copied price): mean {sum(p) / len(p):.3f}, over 0.5 on {sum(x > 0.5 for x in p)} "
      f"of {len(p)} held-out questions")
PY
