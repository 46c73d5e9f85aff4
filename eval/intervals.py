"""The report's 95% intervals and significance marks.

From each run's decoded test sentences (:mod:`m4moe.eval.examples`) and
sacrebleu's bootstrap (:mod:`m4moe.eval.significance`), per language and
metric (BLEU and chrF++):

* every model's and the baseline's score with its bootstrap interval; a
  model with several seeds (:mod:`m4moe.eval.seeds`) is scored by the mean
  over its seeds, resampled index by index (all seeds of a language share
  the resampling indices), with the spread over seeds beside it, computed
  from the eval JSONs' scores;
* Δ = model − bilingual baseline with its paired interval and sacrebleu's
  paired-bootstrap p-value (significant at p < alpha), and the same for the
  given model pairs (MoE − dense); for pairs of models with several seeds
  each, also the difference of their seed means with Welch's t-interval
  and test over seeds (:func:`seeds.welch_difference`), which counts the
  training variance the bootstrap leaves out;
* per resource bucket (the comparison's averaged languages): the mean over
  the bucket's languages with a bootstrap interval from the same resamples
  (languages resampled independently, each with its own seed), the mean Δ
  with its interval and p-value, and the seed spread of the bucket mean.

Systems compared must have decoded the same test sentences (same number and
same sources); otherwise the pair has no Δ interval and the reason is in
``problems``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from m4moe.eval import comparison as comparison_lib
from m4moe.eval import examples as examples_lib
from m4moe.eval import results
from m4moe.eval import scoring
from m4moe.eval import seeds as seeds_lib
from m4moe.eval import significance

BASELINE = comparison_lib.BASELINE_NAME
METRICS = significance.METRICS


@dataclasses.dataclass(frozen=True)
class Cell:
  """One system on one language (or bucket) and metric.

  Attributes:
    interval: the score (seed mean) with its bootstrap interval (None if
      the system has no usable outputs there).
    seeds: spread of the score over seeds (None for a single run).
    delta: Δ vs the bilingual baseline, paired (None if unavailable).
    delta_seeds: spread over seeds of Δ (each seed minus the baseline).
  """

  interval: significance.Interval | None = None
  seeds: seeds_lib.Spread | None = None
  delta: significance.Difference | None = None
  delta_seeds: seeds_lib.Spread | None = None

  def to_dict(self) -> dict[str, Any]:
    return {
        "interval": self.interval and self.interval.to_dict(),
        "seeds": self.seeds and self.seeds.to_dict(),
        "delta": self.delta and self.delta.to_dict(),
        "delta_seeds": self.delta_seeds and self.delta_seeds.to_dict()}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Intervals:
  """Everything the report's interval tables show.

  Attributes:
    n_samples, seed, alpha: bootstrap resamples, base seed (each language
      uses ``significance.language_seed(seed, lang)``), significance level.
    systems: model names then ``BASELINE``.
    num_seeds: model -> runs (seeds) given.
    languages: language -> metric -> system -> Cell.
    pairs: (system, reference) model pairs compared, e.g. (moe, dense).
    pair_deltas: language -> metric -> "system − reference" -> Difference
      (None if unavailable).
    buckets: system -> bucket -> metric -> Cell over the bucket's averaged
      languages (interval None if any of them lacks outputs).
    bucket_pairs: bucket -> metric -> "system − reference" -> Difference.
    bucket_languages: bucket -> the languages averaged.
    problems: why intervals are missing where they are.
    pair_seed_deltas: language -> metric -> "system − reference" -> the
      Welch comparison of their seeds (None unless both have >= 2 seeds).
    bucket_pair_seeds: bucket -> metric -> "system − reference" -> the
      same for the bucket means.
  """

  n_samples: int
  seed: int
  alpha: float
  systems: tuple[str, ...]
  num_seeds: Mapping[str, int]
  languages: Mapping[str, Mapping[str, Mapping[str, Cell]]]
  pairs: tuple[tuple[str, str], ...]
  pair_deltas: Mapping[str, Mapping[str, Mapping[str,
                                                significance.Difference
                                                | None]]]
  buckets: Mapping[str, Mapping[str, Mapping[str, Cell]]]
  bucket_pairs: Mapping[str, Mapping[str, Mapping[str,
                                                  significance.Difference
                                                  | None]]]
  bucket_languages: Mapping[str, tuple[str, ...]]
  problems: tuple[str, ...]
  pair_seed_deltas: Mapping[str, Mapping[str, Mapping[
      str, seeds_lib.SeedDifference | None]]] = dataclasses.field(
          default_factory=dict)
  bucket_pair_seeds: Mapping[str, Mapping[str, Mapping[
      str, seeds_lib.SeedDifference | None]]] = dataclasses.field(
          default_factory=dict)

  @property
  def available(self) -> bool:
    return any(c.interval is not None for m in self.languages.values()
               for s in m.values() for c in s.values())

  def to_dict(self) -> dict[str, Any]:
    def diffs(d):
      return {k: v and v.to_dict() for k, v in d.items()}
    return {
        "method": ("sacrebleu paired bootstrap resampling of test sentences: "
                   "interval = bootstrap mean ± half the 2.5-97.5 percentile"
                   " range; p = sacrebleu's paired bootstrap test; seeds: "
                   "mean, min-max, std, 95% t-interval; model pairs over "
                   "seeds: Welch t-interval and t-test"),
        "n_samples": self.n_samples, "seed": self.seed, "alpha": self.alpha,
        "num_seeds": dict(self.num_seeds),
        "languages": {l: {m: {s: c.to_dict() for s, c in by_sys.items()}
                          for m, by_sys in by_metric.items()}
                      for l, by_metric in self.languages.items()},
        "pairs": [f"{a} − {b}" for a, b in self.pairs],
        "pair_deltas": {l: {m: diffs(d) for m, d in by_metric.items()}
                        for l, by_metric in self.pair_deltas.items()},
        "buckets": {s: {b: {m: c.to_dict() for m, c in by_metric.items()}
                        for b, by_metric in by_bucket.items()}
                    for s, by_bucket in self.buckets.items()},
        "bucket_pairs": {b: {m: diffs(d) for m, d in by_metric.items()}
                         for b, by_metric in self.bucket_pairs.items()},
        "bucket_languages": {b: list(v)
                             for b, v in self.bucket_languages.items()},
        "pair_seed_deltas": {l: {m: diffs(d) for m, d in by_metric.items()}
                             for l, by_metric in self.pair_seed_deltas.items()},
        "bucket_pair_seeds": {b: {m: diffs(d) for m, d in by_metric.items()}
                              for b, by_metric in
                              self.bucket_pair_seeds.items()},
        "problems": list(self.problems)}


def pair_name(system: str, reference: str) -> str:
  return f"{system} − {reference}"


def _ok(score: scoring.LanguageScore | None, metric: str) -> float | None:
  if score is None or score.status != scoring.STATUS_OK:
    return None
  return getattr(score, metric)


def _spread(values: Sequence[float | None]) -> seeds_lib.Spread | None:
  if len(values) < 2 or any(v is None for v in values):
    return None
  return seeds_lib.spread(values)


def _seed_difference(a: Cell | None, b: Cell | None, alpha: float
                     ) -> seeds_lib.SeedDifference | None:
  if a is None or b is None or a.seeds is None or b.seeds is None:
    return None
  return seeds_lib.welch_difference(a.seeds, b.seeds, alpha=alpha)


def _same_sentences(a: Sequence[examples_lib.LanguageOutputs],
                    b: Sequence[examples_lib.LanguageOutputs]) -> bool:
  first = a[0] if a else None
  return all(o.sources == first.sources and o.references == first.references
             for o in [*a, *b])


@dataclasses.dataclass
class _Lang:
  """Resamples of one language: system -> metric -> Resamples."""

  resamples: dict[str, dict[str, significance.Resamples]]
  outputs: dict[str, list[examples_lib.LanguageOutputs]]


def _resample_language(lang: str, *, groups: Sequence[seeds_lib.ModelGroup],
                       group_outputs: Mapping[str, Sequence[
                           examples_lib.RunOutputs]],
                       baseline_outputs: examples_lib.RunOutputs | None,
                       n_samples: int, seed: int,
                       problems: list[str]) -> _Lang:
  systems: dict[str, list[examples_lib.LanguageOutputs]] = {}
  for group in groups:
    runs = group_outputs[group.name]
    outs = [r.languages.get(lang) for r in runs]
    if all(o is None for o in outs):
      continue  # listed with the reasons by the run's RunOutputs
    if any(o is None for o in outs):
      missing = [r.label for r, o in zip(runs, outs) if o is None]
      problems.append(f"{lang}: {group.name} has no usable outputs from "
                      f"{', '.join(missing)}: no interval")
      continue
    if not _same_sentences(outs, []):
      problems.append(f"{lang}: {group.name}'s seeds decoded different test "
                      "sentences: no interval")
      continue
    systems[group.name] = outs
  if baseline_outputs is not None and lang in baseline_outputs.languages:
    systems[BASELINE] = [baseline_outputs.languages[lang]]
  lang_seed = significance.language_seed(seed, lang)
  resamples: dict[str, dict[str, significance.Resamples]] = {}
  for name, outs in systems.items():
    resamples[name] = {}
    for metric in METRICS:
      per_run = [significance.resample(
          o.hypotheses, o.references, metric=metric,
          target_lang=o.target_lang, n_samples=n_samples, seed=lang_seed)
                 for o in outs]
      resamples[name][metric] = significance.mean_resamples(per_run)
  return _Lang(resamples=resamples, outputs=systems)


def _paired(lang_data: _Lang, system: str, reference: str, metric: str,
            alpha: float) -> significance.Difference | None:
  if (system not in lang_data.resamples
      or reference not in lang_data.resamples):
    return None
  if not _same_sentences(lang_data.outputs[system],
                         lang_data.outputs[reference]):
    return None
  return significance.paired_difference(
      lang_data.resamples[system][metric],
      lang_data.resamples[reference][metric], alpha=alpha)


def compute_intervals(comp: comparison_lib.Comparison, *,
                      groups: Sequence[seeds_lib.ModelGroup],
                      group_outputs: Mapping[str, Sequence[
                          examples_lib.RunOutputs]],
                      baseline_outputs: Mapping[str, examples_lib.RunOutputs],
                      baselines: Sequence[results.EvalResult] = (),
                      pairs: Sequence[tuple[str, str]] = (),
                      n_samples: int = significance.DEFAULT_SAMPLES,
                      seed: int = significance.DEFAULT_SEED,
                      alpha: float = significance.ALPHA) -> Intervals:
  """Bootstrap intervals, paired tests and seed spreads for the report.

  Args:
    comp: the comparison (languages, buckets, averaged set) of the groups'
      merged results against the baselines.
    groups: the models, each with its seeds.
    group_outputs: model -> one :class:`RunOutputs` per run, in run order.
    baseline_outputs: language -> the outputs of the baseline covering it.
    baselines: the baselines' eval results (their scores give the seed
      spread of Δ; the first result covering a language is used).
    pairs: (system, reference) model pairs to compare, e.g. (moe, dense).
    n_samples, seed, alpha: bootstrap resamples, base seed, level.
  """
  problems: list[str] = []
  names = [g.name for g in groups]
  baseline_scores = _first_baseline_scores(baselines)
  data: dict[str, _Lang] = {}
  languages: dict[str, dict[str, dict[str, Cell]]] = {}
  pair_deltas: dict[str, dict[str, dict[str, Any]]] = {}
  for lang in comp.languages:
    lang_data = data[lang] = _resample_language(
        lang, groups=groups, group_outputs=group_outputs,
        baseline_outputs=baseline_outputs.get(lang), n_samples=n_samples,
        seed=seed, problems=problems)
    languages[lang] = {metric: _language_cells(
        lang_data, lang=lang, metric=metric, groups=groups,
        baseline_score=baseline_scores.get(lang), alpha=alpha)
                       for metric in METRICS}
    pair_deltas[lang] = {metric: {
        pair_name(a, b): _paired(lang_data, a, b, metric, alpha)
        for a, b in pairs} for metric in METRICS}
    problems += _unpaired_problems(lang, lang_data, names)
  problems += _missing_hypotheses(comp, groups=groups, data=data,
                                  baseline_scores=baseline_scores)
  buckets, bucket_pairs, bucket_langs = _buckets(
      comp, groups=groups, data=data, pairs=pairs, alpha=alpha,
      baseline_scores=baseline_scores, problems=problems)
  pair_seed_deltas, bucket_pair_seeds = _seed_pair_differences(
      languages, buckets, bucket_langs=bucket_langs, pairs=pairs, alpha=alpha)
  return Intervals(
      n_samples=n_samples, seed=seed, alpha=alpha,
      pair_seed_deltas=pair_seed_deltas, bucket_pair_seeds=bucket_pair_seeds,
      systems=(*names, BASELINE),
      num_seeds={g.name: g.num_seeds for g in groups}, languages=languages,
      pairs=tuple(pairs), pair_deltas=pair_deltas, buckets=buckets,
      bucket_pairs=bucket_pairs, bucket_languages=bucket_langs,
      problems=tuple(problems))


def _first_baseline_scores(baselines: Sequence[results.EvalResult]
                           ) -> dict[str, scoring.LanguageScore]:
  """language -> the score of the first baseline covering it.

  The report pairs each language with one baseline; when two cover a
  language the first one given wins, as in the comparison.
  """
  scores: dict[str, scoring.LanguageScore] = {}
  for result in baselines:
    for lang, score in result.languages.items():
      scores.setdefault(lang, score)
  return scores


def _language_cells(lang_data: _Lang, *, lang: str, metric: str,
                    groups: Sequence[seeds_lib.ModelGroup],
                    baseline_score: scoring.LanguageScore | None,
                    alpha: float) -> dict[str, Cell]:
  """system -> the cell of one language and metric.

  A model's cell has its bootstrap interval, its seed spread, the paired Δ
  against the baseline and the seed spread of that Δ (each seed's score
  minus the baseline's, so seed noise and test-set noise are told apart).
  """
  cells: dict[str, Cell] = {}
  base_rs = lang_data.resamples.get(BASELINE, {}).get(metric)
  base_value = _ok(baseline_score, metric)
  for group in groups:
    rs = lang_data.resamples.get(group.name, {}).get(metric)
    run_scores = [_ok(r.languages.get(lang), metric) for r in group.runs]
    cells[group.name] = Cell(
        interval=rs and significance.interval(rs),
        seeds=_spread(run_scores),
        delta=_paired(lang_data, group.name, BASELINE, metric, alpha),
        delta_seeds=(None if base_value is None else _spread(
            [None if v is None else v - base_value for v in run_scores])))
  cells[BASELINE] = Cell(interval=base_rs and significance.interval(base_rs))
  return cells


def _unpaired_problems(lang: str, lang_data: _Lang,
                       names: Sequence[str]) -> list[str]:
  """Models that decoded other test sentences than the baseline: their Δ
  cannot be paired sentence by sentence, and the report says why it is
  missing."""
  if not (BASELINE in lang_data.resamples
          and lang_data.resamples.keys() - {BASELINE}):
    return []
  return [f"{lang}: {name} and its baseline decoded different test "
          "sentences: no paired Δ"
          for name in names
          if name in lang_data.resamples and not _same_sentences(
              lang_data.outputs[name], lang_data.outputs[BASELINE])]


def _missing_hypotheses(comp: comparison_lib.Comparison, *,
                        groups: Sequence[seeds_lib.ModelGroup],
                        data: Mapping[str, _Lang],
                        baseline_scores: Mapping[str, scoring.LanguageScore]
                        ) -> list[str]:
  """Systems scored on a language whose hypotheses could not be resampled,
  so a missing interval is explained rather than silently blank."""
  problems = []
  for group in groups:
    lacking = [l for l in comp.languages
               if _ok(group.merged.languages.get(l), "bleu") is not None
               and group.name not in data[l].resamples]
    if lacking:
      problems.append(f"{group.name}: no usable hypotheses on "
                      f"{', '.join(lacking)} (see Examples)")
  lacking = [l for l in comp.languages
             if _ok(baseline_scores.get(l), "bleu") is not None
             and BASELINE not in data[l].resamples]
  if lacking:
    problems.append(f"{BASELINE}: no usable hypotheses on "
                    f"{', '.join(lacking)} (see Examples)")
  return problems


def _seed_pair_differences(languages, buckets, *, bucket_langs,
                           pairs: Sequence[tuple[str, str]], alpha: float):
  """(per language, per bucket) seed-level differences of each model pair.

  They complement the bootstrap's paired Δ: with several seeds, a pair's
  difference must also exceed the spread between seeds.
  """
  pair_seed_deltas = {
      lang: {metric: {pair_name(a, b): _seed_difference(
          cells.get(a), cells.get(b), alpha) for a, b in pairs}
             for metric, cells in by_metric.items()}
      for lang, by_metric in languages.items()}
  bucket_pair_seeds = {
      bucket: {metric: {pair_name(a, b): _seed_difference(
          buckets[a][bucket][metric], buckets[b][bucket][metric], alpha)
                        for a, b in pairs} for metric in METRICS}
      for bucket in bucket_langs}
  return pair_seed_deltas, bucket_pair_seeds


def _bucket_resamples(data: Mapping[str, _Lang], langs: Sequence[str],
                      system: str, metric: str
                      ) -> significance.Resamples | None:
  items = [data[l].resamples.get(system, {}).get(metric) for l in langs]
  if not items or any(i is None for i in items):
    return None
  return significance.mean_resamples(items)


def _bucket_seed_spread(group: seeds_lib.ModelGroup, langs: Sequence[str],
                        metric: str, minus: Mapping[str, float | None] | None
                        ) -> seeds_lib.Spread | None:
  if group.num_seeds < 2 or not langs:
    return None
  per_seed = []
  for run in group.runs:
    values = []
    for lang in langs:
      value = _ok(run.languages.get(lang), metric)
      offset = 0.0 if minus is None else minus.get(lang)
      if value is None or offset is None:
        return None
      values.append(value - offset)
    per_seed.append(sum(values) / len(values))
  return seeds_lib.spread(per_seed)


def _buckets(comp: comparison_lib.Comparison, *,
             groups: Sequence[seeds_lib.ModelGroup],
             data: Mapping[str, _Lang], pairs: Sequence[tuple[str, str]],
             alpha: float,
             baseline_scores: Mapping[str, scoring.LanguageScore],
             problems: list[str]):
  buckets: dict[str, dict[str, dict[str, Cell]]] = {}
  bucket_pairs: dict[str, dict[str, dict[str, Any]]] = {}
  bucket_langs = {}
  for bucket in comparison_lib.BUCKETS:
    bucket_langs[bucket] = tuple(l for l in comp.averaged if bucket == "all"
                                 or comp.buckets[l] == bucket)
  for system in [*(g.name for g in groups), BASELINE]:
    buckets[system] = {}
    group = next((g for g in groups if g.name == system), None)
    for bucket, langs in bucket_langs.items():
      buckets[system][bucket] = {}
      for metric in METRICS:
        rs = _bucket_resamples(data, langs, system, metric)
        base = _bucket_resamples(data, langs, BASELINE, metric)
        delta = None
        if (rs is not None and base is not None and system != BASELINE
            and all(_same_sentences(data[l].outputs[system],
                                    data[l].outputs[BASELINE])
                    for l in langs)):
          delta = significance.paired_difference(rs, base, alpha=alpha)
        seeds = delta_seeds = None
        if group is not None:
          seeds = _bucket_seed_spread(group, langs, metric, None)
          delta_seeds = _bucket_seed_spread(
              group, langs, metric,
              {l: _ok(baseline_scores.get(l), metric) for l in langs})
        buckets[system][bucket][metric] = Cell(
            interval=rs and significance.interval(rs), seeds=seeds,
            delta=delta, delta_seeds=delta_seeds)
  for bucket, langs in bucket_langs.items():
    bucket_pairs[bucket] = {}
    for metric in METRICS:
      bucket_pairs[bucket][metric] = {}
      for a, b in pairs:
        ra = _bucket_resamples(data, langs, a, metric)
        rb = _bucket_resamples(data, langs, b, metric)
        ok = ra is not None and rb is not None and all(
            _same_sentences(data[l].outputs[a], data[l].outputs[b])
            for l in langs)
        bucket_pairs[bucket][metric][pair_name(a, b)] = (
            significance.paired_difference(ra, rb, alpha=alpha) if ok
            else None)
  needed = [g.name for g in groups] + ([BASELINE] if baseline_scores
                                       else [])
  for system in needed:
    missing = [l for l in bucket_langs["all"]
               if system not in data[l].resamples]
    if missing:
      problems.append(f"{system}: no bucket intervals (no usable outputs on "
                      f"averaged languages {', '.join(missing)})")
  return buckets, bucket_pairs, bucket_langs
