#!/usr/bin/env bash
# Regenerates eval/results/demo/ (the demo recipe: corpus, vocab, tiny MoE,
# four early-stopped 2+2 dense baselines, beam-4 eval, report). Stages are
# resumable: re-running the same command skips finished ones.
#
#   eval/results/demo/regenerate.sh [RUN_DIR] [CACHE_DIR]
#
# Then copies the small outputs here: stage markers, eval JSONs and
# hypotheses, report.md, summary.json and the figure (no checkpoints, no
# corpus).
set -euo pipefail
run=${1:-/work/runs/demo}; cache=${2:-/work/runs/cache}
here=$(cd "$(dirname "$0")" && pwd)
/usr/bin/time -v m4moe-run --recipe=demo --run_dir="$run" --cache_dir="$cache"
mkdir -p "$here/eval" "$here/stages"
cp "$run"/stages/*.json "$here/stages/"
cp -r "$run"/eval/. "$here/eval/"  # eval JSONs and <model>/<lang>.hyp
if [[ -d "$run/report" ]]; then
  cp "$run"/report/{report.md,summary.json,delta_bleu.png,router_stats.png} "$here/"
fi
