"""Does dev cross-entropy (the demo's stopping rule) track test BLEU?

  python3 results/archive/demo_stopping/summarize.py --run_dir=RUN \
      --work_dir=WORK --output_dir=DIR

Reads ``WORK/<model>.<step>.json`` (m4moe-eval of checkpoint ``<step>`` of
``RUN/models/<model>``, written by ``run.sh``) and the ``eval`` records of
``RUN/models/<model>/metrics.jsonl`` (dev CE per language at every
evaluation), and writes ``stopping.json`` (every number) and ``stopping.md``:

* per model and language, one row per kept checkpoint: dev CE, test BLEU and
  chrF++;
* whether the checkpoint with the lowest dev CE is the one with the highest
  test BLEU, and the BLEU given up by choosing on dev CE ("regret");
* the Spearman rank correlation of -dev CE with BLEU over the checkpoints
  (undefined for fewer than 3).

Only kept checkpoints can be scored (the demo keeps one every 600 steps), so
the rule's own choice (every 200 or 250 steps) is compared at that grain; a
checkpoint between two dev evaluations (the MoE's, evaluated every 250
steps) gets their linearly interpolated dev CE, marked ``~``.
"""

from __future__ import annotations

import json
import pathlib
import re

from absl import app
from absl import flags

_RUN_DIR = flags.DEFINE_string("run_dir", None, "The demo run (read only).")
_WORK_DIR = flags.DEFINE_string("work_dir", None,
                                "Where run.sh wrote <model>.<step>.json.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None,
                                  "Where stopping.json/.md go.")

_NAME = re.compile(r"^(?P<model>.+)\.(?P<step>\d+)\.json$")


