"""Several training seeds of one model: grouping, seed means and spread.

``m4moe-report --models`` may name several eval JSONs with the same model
name: runs of one model trained with different seeds. :func:`group_models`
groups them (input order kept) and merges each group into one
:class:`~m4moe.eval.results.EvalResult` whose BLEU and chrF++ per language
are the means over the seeds, so the comparison, figure and tables use
seed means. A run's seed is ``metadata.seed`` of its eval JSON (m4moe-eval
records it, so a landed JSON keeps it away from its run directory), else
``train.seed`` of ``<metadata.model_dir>/config.json`` (written by
m4moe-train), else unknown; two runs of one model with the same known seed
are an error (the same run given twice). Everything else about the merged
result (metadata, model dir, training log) is the first run's.

:func:`spread` summarises per-seed values: mean, min-max, sample standard
deviation and the 95% Student-t interval of the mean
(mean ± t(0.975, n-1) · std / √n); the last two need n ≥ 2.

:func:`welch_difference` compares two models' seeds: the difference of
their seed means with Welch's t-interval and two-sided t-test (unequal
variances, Welch-Satterthwaite degrees of freedom). Runs of two models are
independent trainings, not pairs, so the test is unpaired. Unlike the
bootstrap over test sentences (:mod:`.significance`), which holds each
model's seed mean fixed, it counts the training variance between seeds.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import statistics
from typing import Any, Sequence

from scipy import stats as scipy_stats

from m4moe import jsonfile
from m4moe.eval import results
from m4moe.eval import scoring


@dataclasses.dataclass(frozen=True)
class Spread:
  """Per-seed values of one quantity and their summary.

  Attributes:
    values: one value per seed, in input order.
    mean, min, max: over the seeds.
    std: sample standard deviation (None for one seed).
    t_low, t_high: 95% Student-t interval of the mean (None for one seed).
  """

  values: tuple[float, ...]
  mean: float
  min: float
  max: float
  std: float | None
  t_low: float | None
  t_high: float | None

  def to_dict(self) -> dict[str, Any]:
    return {"num_seeds": len(self.values), **dataclasses.asdict(self),
            "values": list(self.values)}


def spread(values: Sequence[float]) -> Spread:
  """Mean, range, std and t-interval of per-seed values.

  Raises:
    ValueError: no values.
  """
  if not values:
    raise ValueError("no per-seed values")
  values = tuple(float(v) for v in values)
  mean = statistics.fmean(values)
  std = t_low = t_high = None
  if len(values) >= 2:
    std = statistics.stdev(values)
    half = (float(scipy_stats.t.ppf(0.975, len(values) - 1)) * std
            / math.sqrt(len(values)))
    t_low, t_high = mean - half, mean + half
  return Spread(values=values, mean=mean, min=min(values), max=max(values),
                std=std, t_low=t_low, t_high=t_high)


@dataclasses.dataclass(frozen=True)
class SeedDifference:
  """Difference of two models' seed means, with Welch's t-test.

  Attributes:
    mean: mean over A's seeds minus mean over B's seeds.
    t_low, t_high: its (1 − alpha) Welch t-interval.
    df: Welch-Satterthwaite degrees of freedom (None if both spreads are
      zero: the interval is then the point itself).
    p_value: two-sided Welch t-test of equal means.
    significant: ``p_value < alpha``.
  """

  mean: float
  t_low: float
  t_high: float
  df: float | None
  p_value: float
  significant: bool

  def to_dict(self) -> dict[str, Any]:
    return {"method": "Welch t-test over seeds (unpaired)",
            **dataclasses.asdict(self)}


def welch_difference(a: Spread, b: Spread, *, alpha: float = 0.05
                     ) -> SeedDifference:
  """A − B over seeds: Welch's t-interval and two-sided t-test.

  Raises:
    ValueError: either side has fewer than two seeds, or alpha is not in
      (0, 1).
  """
  if len(a.values) < 2 or len(b.values) < 2:
    raise ValueError(f"Welch's test needs >= 2 seeds per model; got "
                     f"{len(a.values)} and {len(b.values)}")
  if not 0 < alpha < 1:
    raise ValueError(f"alpha={alpha}: use a level in (0, 1), e.g. 0.05")
  diff = a.mean - b.mean
  va = statistics.variance(a.values) / len(a.values)
  vb = statistics.variance(b.values) / len(b.values)
  se = math.sqrt(va + vb)
  if se == 0.0:
    p = 1.0 if diff == 0.0 else 0.0
    return SeedDifference(mean=diff, t_low=diff, t_high=diff, df=None,
                          p_value=p, significant=p < alpha)
  df = (va + vb) ** 2 / (va ** 2 / (len(a.values) - 1)
                         + vb ** 2 / (len(b.values) - 1))
  half = float(scipy_stats.t.ppf(1 - alpha / 2, df)) * se
  p = float(2 * scipy_stats.t.sf(abs(diff) / se, df))
  return SeedDifference(mean=diff, t_low=diff - half, t_high=diff + half,
                        df=df, p_value=p, significant=p < alpha)


def seed_of(result: results.EvalResult) -> int | None:
  """``metadata.seed``, else ``train.seed`` of the model dir's config.json."""
  seed = result.metadata.get("seed")
  if isinstance(seed, int) and not isinstance(seed, bool):
    return seed
  model_dir = result.metadata.get("model_dir")
  if not model_dir:
    return None
  path = pathlib.Path(model_dir) / "config.json"
  try:
    config = jsonfile.load(path, what="the run's config.json", fix="")
  except jsonfile.JSONFileError:
    return None  # no seed recorded: the run is still reported
  return config_seed(config)


