#!/usr/bin/env bash
# Recipe ablation, round 2: the settings round 1 (ablation.sh)
# did not isolate, each changed alone from the zoo's small-model recipe of
# the time (pinned in $base below: peak 1e-3 held 300 steps then rsqrt decay,
# beta1 0.9, unfactored, no parameter scaling or clipping, label smoothing
# 0.1, dropout 0.1), on the demo's pt->en pair with the 2+2-layer models and
# 4096-token batches, every run to the same number of training tokens, then
# beam-4 decoding of the first 1000 pt test sentences and sacrebleu (with
# its 95% bootstrap intervals). Each setting runs with every seed in SEEDS.
#
#   results/peer/ablation2.sh CORPUS_DIR VOCAB_DIR OUT_DIR [NAMES...]
#   SEEDS="0 1" STEPS=1000 JOBS=1 results/peer/ablation2.sh ...
#
# Writes OUT_DIR/<name>_s<seed>.json (m4moe-eval of the last checkpoint) and,
# for the averaging rows, <name>_avg<k>_s<seed>.json (the mean of the last
# k checkpoints, m4moe-average), their decoded sentences in
# <name>_s<seed>/hyp and hyp_avg<k>. Re-running skips runs whose eval JSON
# exists; m4moe-train resumes a killed run. JOBS runs at a time (each
# m4moe-train uses one intra-op thread). `python3
# results/peer/ablation_table.py OUT_DIR --seeds` writes the table.
set -euo pipefail
corpus=$1; vocab=$2; out=$3
shift 3
steps=${STEPS:-1000}
seeds=(${SEEDS:-0 1})
jobs=${JOBS:-1}

# The schedule is peak * min(1, sqrt(warmup / step)) with learning_rate =
# peak * sqrt(warmup); rows that change the warmup or the batch size keep
# the 1e-3 peak, and the batch-size rows scale steps and warmup so that the
# rate is the same function of training tokens.
# The recipe of this round, pinned (configs/tiny/*.flags carried it until
# the round's winners replaced it): every row starts from it.
base="--learning_rate=0.01732 --warmup_steps=300 --dropout_rate=0.1
  --attention_dropout_rate=0.1 --beta1=0.9 --nomultiply_by_parameter_scale
  --nofactored --clipping_threshold=0 --label_smoothing=0.1"
declare -A recipes=(
  [recipe]=""
  [warmup100]="--warmup_steps=100 --learning_rate=0.01"
  [warmup1000]="--warmup_steps=1000 --learning_rate=0.031623"
  # Adafactor's parameter scaling alone: the update is multiplied by each
  # matrix's RMS (about 0.05-0.09 here), so the rate is 10x the recipe's:
  # a relative step of 1e-2 at the peak, the paper's cap.
  [paramscale]="--multiply_by_parameter_scale --learning_rate=0.1732"
  [batch2048]="--batch_tokens=2048 --warmup_steps=600 --learning_rate=0.024495"
  [batch8192]="--batch_tokens=8192 --warmup_steps=150 --learning_rate=0.012247"
  [dropout0]="--dropout_rate=0 --attention_dropout_rate=0"
  [labelsmooth0]="--label_smoothing=0"
  # The MoE (tiny/moe 2+2, same active FLOPs) with the fixed initializer
  # and with the since-fixed defect: router and expert weights drawn
  # with the nominal, not the realised, sigma, i.e. 0.8796x narrower
  # (scale 0.8796^2 = 0.7737).
  [moe]=""
  [moe_initdefect]="--expert_init_scale=0.7737"
  # The candidates together: warmup 1000 (same 1e-3 peak) and no dropout;
  # and the same at 2048-token batches (twice the steps, warmup 2000: the
  # same rate per training token).
  [combo]="--warmup_steps=1000 --learning_rate=0.031623 --dropout_rate=0 --attention_dropout_rate=0"
  [combo_b2048]="--batch_tokens=2048 --warmup_steps=2000 --learning_rate=0.044721 --dropout_rate=0 --attention_dropout_rate=0"
)
# The zoo config of each row (default tiny/dense).
declare -A config=([moe]=tiny/moe [moe_initdefect]=tiny/moe)
# Steps per row (to equal training tokens).
declare -A step_factor=([batch2048]=2 [batch8192]=0.5 [combo_b2048]=2)
# Rows also decoded from the average of their last k checkpoints, for each k
# listed (checkpoints every tenth of the run, the last 5 kept).
declare -A averaged=([recipe]="2 5" [moe]="2 5")

names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=(recipe moe moe_initdefect warmup100
  warmup1000 paramscale batch2048 batch8192 dropout0 labelsmooth0)

evaluate() {  # name checkpoint_flag output hypotheses_subdir
  local name=$1 flag=$2 output=$3 dir="$out/$1" hyp=$4
  m4moe-eval --model_dir="$dir/model" --vocab_dir="$vocab" \
    --corpus_dir="$corpus" --languages=pt --max_sentences=1000 \
    --beam_size=4 --model_name="${output%.json}" --kind=bilingual \
    $flag --hypotheses_dir="$dir/$hyp" \
    --output="$out/$output.tmp" >> "$dir/eval.log" 2>&1
  mv "$out/$output.tmp" "$out/$output"
}

run_one() {  # name seed
  local name=$1 seed=$2 run="$1_s$2" dir="$out/$1_s$2"
  local n k every
  n=$(python3 -c "print(int($steps * ${step_factor[$name]:-1}))")
  every=$(( n / 10 ))
  mkdir -p "$dir"
  if [[ ! -f "$out/$run.json" ]]; then
    # shellcheck disable=SC2086
    m4moe-train --config="${config[$name]:-tiny/dense}" --num_encoder_layers=2 \
      --num_decoder_layers=2 --corpus_dir="$corpus" --vocab_dir="$vocab" \
      --languages=pt --batch_tokens=4096 --sequence_length=64 \
      --train_steps="$n" --checkpoint_every="$every" --keep_checkpoints=5 \
      --eval_every=$(( n / 4 )) --log_every=50 --seed="$seed" \
      $base ${recipes[$name]} --model_dir="$dir/model" >> "$dir/train.log" 2>&1
    evaluate "$run" "" "$run.json" hyp
  fi
  for k in ${averaged[$name]:-}; do
    [[ -f "$out/${name}_avg${k}_s$seed.json" ]] && continue
    m4moe-average --model_dir="$dir/model" --last="$k" >> "$dir/eval.log" 2>&1
    evaluate "$run" "--checkpoint=averaged" "${name}_avg${k}_s$seed.json" \
      "hyp_avg$k"
  done
  echo "$run done"
}

mkdir -p "$out"
i=0
for seed in "${seeds[@]}"; do
  for name in "${names[@]}"; do
    [[ -n ${recipes[$name]+x} ]] || { echo "unknown recipe $name" >&2; exit 2; }
    run_one "$name" "$seed" &
    i=$(( i + 1 ))
    if (( i % jobs == 0 )); then wait; fi
  done
done
wait
