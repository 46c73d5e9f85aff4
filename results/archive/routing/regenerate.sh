#!/usr/bin/env bash
# Which experts does each demo language use? Needs a finished
# demo run (m4moe-run --recipe=demo --run_dir=RUN, e.g. runs/demo3).
#   results/archive/routing/regenerate.sh RUN
set -euo pipefail
run=${1:?usage: $0 RUN_DIR (a finished m4moe-run --recipe=demo run)}
m4moe-analyze-routing --model_dir="$run/models/moe" \
  --corpus_dir="$run/corpus" --vocab_dir="$run/vocab" --split=dev \
  --output_dir="$(dirname "$0")/demo"
