"""The multilingual-vs-bilingual report: figure, tables, report.md/.html.

:func:`write_report` writes to ``output_dir``:

* ``delta_bleu.png`` -- the paper's Figure 6 (:mod:`m4moe.eval.figure`);
* ``router_stats.png`` -- expert load CV and dropped second choices over
  training, when the models' training logs carry router statistics;
* ``report.md`` -- every table below, the smoother and bucket bounds;
* ``report.html`` -- the same, self-contained (figure embedded as base64);
* ``summary.json`` -- the averages and exclusions, machine-readable; under
  ``dev_ce`` the dev cross-entropy comparison (None when unavailable).

Tables: model table in the style of SPEC Table 1 (params, E, L, total
experts, avg BLEU, avg ΔBLEU); averages over all/high/mid/low buckets;
per-language BLEU/ΔBLEU (or chrF++ with ``metric="chrf"``); dev
cross-entropy vs the bilingual baselines (:mod:`m4moe.eval.dev_ce`; bucket
means, ΔCE and wins, per language; from the last dev evaluation in the
models' and baselines' training logs, shown when at least one model and one
baseline have one); training cost like Table 3 and tokens to reach
cross-entropy thresholds like Table 2 and router statistics over training
(load balance, dropped tokens, aux loss; from training metrics JSONL logs).
Languages left out of averages, and why, are always listed.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Mapping, Sequence

from m4moe.eval import comparison as comparison_lib
from m4moe.eval import dev_ce as dev_ce_lib
from m4moe.eval import document as doc
from m4moe.eval import figure as figure_lib
from m4moe.eval import results
from m4moe.eval import training_logs

FIGURE_FILE = "delta_bleu.png"
ROUTER_FIGURE_FILE = "router_stats.png"
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
  """Params/experts/layers: m4moe.cost on the stored config, else metadata."""
  meta = result.metadata
  config = meta.get("config")
  if isinstance(config, Mapping):
    try:
      # pylint: disable=g-import-not-at-top
      from m4moe import config as config_lib
      from m4moe import cost
      model_config = config_lib.config_from_dict(config)
      return ModelFacts(
          params=cost.num_params(model_config),
          experts=model_config.moe.num_experts,
          layers=model_config.num_layers,
          total_experts=cost.num_experts_total(model_config),
          source="m4moe.cost")
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


def _language_table(comp) -> doc.Table:
  metric = comp.metric_name
  headers = ["language", "train pairs", "bucket", f"baseline {metric}"]
  for model in comp.models:
    headers += [f"{model} {metric}", f"{model} Δ{metric}"]
  headers.append("in averages")
  rows = []
  for lang in comp.languages:
    row = [lang, _fmt_int(comp.train_sizes[lang]), comp.buckets[lang] or DASH,
           _fmt(comp.baseline_bleu[lang])]
    for model in comp.models:
      row += [_fmt(comp.bleu[model][lang]),
              _fmt(comp.delta[model][lang], signed=True)]
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
          "(teacher-forced), from the last dev evaluation in each run's "
          "training log; positive = the multilingual model is better. Far "
          "steadier than BLEU on small test sets. Buckets as above; means "
          f"over the {len(dev.averaged)} languages with a dev CE from the "
          "baseline and every model listed; wins = languages with ΔCE > 0."),
      _dev_ce_bucket_table(dev),
      _dev_ce_language_table(comp, dev),
      *_dev_ce_gap_blocks(dev),
  ]


def _training_blocks(logs: Mapping[str, pathlib.Path],
                     thresholds: Sequence[float]) -> list[doc.Block]:
  if not logs:
    return [doc.Heading("Training cost and convergence"),
            doc.Paragraph("No training metrics logs were given "
                          "(--training_logs or metadata.model_dir).")]
  cost_rows, ce_rows = [], []
  for model, path in logs.items():
    records = training_logs.read_records(path)
    cost = training_logs.training_cost(records)
    cost_rows.append((
        model, _fmt_int(cost.devices),
        DASH if cost.steps_per_sec is None else f"{cost.steps_per_sec:.3g}",
        _fmt_int(cost.batch_tokens),
        DASH if cost.device_hours is None else f"{cost.device_hours:.3g}",
        DASH if cost.wall_hours is None else f"{cost.wall_hours:.3g}",
        _fmt_int(cost.steps), _fmt_int(cost.tokens)))
    reached = training_logs.tokens_to_reach(records, thresholds)
    ce_rows.append((model, *(_fmt_int(reached[t]) for t in thresholds)))
  return [
      doc.Heading("Training cost (Table 3 style)"),
      doc.Table(("model", "devices", "steps/s", "batch tokens",
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


def build_blocks(comp, models, *, figure: figure_lib.DeltaFigure, png: bytes,
                 logs: Mapping[str, pathlib.Path],
                 thresholds: Sequence[float],
                 inputs: Sequence[str],
                 router: Mapping[str, Sequence[
                     training_logs.RouterPoint]] | None = None,
                 router_png: bytes | None = None,
                 dev_ce: dev_ce_lib.DevCeComparison | None = None
                 ) -> list[doc.Block]:
  """The report's content, shared by the Markdown and HTML renderings."""
  metric = comp.metric_name
  return [
      doc.Paragraph("Inputs: " + ", ".join(inputs)),
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
      _language_table(comp),
      *_dev_ce_blocks(comp, dev_ce),
      *_gaps_blocks(comp),
      *_training_blocks(logs, thresholds),
      *_router_blocks(router or {}, router_png),
  ]


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


