"""What share of the MoE teacher's quality gain a distilled dense student keeps.

  python3 results/archive/distill/summarize.py OUT_DIR TEACHER_DIR --output PATH

Reads, for the three models of ``run.sh``:

* ``OUT_DIR/{teacher,dense_scratch,distilled}.json``: m4moe-eval results
  (test BLEU and chrF++ per language);
* the last ``eval`` record of ``metrics.jsonl`` of ``TEACHER_DIR``,
  ``OUT_DIR/dense_scratch`` and ``OUT_DIR/distilled``: dev cross-entropy
  (token-weighted mean over the languages, nats per target token);

and writes a JSON with every number, plus the fraction of the gain kept,
``(student - scratch) / (teacher - scratch)``, for dev CE (lower is better;
the same formula gives the share of the CE reduction), mean BLEU and mean
chrF++ (unweighted means over the languages). A fraction is null when the
teacher is not better than the dense model trained from scratch (no gain to
keep). The dev CE of the two students is also compared at every evaluation
step they share (and, if ``OUT_DIR/init_only`` exists, the dev CE of
run.sh's teacher-weight-0 ablation at its steps; once
``OUT_DIR/init_only.json`` exists the ablation is a fourth model of the
table, with its own fraction of the gain, and the baseline of a third
set of paired differences). With the hypotheses
m4moe-eval kept (``OUT_DIR/<model>.hyp/``) and the corpus, every BLEU/chrF++
(per language and the mean) gets sacrebleu's 95% bootstrap interval, and
each model minus dense_scratch and minus the teacher a paired bootstrap
interval and p-value
(m4moe.eval.significance, the resampling m4moe-report uses). Prints a
Markdown table.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Sequence

from m4moe.eval import examples as examples_lib
from m4moe.eval import results as results_lib
from m4moe.eval import significance

MODELS = ("teacher", "dense_scratch", "distilled")
ABLATION = "init_only"  # run.sh's teacher-weight-0 student


def _records(path: pathlib.Path) -> list[dict]:
  if not path.is_file():
    sys.exit(f"summarize.py: {path} not found: run run.sh first")
  out = []
  for number, line in enumerate(path.read_text().splitlines(), 1):
    if not line.strip():
      continue
    try:
      out.append(json.loads(line))
    except json.JSONDecodeError as e:
      sys.exit(f"summarize.py: {path}:{number}: not JSON ({e})")
  return out


def dev_curve(metrics: pathlib.Path) -> dict[int, dict]:
  """{step: eval record} of a run's metrics.jsonl (the last one per step)."""
  return {r["step"]: r for r in _records(metrics) if r.get("kind") == "eval"}


def eval_scores(path: pathlib.Path) -> dict:
  if not path.is_file():
    sys.exit(f"summarize.py: {path} not found: run run.sh first")
  result = json.loads(path.read_text())
  langs = {lang: {"bleu": v.get("bleu"), "chrf": v.get("chrf"),
                  "sentences": v.get("num_segments")}
           for lang, v in sorted(result["languages"].items())
           if v.get("status", "ok") == "ok"}
  mean = lambda key: (sum(v[key] for v in langs.values()) / len(langs)
                      if langs else None)
  return {"checkpoint": result["metadata"].get("checkpoint"),
          "num_params": result["metadata"].get("num_params"),
          "languages": langs, "bleu": mean("bleu"), "chrf": mean("chrf")}


def fraction_kept(*, student: float, scratch: float,
                  teacher: float) -> float | None:
  """(student - scratch) / (teacher - scratch); None if there is no gain."""
  gain = teacher - scratch
  if gain == 0:
    return None
  return (student - scratch) / gain


