"""Upcycled MoE vs MoE from scratch vs continued dense, at equal extra steps.

  python results/archive/upcycling/summarize.py OUT_DIR --corpus_dir=CORPUS \
      --output=PATH

Reads what ``run.sh`` left in OUT_DIR:

* ``dense/metrics.jsonl``: the base dense run (its step and last dev CE);
* for each of dense_continued, moe_upcycled, moe_upcycled_opt (if it was
  run) and moe_scratch: ``<name>/metrics.jsonl`` (dev cross-entropy at every
  evaluation, counted in steps after the base for dense_continued),
  ``<name>.json`` and ``<name>.hyp/`` (m4moe-eval: test BLEU and chrF++ of
  the first sentences per language, with sacrebleu's 95% bootstrap
  intervals and paired differences to dense_continued and to moe_scratch,
  as ``results/archive/distill/summarize.py`` computes them);
* ``<name>.routing/routing.json`` of the MoE runs (m4moe-analyze-routing):
  the normalised language-expert mutual information per MoE layer.

Writes one JSON with every number and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import sys

_DISTILL = pathlib.Path(__file__).resolve().parent.parent / "distill"
_spec = importlib.util.spec_from_file_location("distill_summarize",
                                               _DISTILL / "summarize.py")
distill_summary = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(distill_summary)

RUNS = ("dense_continued", "moe_upcycled", "moe_upcycled_opt", "moe_scratch")
BASELINES = ("dense_continued", "moe_scratch")


def _routing(path: pathlib.Path) -> dict[str, float] | None:
  """{layer: normalised MI of language and first-choice expert}."""
  if not path.is_file():
    return None
  layers = json.loads(path.read_text(encoding="utf-8"))["layers"]
  return {name: layer["first_choice"]["normalized_mutual_information"]
          for name, layer in sorted(layers.items())}


def summarize(out_dir: pathlib.Path, *,
              corpus_dir: pathlib.Path | None = None) -> dict:
  """Every number of the comparison (see the module docstring)."""
  base_curve = distill_summary.dev_curve(out_dir / "dense" / "metrics.jsonl")
  if not base_curve:
    sys.exit(f"summarize.py: {out_dir}/dense/metrics.jsonl has no dev "
             "evaluation")
  base_step = max(base_curve)
  names = [n for n in RUNS if (out_dir / n).is_dir()]
  for needed in BASELINES + ("moe_upcycled",):
    if needed not in names:
      sys.exit(f"summarize.py: {out_dir / needed} not found: run run.sh "
               "first")
  runs = {}
  for name in names:
    curve = distill_summary.dev_curve(out_dir / name / "metrics.jsonl")
    offset = base_step if name == "dense_continued" else 0
    extra = {step - offset: record["dev_ce_mean"]
             for step, record in sorted(curve.items()) if step > offset}
    if not extra:
      sys.exit(f"summarize.py: {out_dir / name}/metrics.jsonl has no dev "
               "evaluation after the base")
    last = curve[max(curve)]
    runs[name] = {"run_dir": str(out_dir / name),
                  "extra_steps": max(extra), "dev_ce": last["dev_ce_mean"],
                  "dev_ce_per_language": last["dev_ce"],
                  "dev_ce_curve": extra,
                  "routing_nmi": _routing(out_dir / f"{name}.routing"
                                          / "routing.json"),
                  **distill_summary.eval_scores(out_dir / f"{name}.json")}
  steps = {r["extra_steps"] for r in runs.values()}
  if len(steps) != 1:
    sys.exit("summarize.py: the runs stopped after different extra steps "
             f"({ {n: r['extra_steps'] for n, r in runs.items()} }): finish "
             "them all")
  intervals = {}
  for baseline in BASELINES:
    got = distill_summary.score_intervals(out_dir, names, baseline=baseline,
                                         corpus_dir=corpus_dir)
    for name, metrics in got.items():
      for metric, entry in metrics.items():
        intervals.setdefault(name, {}).setdefault(metric, {}).update(entry)
  return {"base_dense": {"run_dir": str(out_dir / "dense"),
                         "steps": base_step,
                         "dev_ce": base_curve[base_step]["dev_ce_mean"]},
          "extra_steps": steps.pop(), "runs": runs,
          "test_intervals": intervals}


def markdown(summary: dict) -> str:
  """One row per run: params, dev CE, mean test scores, Δ BLEU."""
  with_interval = distill_summary.with_interval
  intervals = summary["test_intervals"]
  lines = ["| run | params | dev CE | BLEU | chrF++ | BLEU − dense_continued "
           "| BLEU − moe_scratch |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]

  def delta(name: str, baseline: str) -> str:
    return distill_summary.format_delta(
        intervals[name]["bleu"].get(f"minus_{baseline}", {}).get("mean"))

  for name, run in summary["runs"].items():
    got = intervals[name]
    lines.append(
        f"| {name} | {run['num_params']:,} | {run['dev_ce']:.3f} | "
        f"{with_interval(run['bleu'], got['bleu']['mean'])} | "
        f"{with_interval(run['chrf'], got['chrf']['mean'])} | "
        f"{delta(name, 'dense_continued')} | {delta(name, 'moe_scratch')} |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("out_dir", type=pathlib.Path)
  parser.add_argument("--output", type=pathlib.Path, required=True)
  parser.add_argument("--corpus_dir", type=pathlib.Path, default=None,
                      help="Corpus the runs were scored on (default: the "
                      "eval JSONs' metadata.corpus_dir).")
  args = parser.parse_args()
  summary = summarize(args.out_dir, corpus_dir=args.corpus_dir)
  distill_summary.write_summary(summary, args.output)
  print(markdown(summary))


if __name__ == "__main__":
  main()
