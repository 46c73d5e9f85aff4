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
  p-value and seed spread,
  :meth:`m4moe.eval.intervals.Intervals.to_dict`; None with
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
evaluation, the checkpoint scored); training cost like Table 3 and tokens
to reach cross-entropy thresholds like Table 2 and router statistics over
training (load balance, dropped tokens, aux loss; from training metrics
JSONL logs). Languages left out of averages, and why, are always listed.
A report on a corpus whose build skipped part of its recipe (the corpus
report's ``reduced`` section, :mod:`m4moe.data.corpus_coverage`; read from
``corpus_dir``) opens with a "Data reduced" header listing what was
skipped and each language's training pairs against the recipe's, so its
scores are never read as the recipe's.
Section order: data reduced (if so), figure, models, buckets,
per-language scores, confidence intervals, dev CE, source reliance,
exclusions, training cost, router statistics, examples.

This module gathers the evidence, orders the sections and writes the
files; the sections themselves are :mod:`.report_sections` (tables) and
:mod:`.report_intervals` (confidence intervals and significance), each
cell formatted by :mod:`.report_cells`, and ``summary.json`` is
:mod:`.report_summary`.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Mapping, Sequence

from m4moe import jsonfile
from m4moe.eval import comparison as comparison_lib
from m4moe.eval import dev_ce as dev_ce_lib
from m4moe.eval import document as doc
from m4moe.eval import examples as examples_lib
from m4moe.eval import figure as figure_lib
from m4moe.eval import intervals as intervals_lib
from m4moe.eval import report_intervals
from m4moe.eval import report_sections as sections
from m4moe.eval import report_summary
from m4moe.eval import results
from m4moe.eval import run_logs as run_logs_lib
from m4moe.eval import seeds as seeds_lib
from m4moe.eval import significance
from m4moe.eval import source_reliance as reliance_lib
from m4moe.eval import textio
from m4moe.eval import training_logs
# Re-exported: callers read them from the report they belong to.
from m4moe.eval.report_sections import ROUTER_FIGURE_FILE  # noqa: F401
from m4moe.eval.report_sections import ModelFacts  # noqa: F401
from m4moe.eval.report_sections import model_facts  # noqa: F401
from m4moe.eval.report_summary import nonfinite_paths  # noqa: F401
from m4moe.eval.report_summary import strict_json  # noqa: F401
from m4moe.eval.report_summary import strict_summary  # noqa: F401

FIGURE_FILE = "delta_bleu.png"
SPLIT_DESCRIPTIONS = {
    "test": "in-domain test: English groups held out by the frozen split "
            "keys",
    "test_ood": "out-of-domain test: whole source packages held out of "
                "train, dev and test, English unseen in the corpus",
    "dev": "dev split",
}


@dataclasses.dataclass(frozen=True)
class ReportFiles:
  """What :func:`write_report` wrote and built."""

  markdown: pathlib.Path
  html: pathlib.Path
  png: pathlib.Path
  summary: pathlib.Path
  figure: figure_lib.DeltaFigure
  comparison: comparison_lib.Comparison


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
      sections.model_table(comp, models),
      doc.Heading("Averages by resource bucket"),
      doc.Paragraph(f"Bucket bounds: {comp.bounds.describe()}. Averages are "
                    f"over the {len(comp.averaged)} languages scored by "
                    "every model (and baseline, if any)."),
      sections.averages_table(comp),
      doc.Heading(f"Per-language {metric} and Δ{metric}"),
      *([doc.Paragraph(f"± = 95% bootstrap interval, * = Δ{metric} "
                       f"significant at p < {intervals.alpha:g} (see "
                       "Confidence intervals).")]
        if intervals is not None and intervals.available else []),
      sections.language_table(comp, intervals, num_seeds),
      *report_intervals.interval_blocks(comp, intervals),
      *sections.dev_ce_blocks(comp, dev_ce),
      *sections.source_reliance_blocks(comp, reliance),
      *sections.gaps_blocks(comp),
      *stopping,
      *sections.training_blocks(logs, thresholds),
      *sections.router_blocks(router or {}, router_png),
      *sections.examples_blocks(examples or {}, runs, count=example_count),
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

def model_pairs(groups: Sequence[seeds_lib.ModelGroup]
                ) -> list[tuple[str, str]]:
  """(system, reference) pairs compared model vs model.

  Every MoE model (experts per layer > 0, from :func:`model_facts`) minus
  every dense one; without such a pair, every later model minus the first.
  """
  experts = {g.name: sections.model_facts(g.merged).experts for g in groups}
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
  router = sections.router_trajectories(run_logs_lib.first_logs(evidence.logs))
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
      reduced=reduced, stopping=sections.stopping_blocks(
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
  summary = report_summary.strict_summary(report_summary.summary(
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
