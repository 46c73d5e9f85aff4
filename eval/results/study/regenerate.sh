#!/usr/bin/env bash
# Regenerates the mini-M4 study v2 into eval/results/study/v2/.
#
#   bash eval/results/study/regenerate.sh [RUN_DIR] [CACHE_DIR]
#   COPY_ONLY=1 bash eval/results/study/regenerate.sh [RUN_DIR]
#
# 1. `m4moe-run --recipe=study` builds the offline corpus for the study's 16
#    languages with the frozen split keys (data/splits/split_keys.txt,
#    version 2) and the out-of-domain packages (data/splits/ood_packages.txt)
#    held out as test_ood, downloading the pinned Debian/PyPI packages into
#    CACHE_DIR once; trains the SentencePiece vocabularies, the 2+2-layer
#    dense and MoE models with seeds 1-3 each and the 16 bilingual baselines,
#    every run to early stopping on dev; decodes every in-domain and
#    out-of-domain test sentence (beam 4), scores them with sacrebleu and
#    writes report/ (in-domain) and report_ood/ (out-of-domain), with seed
#    spreads and 95% bootstrap intervals. It is resumable: re-running skips
#    finished stages, and a killed training stage resumes from its last
#    checkpoint.
# 2. `m4moe-report --metric=chrf` writes both reports again on chrF++.
# 3. Reports, eval JSONs, training logs, stage times and the corpus report
#    are copied to v2/.
#
# COPY_ONLY=1 skips steps 1-2 and copies what has landed so far (eval JSONs,
# training logs, stage records, and reports if written), so results can be
# committed as they land during a run that takes several sittings.
#
# About 9-15 h on a 2-core machine (README.md in this directory).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/v2"
run_dir="${1:-runs/study}"
cache_dir="${2:-${run_dir}/cache}"

if [[ -z "${COPY_ONLY:-}" ]]; then
  m4moe-run --recipe=study --run_dir="${run_dir}" --cache_dir="${cache_dir}"
  # The same comparisons on chrF++.
  logs="dense_L2=${run_dir}/models/dense_L2_s1/metrics.jsonl"
  logs+=",moe_E8_L2=${run_dir}/models/moe_E8_L2_s1/metrics.jsonl"
  logs+=",dense_L2_6k=${run_dir}/models/dense_L2_6k_s1/metrics.jsonl"
  logs+=",moe_E8_L2_6k=${run_dir}/models/moe_E8_L2_6k_s1/metrics.jsonl"
  for split in eval eval_ood; do
    suffix="${split#eval}"  # "" or "_ood"
    m4moe-report --metric=chrf \
      --models="${run_dir}/${split}/dense_L2_s*.json,${run_dir}/${split}/moe_E8_L2_s*.json,${run_dir}/${split}/dense_L2_6k_s*.json,${run_dir}/${split}/moe_E8_L2_6k_s*.json" \
      --baselines="${run_dir}/${split}/bilingual_*.json" \
      --corpus_dir="${run_dir}/corpus" --training_logs="${logs}" \
      --output_dir="${run_dir}/report${suffix}_chrf" \
      --ce_thresholds=4.0,3.0,2.5 \
      --title="m4moe study v2 on chrF++ (test${suffix}): dense vs MoE vs bilingual"
  done
fi

mkdir -p "${here}/metrics"
for dir in report report_chrf report_ood report_ood_chrf; do
  if [[ -d "${run_dir}/${dir}" ]]; then
    mkdir -p "${here}/${dir}"
    cp -r "${run_dir}/${dir}/." "${here}/${dir}/"
  fi
done
for split in eval eval_ood; do
  if compgen -G "${run_dir}/${split}/*.json" > /dev/null; then
    mkdir -p "${here}/${split}"
    cp "${run_dir}/${split}"/*.json "${here}/${split}/"
  fi
done
for log in "${run_dir}"/models/*/metrics.jsonl; do
  [[ -f "${log}" ]] || continue
  cp "${log}" "${here}/metrics/$(basename "$(dirname "${log}")").jsonl"
done
if [[ -f "${run_dir}/corpus/report.json" ]]; then
  cp "${run_dir}/corpus/report.json" "${here}/corpus_report.json"
fi
if [[ -d "${run_dir}/stages" ]]; then
  cp -r "${run_dir}/stages" "${here}/"
fi
echo "study v2 results copied to ${here}"
