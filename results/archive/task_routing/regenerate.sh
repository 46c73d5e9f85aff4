#!/usr/bin/env bash
# Task-level routing with per-language extraction on the demo
# corpus: a tiny 2+2 MoE trained with --route_by=language, one SavedModel per
# language (m4moe-export --language=xx), then full vs extracted BLEU/chrF++
# and identical outputs on the first 200 test pairs (measure.py).
#   results/archive/task_routing/regenerate.sh DEMO_RUN WORK_DIR [STEPS]
set -euo pipefail
demo=${1:?usage: $0 DEMO_RUN WORK_DIR [STEPS]}; work=${2:?usage: $0 DEMO_RUN WORK_DIR [STEPS]}
steps=${3:-600}
here=$(cd "$(dirname "$0")" && pwd)
m4moe-train --config=tiny/moe --route_by=language --num_encoder_layers=2 \
  --num_decoder_layers=2 --corpus_dir="$demo/corpus" \
  --vocab_dir="$demo/vocab" --model_dir="$work/model" \
  --train_steps="$steps" --checkpoint_every=200 --eval_every=200 \
  --batch_tokens=2048 --sequence_length=64
for lang in ia kk pt si; do
  [[ -d "$work/export/$lang" ]] || m4moe-export --model_dir="$work/model" \
    --export_dir="$work/export/$lang" --language="$lang" --beam_size=4 \
    --alpha=0.6 --max_decode_length=64 | tee "$work/export_$lang.txt"
done
python "$here/measure.py" --model_dir="$work/model" \
  --export_root="$work/export" --corpus_dir="$demo/corpus" --split=test \
  --max_sentences=200 --beam_size=4 --alpha=0.6 --max_decode_length=64 \
  --output="$here/task_routing.json"