def config_seed(run_config: Any) -> int | None:
  """``train.seed`` of a run's ``config.json`` contents (None: not there)."""
  train = run_config.get("train") if isinstance(run_config, dict) else None
  seed = train.get("seed") if isinstance(train, dict) else None
  return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelGroup:
  """The runs (seeds) of one model.

  Attributes:
    name: the model name.
    runs: its eval results, in input order.
    seeds: each run's seed (None if unknown).
    paths: each run's eval JSON (None if not read from a file).
    merged: one result with the seed-mean scores (``runs[0]`` if one run).
  """

  name: str
  runs: tuple[results.EvalResult, ...]
  seeds: tuple[int | None, ...]
  paths: tuple[pathlib.Path | None, ...]
  merged: results.EvalResult

  @property
  def num_seeds(self) -> int:
    return len(self.runs)

  def run_label(self, index: int) -> str:
    """``name`` for one run, else ``name (seed S)`` / ``name (run i)``."""
    if self.num_seeds == 1:
      return self.name
    seed = self.seeds[index]
    return (f"{self.name} (seed {seed})" if seed is not None
            else f"{self.name} (run {index + 1})")


def _merge_language(lang: str, scores: Sequence[scoring.LanguageScore | None]
                    ) -> scoring.LanguageScore | None:
  present = [s for s in scores if s is not None]
  if len(present) != len(scores):
    return None  # not evaluated by every seed: not in the seed mean
  ok = [s for s in present if s.status == scoring.STATUS_OK]
  first = present[0]
  if len(ok) != len(present):
    return dataclasses.replace(first, status=scoring.STATUS_EMPTY, bleu=None,
                               chrf=None)
  return dataclasses.replace(
      first, bleu=statistics.fmean(s.bleu for s in ok),
      chrf=statistics.fmean(s.chrf for s in ok))


def _merge(runs: Sequence[results.EvalResult],
           seeds: Sequence[int | None]) -> results.EvalResult:
  if len(runs) == 1:
    return runs[0]
  langs = sorted({l for r in runs for l in r.languages})
  merged = {}
  for lang in langs:
    score = _merge_language(lang, [r.languages.get(lang) for r in runs])
    if score is not None:
      merged[lang] = score
  return dataclasses.replace(
      runs[0], languages=merged,
      metadata={**runs[0].metadata, "seeds": list(seeds),
                "num_seeds": len(runs)})


def group_models(models: Sequence[results.EvalResult],
                 paths: Sequence[pathlib.Path | None] = ()
                 ) -> list[ModelGroup]:
  """Groups eval results by model name (first appearance order).

  A language missing from one seed's eval JSON is left out of the merged
  result (and so listed by the comparison as not evaluated); one empty
  test split in any seed makes the merged language empty.

  Args:
    models: eval results; several per name = several seeds.
    paths: the eval JSON of each result, parallel to ``models`` (optional).

  Raises:
    ValueError: ``paths`` has the wrong length, or two runs of one model
      have the same known seed.
  """
  if paths and len(paths) != len(models):
    raise ValueError(f"{len(paths)} eval JSON paths for {len(models)} "
                     "models")
  paths = list(paths) or [None] * len(models)
  order: list[str] = []
  members: dict[str, list[int]] = {}
  for i, result in enumerate(models):
    if result.model not in members:
      order.append(result.model)
      members[result.model] = []
    members[result.model].append(i)
  groups = []
  for name in order:
    idx = members[name]
    runs = tuple(models[i] for i in idx)
    seeds = tuple(seed_of(r) for r in runs)
    known = [s for s in seeds if s is not None]
    if len(set(known)) != len(known):
      files = ", ".join(str(paths[i] or name) for i in idx)
      raise ValueError(f"--models: model {name} has two eval JSONs with the "
                       f"same seed ({files}); give each seed once")
    groups.append(ModelGroup(name=name, runs=runs, seeds=seeds,
                             paths=tuple(paths[i] for i in idx),
                             merged=_merge(runs, seeds)))
  return groups