def _summary(comp, dev: dev_ce_lib.DevCeComparison | None = None
             ) -> dict[str, Any]:
  return {
      "languages": list(comp.languages),
      "averaged": list(comp.averaged),
      "excluded": {k: list(v) for k, v in comp.excluded.items()},
      "bucket_bounds": dataclasses.asdict(comp.bounds),
      "buckets": dict(comp.buckets),
      "averages": {name: {b: dataclasses.asdict(a) for b, a in avg.items()}
                   for name, avg in comp.averages.items()},
      "notes": list(comp.notes),
      "dev_ce": _dev_ce_summary(dev),
  }


def find_training_logs(models: Sequence[results.EvalResult],
                       explicit: Mapping[str, str]) -> dict[str, pathlib.Path]:
  """model -> metrics JSONL: explicit paths, else metadata.model_dir's log.

  Raises:
    FileNotFoundError: an explicitly given log does not exist.
  """
  logs = {}
  for result in models:
    path = explicit.get(result.model)
    if path is None and result.metadata.get("model_dir"):
      candidate = pathlib.Path(result.metadata["model_dir"]) / "metrics.jsonl"
      path = str(candidate) if candidate.is_file() else None
    if path is not None:
      if not pathlib.Path(path).is_file():
        raise FileNotFoundError(f"--training_logs: {path} for model "
                                f"{result.model} does not exist")
      logs[result.model] = pathlib.Path(path)
  unknown = set(explicit) - {m.model for m in models}
  if unknown:
    raise ValueError(f"--training_logs names unknown models: "
                     f"{sorted(unknown)}")
  return logs


def runs_dev_ce(runs: Sequence[results.EvalResult],
                logs: Mapping[str, pathlib.Path]
                ) -> dict[str, dict[str, float] | None]:
  """name -> last dev CE per language in its log (None: no log found)."""
  out: dict[str, dict[str, float] | None] = {}
  for run in runs:
    path = logs.get(run.model)
    out[run.model] = (None if path is None else training_logs.final_dev_ce(
        training_logs.read_records(path)))
  return out


def write_report(output_dir: str | pathlib.Path, *,
                 models: Sequence[results.EvalResult],
                 baselines: Sequence[results.EvalResult] = (),
                 bounds: comparison_lib.BucketBounds | None = None,
                 train_sizes: Mapping[str, int] | None = None,
                 training_log_paths: Mapping[str, str] | None = None,
                 ce_thresholds: Sequence[float] = (0.7, 0.6, 0.5),
                 trend_frac: float = 0.5,
                 inputs: Sequence[str] = (),
                 title: str = "m4moe: multilingual vs bilingual",
                 metric: str = "bleu") -> ReportFiles:
  """Builds the comparison, draws the figure and writes every file.

  ``metric`` is the compared score: "bleu" or "chrf" (chrF++). The models'
  training logs are ``training_log_paths`` or their metadata.model_dir's
  metrics.jsonl; the baselines' are their metadata.model_dir's (a baseline
  without one has no dev CE, which the report lists).

  Raises:
    ValueError: invalid comparison inputs, unknown models in
      ``training_log_paths``, or two baselines covering one language.
    FileNotFoundError: a log in ``training_log_paths`` does not exist.
  """
  output_dir = pathlib.Path(output_dir)
  output_dir.mkdir(parents=True, exist_ok=True)
  comp = comparison_lib.compare(models, baselines, bounds=bounds,
                                metric=metric,
                                train_sizes=train_sizes)
  logs = find_training_logs(models, training_log_paths or {})
  dev = dev_ce_lib.compare_dev_ce(
      comp, model_runs=runs_dev_ce(models, logs), baselines=baselines,
      baseline_runs=runs_dev_ce(baselines, find_training_logs(baselines, {})))
  figure = figure_lib.delta_bleu_figure(comp, frac=trend_frac)
  png_path = output_dir / FIGURE_FILE
  figure.save_png(png_path)
  router = router_trajectories(logs)
  router_png = None
  if router:
    router_path = output_dir / ROUTER_FIGURE_FILE
    router_fig = figure_lib.router_figure(router)
    router_fig.savefig(str(router_path), format="png", dpi=120)
    router_png = router_path.read_bytes()
  blocks = build_blocks(comp, models, figure=figure,
                        png=png_path.read_bytes(), logs=logs,
                        thresholds=ce_thresholds,
                        inputs=inputs or [m.model for m in models],
                        router=router, router_png=router_png, dev_ce=dev)
  md_path, html_path = output_dir / "report.md", output_dir / "report.html"
  md_path.write_text(doc.to_markdown(title, blocks), encoding="utf-8")
  html_path.write_text(doc.to_html(title, blocks), encoding="utf-8")
  summary_path = output_dir / "summary.json"
  summary_path.write_text(json.dumps(_summary(comp, dev), indent=1,
                                     ensure_ascii=False) + "\n",
                          encoding="utf-8")
  return ReportFiles(markdown=md_path, html=html_path, png=png_path,
                     summary=summary_path, figure=figure, comparison=comp)