def score_intervals(out_dir: pathlib.Path, names: Sequence[str], *,
                   baseline: str, corpus_dir: pathlib.Path | None = None,
                   n_samples: int = significance.DEFAULT_SAMPLES) -> dict:
  """95% bootstrap intervals of test BLEU/chrF++, and paired differences.

  Reads ``OUT_DIR/<name>.json`` and the hypotheses in ``OUT_DIR/<name>.hyp``
  (references: the first scored sentences of ``corpus_dir``'s test split,
  default the eval JSON's ``metadata.corpus_dir``). Every model of one
  language is resampled with the same indices (per-language seed), so the
  differences to ``baseline`` are paired; the mean over languages averages
  the per-language resamples index by index.

  Returns:
    ``{name: {metric: {"languages": {lang: interval}, "mean": interval,
    "minus_<baseline>": {"languages": {...}, "mean": difference}}}}``; the
    difference entries are absent for the baseline itself.
  """
  outputs = {}
  for name in names:
    path = out_dir / f"{name}.json"
    try:
      result = results_lib.read_eval_json(path)
    except ValueError as e:
      sys.exit(f"summarize.py: {e}")
    run = examples_lib.load_run_outputs(
        result, label=name, eval_path=path, corpus_dir=corpus_dir,
        hypotheses_dir=out_dir / f"{name}.hyp")
    if run.missing or run.problems:
      sys.exit(f"summarize.py: {name}: cannot pair hypotheses with "
               f"references: {run.missing or run.problems}")
    outputs[name] = run.languages
  langs = sorted(outputs[baseline])
  for name in names:
    if sorted(outputs[name]) != langs:
      sys.exit(f"summarize.py: {name} scored {sorted(outputs[name])}, "
               f"{baseline} {langs}: evaluate the same languages")
  summary = {}
  for name in names:
    summary[name] = {}
    for metric in significance.METRICS:
      per_lang = {}
      for lang in langs:
        seen = outputs[name][lang]
        if seen.references != outputs[baseline][lang].references:
          sys.exit(f"summarize.py: {name} and {baseline} scored different "
                   f"{lang} test sentences")
        per_lang[lang] = significance.resample(
            seen.hypotheses, seen.references, metric=metric,
            target_lang=seen.target_lang, n_samples=n_samples,
            seed=significance.language_seed(significance.DEFAULT_SEED, lang))
      summary[name][metric] = per_lang
  out = {}
  for name in names:
    out[name] = {}
    for metric in significance.METRICS:
      per_lang = summary[name][metric]
      mean = significance.mean_resamples([per_lang[l] for l in langs])
      entry = {"languages": {l: significance.interval(r).to_dict()
                             for l, r in per_lang.items()},
               "mean": significance.interval(mean).to_dict()}
      if name != baseline:
        base = summary[baseline][metric]
        base_mean = significance.mean_resamples([base[l] for l in langs])
        entry[f"minus_{baseline}"] = {
            "languages": {l: significance.paired_difference(
                per_lang[l], base[l]).to_dict() for l in langs},
            "mean": significance.paired_difference(mean,
                                                   base_mean).to_dict()}
      out[name][metric] = entry
  return out


def summarize(out_dir: pathlib.Path, teacher_dir: pathlib.Path, *,
              corpus_dir: pathlib.Path | None = None) -> dict:
  run_dirs = {"teacher": teacher_dir, "dense_scratch": out_dir / "dense_scratch",
              "distilled": out_dir / "distilled",
              "init_only": out_dir / "init_only"}
  # The ablation joins the table once it was trained and scored.
  names = MODELS + ((ABLATION,) if (out_dir / f"{ABLATION}.json").is_file()
                    else ())
  models = {}
  for name in names:
    curve = dev_curve(run_dirs[name] / "metrics.jsonl")
    if not curve:
      sys.exit(f"summarize.py: {run_dirs[name]}/metrics.jsonl has no dev "
               "evaluation")
    last = curve[max(curve)]
    models[name] = {"run_dir": str(run_dirs[name]), "steps": max(curve),
                    "dev_ce": last["dev_ce_mean"],
                    "dev_ce_per_language": last["dev_ce"],
                    **eval_scores(out_dir / f"{name}.json")}
  teacher, scratch, student = (models[n] for n in MODELS)
  if ABLATION in models:
    models[ABLATION]["fraction_kept"] = {
        key: fraction_kept(student=models[ABLATION][key],
                           scratch=scratch[key], teacher=teacher[key])
        for key in ("dev_ce", "bleu", "chrf")}
  if scratch["steps"] != student["steps"]:
    sys.exit(f"summarize.py: the students stopped at different steps "
             f"({scratch['steps']} from scratch, {student['steps']} "
             "distilled): finish both runs")
  kept = {key: fraction_kept(student=student[key], scratch=scratch[key],
                             teacher=teacher[key])
          for key in ("dev_ce", "bleu", "chrf")}
  scratch_curve = dev_curve(run_dirs["dense_scratch"] / "metrics.jsonl")
  student_curve = dev_curve(run_dirs["distilled"] / "metrics.jsonl")
  curve = [{"step": step,
            "dense_scratch": scratch_curve[step]["dev_ce_mean"],
            "distilled": student_curve[step]["dev_ce_mean"],
            "fraction_kept": fraction_kept(
                student=student_curve[step]["dev_ce_mean"],
                scratch=scratch_curve[step]["dev_ce_mean"],
                teacher=teacher["dev_ce"])}
           for step in sorted(set(scratch_curve) & set(student_curve))]
  intervals = {}
  for baseline in ("dense_scratch", "teacher") + tuple(names[len(MODELS):]):
    got = score_intervals(out_dir, names, baseline=baseline,
                          corpus_dir=corpus_dir)
    for name, metrics in got.items():
      for metric, entry in metrics.items():
        intervals.setdefault(name, {}).setdefault(metric, {}).update(entry)
  # The ablation of run.sh (teacher weight 0: the teacher's weights without
  # its targets), if it was run: its dev CE at the steps it shares.
  init_only = out_dir / ABLATION / "metrics.jsonl"
  if init_only.is_file():
    init_curve = dev_curve(init_only)
    for point in curve:
      if point["step"] in init_curve:
        point["init_only"] = init_curve[point["step"]]["dev_ce_mean"]
  return {"models": models, "fraction_kept": kept, "dev_ce_curve": curve,
          "student_steps": student["steps"], "teacher_steps": teacher["steps"],
          "test_intervals": intervals}


