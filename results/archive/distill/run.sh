#!/usr/bin/env bash
# Sparse -> dense distillation on the demo languages: how much
# of the MoE teacher's quality gain a dense student keeps.
#
#   results/archive/distill/run.sh OUT_DIR [STEPS]
#
# Teacher: the demo MoE ($DEMO/models/moe, default DEMO=runs/demo3:
# tiny/moe at 2+2 layers, 8 experts in every other FFN, 3000 steps;
# m4moe-run --recipe=demo). Two tiny/dense students at the teacher's 2+2
# layers (d_ff 512: the teacher's active FLOPs per token) get the same STEPS
# (default 1000) on the same data and seed:
#   dense_scratch  m4moe-train from a random init, ground truth only
#   distilled      m4moe-distill: the teacher's non-expert weights, target
#                  0.25 teacher + 0.75 ground truth (Switch §4.2)
# All three are scored on the same 200 test sentences per language (beam 4,
# sacrebleu) and summarize.py writes results/archive/distill/distill.json: the
# models' dev CE / BLEU / chrF++ and the fraction of the gain kept,
# (student - scratch) / (teacher - scratch).
#
# The shared machine: one training process at a time. Re-running resumes
# killed runs exactly (both tools resume) and skips finished evaluations.
# dense_scratch keeps its step-STEPS checkpoint, which
# results/archive/upcycling/run.sh reuses (as a copy) as its dense base.
set -euo pipefail
demo=${DEMO:-runs/demo3}
teacher=$demo/models/moe
corpus=$demo/corpus
vocab=$demo/vocab
out=${1:?usage: $0 OUT_DIR [STEPS] (e.g. runs/distill 1000)}
steps=${2:-1000}
here=$(cd "$(dirname "$0")" && pwd)
langs=pt,kk,si,ia
common=(--corpus_dir="$corpus" --vocab_dir="$vocab" --languages="$langs"
        --num_encoder_layers=2 --num_decoder_layers=2
        --batch_tokens=4096 --sequence_length=64 --seed=0
        --train_steps="$steps" --checkpoint_every=$(( steps / 2 ))
        --eval_every=$(( steps / 4 )) --log_every=50)
mkdir -p "$out"

m4moe-train --config=tiny/dense "${common[@]}" \
  --model_dir="$out/dense_scratch"

m4moe-distill --teacher_dir="$teacher" --student_config=tiny/dense \
  "${common[@]}" --distill_teacher_weight=0.25 --model_dir="$out/distilled"

# Ablation: the student's initialisation without the teacher's targets
# (--distill_teacher_weight=0: ground truth only, from the teacher's
# non-expert weights) for INIT_ONLY_STEPS (default STEPS; 0 skips it)
# steps, same data and seed: separates what the teacher's weights give from
# what its probabilities give. Scored like the students when it reaches
# STEPS.
init_steps=${INIT_ONLY_STEPS:-$steps}
if (( init_steps > 0 )); then
  m4moe-distill --teacher_dir="$teacher" --student_config=tiny/dense \
    "${common[@]}" --train_steps="$init_steps" --distill_teacher_weight=0 \
    --model_dir="$out/init_only"
fi

# The demo already scored its MoE this way (m4moe-run --recipe=demo: the
# first 200 test sentences, beam 4): reuse that eval JSON and hypotheses.
if [[ ! -f "$out/teacher.json" && -f "$demo/eval/moe.json" ]]; then
  cp -r "$demo/eval/moe" "$out/teacher.hyp"
  cp "$demo/eval/moe.json" "$out/teacher.json"
fi
names=(teacher dense_scratch distilled)
(( init_steps == steps )) && names+=(init_only)
for name in "${names[@]}"; do
  dir=$out/$name
  [[ $name == teacher ]] && dir=$teacher
  [[ -f "$out/$name.json" ]] || {
    m4moe-eval --model_dir="$dir" --vocab_dir="$vocab" \
      --corpus_dir="$corpus" --languages="$langs" --max_sentences=200 \
      --beam_size=4 --model_name="$name" --hypotheses_dir="$out/$name.hyp" \
      --output="$out/$name.json.tmp"
    mv "$out/$name.json.tmp" "$out/$name.json"
  }
done

python "$here/summarize.py" "$out" "$teacher" --corpus_dir="$corpus" \
  --output="$here/distill.json"
