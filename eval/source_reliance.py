"""Source reliance per language: models and bilingual baselines.

The trainer logs, at every dev evaluation, ``source_reliance``: per
language, the dev cross-entropy with each pair's source replaced by another
pair's source minus the true dev cross-entropy, in nats per target token
(``StepRunner.evaluate_with_source_reliance``). A model that translates
loses several nats per token without its source; one that ignores its input
and only models the target language shows ~0, long before BLEU says so.

:func:`compare_source_reliance` reads it from the last dev evaluation of
each model's training log and, per language, of the bilingual baseline
covering it (:func:`m4moe.eval.training_logs.final_source_reliance`). Runs
without a log, or whose log predates the measurement, are listed with the
reason in ``without``; their cells are None.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Mapping, Sequence

from m4moe.eval import comparison as comparison_lib
from m4moe.eval import dev_ce as dev_ce_lib
from m4moe.eval import results
from m4moe.eval import training_logs
from m4moe.training import metrics_log

NO_KEY = ("its last dev evaluation has no source_reliance (a log from "
          "before the trainer measured it)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SourceRelianceComparison:
  """Source reliance (nats/token) per language of models and baselines.

  Attributes:
    languages: the report's languages, high -> low resource.
    models: model names, input order.
    values: model -> language -> gap (None if unavailable).
    baseline: language -> its baseline's gap (None if unavailable).
    steps: model or baseline name -> step of the dev evaluation read.
    without: model or baseline name -> why it has no values.
  """

  languages: tuple[str, ...]
  models: tuple[str, ...]
  values: Mapping[str, Mapping[str, float | None]]
  baseline: Mapping[str, float | None]
  steps: Mapping[str, int | None]
  without: Mapping[str, str]

  @property
  def any_log(self) -> bool:
    """True when any model or baseline had a log with a dev evaluation."""
    return bool(self.steps) or any(NO_KEY in why
                                   for why in self.without.values())

  @property
  def available(self) -> bool:
    """True when any model or baseline has a value."""
    return any(v is not None for m in self.values.values()
               for v in m.values()) or any(
                   v is not None for v in self.baseline.values())

  def to_dict(self) -> dict[str, Any]:
    return {"unit": "nats per target token",
            "models": {m: dict(self.values[m]) for m in self.models},
            comparison_lib.BASELINE_NAME: dict(self.baseline),
            "steps": dict(self.steps), "without": dict(self.without)}


def _read(path: pathlib.Path | None
          ) -> tuple[training_logs.SourceReliance | None, str | None]:
  if path is None:
    return None, ("no training log (--training_logs or "
                  "metadata.model_dir/metrics.jsonl)")
  reliance = training_logs.final_source_reliance(
      metrics_log.read_metrics(path))
  if reliance.step is None:
    return None, f"{path} has no dev evaluation"
  if not reliance.logged:
    return None, f"{path}: {NO_KEY}"
  return reliance, None


def compare_source_reliance(
    languages: Sequence[str], *, models: Sequence[str],
    model_logs: Mapping[str, pathlib.Path],
    baselines: Sequence[results.EvalResult],
    baseline_logs: Mapping[str, pathlib.Path]) -> SourceRelianceComparison:
  """Source reliance of each model and each language's baseline.

  Args:
    languages: languages to report, in order.
    models: model names; ``model_logs`` maps those with a training log.
    baselines: the bilingual baselines (one per language).
    baseline_logs: baseline name -> its training log.

  Raises:
    ValueError: two baselines cover one language.
  """
  values: dict[str, dict[str, float | None]] = {}
  steps: dict[str, int | None] = {}
  without: dict[str, str] = {}
  for model in models:
    reliance, why = _read(model_logs.get(model))
    if reliance is None:
      without[model] = why
      values[model] = {l: None for l in languages}
      continue
    steps[model] = reliance.step
    values[model] = {l: reliance.values.get(l) for l in languages}
  owners = dev_ce_lib.baseline_owners(baselines)
  read: dict[str, training_logs.SourceReliance | None] = {}
  baseline: dict[str, float | None] = {}
  for lang in languages:
    owner = owners.get(lang)
    if owner is None:
      baseline[lang] = None
      continue
    if owner not in read:
      read[owner], why = _read(baseline_logs.get(owner))
      if read[owner] is None:
        without[owner] = why
      else:
        steps[owner] = read[owner].step
    baseline[lang] = (None if read[owner] is None
                      else read[owner].values.get(lang))
  return SourceRelianceComparison(
      languages=tuple(languages), models=tuple(models), values=values,
      baseline=baseline, steps=steps, without=without)