def with_interval(value: float | None, interval: dict | None) -> str:
  """``value ±ci`` (one decimal), ``–`` for a missing value."""
  if value is None:
    return "–"
  return f"{value:.1f}" + (f" ±{interval['ci']:.1f}" if interval else "")


def format_delta(difference: dict | None) -> str:
  """``+Δ ±ci`` with ``*`` when significant (p < 0.05), ``–`` if absent."""
  if difference is None:
    return "–"
  return (f"{difference['score']:+.1f} ±{difference['ci']:.1f}"
          + ("*" if difference["significant"] else ""))


def markdown(summary: dict) -> str:
  """The models' table (mean test scores with 95% intervals) and the gain."""
  fmt = lambda v, d=2: "–" if v is None else f"{v:.{d}f}"
  intervals = summary.get("test_intervals", {})
  lines = ["| model | steps | params | dev CE | BLEU | chrF++ |"
           " BLEU − dense_scratch | BLEU − teacher |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
  for name in summary["models"]:
    m = summary["models"][name]
    got = intervals.get(name, {})
    mean = lambda metric: got.get(metric, {}).get("mean")
    delta_text = lambda baseline: format_delta(
        got.get("bleu", {}).get(f"minus_{baseline}", {}).get("mean"))
    lines.append(f"| {name} | {m['steps']} | {m['num_params']:,} | "
                 f"{fmt(m['dev_ce'], 3)} | "
                 f"{with_interval(m['bleu'], mean('bleu'))} | "
                 f"{with_interval(m['chrf'], mean('chrf'))} | "
                 f"{delta_text('dense_scratch')} | {delta_text('teacher')} |")
  kept = summary["fraction_kept"]
  lines.append(f"| fraction of the gain kept | | | {fmt(kept['dev_ce'])} | "
               f"{fmt(kept['bleu'])} | {fmt(kept['chrf'])} | | |")
  return "\n".join(lines)


def write_summary(summary: dict, output: pathlib.Path) -> None:
  """Writes ``summary`` as JSON atomically (temporary file + rename)."""
  tmp = output.with_name(output.name + ".tmp")
  tmp.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
  tmp.replace(output)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("out_dir", type=pathlib.Path)
  parser.add_argument("teacher_dir", type=pathlib.Path)
  parser.add_argument("--output", type=pathlib.Path, required=True)
  parser.add_argument("--corpus_dir", type=pathlib.Path, default=None,
                      help="Corpus the models were scored on (default: the "
                      "eval JSONs' metadata.corpus_dir).")
  args = parser.parse_args()
  summary = summarize(args.out_dir, args.teacher_dir,
                      corpus_dir=args.corpus_dir)
  write_summary(summary, args.output)
  print(markdown(summary))


if __name__ == "__main__":
  main()
