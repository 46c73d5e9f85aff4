r"""m4moe-report: ΔBLEU figure and tables from eval JSONs.

Example:

  m4moe-report --models=runs/evals/moe.json,runs/evals/dense.json \
      --baselines='runs/evals/bilingual/*.json' --output_dir=runs/report \
      --training_logs=moe=runs/moe/metrics.jsonl \
      --bucket_bounds=100000,10000 --ce_thresholds=4,3,2.5

Writes delta_bleu.png, report.md, report.html (self-contained) and
summary.json to --output_dir and prints report.md's averages section.

Several --models files with the same model name are seeds of one model:
the report shows their mean and spread (num_seeds in summary.json), the
seed mean of their dev cross-entropy and a training-cost row per seed
(--training_logs then names the model once per seed). From each run's
decoded test sentences (metadata.hypotheses_dir of its eval JSON, written
by m4moe-eval --hypotheses_dir; else <json dir>/<json file stem>/ or
<json dir>/<model>/; or --hypotheses_dirs) and the corpus's test
sentences (--corpus_dir, else metadata.corpus_dir) it adds the first --examples sentences per language
and 95% bootstrap intervals with paired significance (sacrebleu,
--bootstrap_samples; 0 disables); two models given with several seeds each
are also compared over their seeds (Welch's t-test). See m4moe.eval.report.

Every input eval JSON is validated against the schema (types, finite
BLEU/chrF in [0, 100], non-negative sizes; errors name the file and the
field); --output_dir is checked before any work, every input (eval JSONs,
training logs, decoded hypotheses) is read and checked before a new directory
is created, so bad input leaves nothing behind, and each file is written
atomically. summary.json is strict JSON: non-finite values become null and
are listed in its notes.

A report over zero averaged languages (every language excluded: no
baseline, a failed or empty eval, ...) is an error: it exits 1, naming each
language's reason, and writes nothing. One writer per --output_dir: the
tool holds an flock on ``<output_dir>/report.lock`` while it writes, so a
second m4moe-report on the same directory exits 1 naming the first.
"""

from __future__ import annotations

import glob
import pathlib
import sys

from absl import app
from absl import flags

from m4moe import cli
from m4moe import run_lock
from m4moe.eval import comparison
from m4moe.eval import report
from m4moe.eval import results
from m4moe.eval import testsets
from m4moe.eval import textio

_MODELS = flags.DEFINE_list(
    "models", [], "Multilingual models' eval JSONs (paths or globs).")
_BASELINES = flags.DEFINE_list(
    "baselines", [], "Bilingual baselines' eval JSONs (paths or globs).")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Report directory.")
_BUCKET_BOUNDS = flags.DEFINE_list(
    "bucket_bounds", [],
    "HIGH_MIN,LOW_MAX training-pair bounds: high >= HIGH_MIN, low < LOW_MAX "
    "(default: terciles of the languages).")
_TRAINING_LOGS = flags.DEFINE_list(
    "training_logs", [],
    "MODEL=metrics.jsonl pairs; a model with several seeds is named once "
    "per seed, in the order of its --models files; a bilingual baseline "
    "is named by its model name, e.g. to read a landed copy of its log "
    "(default: each eval JSON's metadata.model_dir/metrics.jsonl).")
_CE_THRESHOLDS = flags.DEFINE_list(
    "ce_thresholds", ["0.7", "0.6", "0.5"],
    "Training cross-entropy thresholds for the tokens-to-reach table.")
_CORPUS_DIR = flags.DEFINE_string(
    "corpus_dir", None, "A built corpus whose training sizes override the "
    "eval JSONs' train_size and whose test/<lang>.tsv give the examples' "
    "sources and references (default for those: metadata.corpus_dir).")
_EXAMPLES = flags.DEFINE_integer(
    "examples", 10, "Test sentences shown per language (0 = none).",
    lower_bound=0)
_HYPOTHESES_DIRS = flags.DEFINE_list(
    "hypotheses_dirs", [], "RUN=DIR pairs: <lang>.hyp files of a model or "
    "baseline (default: metadata.hypotheses_dir, else <json dir>/<json "
    "file stem>/ or <json dir>/<model>/).")
_BOOTSTRAP_SAMPLES = flags.DEFINE_integer(
    "bootstrap_samples", 1000, "sacrebleu bootstrap resamples for the 95% "
    "intervals and paired tests (0 = no intervals).", lower_bound=0)
_BOOTSTRAP_SEED = flags.DEFINE_integer(
    "bootstrap_seed", 12345, "Base seed of the resampling (each language "
    "uses a seed derived from it).")
_TREND_FRAC = flags.DEFINE_float("trend_frac", 0.5,
                                 "LOWESS neighbourhood fraction in (0, 1].")
_METRIC = flags.DEFINE_enum(
    "metric", "bleu", ["bleu", "chrf"], "Score compared against the "
    "baselines: sacrebleu BLEU or chrF++ (steadier at low quality).")
_TITLE = flags.DEFINE_string("title", "m4moe: multilingual vs bilingual",
                             "Report title.")


def _expand(patterns: list[str], flag: str) -> list[pathlib.Path]:
  paths = []
  for pattern in patterns:
    matched = sorted(glob.glob(pattern))
    if not matched:
      raise app.UsageError(f"--{flag}: {pattern!r} matches no file")
    paths += [pathlib.Path(p) for p in matched]
  return paths


