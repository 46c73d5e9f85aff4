#!/usr/bin/env bash
# Does the demo's stopping rule (dev cross-entropy) track test BLEU? Scores
# every checkpoint the demo run kept (every 600 steps) on the same first 200
# test sentences per language as the demo's eval stages (beam 4, sacrebleu),
# then summarize.py pairs each with the dev CE of the same step from the
# training log and writes stopping.json and stopping.md here.
#
#   results/archive/demo_stopping/run.sh RUN_DIR WORK_DIR
#
# RUN_DIR: a finished `m4moe-run --recipe=demo` run (read only). Re-running
# skips the checkpoints already scored.
set -euo pipefail
run=${1:?usage: $0 RUN_DIR WORK_DIR}; work=${2:?usage: $0 RUN_DIR WORK_DIR}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work"
for model_dir in "$run"/models/*/; do
  name=$(basename "$model_dir")
  langs=$(python3 -c "import json,sys; print(','.join(json.load(open(sys.argv[1]))['languages']))" "$model_dir/config.json")
  kind=multilingual; [[ $name == bilingual_* ]] && kind=bilingual
  for index in "$model_dir"/ckpt-*.index; do
    step=${index##*/ckpt-}; step=${step%.index}
    out=$work/$name.$step.json
    [[ -f $out ]] && continue
    m4moe-eval --model_dir="$model_dir" --checkpoint="$step" \
      --vocab_dir="$run/vocab" --corpus_dir="$run/corpus" \
      --languages="$langs" --kind="$kind" --model_name="$name" \
      --max_sentences=200 --beam_size=4 --output="$out.tmp"
    mv "$out.tmp" "$out"
  done
done
python3 "$here/summarize.py" --run_dir="$run" --work_dir="$work" \
  --output_dir="$here"
