#!/usr/bin/env bash
# Recipe ablation on the demo's pt->en pair: the 2+2-layer tiny
# dense model, 4096-token batches, one setting changed at a time from the
# Adam-like probe, every run the same number of steps, then beam-4 decoding of
# the same 200 test sentences and sacrebleu. Two runs at a time, each pinned
# to one core (taskset), so runs that share the machine share it equally.
#
#   results/peer/ablation.sh CORPUS_DIR VOCAB_DIR OUT_DIR [STEPS] [NAMES...]
#
# Re-running skips runs whose eval JSON exists (m4moe-train itself resumes a
# killed run). `python3 results/peer/ablation_table.py OUT_DIR` writes
# the table. Needs the demo corpus and vocabularies (m4moe-run --recipe=demo
# stages corpus and vocab).
set -euo pipefail
corpus=$1; vocab=$2; out=$3; steps=${4:-600}
shift $(( $# < 4 ? $# : 4 ))

common=(--config=tiny/dense --num_encoder_layers=2 --num_decoder_layers=2
        --corpus_dir="$corpus" --vocab_dir="$vocab" --languages=pt
        --batch_tokens=4096 --sequence_length=64 --train_steps="$steps"
        --checkpoint_every="$steps" --eval_every=$(( steps / 3 ))
        --log_every=50 --seed=0
        # Pinned to what tiny/dense carried when this round ran (2026-11-23):
        # dropout 0.1 and no optimiser flags, i.e. the paper's Adafactor.
        --dropout_rate=0.1 --attention_dropout_rate=0.1)
# The Adam-like probe first specified: peak 5e-4 (0.00866/sqrt(300)), held for
# 300 steps then rsqrt decay; momentum, no factoring, parameter scaling or
# update clipping; label smoothing 0.1.
probe=(--learning_rate=0.00866 --warmup_steps=300 --label_smoothing=0.1
       --beta1=0.9 --nomultiply_by_parameter_scale --nofactored
       --clipping_threshold=0)
declare -A recipes=(
  [paper]="--learning_rate=1.0 --warmup_steps=100 --beta1=0 --factored
           --multiply_by_parameter_scale --clipping_threshold=1.0
           --label_smoothing=0"
  [probe]="${probe[*]}"
  [probe_lr2x]="${probe[*]} --learning_rate=0.01732"
  [probe_lr4x]="${probe[*]} --learning_rate=0.03464"
  [probe_factored]="${probe[*]} --factored"
  [probe_clip1]="${probe[*]} --clipping_threshold=1.0"
  [probe_beta0]="${probe[*]} --beta1=0"
  [probe_ls0]="${probe[*]} --label_smoothing=0"
  [probe_dropout0]="${probe[*]} --dropout_rate=0 --attention_dropout_rate=0"
  [probe_paramscale]="${probe[*]} --multiply_by_parameter_scale --learning_rate=1.0"
)
names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=(paper probe probe_lr2x probe_factored
  probe_clip1 probe_beta0 probe_ls0 probe_dropout0)

run_one() {  # name core
  local name=$1 core=$2 dir="$out/$1"
  [[ -f "$out/$name.json" ]] && return 0
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  taskset -c "$core" m4moe-train "${common[@]}" ${recipes[$name]} \
    --model_dir="$dir/model" > "$dir/train.log" 2>&1
  taskset -c "$core" m4moe-eval --model_dir="$dir/model" --vocab_dir="$vocab" \
    --corpus_dir="$corpus" --languages=pt --max_sentences=200 --beam_size=4 \
    --model_name="$name" --kind=bilingual --hypotheses_dir="$dir/hyp" \
    --output="$out/$name.json.tmp" > "$dir/eval.log" 2>&1
  mv "$out/$name.json.tmp" "$out/$name.json"
  echo "$name done"
}

mkdir -p "$out"
i=0
for name in "${names[@]}"; do
  [[ -n ${recipes[$name]+x} ]] || { echo "unknown recipe $name" >&2; exit 2; }
  run_one "$name" $(( i % 2 )) &
  i=$(( i + 1 ))
  if (( i % 2 == 0 )); then wait; fi
done
wait