def _bounds() -> comparison.BucketBounds | None:
  if not _BUCKET_BOUNDS.value:
    return None
  try:
    high, low = (int(v) for v in _BUCKET_BOUNDS.value)
    return comparison.BucketBounds(high_min=high, low_max=low)
  except ValueError as e:
    raise app.UsageError(f"--bucket_bounds={_BUCKET_BOUNDS.value}: give "
                         f"HIGH_MIN,LOW_MAX integers ({e})") from e


def _pairs(values: list[str], flag: str) -> dict[str, str]:
  out = {}
  for item in values:
    model, sep, path = item.partition("=")
    if not sep:
      raise app.UsageError(f"--{flag}: {item!r} is not NAME=PATH")
    out[model] = path
  return out


def _training_logs() -> dict[str, list[str]]:
  """MODEL -> its logs, one per seed, in the order given."""
  out: dict[str, list[str]] = {}
  for item in _TRAINING_LOGS.value:
    model, sep, path = item.partition("=")
    if not sep:
      raise app.UsageError(f"--training_logs: {item!r} is not NAME=PATH")
    out.setdefault(model, []).append(path)
  return out


def _round(value: float | None) -> float | None:
  return None if value is None else round(value, 2)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not _MODELS.value or not _OUTPUT_DIR.value:
    raise app.UsageError("--models and --output_dir are required")
  try:
    thresholds = [float(t) for t in _CE_THRESHOLDS.value]
  except ValueError as e:
    raise app.UsageError(f"--ce_thresholds: {e}") from e
  try:
    textio.check_output_dir(_OUTPUT_DIR.value, flag="--output_dir")
  except textio.OutputError as e:
    raise app.UsageError(str(e)) from e
  model_paths = _expand(_MODELS.value, "models")
  baseline_paths = _expand(_BASELINES.value, "baselines")
  try:
    models = [results.read_eval_json(p) for p in model_paths]
    baselines = [results.read_eval_json(p, kind="bilingual")
                 for p in baseline_paths]
    files = _prepare_and_write(models, baselines, model_paths,
                               baseline_paths, thresholds)
  except run_lock.RunLockedError as e:
    sys.exit(f"m4moe-report: refused, nothing was changed: {e}")
  except report.EmptyReportError as e:
    sys.exit(f"m4moe-report: error: {e}")
  except (ValueError, FileNotFoundError) as e:
    raise app.UsageError(str(e)) from e
  except OSError as e:
    sys.exit(f"m4moe-report: error: cannot write --output_dir="
             f"{_OUTPUT_DIR.value} ({e})")
  _print_summary(files)


def _prepare_and_write(models, baselines, model_paths, baseline_paths,
                       thresholds) -> report.ReportFiles:
  """Reads and checks every input, then writes the report under the
  directory's lock.

  A new --output_dir is created only after its inputs passed, so refused
  input leaves nothing behind; an existing one is locked first, so a
  directory another report is writing is refused before any work.
  """
  out = pathlib.Path(_OUTPUT_DIR.value)
  prepared = None
  if not out.is_dir():
    prepared = _prepare(models, baselines, model_paths, baseline_paths)
    out.mkdir(parents=True, exist_ok=True)
  with run_lock.RunLock(out, role=run_lock.REPORT):
    if prepared is None:
      prepared = _prepare(models, baselines, model_paths, baseline_paths)
    return report.write_prepared(out, prepared, title=_TITLE.value,
                                 trend_frac=_TREND_FRAC.value,
                                 ce_thresholds=thresholds)


def _prepare(models, baselines, model_paths,
             baseline_paths) -> report.PreparedReport:
  """:func:`report.prepare_report` with the flags' settings: every input
  is read and checked before --output_dir is created."""
  return report.prepare_report(
      models=models, baselines=baselines, bounds=_bounds(),
      train_sizes=(testsets.train_sizes(_CORPUS_DIR.value)
                   if _CORPUS_DIR.value else None),
      training_log_paths=_training_logs(),
      inputs=[str(p) for p in model_paths + baseline_paths],
      metric=_METRIC.value, model_paths=model_paths,
      baseline_paths=baseline_paths, corpus_dir=_CORPUS_DIR.value,
      examples=_EXAMPLES.value,
      hypotheses_dirs=_pairs(_HYPOTHESES_DIRS.value, "hypotheses_dirs"),
      bootstrap_samples=_BOOTSTRAP_SAMPLES.value,
      bootstrap_seed=_BOOTSTRAP_SEED.value)


def _print_summary(files: report.ReportFiles) -> None:
  comp = files.comparison
  print(f"Bucket bounds: {comp.bounds.describe()}")
  print(f"Averaged over {len(comp.averaged)} of {len(comp.languages)} "
        "languages; excluded:")
  for lang, reasons in comp.excluded.items():
    print(f"  {lang}: {'; '.join(reasons)}")
  for name, buckets in comp.averages.items():
    if name == comparison.BASELINE_NAME and not comp.baseline_models:
      print(f"No bilingual baselines given: no Δ{comp.metric_name}.")
      continue
    metric = comp.metric_name
    cells = ", ".join(f"{b}: {metric} {_round(a.bleu)} Δ{metric} "
                      f"{_round(a.delta)} (n={a.count})"
                      for b, a in buckets.items())
    print(f"{name}: {cells}")
  print(f"Wrote {files.markdown}, {files.html}, {files.png}, {files.summary}")


def run():
  cli.run_tool(main, module=__name__)


if __name__ == "__main__":
  run()
