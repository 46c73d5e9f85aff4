#!/usr/bin/env bash
# Regenerates results/demo_pypi/run/ (the demo_pypi recipe: the PyPI half of
# the corpus recipe, no apt; corpus, vocab, then two lanes of one core each
# -- the 2+2 tiny MoE and beside it the bilingual baselines, each 2+2 tiny
# dense trained to early stopping on dev -- beam-4 eval, report). Stages
# are resumable: re-running the same command skips finished ones.
#
#   results/demo_pypi/regenerate.sh [RUN_DIR] [CACHE_DIR]
#
# Then copies the small outputs into run/: stage markers, eval JSONs and
# hypotheses, the dev evaluations of every training log, report.md,
# summary.json and the figures (no checkpoints, no corpus), and the
# command's /usr/bin/time -v output.
set -euo pipefail
run=${1:-runs/demo_pypi}; cache=${2:-$run/cache}
here=$(cd "$(dirname "$0")" && pwd)/run
mkdir -p "$here/eval" "$here/stages" "$here/logs"
/usr/bin/time -v -o "$here/time_v.txt" \
  m4moe-run --recipe=demo_pypi --run_dir="$run" --cache_dir="$cache"
cp "$run"/stages/*.json "$here/stages/"
cp -r "$run"/eval/. "$here/eval/"  # eval JSONs and <model>/<lang>.hyp
for log in "$run"/models/*/metrics.jsonl; do
  name=$(basename "$(dirname "$log")")
  grep -v '"kind": "train"' "$log" > "$here/logs/$name.evals.jsonl"
done
cp "$run"/report/{report.md,summary.json,delta_bleu.png,router_stats.png} \
  "$here/"
