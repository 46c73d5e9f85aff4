#!/usr/bin/env bash
# Dense -> MoE upcycling on the demo languages: upcycled MoE vs
# MoE from scratch vs continuing the dense model, at equal extra steps.
#
#   results/archive/upcycling/run.sh OUT_DIR [EXTRA] [DENSE_RUN]
#
# The base is a multilingual tiny/dense model at the demo's 2+2 layers
# (d_ff 512) on pt, kk, si, ia (4096 tokens per batch, seed 0). By default it
# is the dense_scratch run of results/archive/distill/run.sh (1000 steps, the
# same flags), copied to OUT_DIR/dense and never modified; if DENSE_RUN does
# not exist, it is trained here for BASE (env, default 1000) steps. Then each
# run gets the same EXTRA steps (default 500) on the same data:
#   dense_continued  a copy of the dense run resumed to BASE + EXTRA
#   moe_upcycled     tiny/moe at 2+2 with 512-wide experts, --init_from_dense
#                    (experts = the dense FFN, routers fresh, new optimiser)
#   moe_upcycled_opt the same with --init_from_dense_optimizer (Adafactor
#                    state and learning-rate schedule carried over); skipped
#                    with SKIP_OPT=1
#   moe_scratch      the same MoE config from a random init
# Each is scored on the first 200 test sentences per language (beam 4,
# sacrebleu), the MoE runs get a routing-by-language analysis on dev, and
# summarize.py writes results/archive/upcycling/upcycling.json.
#
# DEMO (env, default runs/demo3) gives the corpus and vocabularies.
# One training process at a time; re-running resumes killed runs
# (m4moe-train resumes) and skips finished evaluations.
set -euo pipefail
demo=${DEMO:-runs/demo3}
corpus=$demo/corpus; vocab=$demo/vocab
out=${1:?usage: $0 OUT_DIR [EXTRA] [DENSE_RUN]}; extra=${2:-500}
dense_run=${3:-runs/distill/dense_scratch}
base=${BASE:-1000}
here=$(cd "$(dirname "$0")" && pwd)
langs=pt,kk,si,ia
data=(--corpus_dir="$corpus" --vocab_dir="$vocab" --languages="$langs"
      --num_encoder_layers=2 --num_decoder_layers=2
      --batch_tokens=4096 --sequence_length=64 --seed=0 --log_every=50)
# The upcycled experts are as wide as the dense FFN they copy.
moe=(--config=tiny/moe --expert_hidden_dim=512)
mkdir -p "$out"

if [[ ! -d "$out/dense" ]]; then
  if [[ -d "$dense_run" ]]; then
    # Copy through a temporary name: a killed copy is never taken for a run.
    rm -rf "$out/dense.tmp"
    cp -r "$dense_run" "$out/dense.tmp"
    mv "$out/dense.tmp" "$out/dense"
  else
    m4moe-train --config=tiny/dense "${data[@]}" --train_steps="$base" \
      --checkpoint_every="$base" --eval_every=$(( base / 4 )) \
      --model_dir="$out/dense"
  fi
fi
# The base's step, from its newest checkpoint (its config may say more
# steps if it was stopped early).
base=$(sed -n 's/^model_checkpoint_path: "ckpt-\([0-9]*\)"$/\1/p' \
  "$out/dense/checkpoint")
[[ -n "$base" ]] || { echo "run.sh: $out/dense has no checkpoint" >&2; exit 1; }

# Continue a copy, so the upcycling source stays at step BASE.
if [[ ! -d "$out/dense_continued" ]]; then
  rm -rf "$out/dense_continued.tmp"
  cp -r "$out/dense" "$out/dense_continued.tmp"
  mv "$out/dense_continued.tmp" "$out/dense_continued"
fi
m4moe-train --config=tiny/dense "${data[@]}" \
  --train_steps=$(( base + extra )) --checkpoint_every="$extra" \
  --eval_every=100 --model_dir="$out/dense_continued"

runs=(moe_upcycled moe_scratch)
[[ ${SKIP_OPT:-0} == 1 ]] || runs=(moe_upcycled moe_upcycled_opt moe_scratch)
for name in "${runs[@]}"; do
  init=()
  case $name in
    moe_upcycled) init=(--init_from_dense="$out/dense") ;;
    moe_upcycled_opt) init=(--init_from_dense="$out/dense"
                            --init_from_dense_optimizer) ;;
  esac
  m4moe-train "${moe[@]}" "${data[@]}" "${init[@]}" --train_steps="$extra" \
    --checkpoint_every="$extra" --eval_every=100 --model_dir="$out/$name"
done

for name in dense_continued "${runs[@]}"; do
  [[ -f "$out/$name.json" ]] || {
    m4moe-eval --model_dir="$out/$name" --vocab_dir="$vocab" \
      --corpus_dir="$corpus" --languages="$langs" --max_sentences=200 \
      --beam_size=4 --model_name="$name" --hypotheses_dir="$out/$name.hyp" \
      --output="$out/$name.json.tmp"
    mv "$out/$name.json.tmp" "$out/$name.json"
  }
done

for name in "${runs[@]}"; do
  [[ -f "$out/$name.routing/routing.json" ]] || \
    m4moe-analyze-routing --model_dir="$out/$name" --vocab_dir="$vocab" \
      --corpus_dir="$corpus" --languages="$langs" --split=dev \
      --output_dir="$out/$name.routing"
done

python "$here/summarize.py" "$out" --corpus_dir="$corpus" \
  --output="$here/upcycling.json"
