"""Teacher-forced dev cross-entropy: multilingual models vs bilingual baselines.

The Figure-6 comparison on dev cross-entropy instead of BLEU: on small test
sets BLEU is noisy, while the dev cross-entropy logged during training
(``training_logs.final_dev_ce``: the dev evaluation of the scored
checkpoint's step, else the last one, of each run; nats per target token)
is steady. ΔCE of a model on a language is the bilingual
baseline's dev CE minus the model's, so positive = the multilingual model is
better (the sign convention of ΔBLEU).

Each language's baseline is the one bilingual eval result covering it (two
covering one language is an error); its dev CE comes from that baseline's
training log. Averages never hide gaps, as in :mod:`m4moe.eval.comparison`:
they are over the *averaged set*, the comparison's bucketed languages on
which the baseline and every model with dev CE have a value, with the
comparison's buckets. Every other language is in ``excluded`` with the
reasons, and every model without dev CE in ``models_without``.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from m4moe.eval import comparison as comparison_lib
from m4moe.eval import results

# A run's dev CE: language -> CE; None = no training log was found.
RunDevCe = Mapping[str, float] | None


@dataclasses.dataclass(frozen=True)
class DevCeAverage:
  """Mean dev CE and ΔCE of one model over one bucket of the averaged set.

  Attributes:
    ce: mean dev CE (None if the bucket is empty).
    delta: mean ΔCE (None for the baselines and empty buckets).
    count: languages in the bucket.
    wins: languages with ΔCE > 0 (None for the baselines).
  """

  ce: float | None
  delta: float | None
  count: int
  wins: int | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class DevCeComparison:
  """Dev CE of models and baselines per language, deltas and bucket means.

  Attributes:
    models: the models with dev CE in their training log, in input order.
    models_without: every other model -> why it has no dev CE.
    baseline: language -> the baseline's dev CE (None if unavailable), for
      every language of the comparison.
    baseline_models: language -> the baseline covering it.
    ce: model -> language -> dev CE (None if not in the model's log).
    delta: model -> language -> ΔCE = baseline - model (None if either is
      missing).
    averaged: the languages averages are over, high -> low resource.
    excluded: language -> reasons it is not in ``averaged``.
    averages: model (and "bilingual baselines") -> bucket -> average.
  """

  models: tuple[str, ...]
  models_without: Mapping[str, str]
  baseline: Mapping[str, float | None]
  baseline_models: Mapping[str, str]
  ce: Mapping[str, Mapping[str, float | None]]
  delta: Mapping[str, Mapping[str, float | None]]
  averaged: tuple[str, ...]
  excluded: Mapping[str, tuple[str, ...]]
  averages: Mapping[str, Mapping[str, DevCeAverage]]

  @property
  def available(self) -> bool:
    """True when at least one model and one baseline have dev CE."""
    return bool(self.models) and any(
        v is not None for v in self.baseline.values())


def baseline_owners(baselines: Sequence[results.EvalResult]
                    ) -> dict[str, str]:
  """language -> the name of the one baseline result covering it.

  Raises:
    ValueError: two baselines cover the same language.
  """
  owners: dict[str, str] = {}
  for result in baselines:
    for lang in result.languages:
      if lang in owners:
        raise ValueError(
            f"--baselines: {owners[lang]} and {result.model} both cover "
            f"{lang}; give one bilingual baseline per language")
      owners[lang] = result.model
  return owners


def _mean(values: Sequence[float]) -> float | None:
  return sum(values) / len(values) if values else None


def _baseline_ce(owners: Mapping[str, str],
                 baseline_runs: Mapping[str, RunDevCe],
                 languages: Sequence[str]) -> dict[str, float | None]:
  out = {}
  for lang in languages:
    run = baseline_runs.get(owners[lang]) if lang in owners else None
    out[lang] = None if run is None else run.get(lang)
  return out


def _models_without(model_runs: Mapping[str, RunDevCe]) -> dict[str, str]:
  out = {}
  for model, run in model_runs.items():
    if run is None:
      out[model] = ("no training log (--training_logs or "
                    "metadata.model_dir/metrics.jsonl)")
    elif not run:
      out[model] = "its training log has no eval record with dev_ce"
  return out


def _baseline_reason(lang: str, owners: Mapping[str, str],
                     baseline_runs: Mapping[str, RunDevCe]) -> str | None:
  if lang not in owners:
    return "no bilingual baseline"
  run = baseline_runs.get(owners[lang])
  if run is None:
    return (f"baseline {owners[lang]} has no training log "
            "(metadata.model_dir/metrics.jsonl)")
  if lang not in run:
    return f"baseline {owners[lang]}'s training log has no dev_ce for {lang}"
  return None


def _exclusions(lang: str, *, comp: comparison_lib.Comparison,
                owners: Mapping[str, str],
                baseline_runs: Mapping[str, RunDevCe],
                ce: Mapping[str, Mapping[str, float | None]]
                ) -> tuple[str, ...]:
  reasons = [_baseline_reason(lang, owners, baseline_runs)]
  reasons += [f"not in {model}'s last dev evaluation"
              for model, values in ce.items() if values[lang] is None]
  if comp.buckets[lang] is None:
    reasons.append("unknown training size (cannot be bucketed)")
  return tuple(r for r in reasons if r is not None)


def _averages(averaged: Sequence[str], buckets: Mapping[str, str | None],
              ce: Mapping[str, Mapping[str, float | None]],
              delta: Mapping[str, Mapping[str, float | None]],
              baseline: Mapping[str, float | None]
              ) -> dict[str, dict[str, DevCeAverage]]:
  out: dict[str, dict[str, DevCeAverage]] = {}
  for name in [*ce, comparison_lib.BASELINE_NAME]:
    out[name] = {}
    for bucket in comparison_lib.BUCKETS:
      langs = [l for l in averaged if bucket == "all" or buckets[l] == bucket]
      if name == comparison_lib.BASELINE_NAME:
        out[name][bucket] = DevCeAverage(
            ce=_mean([baseline[l] for l in langs]), delta=None,
            count=len(langs), wins=None)
        continue
      deltas = [delta[name][l] for l in langs]
      out[name][bucket] = DevCeAverage(
          ce=_mean([ce[name][l] for l in langs]), delta=_mean(deltas),
          count=len(langs), wins=sum(d > 0 for d in deltas))
  return out


def compare_dev_ce(comp: comparison_lib.Comparison, *,
                   model_runs: Mapping[str, RunDevCe],
                   baselines: Sequence[results.EvalResult],
                   baseline_runs: Mapping[str, RunDevCe]) -> DevCeComparison:
  """Compares the models' dev CE with the baselines' on comp's languages.

  Args:
    comp: the BLEU comparison (languages, their order and buckets, models).
    model_runs: model -> its last dev CE per language ({} if its log has no
      dev CE, None or absent if it has no log).
    baselines: the bilingual baselines' eval results.
    baseline_runs: baseline name -> its last dev CE per language, like
      ``model_runs``.

  Raises:
    ValueError: two baselines cover the same language.
  """
  owners = baseline_owners(baselines)
  runs = {m: model_runs.get(m) for m in comp.models}
  without = _models_without(runs)
  models = tuple(m for m in comp.models if m not in without)
  baseline = _baseline_ce(owners, baseline_runs, comp.languages)
  ce = {m: {l: runs[m].get(l) for l in comp.languages} for m in models}
  delta = {m: {l: (baseline[l] - ce[m][l] if baseline[l] is not None
                   and ce[m][l] is not None else None)
               for l in comp.languages} for m in models}
  excluded = {}
  for lang in comp.languages:
    reasons = _exclusions(lang, comp=comp, owners=owners,
                          baseline_runs=baseline_runs, ce=ce)
    if reasons:
      excluded[lang] = reasons
  averaged = tuple(l for l in comp.languages if l not in excluded)
  return DevCeComparison(
      models=models, models_without=without, baseline=baseline,
      baseline_models={l: owners[l] for l in comp.languages if l in owners},
      ce=ce, delta=delta, averaged=averaged, excluded=excluded,
      averages=_averages(averaged, comp.buckets, ce, delta, baseline))
