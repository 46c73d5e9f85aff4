"""The report's sections as document blocks: the models, bucket and
per-language score tables, dev cross-entropy, source reliance, exclusions,
how each run was trained, training cost, router statistics and examples.

Each function turns one computed comparison (:mod:`.comparison`,
:mod:`.dev_ce`, :mod:`.source_reliance`, :mod:`.training_logs`,
:mod:`.examples`) into :mod:`.document` blocks; :mod:`.report` puts them in
order. The confidence-interval section is :mod:`.report_intervals`.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Mapping, Sequence

from m4moe.eval import comparison as comparison_lib
from m4moe.eval import dev_ce as dev_ce_lib
from m4moe.eval import document as doc
from m4moe.eval import examples as examples_lib
from m4moe.eval import intervals as intervals_lib
from m4moe.eval import report_cells as cells
from m4moe.eval import results
from m4moe.eval import run_logs as run_logs_lib
from m4moe.eval import source_reliance as reliance_lib
from m4moe.eval import training_logs
from m4moe.training import metrics_log

ROUTER_FIGURE_FILE = "router_stats.png"
ROUTER_TABLE_POINTS = 5
DASH = cells.DASH


@dataclasses.dataclass(frozen=True)
class ModelFacts:
  """Size facts of one model for the Table-1-style table."""

  params: int | None
  experts: int | None
  layers: int | None
  total_experts: int | None
  source: str


def model_facts(result: results.EvalResult) -> ModelFacts:
  """Params/experts/layers: m4moe.cost.model on the stored config, else
  metadata."""
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


def model_table(comp, models: Sequence[results.EvalResult]) -> doc.Table:
  rows = []
  for result in models:
    facts = model_facts(result)
    avg = comp.averages[result.model]["all"]
    rows.append((result.model, cells.fmt_int(facts.params),
                 cells.fmt_int(facts.experts) if facts.experts else "dense",
                 cells.fmt_int(facts.layers),
                 cells.fmt_int(facts.total_experts) if facts.experts
                 else DASH,
                 cells.fmt(avg.bleu), cells.fmt(avg.delta, signed=True),
                 facts.source))
  base = comp.averages[comparison_lib.BASELINE_NAME]["all"]
  if comp.baseline_models:
    rows.append((comparison_lib.BASELINE_NAME,
                 f"{len(set(comp.baseline_models.values()))} models", DASH,
                 DASH, DASH, cells.fmt(base.bleu),
                 cells.fmt(0.0, signed=True), DASH))
  return doc.Table(("model", "params", "E (experts/layer)", "L (layers)",
                    "total experts", f"avg {comp.metric_name}",
                    f"avg Δ{comp.metric_name}", "params from"),
                   tuple(rows))


def averages_table(comp) -> doc.Table:
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
      row += [cells.fmt(avg.bleu), cells.fmt(avg.delta, signed=True),
              str(avg.count)]
    rows.append(tuple(row))
  return doc.Table(tuple(headers), tuple(rows))


def language_table(comp, iv: intervals_lib.Intervals | None = None,
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
    lang_cells = (iv.languages[lang][comp.metric]
             if iv is not None and lang in iv.languages else {})
    base = lang_cells.get(comparison_lib.BASELINE_NAME)
    row = [lang, cells.fmt_int(comp.train_sizes[lang]),
           comp.buckets[lang] or DASH,
           cells.fmt_interval(base) if base and base.interval
           else cells.fmt(comp.baseline_bleu[lang])]
    for model in comp.models:
      cell = lang_cells.get(model)
      row += [cells.fmt_interval(cell) if cell and cell.interval
              else cells.fmt(comp.bleu[model][lang]),
              cells.fmt_difference(cell.delta) if cell and cell.delta
              else cells.fmt(comp.delta[model][lang], signed=True)]
    row.append("yes" if lang in comp.averaged else "no")
    rows.append(tuple(row))
  return doc.Table(tuple(headers), tuple(rows))


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
      row += [cells.fmt_ce(avg.ce), cells.fmt_ce(avg.delta, signed=True),
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
    row = [lang, comp.buckets[lang] or DASH, cells.fmt_ce(dev.baseline[lang])]
    for model in dev.models:
      row += [cells.fmt_ce(dev.ce[model][lang]),
              cells.fmt_ce(dev.delta[model][lang], signed=True)]
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


def dev_ce_blocks(comp, dev: dev_ce_lib.DevCeComparison | None
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


def training_blocks(logs: Mapping[str, Sequence[run_logs_lib.RunLog]],
                     thresholds: Sequence[float]) -> list[doc.Block]:
  with_log = [r for runs in logs.values() for r in runs if r.path is not None]
  if not with_log:
    return [doc.Heading("Training cost and convergence"),
            doc.Paragraph("No training metrics logs were given "
                          "(--training_logs or metadata.model_dir).")]
  cost_rows, ce_rows = [], []
  for run_log in with_log:
    records = metrics_log.read_metrics(run_log.path)
    cost = training_logs.training_cost(records)
    cost_rows.append((
        run_log.label, cells.fmt_int(cost.devices),
        DASH if cost.steps_per_sec is None else f"{cost.steps_per_sec:.3g}",
        DASH if cost.cpu_sec_per_step is None
        else f"{cost.cpu_sec_per_step:.3g}",
        cells.fmt_int(cost.batch_tokens),
        DASH if cost.device_hours is None else f"{cost.device_hours:.3g}",
        DASH if cost.wall_hours is None else f"{cost.wall_hours:.3g}",
        cells.fmt_int(cost.steps), cells.fmt_int(cost.tokens)))
    reached = training_logs.tokens_to_reach(records, thresholds)
    ce_rows.append((run_log.label,
                    *(cells.fmt_int(reached[t]) for t in thresholds)))
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
    points = training_logs.router_trajectory(metrics_log.read_metrics(path))
    if points:
      out[model] = points
  return out


def router_blocks(trajectories: Mapping[str, Sequence[
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
      rows.append((model, str(p.step), str(p.layers),
                   cells.fmt3(p.load_cv_mean),
                   cells.fmt3(p.load_cv_max), cells.percent(p.dropped_first),
                   cells.percent(p.dropped_second), cells.fmt3(p.aux_loss)))
  blocks.append(doc.Table(("model", "step", "MoE layers", "load CV mean",
                           "load CV max", "dropped 1st", "dropped 2nd",
                           "aux loss"), tuple(rows)))
  return blocks


def gaps_blocks(comp) -> list[doc.Block]:
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


def source_reliance_blocks(comp, rel: reliance_lib.SourceRelianceComparison
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
  rows = [(lang, comp.buckets[lang] or DASH, cells.fmt_ce(rel.baseline[lang]),
           *(cells.fmt_ce(rel.values[m][lang]) for m in rel.models))
          for lang in rel.languages]
  blocks.append(doc.Table(tuple(headers), tuple(rows)))
  if rel.without:
    blocks += [doc.Paragraph("Without source reliance (– above):"),
               doc.Bullets(tuple(f"{name}: {why}"
                                 for name, why in rel.without.items()))]
  return blocks


def examples_blocks(examples: Mapping[str, Sequence[examples_lib.Example]],
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


def stopping_blocks(run_logs: Sequence[run_logs_lib.RunLog]
                     ) -> list[doc.Block]:
  """How each scored run was sized and which of its checkpoints was scored."""
  rows = []
  for run_log in run_logs:
    if run_log.path is None:
      continue
    run = run_log.run
    stop = training_logs.stopping(metrics_log.read_metrics(run_log.path))
    checkpoint = str(run.metadata.get("checkpoint") or "")
    step = training_logs.checkpoint_step(checkpoint)
    which = DASH if step is None else (
        f"{step} (best dev)" if "/best/" in checkpoint.replace("\\", "/")
        else str(step))
    rows.append((run_log.label, ", ".join(sorted(run.languages)),
                 cells.fmt_int(stop.steps), stop.stopped_by or DASH,
                 str(stop.evaluations), cells.fmt_int(stop.best_step), which))
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
