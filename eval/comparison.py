"""Multilingual models vs bilingual baselines: ΔBLEU, ordering, buckets.

The score is BLEU by default; ``metric="chrf"`` compares chrF++ instead (the
fields keep the ``bleu`` names and hold the chosen metric's scores;
:attr:`Comparison.metric_name` is its display name).

Languages are ordered from high to low resource by training-set size (ties
by code; languages with unknown size go last). ΔBLEU of a model on a
language is its BLEU minus the bilingual baseline's BLEU there.

Averages never hide gaps: they are taken over the *averaged set*, the
languages on which every multilingual model has a score and, when baselines
are given at all, the baseline too. Every other language is listed in
``Comparison.excluded`` with the reason (missing baseline, missing from a
model, empty test split, unknown training size for bucketing).

Buckets: ``high`` = train size >= high_min, ``low`` = train size < low_max,
``mid`` otherwise. Bounds default to the terciles of the ordered languages
and are always printed with the report.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

from m4moe.eval import results
from m4moe.eval import scoring

BUCKETS = ("all", "high", "mid", "low")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BucketBounds:
  """Training-size bounds: high >= high_min > ... ; low < low_max."""

  high_min: int
  low_max: int

  def __post_init__(self) -> None:
    if self.low_max > self.high_min:
      raise ValueError(f"--bucket_bounds: high_min={self.high_min} must be "
                       f">= low_max={self.low_max}")

  def bucket(self, train_size: int | None) -> str | None:
    if train_size is None:
      return None
    if train_size >= self.high_min:
      return "high"
    return "low" if train_size < self.low_max else "mid"

  def describe(self) -> str:
    return (f"high: train pairs >= {self.high_min:,}; "
            f"mid: {self.low_max:,} <= train pairs < {self.high_min:,}; "
            f"low: train pairs < {self.low_max:,}")


@dataclasses.dataclass(frozen=True)
class Average:
  """Mean BLEU and ΔBLEU of one model over one bucket of the averaged set."""

  bleu: float | None
  delta: float | None
  count: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class Comparison:
  """Everything the report tables and figure need.

  Attributes:
    models: multilingual model names, in input order.
    languages: every language seen, high -> low resource.
    train_sizes: language -> training pairs (None if unknown).
    bleu: model -> language -> BLEU (None if absent or empty).
    baseline_bleu: language -> bilingual baseline BLEU (None if absent).
    baseline_models: language -> the baseline result's model name.
    delta: model -> language -> ΔBLEU (None if either side is missing).
    bounds: the bucket bounds used.
    buckets: language -> "high" / "mid" / "low" (None if size unknown).
    averaged: the languages averages are taken over, in order.
    excluded: language -> reasons it is not in ``averaged``.
    averages: model (and "bilingual baselines") -> bucket -> Average.
    notes: other problems (conflicting training sizes, duplicates...).
    metric: the compared score, "bleu" or "chrf" (chrF++).
  """

  models: tuple[str, ...]
  languages: tuple[str, ...]
  train_sizes: Mapping[str, int | None]
  bleu: Mapping[str, Mapping[str, float | None]]
  baseline_bleu: Mapping[str, float | None]
  baseline_models: Mapping[str, str]
  delta: Mapping[str, Mapping[str, float | None]]
  bounds: BucketBounds
  buckets: Mapping[str, str | None]
  averaged: tuple[str, ...]
  excluded: Mapping[str, tuple[str, ...]]
  averages: Mapping[str, Mapping[str, Average]]
  notes: tuple[str, ...]
  metric: str = "bleu"

  @property
  def metric_name(self) -> str:
    """"BLEU" or "chrF++"."""
    return METRICS[self.metric]


# Scores a comparison can use: LanguageScore attribute -> display name.
METRICS = {"bleu": "BLEU", "chrf": "chrF++"}

BASELINE_NAME = "bilingual baselines"


def _ok_score(score: scoring.LanguageScore | None, metric: str
              ) -> float | None:
  if score is None or score.status != scoring.STATUS_OK:
    return None
  return getattr(score, metric)


def _train_sizes(all_results: Sequence[results.EvalResult],
                 overrides: Mapping[str, int], notes: list[str]
                 ) -> dict[str, int | None]:
  sizes: dict[str, int | None] = {}
  for result in all_results:
    for lang, score in result.languages.items():
      size = score.train_size
      if lang in overrides:
        size = overrides[lang]
      old = sizes.get(lang)
      if old is not None and size is not None and old != size:
        notes.append(f"{lang}: training size {size} in {result.model} "
                     f"differs from {old}; using {old}")
      elif old is None:
        sizes[lang] = size
  return sizes


def _baselines(baselines: Sequence[results.EvalResult], notes: list[str],
               metric: str) -> tuple[dict[str, float | None], dict[str, str],
                                     dict[str, str]]:
  """Merges baseline results: (score, model name, status) per language."""
  bleu, names, status = {}, {}, {}
  for result in baselines:
    for lang, score in result.languages.items():
      if lang in names:
        notes.append(f"{lang}: several baselines ({names[lang]}, "
                     f"{result.model}); using {names[lang]}")
        continue
      bleu[lang], names[lang], status[lang] = (
          _ok_score(score, metric), result.model, score.status)
  return bleu, names, status


def order_languages(sizes: Mapping[str, int | None]) -> tuple[str, ...]:
  """High -> low resource; unknown sizes last; ties by language code."""
  return tuple(sorted(sizes, key=lambda l: (sizes[l] is None,
                                            -(sizes[l] or 0), l)))


def tercile_bounds(ordered_sizes: Sequence[int]) -> BucketBounds:
  """Bounds splitting languages (sizes high -> low) into thirds."""
  if not ordered_sizes:
    return BucketBounds(high_min=1, low_max=0)
  n = len(ordered_sizes)
  high_min = ordered_sizes[max(0, math.ceil(n / 3) - 1)]
  low_max = ordered_sizes[min(n - 1, math.ceil(2 * n / 3) - 1)]
  return BucketBounds(high_min=high_min, low_max=low_max)


def _exclusions(lang: str, *, models: Sequence[results.EvalResult],
                baseline_bleu, baseline_status, have_baselines: bool,
                size) -> tuple[str, ...]:
  reasons = []
  for result in models:
    score = result.languages.get(lang)
    if score is None:
      reasons.append(f"not evaluated by {result.model}")
    elif score.status == scoring.STATUS_EMPTY:
      reasons.append(f"empty test split in {result.model}")
  if have_baselines:
    if lang not in baseline_status:
      reasons.append("no bilingual baseline")
    elif baseline_bleu.get(lang) is None:
      reasons.append("empty test split in the baseline")
  if size is None:
    reasons.append("unknown training size (cannot be bucketed or ordered)")
  return tuple(reasons)


def _mean(values: Sequence[float]) -> float | None:
  return sum(values) / len(values) if values else None


def _averages(averaged: Sequence[str], buckets, bleu, delta,
              baseline_bleu) -> dict[str, dict[str, Average]]:
  out = {}
  series = {name: (bleu[name], delta[name]) for name in bleu}
  series[BASELINE_NAME] = (baseline_bleu,
                           {l: 0.0 for l, v in baseline_bleu.items()
                            if v is not None})
  for name, (b, d) in series.items():
    out[name] = {}
    for bucket in BUCKETS:
      langs = [l for l in averaged if bucket == "all" or buckets[l] == bucket]
      bleus = [b[l] for l in langs if b.get(l) is not None]
      deltas = [d[l] for l in langs if d.get(l) is not None]
      out[name][bucket] = Average(bleu=_mean(bleus), delta=_mean(deltas),
                                  count=len(langs))
  return out


def compare(models: Sequence[results.EvalResult],
            baselines: Sequence[results.EvalResult] = (), *,
            bounds: BucketBounds | None = None,
            train_sizes: Mapping[str, int] | None = None,
            metric: str = "bleu") -> Comparison:
  """Builds the comparison of multilingual models against baselines.

  Args:
    models: one EvalResult per multilingual model (names must be unique).
    baselines: bilingual baselines (one result per language or a few
      results covering several languages).
    bounds: bucket bounds; default: terciles of the known training sizes.
    train_sizes: language -> training pairs, overriding the eval JSONs.
    metric: "bleu" or "chrf" (chrF++).

  Raises:
    ValueError: no models, duplicate model names, or an unknown metric.
  """
  if metric not in METRICS:
    raise ValueError(f"--metric={metric!r}: choose one of "
                     f"{', '.join(METRICS)}")
  if not models:
    raise ValueError("give at least one multilingual eval JSON (--models)")
  names = [m.model for m in models]
  if len(set(names)) != len(names) or BASELINE_NAME in names:
    raise ValueError(f"model names must be unique and not "
                     f"{BASELINE_NAME!r}: {names}")
  notes: list[str] = []
  sizes = _train_sizes([*models, *baselines], train_sizes or {}, notes)
  languages = order_languages(sizes)
  base_bleu, base_names, base_status = _baselines(baselines, notes, metric)
  if bounds is None:
    bounds = tercile_bounds([sizes[l] for l in languages
                             if sizes[l] is not None])
  buckets = {l: bounds.bucket(sizes[l]) for l in languages}
  bleu = {m.model: {l: _ok_score(m.languages.get(l), metric)
                    for l in languages} for m in models}
  delta = {name: {l: (b[l] - base_bleu[l]
                      if b[l] is not None and base_bleu.get(l) is not None
                      else None) for l in languages}
           for name, b in bleu.items()}
  excluded = {}
  for lang in languages:
    reasons = _exclusions(lang, models=models, baseline_bleu=base_bleu,
                          baseline_status=base_status,
                          have_baselines=bool(baselines), size=sizes[lang])
    if reasons:
      excluded[lang] = reasons
  averaged = tuple(l for l in languages if l not in excluded)
  return Comparison(
      models=tuple(names), languages=languages, train_sizes=sizes, bleu=bleu,
      baseline_bleu={l: base_bleu.get(l) for l in languages},
      baseline_models=base_names, delta=delta, bounds=bounds, buckets=buckets,
      averaged=averaged, excluded=excluded,
      averages=_averages(averaged, buckets, bleu, delta,
                         {l: base_bleu.get(l) for l in languages}),
      notes=tuple(notes), metric=metric)