def _dev_ce(metrics: pathlib.Path) -> dict[int, dict[str, float]]:
  """{step: {language: dev CE}} of a training log's eval records."""
  out = {}
  with open(metrics, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise app.UsageError(f"{metrics}: line {number} is not JSON ({e})")
      if record.get("kind") == "eval":
        out[int(record["step"])] = dict(record["dev_ce"])
  return out


def _ranks(values: list[float]) -> list[float]:
  order = sorted(range(len(values)), key=lambda i: values[i])
  ranks = [0.0] * len(values)
  i = 0
  while i < len(order):
    j = i
    while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
      j += 1
    for k in range(i, j + 1):
      ranks[order[k]] = (i + j) / 2.0
    i = j + 1
  return ranks


def spearman(x: list[float], y: list[float]) -> float | None:
  """Spearman's rho (average ranks for ties); None for < 3 points."""
  if len(x) < 3:
    return None
  rx, ry = _ranks(x), _ranks(y)
  mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
  cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
  vx = sum((a - mx) ** 2 for a in rx)
  vy = sum((b - my) ** 2 for b in ry)
  return cov / (vx * vy) ** 0.5 if vx and vy else None


def _dev_ce_at(dev: dict[int, dict[str, float]], lang: str, step: int, *,
               model: str) -> tuple[float, bool]:
  """(dev CE of ``lang`` at ``step``, whether it is interpolated).

  A checkpoint kept between two evaluations (the demo MoE evaluates every
  250 steps and keeps every 600th) gets the linear interpolation of its
  neighbours' dev CE.
  """
  steps = sorted(s for s in dev if lang in dev[s])
  if step in steps:
    return dev[step][lang], False
  before = [s for s in steps if s < step]
  after = [s for s in steps if s > step]
  if not before or not after:
    raise app.UsageError(f"{model}: no dev evaluation of {lang} at or around "
                         f"step {step} in its metrics.jsonl")
  a, b = before[-1], after[0]
  w = (step - a) / (b - a)
  return (1 - w) * dev[a][lang] + w * dev[b][lang], True


def summarize(run_dir: pathlib.Path, work_dir: pathlib.Path) -> dict:
  scored: dict[str, dict[int, dict]] = {}
  for path in sorted(work_dir.glob("*.json")):
    match = _NAME.match(path.name)
    if match:
      scored.setdefault(match["model"], {})[int(match["step"])] = json.loads(
          path.read_text(encoding="utf-8"))
  if not scored:
    raise app.UsageError(f"no <model>.<step>.json in {work_dir}: run run.sh")
  models = {}
  for model, by_step in sorted(scored.items()):
    dev = _dev_ce(run_dir / "models" / model / "metrics.jsonl")
    languages = sorted(next(iter(by_step.values()))["languages"])
    per_language = {}
    for lang in languages:
      rows = []
      for step in sorted(by_step):
        result = by_step[step]["languages"][lang]
        ce, interpolated = _dev_ce_at(dev, lang, step, model=model)
        rows.append({"step": step, "dev_ce": ce,
                     "dev_ce_interpolated": interpolated,
                     "bleu": result["bleu"], "chrf": result["chrf"]})
      by_ce = min(rows, key=lambda r: r["dev_ce"])
      by_bleu = max(rows, key=lambda r: r["bleu"])
      per_language[lang] = {
          "checkpoints": rows,
          "lowest_dev_ce_step": by_ce["step"],
          "highest_bleu_step": by_bleu["step"],
          "agree": by_ce["step"] == by_bleu["step"],
          "bleu_regret": by_bleu["bleu"] - by_ce["bleu"],
          "spearman_neg_ce_vs_bleu": spearman(
              [-r["dev_ce"] for r in rows], [r["bleu"] for r in rows]),
      }
    best_eval = min(dev, key=lambda s: sum(dev[s].values()))
    models[model] = {"languages": per_language, "dev_evaluations": len(dev),
                     "rule_best_step_all_evaluations": best_eval}
  return {"run_dir": str(run_dir), "test_sentences_per_language": 200,
          "models": models}


def markdown(summary: dict) -> str:
  lines = ["| model | language | step | dev CE | test BLEU | chrF++ |",
           "| --- | --- | ---: | ---: | ---: | ---: |"]
  verdicts = ["| model | language | lowest dev CE at | highest BLEU at | "
              "BLEU given up | Spearman(-CE, BLEU) |",
              "| --- | --- | ---: | ---: | ---: | ---: |"]
  for model, info in summary["models"].items():
    for lang, row in info["languages"].items():
      for r in row["checkpoints"]:
        mark = " (lowest CE)" if r["step"] == row["lowest_dev_ce_step"] else ""
        approx = "~" if r["dev_ce_interpolated"] else ""
        lines.append(f"| {model} | {lang} | {r['step']}{mark} | "
                     f"{approx}{r['dev_ce']:.3f} | {r['bleu']:.1f} | "
                     f"{r['chrf']:.1f} |")
      rho = row["spearman_neg_ce_vs_bleu"]
      verdicts.append(
          f"| {model} | {lang} | {row['lowest_dev_ce_step']} | "
          f"{row['highest_bleu_step']} | {row['bleu_regret']:.1f} | "
          f"{'–' if rho is None else f'{rho:.2f}'} |")
  return "\n".join(["# Dev cross-entropy vs test BLEU per kept checkpoint",
                    "", *verdicts, "", "~: interpolated between the two "
                    "nearest dev evaluations.", "", *lines, ""])


def main(argv) -> None:
  del argv
  for flag in (_RUN_DIR, _WORK_DIR, _OUTPUT_DIR):
    if not flag.value:
      raise app.UsageError(f"--{flag.name} is required")
  summary = summarize(pathlib.Path(_RUN_DIR.value),
                      pathlib.Path(_WORK_DIR.value))
  out = pathlib.Path(_OUTPUT_DIR.value)
  (out / "stopping.json").write_text(json.dumps(summary, indent=1) + "\n",
                                     encoding="utf-8")
  (out / "stopping.md").write_text(markdown(summary), encoding="utf-8")
  print(markdown(summary))


if __name__ == "__main__":
  app.run(main)
