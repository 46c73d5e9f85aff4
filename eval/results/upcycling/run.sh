#!/usr/bin/env bash
# Dense -> MoE upcycling (issue 17 §4) on the demo languages: NOT RUN here
# (the shared machine is saturated); commands only.
#
# A multilingual tiny dense model (4+4 layers, d_ff 512) is trained for BASE
# steps; then four runs each get the same EXTRA steps on the same data:
#   dense_continued  the dense run resumed from BASE to BASE + EXTRA
#   moe_upcycled     tiny/moe with 512-wide experts, --init_from_dense
#                    (experts = the dense FFN, routers fresh, new optimiser)
#   moe_upcycled_opt the same with --init_from_dense_optimizer (Adafactor
#                    state and schedule carried over)
#   moe_scratch      the same MoE config from a random init
# Each is scored on the same 200 test sentences per language (beam 4,
# sacrebleu), and both MoE runs get a routing-by-language analysis.
#
#   eval/results/upcycling/run.sh CORPUS_DIR VOCAB_DIR OUT_DIR [BASE] [EXTRA]
#
# Needs the demo corpus and vocabularies (m4moe-run --recipe=demo stages
# corpus and vocab). Re-running resumes killed runs (m4moe-train resumes)
# and skips finished evaluations.
set -euo pipefail
corpus=$1; vocab=$2; out=$3; base=${4:-1200}; extra=${5:-600}
langs=pt,kk,si,ia
data=(--corpus_dir="$corpus" --vocab_dir="$vocab" --languages="$langs"
      --batch_tokens=4096 --sequence_length=64 --eval_every=200
      --log_every=50 --seed=0)
# The upcycled experts are as wide as the dense FFN they copy.
moe=(--config=tiny/moe --expert_hidden_dim=512)
mkdir -p "$out"

m4moe-train --config=tiny/dense "${data[@]}" --train_steps="$base" \
  --checkpoint_every="$base" --model_dir="$out/dense"

# Continue a copy, so the upcycling source stays at step BASE.
[[ -d "$out/dense_continued" ]] || cp -r "$out/dense" "$out/dense_continued"
m4moe-train --config=tiny/dense "${data[@]}" \
  --train_steps=$(( base + extra )) --checkpoint_every="$extra" \
  --model_dir="$out/dense_continued"

m4moe-train "${moe[@]}" "${data[@]}" --init_from_dense="$out/dense" \
  --train_steps="$extra" --checkpoint_every="$extra" \
  --model_dir="$out/moe_upcycled"

m4moe-train "${moe[@]}" "${data[@]}" --init_from_dense="$out/dense" \
  --init_from_dense_optimizer --train_steps="$extra" \
  --checkpoint_every="$extra" --model_dir="$out/moe_upcycled_opt"

m4moe-train "${moe[@]}" "${data[@]}" --train_steps="$extra" \
  --checkpoint_every="$extra" --model_dir="$out/moe_scratch"

for name in dense_continued moe_upcycled moe_upcycled_opt moe_scratch; do
  [[ -f "$out/$name.json" ]] || {
    m4moe-eval --model_dir="$out/$name" --vocab_dir="$vocab" \
      --corpus_dir="$corpus" --languages="$langs" --max_sentences=200 \
      --beam_size=4 --model_name="$name" --hypotheses_dir="$out/$name.hyp" \
      --output="$out/$name.json.tmp"
    mv "$out/$name.json.tmp" "$out/$name.json"
  }
done

for name in moe_upcycled moe_upcycled_opt moe_scratch; do
  m4moe-analyze-routing --model_dir="$out/$name" --vocab_dir="$vocab" \
    --corpus_dir="$corpus" --languages="$langs" --split=dev \
    --output_dir="$out/$name.routing"
done

# Dev cross-entropy curves over the EXTRA steps: the "eval" records of
# $out/{dense_continued,moe_upcycled,moe_upcycled_opt,moe_scratch}/metrics.jsonl.
