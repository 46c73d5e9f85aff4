"""Tables of the recipe ablations: ``ablation.sh`` (round 1, one run per
recipe) and ``ablation2.sh`` (round 2, several seeds, ``--seeds``).

  python3 results/peer/ablation_table.py OUT_DIR [--json PATH]
  python3 results/peer/ablation_table.py OUT_DIR --seeds [--json PATH]

Reads ``OUT_DIR/<recipe>.json`` (m4moe-eval) and
``OUT_DIR/<recipe>/model/metrics.jsonl`` (m4moe-train) and prints a
Markdown table: steps, last dev CE, source reliance (dev CE with each source
replaced by another pair's minus the true dev CE), training tokens/s, test
BLEU and chrF++ with sacrebleu's 95% bootstrap interval half-widths where
the eval JSON has them.

With ``--seeds`` (round 2) it reads ``OUT_DIR/<row>_s<seed>.json`` and the
decoded sentences beside them, and prints per row: the seeds, steps, mean
dev CE and source reliance, BLEU and chrF++ of each seed and their mean
with sacrebleu's 95% bootstrap interval (the seeds' paired resamples
averaged index by index), and the row's difference from its reference row
(``recipe`` for the dense rows and for ``moe`` itself, ``moe`` for the
other MoE rows, the row without ``_avg<k>`` for an averaged checkpoint) on the same resamples, with the
paired bootstrap p-value: ``*`` marks p < 0.05.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import re

import numpy as np

from m4moe.eval import examples
from m4moe.eval import results
from m4moe.eval import significance


def _metrics(path: pathlib.Path) -> dict:
  records = [json.loads(line) for line in path.read_text().splitlines()
             if line.strip()]
  evals = [r for r in records if r.get("kind") == "eval"]
  train = [r for r in records if r.get("kind") == "train"]
  last = evals[-1] if evals else {}
  speeds = [r["tokens_per_sec"] for r in train[1:]]  # the first has tracing
  return {
      "steps": max((r.get("step", 0) for r in records), default=0),
      "dev_ce": last.get("dev_ce_mean"),
      "source_reliance": next(iter(last.get("source_reliance", {}).values()),
                              None),
      "tokens_per_sec": sorted(speeds)[len(speeds) // 2] if speeds else None,
  }


def rows(out_dir: pathlib.Path) -> list[dict]:
  """One dict per recipe with an eval JSON, in file-name order."""
  out = []
  for path in sorted(out_dir.glob("*.json")):
    result = json.loads(path.read_text())
    lang = next(iter(result["languages"].values()))
    row = {"recipe": result["model"], "bleu": lang.get("bleu"),
           "chrf": lang.get("chrf"), "test_sentences": lang.get("num_segments")}
    metrics = out_dir / path.stem / "model" / "metrics.jsonl"
    if metrics.is_file():
      row.update(_metrics(metrics))
    out.append(row)
  return out


def _fmt(value, digits=2):
  return "–" if value is None else f"{value:.{digits}f}"


def markdown(table: list[dict]) -> str:
  lines = ["| recipe | steps | dev CE | source reliance | tokens/s | BLEU | chrF++ |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
  for r in table:
    lines.append(
        f"| {r['recipe']} | {r.get('steps', '–')} | {_fmt(r.get('dev_ce'))} | "
        f"{_fmt(r.get('source_reliance'))} | {_fmt(r.get('tokens_per_sec'), 0)} | "
        f"{_fmt(r['bleu'], 1)} | {_fmt(r['chrf'], 1)} |")
  return "\n".join(lines)


_SEEDED = re.compile(r"^(?P<row>.+)_s(?P<seed>\d+)$")


def reference_row(row: str) -> str | None:
  """The row a round-2 row is compared with (None: it is a reference)."""
  if "_avg" in row:
    return row.split("_avg")[0]
  if row == "recipe":
    return None
  if row == "moe":
    return "recipe"  # MoE - dense at equal steps and active FLOPs
  if row == "combo_b2048":
    return "combo"  # the batch size on top of the other winners
  return "moe" if row.startswith("moe") else "recipe"


def seeded_rows(out_dir: pathlib.Path, *, language: str = "pt") -> list[dict]:
  """Round 2: one dict per row, over its seeds, with intervals and the
  paired difference from its reference row (same seeds only)."""
  by_row: dict[str, dict[int, pathlib.Path]] = collections.defaultdict(dict)
  for path in sorted(out_dir.glob("*_s*.json")):
    match = _SEEDED.match(path.stem)
    if match:
      by_row[match["row"]][int(match["seed"])] = path
  data = {}
  for row, paths in by_row.items():
    seeds = {}
    for seed, path in sorted(paths.items()):
      result = results.read_eval_json(path)
      outputs = examples.load_run_outputs(result, label=path.stem,
                                          eval_path=path)
      if language not in outputs.languages:
        raise SystemExit(f"{path}: no usable {language} outputs "
                         f"({outputs.missing or outputs.problems})")
      out = outputs.languages[language]
      model_dir = out_dir / f"{row.split('_avg')[0]}_s{seed}" / "model"
      seeds[seed] = {
          "outputs": out,
          "metrics": _metrics(model_dir / "metrics.jsonl")
                     if (model_dir / "metrics.jsonl").is_file() else {},
          **{m: significance.resample(list(out.hypotheses),
                                      list(out.references), metric=m,
                                      target_lang=out.target_lang)
             for m in significance.METRICS}}
    data[row] = seeds
  table = []
  for row, seeds in sorted(data.items()):
    entry = {"row": row, "seeds": sorted(seeds),
             "test_sentences": len(next(iter(seeds.values()))["outputs"]
                                   .references)}
    for key in ("steps", "dev_ce", "source_reliance", "tokens_per_sec"):
      values = [s["metrics"].get(key) for s in seeds.values()]
      values = [v for v in values if v is not None]
      entry[key] = float(np.mean(values)) if values else None
    ref = reference_row(row)
    common = sorted(set(seeds) & set(data.get(ref, {}))) if ref else []
    for metric in significance.METRICS:
      mean = significance.mean_resamples([s[metric] for s in seeds.values()])
      entry[metric] = {
          "per_seed": {str(k): s[metric].score for k, s in seeds.items()},
          **significance.interval(mean).to_dict()}
      if common:
        diff = significance.paired_difference(
            significance.mean_resamples([seeds[k][metric] for k in common]),
            significance.mean_resamples([data[ref][k][metric]
                                         for k in common]))
        entry[metric]["vs"] = {"row": ref, "seeds": common, **diff.to_dict()}
    table.append(entry)
  return table


def seeded_markdown(table: list[dict]) -> str:
  lines = ["| row | seeds | steps | tokens/s | dev CE | source reliance "
           "| BLEU per seed | BLEU mean ±95% | Δ BLEU vs (p) | chrF++ mean ±95% "
           "| Δ chrF++ |",
           "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | --- | ---: "
           "| ---: |"]
  for r in table:
    def delta(metric):
      vs = r[metric].get("vs")
      if not vs:
        return "–"
      mark = "*" if vs["significant"] else ""
      return (f"{vs['score']:+.1f}{mark} ±{vs['ci']:.1f} vs {vs['row']} "
              f"(p={vs['p_value']:.3f})" if metric == "bleu"
              else f"{vs['score']:+.1f}{mark}")
    per_seed = " / ".join(f"{v:.1f}" for v in r["bleu"]["per_seed"].values())
    lines.append(
        f"| {r['row']} | {','.join(map(str, r['seeds']))} | "
        f"{_fmt(r['steps'], 0)} | {_fmt(r['tokens_per_sec'], 0)} | "
        f"{_fmt(r['dev_ce'])} | "
        f"{_fmt(r['source_reliance'])} | {per_seed} | "
        f"{r['bleu']['score']:.1f} ±{r['bleu']['ci']:.1f} | {delta('bleu')} | "
        f"{r['chrf']['score']:.1f} ±{r['chrf']['ci']:.1f} | {delta('chrf')} |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("out_dir", type=pathlib.Path)
  parser.add_argument("--json", type=pathlib.Path, default=None,
                      help="also write the rows as JSON here")
  parser.add_argument("--seeds", action="store_true",
                      help="round 2: <row>_s<seed>.json with intervals")
  args = parser.parse_args()
  if args.seeds:
    table = seeded_rows(args.out_dir)
    print(seeded_markdown(table))
  else:
    table = rows(args.out_dir)
    print(markdown(table))
  if args.json:
    args.json.write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
  main()
