"""Table of the recipe ablation (``ablation.sh``): one row per recipe.

  python3 eval/results/peer/ablation_table.py OUT_DIR [--json PATH]

Reads ``OUT_DIR/<recipe>.json`` (m4moe-eval) and
``OUT_DIR/<recipe>/model/metrics.jsonl`` (m4moe-train) and prints a
Markdown table: steps, last dev CE, source reliance (dev CE with each source
replaced by another pair's minus the true dev CE), training tokens/s, test
BLEU and chrF++ with sacrebleu's 95% bootstrap interval half-widths where
the eval JSON has them.
"""

from __future__ import annotations

import argparse
import json
import pathlib


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


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("out_dir", type=pathlib.Path)
  parser.add_argument("--json", type=pathlib.Path, default=None,
                      help="also write the rows as JSON here")
  args = parser.parse_args()
  table = rows(args.out_dir)
  print(markdown(table))
  if args.json:
    args.json.write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
  main()
