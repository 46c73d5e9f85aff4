"""The multilingual-vs-bilingual report: figure, tables, report.md/.html.

:func:`write_report` writes to ``output_dir``:

* ``delta_bleu.png`` -- the paper's Figure 6 (:mod:`m4moe.eval.figure`);
* ``router_stats.png`` -- expert load CV and dropped second choices over
  training, when the models' training logs carry router statistics;
* ``report.md`` -- every table below, the smoother and bucket bounds;
* ``report.html`` -- the same, self-contained (figure embedded as base64);
* ``summary.json`` -- the averages and exclusions, machine-readable;
  ``split``: the corpus split the eval JSONs scored (``test`` or
  ``test_ood``; runs that scored different splits are refused); under
  ``dev_ce`` the dev cross-entropy comparison (None when unavailable);
  ``num_seeds``/``seeds`` per model; ``intervals`` (every 95% interval,
  p-value and seed spread, :meth:`m4moe.eval.intervals.Intervals.to_dict`; None with
  ``bootstrap_samples=0``); ``source_reliance`` (nats/token, None cells
  where unavailable); ``examples`` (language -> [{source, reference,
  hypotheses: {run: text or null}}]); ``hypotheses`` (per run: directory,
  usable languages, why others are not). Strict JSON: NaN/inf become null,
  listed in ``nonfinite_as_null`` and a line of ``notes``.

Every file is written atomically (temporary file in ``output_dir``, then
``os.replace``); the inputs are eval JSONs validated by
:func:`m4moe.eval.results.read_eval_json`.

Several models with one name are seeds of one model (:mod:`.seeds`): every
score table uses the seed mean; each run's own training log
(:mod:`.run_logs`) gives the dev cross-entropy as a seed mean too, a
training-cost and a stopping row per seed, and the router statistics and
source reliance of the first seed. From the runs' decoded test sentences
(:mod:`.examples`; each eval JSON's metadata.hypotheses_dir, else beside
the JSON: ``<dir>/<file stem>/`` or ``<dir>/<model>/``; only languages
whose ``.hyp`` has ``num_segments`` lines and rescores to the eval JSON's
BLEU) the report adds:

* Confidence intervals and significance (:mod:`.intervals`, sacrebleu's
  bootstrap via :mod:`.significance`): every BLEU and chrF++ per language
  ± its 95% interval, Δ vs the baseline with sacrebleu's paired-bootstrap
  p-value (* = p < 0.05), the spread over seeds (min–max, 95% t-interval),
  model − model (MoE − dense) per language and bucket (with Welch's
  t-test over seeds when both models have several), and bucket means
  with intervals from the same resamples. The per-language table's cells
  carry the interval and mark too.
* Examples: per language, the first N test sentences with the source, the
  reference and every model's (first seed's) and the baseline's output;
  runs and languages without usable hypotheses are listed.

Source reliance (:mod:`.source_reliance`): per language and model (and
baseline), the last dev evaluation's dev CE with wrong sources minus the
true dev CE; logs without it show – and are listed.

Tables: model table in the style of the GShard paper's Table 1 (params, E,
L, total experts, avg BLEU, avg ΔBLEU); averages over all/high/mid/low buckets;
per-language BLEU/ΔBLEU (or chrF++ with ``metric="chrf"``); dev
cross-entropy vs the bilingual baselines (:mod:`m4moe.eval.dev_ce`; bucket
means, ΔCE and wins, per language; from the dev evaluation of the scored
checkpoint's step, else the last one, in the models' and baselines'
training logs, shown when at least one model and one baseline have one);
how each run was sized (steps, what stopped it, the step of its best dev
evaluation, the checkpoint scored); training cost like Table 3 and tokens to reach
cross-entropy thresholds like Table 2 and router statistics over training
(load balance, dropped tokens, aux loss; from training metrics JSONL logs).
Languages left out of averages, and why, are always listed.
A report on a corpus whose build skipped part of its recipe (the corpus
report's ``reduced`` section, :mod:`m4moe.data.corpus_coverage`; read from
``corpus_dir``) opens with a "Data reduced" header listing what was
skipped and each language's training pairs against the recipe's, so its
scores are never read as the recipe's.
Section order: data reduced (if so), figure, models, buckets,
per-language scores, confidence intervals, dev CE, source reliance,
exclusions, training cost, router statistics, examples.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Any, Mapping, Sequence

import numpy as np

from m4moe import jsonfile
from m4moe.eval import comparison as comparison_lib
from m4moe.eval import dev_ce as dev_ce_lib
from m4moe.eval import document as doc
from m4moe.eval import examples as examples_lib
from m4moe.eval import figure as figure_lib
from m4moe.eval import intervals as intervals_lib
from m4moe.eval import results
from m4moe.eval import run_logs as run_logs_lib
from m4moe.eval import seeds as seeds_lib
from m4moe.eval import significance
from m4moe.eval import source_reliance as reliance_lib
from m4moe.eval import textio
from m4moe.eval import training_logs

FIGURE_FILE = "delta_bleu.png"
ROUTER_FIGURE_FILE = "router_stats.png"
SPLIT_DESCRIPTIONS = {
    "test": "in-domain test: English groups held out by the frozen split "
            "keys",
    "test_ood": "out-of-domain test: whole source packages held out of "
                "train, dev and test, English unseen in the corpus",
    "dev": "dev split",
}
ROUTER_TABLE_POINTS = 5
DASH = "–"


@dataclasses.dataclass(frozen=True)
class ModelFacts:
  """Size facts of one model for the Table-1-style table."""

  params: int | None
  experts: int | None
  layers: int | None
  total_experts: int | None
  source: str


@dataclasses.dataclass(frozen=True)
class ReportFiles:
  """What :func:`write_report` wrote and built."""

  markdown: pathlib.Path
  html: pathlib.Path
  png: pathlib.Path
  summary: pathlib.Path
  figure: figure_lib.DeltaFigure
  comparison: comparison_lib.Comparison


def _fmt(value: float | None, *, signed: bool = False,
         digits: int = 1) -> str:
  if value is None:
    return DASH
  return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def _fmt_int(value: int | None) -> str:
  return DASH if value is None else f"{value:,}"


def model_facts(result: results.EvalResult) -> ModelFacts:
  """Params/experts/layers: m4moe.cost.model on the stored config, else metadata."""
  meta = result.metadata
  config = meta.get("config")
  if isinstance(config, Mapping):
    try:
      # pylint: disable=g-import-not-at-top
      from m4moe import config as config_lib
      from m4moe.cost import model as cost
      model_config = config_lib.config_from_dict(config)
      return ModelFacts(
          params=cost.num_params(model_config),
          experts=model_config.moe.num_experts,
          layers=model_config.num_layers,
          total_experts=cost.num_experts_total(model_config),
          source="m4moe.cost.model")
    except (ImportError, TypeError, ValueError):
      pass
  experts, layers = meta.get("num_experts"), meta.get("num_layers")
  total = meta.get("num_experts_total")
  if total is None and experts is not None and layers is not None:
    total = experts * layers // 2
  return ModelFacts(params=meta.get("num_params"), experts=experts,
                    layers=layers, total_experts=total, source="metadata")


def _model_table(comp, models: Sequence[results.EvalResult]) -> doc.Table:
  rows = []
  for result in models:
    facts = model_facts(result)
    avg = comp.averages[result.model]["all"]
    rows.append((result.model, _fmt_int(facts.params),
                 _fmt_int(facts.experts) if facts.experts else "dense",
                 _fmt_int(facts.layers),
                 _fmt_int(facts.total_experts) if facts.experts else DASH,
                 _fmt(avg.bleu), _fmt(avg.delta, signed=True), facts.source))
  base = comp.averages[comparison_lib.BASELINE_NAME]["all"]
  if comp.baseline_models:
    rows.append((comparison_lib.BASELINE_NAME,
                 f"{len(set(comp.baseline_models.values()))} models", DASH,
                 DASH, DASH, _fmt(base.bleu), _fmt(0.0, signed=True), DASH))
  return doc.Table(("model", "params", "E (experts/layer)", "L (layers)",
                    "total experts", f"avg {comp.metric_name}",
                    f"avg Δ{comp.metric_name}", "params from"),
                   tuple(rows))


def _averages_table(comp) -> doc.Table:
  headers = ["model"]
  for bucket in comparison_lib.BUCKETS:
    headers += [f"{bucket} {comp.metric_name}",
                f"{bucket} Δ{comp.metric_name}", f"{bucket} n"]
  names = list(comp.models)
  if comp.baseline_models:
    names.append(comparison_lib.BASELINE_NAME)
  rows = []
  for name in names:
    row = [name]
    for bucket in comparison_lib.BUCKETS:
      avg = comp.averages[name][bucket]
      row += [_fmt(avg.bleu), _fmt(avg.delta, signed=True), str(avg.count)]
    rows.append(tuple(row))
  return doc.Table(tuple(headers), tuple(rows))


def _fmt_interval(cell: intervals_lib.Cell | None) -> str:
  """``24.1 ±1.2`` (sacrebleu's μ ± ci around the bootstrap mean)."""
  if cell is None or cell.interval is None:
    return DASH
  return f"{cell.interval.score:.1f} ±{cell.interval.ci:.1f}"


def _fmt_difference(diff: significance.Difference | None, *,
                    with_p: bool = False) -> str:
  """``+2.1 ±0.9*`` (* = significant); ``with_p`` adds ``(p=0.003)``."""
  if diff is None:
    return DASH
  text = (f"{diff.interval.score:+.1f} ±{diff.interval.ci:.1f}"
          f"{'*' if diff.significant else ''}")
  return f"{text} (p={diff.p_value:.3f})" if with_p else text


def _fmt_seed_difference(diff: seeds_lib.SeedDifference | None) -> str:
  """``+0.4, t -0.1–+0.9 (p=0.090)`` over seeds (* = significant)."""
  if diff is None:
    return DASH
  return (f"{diff.mean:+.1f}, t {diff.t_low:+.1f}–{diff.t_high:+.1f}"
          f"{'*' if diff.significant else ''} (p={diff.p_value:.3f})")


def _fmt_spread(spread: seeds_lib.Spread | None, *,
                signed: bool = False) -> str:
  """``23.1–24.9, t 22.0–26.0`` over seeds; – for one seed."""
  if spread is None:
    return DASH
  sign = "+" if signed else ""
  text = f"{spread.min:{sign}.1f}–{spread.max:{sign}.1f}"
  if spread.t_low is not None:
    text += f", t {spread.t_low:{sign}.1f}–{spread.t_high:{sign}.1f}"
  return text


def _language_table(comp, iv: intervals_lib.Intervals | None = None,
                    num_seeds: Mapping[str, int] | None = None
                    ) -> doc.Table:
  """Per-language scores; with ``iv``, each ± its 95% interval (* = p<α)."""
  metric = comp.metric_name
  num_seeds = num_seeds or {}
  headers = ["language", "train pairs", "bucket", f"baseline {metric}"]
  for model in comp.models:
    seeds = num_seeds.get(model, 1)
    suffix = f" (mean of {seeds} seeds)" if seeds > 1 else ""
    headers += [f"{model} {metric}{suffix}", f"{model} Δ{metric}"]
  headers.append("in averages")
  rows = []
  for lang in comp.languages:
    cells = (iv.languages[lang][comp.metric]
             if iv is not None and lang in iv.languages else {})
    base = cells.get(comparison_lib.BASELINE_NAME)
    row = [lang, _fmt_int(comp.train_sizes[lang]), comp.buckets[lang] or DASH,
           _fmt_interval(base) if base and base.interval
           else _fmt(comp.baseline_bleu[lang])]
    for model in comp.models:
      cell = cells.get(model)
      row += [_fmt_interval(cell) if cell and cell.interval
              else _fmt(comp.bleu[model][lang]),
              _fmt_difference(cell.delta) if cell and cell.delta
              else _fmt(comp.delta[model][lang], signed=True)]
    row.append("yes" if lang in comp.averaged else "no")
    rows.append(tuple(row))
  return doc.Table(tuple(headers), tuple(rows))


def _fmt_ce(value: float | None, *, signed: bool = False) -> str:
  return _fmt(value, signed=signed, digits=2)


def _dev_ce_bucket_table(dev: dev_ce_lib.DevCeComparison) -> doc.Table:
  headers = ["model"]
  for bucket in comparison_lib.BUCKETS:
    headers += [f"{bucket} dev CE", f"{bucket} ΔCE", f"{bucket} n",
                f"{bucket} wins"]
  rows = []
  for name, buckets in dev.averages.items():
    row = [name]
    for bucket in comparison_lib.BUCKETS:
      avg = buckets[bucket]
      row += [_fmt_ce(avg.ce), _fmt_ce(avg.delta, signed=True),
              str(avg.count), DASH if avg.wins is None else str(avg.wins)]
    rows.append(tuple(row))
  return doc.Table(tuple(headers), tuple(rows))


def _dev_ce_language_table(comp, dev: dev_ce_lib.DevCeComparison
                           ) -> doc.Table:
  headers = ["language", "bucket", "baseline dev CE"]
  for model in dev.models:
    headers += [f"{model} dev CE", f"{model} ΔCE"]
  headers.append("in averages")
  rows = []
  for lang in comp.languages:
    row = [lang, comp.buckets[lang] or DASH, _fmt_ce(dev.baseline[lang])]
    for model in dev.models:
      row += [_fmt_ce(dev.ce[model][lang]),
              _fmt_ce(dev.delta[model][lang], signed=True)]
    row.append("yes" if lang in dev.averaged else "no")
    rows.append(tuple(row))
  return doc.Table(tuple(headers), tuple(rows))


def _dev_ce_gap_blocks(dev: dev_ce_lib.DevCeComparison) -> list[doc.Block]:
  items = [f"model {model}: {reason}"
           for model, reason in dev.models_without.items()]
  items += [f"{lang}: {'; '.join(reasons)}"
            for lang, reasons in dev.excluded.items()]
  if not items:
    return [doc.Paragraph("Every model and every language has a dev CE.")]
  return [doc.Paragraph("Without dev CE (not in the tables' averages):"),
          doc.Bullets(tuple(items))]


def _dev_ce_blocks(comp, dev: dev_ce_lib.DevCeComparison | None
                   ) -> list[doc.Block]:
  if dev is None or not dev.available:
    return []
  return [
      doc.Heading("Dev cross-entropy vs bilingual baselines"),
      doc.Paragraph(
          "ΔCE = baseline dev CE − model dev CE, in nats per target token "
          "(teacher-forced), from the dev evaluation of the scored "
          "checkpoint's step (else the last one) in each run's "
          "training log; positive = the multilingual model is better. Far "
          "steadier than BLEU on small test sets. Buckets as above; means "
          f"over the {len(dev.averaged)} languages with a dev CE from the "
          "baseline and every model listed; wins = languages with ΔCE > 0."),
      _dev_ce_bucket_table(dev),
      _dev_ce_language_table(comp, dev),
      *_dev_ce_gap_blocks(dev),
  ]


def _training_blocks(logs: Mapping[str, Sequence[run_logs_lib.RunLog]],
                     thresholds: Sequence[float]) -> list[doc.Block]:
  with_log = [r for runs in logs.values() for r in runs if r.path is not None]
  if not with_log:
    return [doc.Heading("Training cost and convergence"),
            doc.Paragraph("No training metrics logs were given "
                          "(--training_logs or metadata.model_dir).")]
  cost_rows, ce_rows = [], []
  for run_log in with_log:
    records = training_logs.read_records(run_log.path)
    cost = training_logs.training_cost(records)
    cost_rows.append((
        run_log.label, _fmt_int(cost.devices),
        DASH if cost.steps_per_sec is None else f"{cost.steps_per_sec:.3g}",
        DASH if cost.cpu_sec_per_step is None
        else f"{cost.cpu_sec_per_step:.3g}",
        _fmt_int(cost.batch_tokens),
        DASH if cost.device_hours is None else f"{cost.device_hours:.3g}",
        DASH if cost.wall_hours is None else f"{cost.wall_hours:.3g}",
        _fmt_int(cost.steps), _fmt_int(cost.tokens)))
    reached = training_logs.tokens_to_reach(records, thresholds)
    ce_rows.append((run_log.label,
                    *(_fmt_int(reached[t]) for t in thresholds)))
  return [
      doc.Heading("Training cost (Table 3 style)"),
      doc.Paragraph("CPU s/step: the median CPU seconds (all threads) per "
                    "step over the logged intervals, which other work on "
                    "a shared core inflates less than steps/s; speeds of "
                    "two models are best compared as ratios measured "
                    "interleaved in one process (m4moe-bench). A model "
                    "with several seeds has a row per seed."),
      doc.Table(("model", "devices", "steps/s", "CPU s/step", "batch tokens",
                 "device-hours", "wall hours", "steps", "tokens seen"),
                tuple(cost_rows)),
      doc.Heading("Tokens to reach training cross-entropy (Table 2 style)"),
      doc.Paragraph("Target tokens seen when the logged train_ce first fell "
                    "to each threshold; – = never reached (or no token "
                    "counts in the log)."),
      doc.Table(("model", *(f"CE ≤ {t:g}" for t in thresholds)),
                tuple(ce_rows))]


def router_trajectories(logs: Mapping[str, pathlib.Path]
                        ) -> dict[str, list[training_logs.RouterPoint]]:
  """model -> router statistics per logged step (MoE models only)."""
  out = {}
  for model, path in logs.items():
    points = training_logs.router_trajectory(training_logs.read_records(path))
    if points:
      out[model] = points
  return out


def _percent(value: float | None) -> str:
  return DASH if value is None else f"{100 * value:.1f}%"


def _router_blocks(trajectories: Mapping[str, Sequence[
    training_logs.RouterPoint]], png: bytes | None) -> list[doc.Block]:
  blocks: list[doc.Block] = [doc.Heading("Router statistics over training")]
  if not trajectories:
    return blocks + [doc.Paragraph(
        "No training log with router statistics (dense models only, or no "
        "logs given).")]
  blocks.append(doc.Paragraph(
      "From the training logs, over each model's MoE layers: load CV = "
      "coefficient of variation of the tokens per expert (0 = balanced); "
      "dropped = fraction of first / second expert choices over capacity; "
      "aux = the balancing loss E·Σ f·P (1.0 = uniform routing)."))
  if png is not None:
    blocks.append(doc.Image(ROUTER_FIGURE_FILE, png,
                            "Router load CV and dropped second choices"))
  rows = []
  for model, points in trajectories.items():
    for p in training_logs.sample_points(points, count=ROUTER_TABLE_POINTS):
      rows.append((model, str(p.step), str(p.layers), _fmt3(p.load_cv_mean),
                   _fmt3(p.load_cv_max), _percent(p.dropped_first),
                   _percent(p.dropped_second), _fmt3(p.aux_loss)))
  blocks.append(doc.Table(("model", "step", "MoE layers", "load CV mean",
                           "load CV max", "dropped 1st", "dropped 2nd",
                           "aux loss"), tuple(rows)))
  return blocks


def _fmt3(value: float | None) -> str:
  return DASH if value is None else f"{value:.3f}"


def _gaps_blocks(comp) -> list[doc.Block]:
  items = [f"{lang}: {'; '.join(reasons)}"
           for lang, reasons in comp.excluded.items()]
  blocks: list[doc.Block] = [doc.Heading("Excluded from averages")]
  if not comp.baseline_models:
    blocks.append(doc.Paragraph(
        f"No bilingual baseline eval JSONs were given (--baselines): "
        f"Δ{comp.metric_name}, "
        "the figure's points and trendlines are unavailable."))
  if items:
    blocks += [doc.Paragraph(f"{len(items)} of {len(comp.languages)} "
                             "languages are not averaged:"),
               doc.Bullets(tuple(items))]
  else:
    blocks.append(doc.Paragraph("None: every language has a score from "
                                "every model (and baseline, if given)."))
  if comp.notes:
    blocks += [doc.Heading("Notes"), doc.Bullets(tuple(comp.notes))]
  return blocks


_INTERVALS_EXPLAINED = (
    "Each score is shown ± the half-width of its 95% interval from "
    "sacrebleu's paired bootstrap resampling of test sentences "
    "({n_samples} resamples; half the 2.5–97.5 percentile range, "
    "as sacrebleu --confidence prints it around the bootstrap mean, "
    "which summary.json also gives; each language resampled with "
    "its own seed derived from {seed}, every system of a language "
    "with the same indices). Δ = model − bilingual baseline on the "
    "same resamples; * = significant at p < "
    "{alpha:g} by sacrebleu's paired bootstrap test. A model "
    "given with several seeds is scored by its seed mean, resampled "
    "likewise; 'seeds' is the min–max over seeds and the 95% "
    "t-interval of the mean (from the eval JSONs' scores). Buckets: "
    "the mean over the bucket's averaged languages, with the "
    "interval and test from the same resamples.")

_PAIRS_EXPLAINED = (
    "Two tests of each difference. The bootstrap (Δ) resamples test "
    "sentences and holds each model's seed mean fixed, so it asks "
    "whether these runs differ on this test set. 'seeds' asks whether "
    "the models differ beyond training noise: the difference of seed "
    "means with its 95% Welch t-interval and Welch's t-test over the "
    "per-seed scores (unpaired: the two models' runs are independent "
    "trainings; – unless both have at least two seeds). * = p < "
    "{alpha:g}.")


def _interval_blocks(comp, iv: intervals_lib.Intervals | None
                     ) -> list[doc.Block]:
  """The report's intervals section: per-language cells, model-vs-model
  differences and bucket means, each with the test that produced it."""
  if iv is None:
    return []
  blocks: list[doc.Block] = [
      doc.Heading("Confidence intervals and significance"),
      doc.Paragraph(_INTERVALS_EXPLAINED.format(
          n_samples=iv.n_samples, seed=iv.seed, alpha=iv.alpha))]
  if not iv.available:
    return blocks + [doc.Paragraph(
        "No intervals: no run has usable hypotheses (see Examples)."),
                     *_problem_blocks(iv.problems)]
  blocks.append(_interval_table(comp, iv))
  if iv.pairs:
    blocks += [doc.Heading("Model vs model", level=3),
               doc.Paragraph(_PAIRS_EXPLAINED.format(alpha=iv.alpha)),
               _pair_table(comp, iv)]
  return blocks + _bucket_blocks(iv) + _problem_blocks(iv.problems)


def _metric_headers(*templates: str) -> list[str]:
  """One column per template and metric, metric-major (``{name}``: the
  metric's display name), so every table orders its metrics alike."""
  return [template.format(name=comparison_lib.METRICS[metric])
          for metric in intervals_lib.METRICS for template in templates]


def _cell_columns(cell: intervals_lib.Cell | None) -> list[str]:
  """Interval, seed spread, paired Δ and Δ's seed spread of one cell."""
  return [_fmt_interval(cell), _fmt_spread(cell and cell.seeds),
          _fmt_difference(cell and cell.delta, with_p=True),
          _fmt_spread(cell and cell.delta_seeds, signed=True)]


def _interval_table(comp, iv: intervals_lib.Intervals) -> doc.Table:
  """Per language and system; systems without any interval are left out
  (they have no hypotheses there, which the problems list says)."""
  headers = ["language", "system", "seeds", *_metric_headers(
      "{name}", "{name} seeds", "Δ{name} vs baseline", "Δ{name} seeds")]
  rows = []
  for lang in comp.languages:
    for system in iv.systems:
      cells = [iv.languages[lang][m].get(system)
               for m in intervals_lib.METRICS]
      if all(c is None or c.interval is None for c in cells):
        continue
      row = [lang, system, str(iv.num_seeds.get(system, 1))]
      for cell in cells:
        row += _cell_columns(cell)
      rows.append(tuple(row))
  return doc.Table(tuple(headers), tuple(rows))


def _pair_row(label: str, name: str, diffs, seed_diffs) -> tuple[str, ...]:
  row = [label, name]
  for diff, seed_diff in zip(diffs, seed_diffs):
    row += [_fmt_difference(diff, with_p=True),
            _fmt_seed_difference(seed_diff)]
  return tuple(row)


def _pair_table(comp, iv: intervals_lib.Intervals) -> doc.Table:
  """Model-vs-model differences per language, then per bucket mean (only
  buckets of several languages: one language's bucket repeats its row)."""
  metrics = intervals_lib.METRICS
  rows = []
  for lang in comp.languages:
    for a, b in iv.pairs:
      name = intervals_lib.pair_name(a, b)
      diffs = [iv.pair_deltas[lang][m][name] for m in metrics]
      seed_diffs = [iv.pair_seed_deltas.get(lang, {}).get(m, {}).get(name)
                    for m in metrics]
      if all(d is None for d in [*diffs, *seed_diffs]):
        continue
      rows.append(_pair_row(lang, name, diffs, seed_diffs))
  for bucket in _multi_language_buckets(iv):
    for a, b in iv.pairs:
      name = intervals_lib.pair_name(a, b)
      diffs = [iv.bucket_pairs[bucket][m][name] for m in metrics]
      seed_diffs = [iv.bucket_pair_seeds.get(bucket, {}).get(m, {})
                    .get(name) for m in metrics]
      if any(d is not None for d in [*diffs, *seed_diffs]):
        rows.append(_pair_row(f"{bucket} (mean)", name, diffs, seed_diffs))
  headers = ["language", "difference",
             *_metric_headers("Δ{name}", "Δ{name} seeds")]
  return doc.Table(tuple(headers), tuple(rows))


def _bucket_blocks(iv: intervals_lib.Intervals) -> list[doc.Block]:
  """Bucket means per system (buckets of several languages only)."""
  rows = []
  for system in iv.systems:
    for bucket in _multi_language_buckets(iv):
      row = [system, bucket, str(len(iv.bucket_languages[bucket]))]
      for metric in intervals_lib.METRICS:
        row += _cell_columns(iv.buckets[system][bucket][metric])
      rows.append(tuple(row))
  if not rows:
    return []
  headers = ["system", "bucket", "languages", *_metric_headers(
      "mean {name}", "{name} seeds", "mean Δ{name}", "Δ{name} seeds")]
  return [doc.Heading("Buckets", level=3),
          doc.Paragraph("Means over the bucket's averaged languages "
                        "(buckets of one language are its row above; "
                        "summary.json has every bucket)."),
          doc.Table(tuple(headers), tuple(rows))]


def _multi_language_buckets(iv: intervals_lib.Intervals) -> list[str]:
  return [b for b in comparison_lib.BUCKETS
          if len(iv.bucket_languages[b]) >= 2]


def _problem_blocks(problems: Sequence[str]) -> list[doc.Block]:
  if not problems:
    return []
  return [doc.Paragraph("Without intervals:"), doc.Bullets(tuple(problems))]


def _source_reliance_blocks(comp, rel: reliance_lib.SourceRelianceComparison
                            | None) -> list[doc.Block]:
  if rel is None or not rel.any_log:
    return []
  blocks: list[doc.Block] = [
      doc.Heading("Source reliance"),
      doc.Paragraph(
          "The dev cross-entropy with each source replaced by another "
          "pair's source minus the true one, in nats per target "
          "token, from the last dev evaluation in each training log: how "
          "much the model uses its input. A model that translates loses "
          "several nats; one that ignores its input and only models "
          "English shows ~0.")]
  headers = ["language", "bucket", "baseline", *rel.models]
  rows = [(lang, comp.buckets[lang] or DASH, _fmt_ce(rel.baseline[lang]),
           *(_fmt_ce(rel.values[m][lang]) for m in rel.models))
          for lang in rel.languages]
  blocks.append(doc.Table(tuple(headers), tuple(rows)))
  if rel.without:
    blocks += [doc.Paragraph("Without source reliance (– above):"),
               doc.Bullets(tuple(f"{name}: {why}"
                                 for name, why in rel.without.items()))]
  return blocks


def _examples_blocks(examples: Mapping[str, Sequence[examples_lib.Example]],
                     runs: Sequence[examples_lib.RunOutputs], *, count: int
                     ) -> list[doc.Block]:
  if count <= 0:
    return []
  blocks: list[doc.Block] = [
      doc.Heading("Examples"),
      doc.Paragraph(
          f"The first {count} test sentences of each language: source, "
          "reference and each system's output (a model given with several "
          "seeds: its first seed). – = no usable output.")]
  for lang, items in examples.items():
    labels = list(items[0].hypotheses) if items else []
    blocks.append(doc.Heading(lang, level=3))
    blocks.append(doc.Table(
        ("#", "source", "reference", *labels),
        tuple((str(i), e.source, e.reference,
               *(DASH if e.hypotheses[l] is None else e.hypotheses[l]
                 for l in labels)) for i, e in enumerate(items, start=1)),
        text=True))
  items = [f"{run.label}: {run.missing}" for run in runs if run.missing]
  items += [f"{run.label}, {lang}: {why}" for run in runs
            for lang, why in run.problems.items()]
  if not examples:
    blocks.append(doc.Paragraph("No run has usable hypotheses."))
  if items:
    blocks += [doc.Paragraph("Runs and languages without usable hypotheses "
                             "(no examples, no intervals):"),
               doc.Bullets(tuple(items))]
  return blocks


def build_blocks(comp, models, *, figure: figure_lib.DeltaFigure, png: bytes,
                 logs: Mapping[str, Sequence[run_logs_lib.RunLog]],
                 thresholds: Sequence[float],
                 inputs: Sequence[str],
                 router: Mapping[str, Sequence[
                     training_logs.RouterPoint]] | None = None,
                 router_png: bytes | None = None,
                 dev_ce: dev_ce_lib.DevCeComparison | None = None,
                 intervals: intervals_lib.Intervals | None = None,
                 num_seeds: Mapping[str, int] | None = None,
                 reliance: reliance_lib.SourceRelianceComparison
                 | None = None,
                 examples: Mapping[str, Sequence[examples_lib.Example]]
                 | None = None,
                 runs: Sequence[examples_lib.RunOutputs] = (),
                 example_count: int = 0,
                 split: str = "test",
                 stopping: Sequence[doc.Block] = (),
                 reduced: Sequence[str] = ()) -> list[doc.Block]:
  """The report's content, shared by the Markdown and HTML renderings."""
  metric = comp.metric_name
  return [
      *_reduced_blocks(reduced),
      doc.Paragraph("Inputs: " + ", ".join(inputs)),
      doc.Paragraph(f"Scored split: {split} "
                    f"({SPLIT_DESCRIPTIONS.get(split, split)})."),
      doc.Heading(f"Δ{metric} vs bilingual baselines (Figure 6 style)"),
      doc.Image(FIGURE_FILE, png,
                f"Δ{metric} per language, high to low resource"),
      doc.Paragraph(f"Points: Δ{metric} per language; lines: trend per model, "
                    f"smoothed with {figure.smoother}; the black zero line "
                    "is the bilingual baselines. Languages with no "
                    f"Δ{metric} for a model are not drawn for it."),
      doc.Heading("Models (Table 1 style)"),
      _model_table(comp, models),
      doc.Heading("Averages by resource bucket"),
      doc.Paragraph(f"Bucket bounds: {comp.bounds.describe()}. Averages are "
                    f"over the {len(comp.averaged)} languages scored by "
                    "every model (and baseline, if any)."),
      _averages_table(comp),
      doc.Heading(f"Per-language {metric} and Δ{metric}"),
      *([doc.Paragraph(f"± = 95% bootstrap interval, * = Δ{metric} "
                       f"significant at p < {intervals.alpha:g} (see "
                       "Confidence intervals).")]
        if intervals is not None and intervals.available else []),
      _language_table(comp, intervals, num_seeds),
      *_interval_blocks(comp, intervals),
      *_dev_ce_blocks(comp, dev_ce),
      *_source_reliance_blocks(comp, reliance),
      *_gaps_blocks(comp),
      *stopping,
      *_training_blocks(logs, thresholds),
      *_router_blocks(router or {}, router_png),
      *_examples_blocks(examples or {}, runs, count=example_count),
  ]


def reduced_data(corpus_dir: str | pathlib.Path | None) -> tuple[str, ...]:
  """The corpus build's warnings when it skipped part of its recipe
  (its report's ``reduced`` section); () for a whole corpus, no
  ``corpus_dir`` or a corpus without a build report."""
  if corpus_dir is None:
    return ()
  path = pathlib.Path(corpus_dir) / "report.json"
  if not path.is_file():
    return ()
  section = json.loads(path.read_text(encoding="utf-8")).get("reduced", {})
  if not section.get("reduced"):
    return ()
  return tuple(section.get("warnings", ()))


def _reduced_blocks(reduced: Sequence[str]) -> list[doc.Block]:
  """The header of a report on a reduced corpus (:func:`reduced_data`)."""
  if not reduced:
    return []
  return [doc.Heading("Data reduced"),
          doc.Paragraph("The corpus build skipped part of its recipe: these "
                        "scores are on less data than the recipe's and are "
                        "not its result. What was skipped and what each "
                        "language lost:"),
          doc.Bullets(tuple(reduced))]


def _dev_ce_summary(dev: dev_ce_lib.DevCeComparison | None
                    ) -> dict[str, Any] | None:
  if dev is None or not dev.available:
    return None
  return {
      "baseline": dict(dev.baseline),
      "baseline_models": dict(dev.baseline_models),
      "averaged": list(dev.averaged),
      "excluded": {k: list(v) for k, v in dev.excluded.items()},
      "models_without": dict(dev.models_without),
      "models": {m: {"ce": dict(dev.ce[m]), "delta": dict(dev.delta[m]),
                     "buckets": {b: dataclasses.asdict(a) for b, a in
                                 dev.averages[m].items()}}
                 for m in dev.models},
      "baseline_buckets": {
          b: dataclasses.asdict(a) for b, a in
          dev.averages[comparison_lib.BASELINE_NAME].items()},
  }


def scored_split(runs: Sequence[results.EvalResult]) -> str:
  """The corpus split every run scored (``metadata.split``, ``test`` when
  absent).

  Raises:
    ValueError: the runs scored different splits (their scores and Δ would
      mix test sets).
  """
  splits = {r.model: r.metadata.get("split") or "test" for r in runs}
  if len(set(splits.values())) > 1:
    shown = ", ".join(f"{m}: {s}" for m, s in sorted(splits.items()))
    raise ValueError(f"the eval JSONs scored different splits ({shown}); "
                     "report each split separately")
  return next(iter(splits.values()), "test")


def _summary(comp, dev: dev_ce_lib.DevCeComparison | None = None, *,
             split: str = "test",
             groups: Sequence[seeds_lib.ModelGroup] = (),
             intervals: intervals_lib.Intervals | None = None,
             reliance: reliance_lib.SourceRelianceComparison | None = None,
             examples: Mapping[str, Sequence[examples_lib.Example]]
             | None = None,
             runs: Sequence[examples_lib.RunOutputs] = ()
             ) -> dict[str, Any]:
  return {
      "split": split,
      "languages": list(comp.languages),
      "averaged": list(comp.averaged),
      "excluded": {k: list(v) for k, v in comp.excluded.items()},
      "bucket_bounds": dataclasses.asdict(comp.bounds),
      "buckets": dict(comp.buckets),
      "averages": {name: {b: dataclasses.asdict(a) for b, a in avg.items()}
                   for name, avg in comp.averages.items()},
      "notes": list(comp.notes),
      "dev_ce": _dev_ce_summary(dev),
      "num_seeds": {g.name: g.num_seeds for g in groups},
      "seeds": {g.name: list(g.seeds) for g in groups},
      "intervals": intervals.to_dict() if intervals is not None else None,
      "source_reliance": (reliance.to_dict() if reliance is not None
                          else None),
      "examples": {lang: [e.to_dict() for e in items]
                   for lang, items in (examples or {}).items()},
      "hypotheses": {run.label: {
          "dir": None if run.hypotheses_dir is None
          else str(run.hypotheses_dir),
          "languages": sorted(run.languages), "missing": run.missing,
          "problems": dict(run.problems)} for run in runs},
  }


def strict_json(value: Any) -> Any:
  """``value`` with every non-finite float (NaN, ±inf) replaced by None."""
  if isinstance(value, float):
    return value if math.isfinite(value) else None
  if isinstance(value, Mapping):
    return {k: strict_json(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [strict_json(v) for v in value]
  if isinstance(value, np.generic):
    return strict_json(value.item())
  return value


def nonfinite_paths(value: Any, prefix: str = "") -> list[str]:
  """Dotted paths of the non-finite floats in ``value`` (what
  :func:`strict_json` turns into null)."""
  if isinstance(value, np.generic):
    value = value.item()
  if isinstance(value, float):
    return [] if math.isfinite(value) else [prefix or "<root>"]
  if isinstance(value, Mapping):
    return [p for k, v in value.items()
            for p in nonfinite_paths(v, f"{prefix}.{k}" if prefix else str(k))]
  if isinstance(value, (list, tuple)):
    return [p for i, v in enumerate(value)
            for p in nonfinite_paths(v, f"{prefix}[{i}]")]
  return []


def strict_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
  """``summary`` as strict JSON: non-finite floats become null, and a note
  in ``notes`` plus ``nonfinite_as_null`` list the fields replaced."""
  replaced = nonfinite_paths(summary)
  out = strict_json(summary)
  out["nonfinite_as_null"] = replaced
  if replaced:
    shown = ", ".join(replaced[:10]) + (" ..." if len(replaced) > 10 else "")
    out["notes"] = [*out.get("notes", []),
                    f"{len(replaced)} non-finite value(s) (NaN or infinity) "
                    f"written as null: {shown}"]
  return out


def _stopping_blocks(run_logs: Sequence[run_logs_lib.RunLog]
                     ) -> list[doc.Block]:
  """How each scored run was sized and which of its checkpoints was scored."""
  rows = []
  for run_log in run_logs:
    if run_log.path is None:
      continue
    run = run_log.run
    stop = training_logs.stopping(training_logs.read_records(run_log.path))
    checkpoint = str(run.metadata.get("checkpoint") or "")
    step = training_logs.checkpoint_step(checkpoint)
    which = DASH if step is None else (
        f"{step} (best dev)" if "/best/" in checkpoint.replace("\\", "/")
        else str(step))
    rows.append((run_log.label, ", ".join(sorted(run.languages)),
                 _fmt_int(stop.steps), stop.stopped_by or DASH,
                 str(stop.evaluations), _fmt_int(stop.best_step), which))
  if not rows:
    return []
  return [
      doc.Heading("How each model was trained and which checkpoint was "
                  "scored"),
      doc.Paragraph("From each run's training log (metadata.model_dir or "
                    "--training_logs) and the checkpoint its eval JSON "
                    "names. stopped by: train_steps (the step budget), "
                    "early_stopping (no new best dev cross-entropy for the "
                    "patience), time_budget; lowest dev CE at: the step of "
                    "the best token-weighted dev cross-entropy; '(best dev)': "
                    "the scored weights are that evaluation's, kept by "
                    "m4moe-train in <model_dir>/best/."),
      doc.Table(("model", "languages", "steps", "stopped by",
                 "dev evaluations", "lowest dev CE at", "scored checkpoint"),
                tuple(rows))]


def model_pairs(groups: Sequence[seeds_lib.ModelGroup]
                ) -> list[tuple[str, str]]:
  """(system, reference) pairs compared model vs model.

  Every MoE model (experts per layer > 0, from :func:`model_facts`) minus
  every dense one; without such a pair, every later model minus the first.
  """
  experts = {g.name: model_facts(g.merged).experts for g in groups}
  moe = [n for n, e in experts.items() if e]
  dense = [n for n, e in experts.items() if e == 0]
  pairs = [(m, d) for m in moe for d in dense]
  if not pairs and len(groups) > 1:
    pairs = [(g.name, groups[0].name) for g in groups[1:]]
  return pairs


def load_outputs(groups: Sequence[seeds_lib.ModelGroup],
                 baselines: Sequence[results.EvalResult], *,
                 baseline_paths: Sequence[pathlib.Path | None] = (),
                 corpus_dir: str | pathlib.Path | None = None,
                 hypotheses_dirs: Mapping[str, str] | None = None
                 ) -> tuple[dict[str, list[examples_lib.RunOutputs]],
                            list[examples_lib.RunOutputs]]:
  """(model -> one RunOutputs per seed, one RunOutputs per baseline).

  Raises:
    ValueError: ``hypotheses_dirs`` names an unknown run or a model with
      several seeds (give those their own metadata.hypotheses_dir).
  """
  explicit = dict(hypotheses_dirs or {})
  names = {g.name: g for g in groups}
  for name in explicit:
    if name in names and names[name].num_seeds > 1:
      raise ValueError(f"--hypotheses_dirs: {name} has "
                       f"{names[name].num_seeds} seeds; one directory cannot "
                       "hold them all")
  unknown = set(explicit) - set(names) - {b.model for b in baselines}
  if unknown:
    raise ValueError(f"--hypotheses_dirs names unknown runs: "
                     f"{sorted(unknown)}")
  group_outputs = {
      g.name: [examples_lib.load_run_outputs(
          run, label=g.run_label(i), eval_path=g.paths[i],
          corpus_dir=corpus_dir, hypotheses_dir=explicit.get(g.name))
               for i, run in enumerate(g.runs)] for g in groups}
  paths = list(baseline_paths) or [None] * len(baselines)
  baseline_outputs = [examples_lib.load_run_outputs(
      b, label=b.model, eval_path=path, corpus_dir=corpus_dir,
      hypotheses_dir=explicit.get(b.model))
                      for b, path in zip(baselines, paths)]
  return group_outputs, baseline_outputs


def _baseline_outputs_by_language(
    baselines: Sequence[results.EvalResult],
    outputs: Sequence[examples_lib.RunOutputs]
) -> dict[str, examples_lib.RunOutputs]:
  """language -> outputs of the (one) baseline covering it."""
  out: dict[str, examples_lib.RunOutputs] = {}
  for result, run in zip(baselines, outputs):
    for lang in result.languages:
      out.setdefault(lang, run)
  return out


def _language_examples(comp: comparison_lib.Comparison,
                       groups: Sequence[seeds_lib.ModelGroup],
                       group_outputs: Mapping[str, Sequence[
                           examples_lib.RunOutputs]],
                       baseline_by_lang: Mapping[str,
                                                 examples_lib.RunOutputs],
                       count: int) -> dict[str, list[examples_lib.Example]]:
  """Examples per language: each model's first run, then the baseline."""
  out = {}
  for lang in comp.languages:
    runs = [group_outputs[g.name][0] for g in groups]
    if lang in baseline_by_lang:
      runs.append(dataclasses.replace(baseline_by_lang[lang],
                                      label=comparison_lib.BASELINE_NAME))
    out.update(examples_lib.build_examples(runs, languages=[lang],
                                           count=count))
  return out


class EmptyReportError(ValueError):
  """No language can be averaged; the message names each one's reason."""


def check_something_averaged(comp: comparison_lib.Comparison) -> None:
  """Refuses a report whose averages would be over zero languages.

  Such a report says "BLEU None (n=0)" everywhere: an empty result that
  looks like a finished one.

  Raises:
    EmptyReportError: naming every language and why it was left out.
  """
  if comp.averaged:
    return
  if not comp.languages:
    raise EmptyReportError(
        "the eval JSONs score no language at all; re-run m4moe-eval on a "
        "corpus split with sentences (its output lists each language)")
  reasons = "; ".join(f"{lang}: {', '.join(why)}"
                      for lang, why in comp.excluded.items())
  raise EmptyReportError(
      f"no language can be averaged, so the report would be empty "
      f"({reasons}); give eval JSONs that score the same languages with "
      "sentences (and --baselines covering them), and nothing was written")


@dataclasses.dataclass(frozen=True)
class _Evidence:
  """Everything a report states besides the comparison itself: training
  logs, dev CE, source reliance, intervals and decoded examples."""

  logs: Mapping[str, tuple[run_logs_lib.RunLog, ...]]
  baseline_logs: Mapping[str, tuple[run_logs_lib.RunLog, ...]]
  dev: dev_ce_lib.DevCeComparison | None
  reliance: reliance_lib.SourceRelianceComparison | None
  intervals: intervals_lib.Intervals | None
  examples: Mapping[str, Sequence[examples_lib.Example]]
  runs: Sequence[examples_lib.RunOutputs]


def _check_arguments(*, baselines: Sequence[results.EvalResult],
                     baseline_paths: Sequence[pathlib.Path | None],
                     bootstrap_samples: int) -> None:
  """Refuses arguments that cannot make a report, before anything is read
  or written."""
  if baseline_paths and len(baseline_paths) != len(baselines):
    raise ValueError(f"{len(baseline_paths)} baseline paths for "
                     f"{len(baselines)} baselines")
  if bootstrap_samples < 0 or bootstrap_samples == 1:
    raise ValueError(f"--bootstrap_samples={bootstrap_samples}: use 0 (no "
                     "intervals) or at least 2")


def _gather_evidence(comp: comparison_lib.Comparison, *,
                     groups: Sequence[seeds_lib.ModelGroup],
                     baselines: Sequence[results.EvalResult],
                     training_log_paths: Mapping[str, str],
                     baseline_paths: Sequence[pathlib.Path | None],
                     corpus_dir: str | pathlib.Path | None,
                     hypotheses_dirs: Mapping[str, str] | None,
                     examples: int, bootstrap_samples: int,
                     bootstrap_seed: int) -> _Evidence:
  """Reads the training logs and decoded outputs and computes what they
  give (see :func:`write_report` for where each is found)."""
  logs, baseline_logs = run_logs_lib.find_all_training_logs(
      groups, run_logs_lib.single_run_groups(baselines), training_log_paths)
  dev = dev_ce_lib.compare_dev_ce(
      comp, model_runs=run_logs_lib.seed_mean_dev_ce(logs),
      baselines=baselines,
      baseline_runs=run_logs_lib.seed_mean_dev_ce(baseline_logs))
  reliance = reliance_lib.compare_source_reliance(
      comp.languages, models=comp.models,
      model_logs=run_logs_lib.first_logs(logs), baselines=baselines,
      baseline_logs=run_logs_lib.first_logs(baseline_logs))
  group_outputs, baseline_outputs = load_outputs(
      groups, baselines, baseline_paths=baseline_paths,
      corpus_dir=corpus_dir, hypotheses_dirs=hypotheses_dirs)
  baseline_by_lang = _baseline_outputs_by_language(baselines,
                                                   baseline_outputs)
  intervals = None
  if bootstrap_samples:
    intervals = intervals_lib.compute_intervals(
        comp, groups=groups, group_outputs=group_outputs,
        baseline_outputs=baseline_by_lang,
        baselines=baselines, pairs=model_pairs(groups),
        n_samples=bootstrap_samples, seed=bootstrap_seed)
  return _Evidence(
      logs=logs, baseline_logs=baseline_logs, dev=dev, reliance=reliance,
      intervals=intervals,
      examples=_language_examples(comp, groups, group_outputs,
                                  baseline_by_lang, examples),
      runs=[*(o for g in groups for o in group_outputs[g.name]),
            *baseline_outputs])


def _write_documents(output_dir: pathlib.Path, *, title: str,
                     comp: comparison_lib.Comparison,
                     groups: Sequence[seeds_lib.ModelGroup],
                     baselines: Sequence[results.EvalResult],
                     evidence: _Evidence, trend_frac: float,
                     ce_thresholds: Sequence[float], inputs: Sequence[str],
                     examples: int, split: str, reduced: Sequence[str] = ()
                     ) -> tuple[figure_lib.DeltaFigure, pathlib.Path]:
  """Writes the figures, report.md and report.html; returns the ΔBLEU
  figure and its PNG's path.

  The Markdown links the PNG files and the HTML embeds the same bytes, so
  both show the same figures and report.html stands alone.
  """
  merged = [g.merged for g in groups]
  figure = figure_lib.delta_bleu_figure(comp, frac=trend_frac)
  png_path = output_dir / FIGURE_FILE
  png = doc.png_bytes(figure.figure)
  textio.write_bytes_atomic(png_path, png)
  router = router_trajectories(run_logs_lib.first_logs(evidence.logs))
  router_png = None
  if router:
    router_png = doc.png_bytes(figure_lib.router_figure(router))
    textio.write_bytes_atomic(output_dir / ROUTER_FIGURE_FILE, router_png)
  blocks = build_blocks(
      comp, merged, figure=figure, png=png, logs=evidence.logs,
      thresholds=ce_thresholds, inputs=inputs, router=router,
      router_png=router_png, dev_ce=evidence.dev,
      intervals=evidence.intervals,
      num_seeds={g.name: g.num_seeds for g in groups},
      reliance=evidence.reliance, examples=evidence.examples,
      runs=evidence.runs, example_count=examples, split=split,
      reduced=reduced, stopping=_stopping_blocks(
          [r for logs in (evidence.logs, evidence.baseline_logs)
           for runs in logs.values() for r in runs]))
  textio.write_text_atomic(output_dir / "report.md",
                           doc.to_markdown(title, blocks))
  textio.write_text_atomic(output_dir / "report.html",
                           doc.to_html(title, blocks))
  return figure, png_path


def _write_summary(output_dir: pathlib.Path, comp: comparison_lib.Comparison,
                   evidence: _Evidence, *, split: str,
                   groups: Sequence[seeds_lib.ModelGroup]) -> pathlib.Path:
  """Writes summary.json as strict JSON (non-finite numbers are refused,
  since other JSON readers reject NaN). Each run's hypotheses ``dir``, and
  any path in its messages, is relative to ``output_dir``, so the summary
  reads the same when the report is committed."""
  path = output_dir / "summary.json"
  summary = strict_summary(_summary(
      comp, evidence.dev, split=split, groups=groups,
      intervals=evidence.intervals, reliance=evidence.reliance,
      examples=evidence.examples, runs=evidence.runs))
  for run in summary["hypotheses"].values():
    if run["dir"] is not None:
      run["dir"] = jsonfile.relative_path(run["dir"], start=output_dir)
  summary["hypotheses"] = jsonfile.relative_paths_in(  # messages too
      summary["hypotheses"], start=output_dir)
  textio.write_text_atomic(path, json.dumps(
      summary, indent=1, ensure_ascii=False, allow_nan=False) + "\n")
  return path


@dataclasses.dataclass(frozen=True)
class PreparedReport:
  """Everything a report states, read and computed but not yet written
  (:func:`prepare_report`), so that bad inputs are refused before an
  output directory exists."""

  comparison: comparison_lib.Comparison
  groups: Sequence[seeds_lib.ModelGroup]
  baselines: Sequence[results.EvalResult]
  evidence: _Evidence
  split: str
  inputs: Sequence[str]
  examples: int
  reduced: Sequence[str] = ()


def prepare_report(*, models: Sequence[results.EvalResult],
                   baselines: Sequence[results.EvalResult] = (),
                   bounds: comparison_lib.BucketBounds | None = None,
                   train_sizes: Mapping[str, int] | None = None,
                   training_log_paths: Mapping[str, str | Sequence[str]]
                   | None = None,
                   inputs: Sequence[str] = (), metric: str = "bleu",
                   examples: int = 10,
                   model_paths: Sequence[pathlib.Path | None] = (),
                   baseline_paths: Sequence[pathlib.Path | None] = (),
                   corpus_dir: str | pathlib.Path | None = None,
                   hypotheses_dirs: Mapping[str, str] | None = None,
                   bootstrap_samples: int = significance.DEFAULT_SAMPLES,
                   bootstrap_seed: int = significance.DEFAULT_SEED
                   ) -> PreparedReport:
  """Builds the comparison and reads every log and decoded output it
  needs; writes nothing (the arguments and errors: :func:`write_report`).
  """
  _check_arguments(baselines=baselines, baseline_paths=baseline_paths,
                   bootstrap_samples=bootstrap_samples)
  groups = seeds_lib.group_models(models, model_paths)
  comp = comparison_lib.compare([g.merged for g in groups], baselines,
                                bounds=bounds, metric=metric,
                                train_sizes=train_sizes)
  check_something_averaged(comp)
  evidence = _gather_evidence(
      comp, groups=groups, baselines=baselines,
      training_log_paths=training_log_paths or {},
      baseline_paths=baseline_paths, corpus_dir=corpus_dir,
      hypotheses_dirs=hypotheses_dirs, examples=examples,
      bootstrap_samples=bootstrap_samples, bootstrap_seed=bootstrap_seed)
  return PreparedReport(
      comparison=comp, groups=tuple(groups), baselines=tuple(baselines),
      evidence=evidence, split=scored_split([*models, *baselines]),
      inputs=tuple(inputs or [m.model for m in models]), examples=examples,
      reduced=reduced_data(corpus_dir))


def write_prepared(output_dir: str | pathlib.Path, prepared: PreparedReport,
                   *, title: str = "m4moe: multilingual vs bilingual",
                   trend_frac: float = 0.5,
                   ce_thresholds: Sequence[float] = (0.7, 0.6, 0.5)
                   ) -> ReportFiles:
  """Draws the figures and writes every file of ``prepared`` into
  ``output_dir`` (created if missing)."""
  output_dir = pathlib.Path(output_dir)
  output_dir.mkdir(parents=True, exist_ok=True)
  p = prepared
  figure, png_path = _write_documents(
      output_dir, title=title, comp=p.comparison, groups=p.groups,
      baselines=p.baselines, evidence=p.evidence, trend_frac=trend_frac,
      ce_thresholds=ce_thresholds, inputs=p.inputs, examples=p.examples,
      split=p.split, reduced=p.reduced)
  return ReportFiles(
      markdown=output_dir / "report.md", html=output_dir / "report.html",
      png=png_path, summary=_write_summary(output_dir, p.comparison,
                                           p.evidence, split=p.split,
                                           groups=p.groups),
      figure=figure, comparison=p.comparison)


def write_report(output_dir: str | pathlib.Path, *,
                 title: str = "m4moe: multilingual vs bilingual",
                 trend_frac: float = 0.5,
                 ce_thresholds: Sequence[float] = (0.7, 0.6, 0.5),
                 **prepare_args: Any) -> ReportFiles:
  """Builds the comparison, draws the figures and writes every file:
  :func:`prepare_report` (keyword arguments ``models``, ``baselines``,
  ``bounds``, ``train_sizes``, ``training_log_paths``, ``inputs``,
  ``metric``, ``examples``, ``model_paths``, ``baseline_paths``,
  ``corpus_dir``, ``hypotheses_dirs``, ``bootstrap_samples``,
  ``bootstrap_seed``), then :func:`write_prepared`.

  ``metric``: "bleu" or "chrf" (chrF++). ``models`` sharing a name are
  seeds (their logs: :mod:`.run_logs`). Examples and intervals read the
  ``.hyp`` files (``hypotheses_dirs`` {run: dir}, else
  :func:`.examples.find_hypotheses_dir`) and ``corpus_dir``'s test text.

  Raises (before ``output_dir`` is created or written):
    ValueError: invalid comparison inputs, a name in
      ``training_log_paths`` that is neither a model nor a baseline (or
      that several baselines share), a wrong log count for a model in
      it, unknown runs in
      ``hypotheses_dirs``, two baselines on one language, a seed given
      twice, or paths lists of the wrong length.
    FileNotFoundError: a log in ``training_log_paths`` does not exist.
    EmptyReportError: no language can be averaged.
  """
  return write_prepared(output_dir, prepare_report(**prepare_args),
                        title=title,
                        trend_frac=trend_frac, ce_thresholds=ce_thresholds)
