"""Each scored run's training log, seeds included.

A report's models may have several runs (seeds, :mod:`.seeds`); each run
has its own training log (``metrics.jsonl``). :func:`find_training_logs`
pairs every run with its log: the paths given for its model (one per run,
in the order the runs were given), else ``<metadata.model_dir>/
metrics.jsonl`` of the run's eval JSON when that file exists.
:func:`find_all_training_logs` does so for the models and the bilingual
baselines together, the given paths naming either.

What the report takes from the logs, and from which runs:

* dev cross-entropy (:func:`seed_mean_dev_ce`): the mean over a model's
  runs of each run's dev evaluation at its scored checkpoint's step (else
  its last), so that it is a seed mean like the BLEU tables;
* training cost and how each run stopped: a row per run;
* router statistics and source reliance (:func:`first_logs`): the first
  run's log, as for the decoded examples.
"""

from __future__ import annotations

import dataclasses
import pathlib
import statistics
from typing import Mapping, Sequence

from m4moe.eval import results
from m4moe.eval import seeds as seeds_lib
from m4moe.eval import training_logs
from m4moe.training import metrics_log


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunLog:
  """One scored run and its training log.

  Attributes:
    label: the run in tables: the model's name, or ``name (seed S)``
      when the model has several runs.
    run: the run's eval result.
    path: its metrics JSONL; None if none was given or found.
  """

  label: str
  run: results.EvalResult
  path: pathlib.Path | None


def _given_paths(value: str | Sequence[str]) -> tuple[str, ...]:
  return (value,) if isinstance(value, str) else tuple(value)


def _default_log(run: results.EvalResult) -> pathlib.Path | None:
  model_dir = run.metadata.get("model_dir")
  if not model_dir:
    return None
  candidate = pathlib.Path(model_dir) / metrics_log.METRICS_FILENAME
  return candidate if candidate.is_file() else None


def _group_logs(group: seeds_lib.ModelGroup,
                given: tuple[str, ...] | None) -> tuple[RunLog, ...]:
  if given is not None and len(given) != group.num_seeds:
    raise ValueError(
        f"--training_logs gives {len(given)} log(s) for model {group.name}, "
        f"which has {group.num_seeds} run(s): give {group.name}=PATH once "
        "per run, in the order its eval JSONs are given, or leave the "
        "model out to read each run's metadata.model_dir/metrics.jsonl")
  out = []
  for i, run in enumerate(group.runs):
    path = _default_log(run) if given is None else pathlib.Path(given[i])
    if given is not None and not path.is_file():
      raise FileNotFoundError(f"--training_logs: {path} for "
                              f"{group.run_label(i)} does not exist")
    out.append(RunLog(label=group.run_label(i), run=run, path=path))
  return tuple(out)


def find_training_logs(groups: Sequence[seeds_lib.ModelGroup],
                       given: Mapping[str, str | Sequence[str]]
                       ) -> dict[str, tuple[RunLog, ...]]:
  """model -> each of its runs with its training log, in the runs' order.

  Args:
    groups: the models, each with its runs (:func:`.seeds.group_models`).
    given: model -> its logs, one per run in the runs' order (a single
      path for a one-run model); models left out read each run's
      ``<metadata.model_dir>/metrics.jsonl`` if it exists.

  Raises:
    ValueError: ``given`` names a model not in ``groups``, or gives a
      model another number of logs than it has runs.
    FileNotFoundError: a given log does not exist.
  """
  unknown = set(given) - {g.name for g in groups}
  if unknown:
    raise ValueError(f"--training_logs names unknown models: "
                     f"{sorted(unknown)}")
  return {g.name: _group_logs(g, _given_paths(given[g.name])
                              if g.name in given else None)
          for g in groups}


def find_all_training_logs(groups: Sequence[seeds_lib.ModelGroup],
                           baseline_groups: Sequence[seeds_lib.ModelGroup],
                           given: Mapping[str, str | Sequence[str]]
                           ) -> tuple[dict[str, tuple[RunLog, ...]],
                                      dict[str, tuple[RunLog, ...]]]:
  """(the models' logs, the baselines' logs), ``given`` naming either.

  A landed baseline's eval JSON names the model directory it was trained
  in, which another machine does not have; naming the baseline (its model
  name, one log) lets a report read its dev CE from a landed copy of the
  log. A name that is both a model and a baseline is the model's.

  Raises:
    ValueError: ``given`` names neither a model nor a baseline, or a
      name several baselines share (each needs its own log), or gives a
      model another number of logs than it has runs.
    FileNotFoundError: a given log does not exist.
  """
  names = {g.name for g in groups}
  baseline_names = [g.name for g in baseline_groups]
  unknown = set(given) - names - set(baseline_names)
  if unknown:
    raise ValueError(f"--training_logs names unknown models: "
                     f"{sorted(unknown)}; name a model of --models or a "
                     "baseline of --baselines by its model name")
  shared = sorted(n for n in set(given) - names
                  if baseline_names.count(n) > 1)
  if shared:
    raise ValueError(f"--training_logs names {shared}, a model name that "
                     "several baselines share: give those baselines "
                     "distinct --model_name values, or leave them out to "
                     "read each one's metadata.model_dir/metrics.jsonl")
  return (find_training_logs(
              groups, {k: v for k, v in given.items() if k in names}),
          find_training_logs(
              baseline_groups,
              {k: v for k, v in given.items() if k not in names}))


def single_run_groups(runs: Sequence[results.EvalResult]
                      ) -> list[seeds_lib.ModelGroup]:
  """Each result as a one-run model (the bilingual baselines)."""
  return [seeds_lib.ModelGroup(name=r.model, runs=(r,), seeds=(None,),
                               paths=(None,), merged=r) for r in runs]


def first_logs(logs: Mapping[str, Sequence[RunLog]]
               ) -> dict[str, pathlib.Path]:
  """model -> its first run's log (models whose first run has one)."""
  return {model: runs[0].path for model, runs in logs.items()
          if runs and runs[0].path is not None}


def _run_dev_ce(run_log: RunLog) -> dict[str, float]:
  step = training_logs.checkpoint_step(run_log.run.metadata.get("checkpoint"))
  return training_logs.final_dev_ce(metrics_log.read_metrics(run_log.path),
                                    step=step)


def seed_mean_dev_ce(logs: Mapping[str, Sequence[RunLog]]
                     ) -> dict[str, dict[str, float] | None]:
  """model -> dev CE per language, the mean over its runs.

  Each run contributes its dev evaluation at the step of the checkpoint
  its eval JSON scored (else its last evaluation). None: a run of the
  model has no log; a language is kept only where every run has a dev
  CE for it ({} when none has any).
  """
  out: dict[str, dict[str, float] | None] = {}
  for model, runs in logs.items():
    if not runs or any(r.path is None for r in runs):
      out[model] = None
      continue
    per_run = [_run_dev_ce(r) for r in runs]
    common = set.intersection(*(set(ce) for ce in per_run))
    out[model] = {lang: statistics.fmean(ce[lang] for ce in per_run)
                  for lang in sorted(common)}
  return out
