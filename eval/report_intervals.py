"""The report's confidence-interval and significance section.

Per language and system: each score with its 95% bootstrap interval, its
paired Δ against the bilingual baseline and the spread over seeds; then
model-vs-model differences with both tests (the sentence bootstrap and
Welch's t-test over seeds) and bucket means. The numbers come from
:mod:`.intervals`; this module only lays them out and says how each was
obtained.
"""

from __future__ import annotations

from typing import Sequence

from m4moe.eval import comparison as comparison_lib
from m4moe.eval import document as doc
from m4moe.eval import intervals as intervals_lib
from m4moe.eval import report_cells as cells


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


def interval_blocks(comp, iv: intervals_lib.Intervals | None
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
  return [cells.fmt_interval(cell), cells.fmt_spread(cell and cell.seeds),
          cells.fmt_difference(cell and cell.delta, with_p=True),
          cells.fmt_spread(cell and cell.delta_seeds, signed=True)]


def _interval_table(comp, iv: intervals_lib.Intervals) -> doc.Table:
  """Per language and system; systems without any interval are left out
  (they have no hypotheses there, which the problems list says)."""
  headers = ["language", "system", "seeds", *_metric_headers(
      "{name}", "{name} seeds", "Δ{name} vs baseline", "Δ{name} seeds")]
  rows = []
  for lang in comp.languages:
    for system in iv.systems:
      by_metric = [iv.languages[lang][m].get(system)
               for m in intervals_lib.METRICS]
      if all(c is None or c.interval is None for c in by_metric):
        continue
      row = [lang, system, str(iv.num_seeds.get(system, 1))]
      for cell in by_metric:
        row += _cell_columns(cell)
      rows.append(tuple(row))
  return doc.Table(tuple(headers), tuple(rows))


def _pair_row(label: str, name: str, diffs, seed_diffs) -> tuple[str, ...]:
  row = [label, name]
  for diff, seed_diff in zip(diffs, seed_diffs):
    row += [cells.fmt_difference(diff, with_p=True),
            cells.fmt_seed_difference(seed_diff)]
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
