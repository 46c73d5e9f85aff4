#!/usr/bin/env bash
# Regenerates results/demo/ (the demo recipe: corpus, vocab, then two
# lanes of one core each -- the 2+2 tiny MoE, 5200 steps of 2048 tokens,
# then the si and ia baselines; beside it the pt and kk baselines, each 2+2
# tiny dense trained to early stopping on dev -- beam-4 eval, report), then
# scores the MoE on the first demo's own test sentences (first_demo.py).
# Stages are resumable:
# re-running the same command skips finished ones.
#
#   results/demo/regenerate.sh [RUN_DIR] [CACHE_DIR]
#
# Then copies the small outputs here: stage markers, eval JSONs and
# hypotheses, the dev evaluations of every training log, report.md,
# summary.json and the figures (no checkpoints, no corpus).
set -euo pipefail
run=${1:-runs/demo}; cache=${2:-$run/cache}
here=$(cd "$(dirname "$0")" && pwd)
/usr/bin/time -v m4moe-run --recipe=demo --run_dir="$run" --cache_dir="$cache"
mkdir -p "$here/eval" "$here/stages" "$here/logs"
cp "$run"/stages/*.json "$here/stages/"
cp -r "$run"/eval/. "$here/eval/"  # eval JSONs and <model>/<lang>.hyp
for log in "$run"/models/*/metrics.jsonl; do
  name=$(basename "$(dirname "$log")")
  grep -v '"kind": "train"' "$log" > "$here/logs/$name.evals.jsonl"
done
cp "$run"/report/{report.md,summary.json,delta_bleu.png,router_stats.png} "$here/"
python3 "$here/first_demo.py" --corpus_dir="$run/corpus" --eval_dir="$run/eval" \
  --output="$here/first_demo.json"
