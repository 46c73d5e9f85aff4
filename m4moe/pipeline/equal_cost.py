"""Candidates compared at equal measured cost, not equal logged CPU time.

A budget of training CPU seconds (``m4moe-train --max_train_cpu_seconds``)
stops every candidate after about the same CPU time, but the CPU time of a
step drifts with the machine (other tenants of the host, the other lane's
work on a sibling core): candidates trained at different times get
different amounts of work for the same seconds. What does not drift is the
ratio of two steps' costs measured in one process, interleaved
(``m4moe-bench recipe_step --clock=cpu``). So each candidate's dev CE curve
is read on one axis, *reference steps*: its own steps times its step cost
over the reference model's step. The common budget is the largest number
of reference steps that every candidate's curve reaches, and each
candidate's dev CE there is interpolated linearly between its evaluations
(never extrapolated).

The cost file is what ``m4moe-bench recipe_step`` prints, one JSON line per
model: the first model is the reference, each other line has
``speed_vs_<reference>`` (the reference's step time over its own). Several
files (measurements at different times) are averaged per model.
"""

from __future__ import annotations

import json
import pathlib
import statistics
from typing import Mapping, Sequence

from m4moe.eval import training_logs


class StepCostError(ValueError):
  """A step-cost file that cannot be read as recipe_step's output."""


def read_step_costs(paths: Sequence[pathlib.Path]) -> dict[str, float]:
  """``{model: its step cost / the reference's}`` (the reference: 1.0).

  Raises:
    StepCostError: a file without recipe_step lines, files with different
      references, or a line without its speed ratio; the message names
      the file and line.
  """
  ratios: dict[str, list[float]] = {}
  reference = None
  for path in paths:
    records = [r for r in _json_lines(path)
               if r.get("benchmark") == "recipe_step"]
    if not records:
      raise StepCostError(f"{path}: no recipe_step lines; give the output "
                          "of m4moe-bench recipe_step")
    first = records[0]["model"]
    if reference not in (None, first):
      raise StepCostError(f"{path}: its reference is {first!r}, another "
                          f"file's {reference!r}; measure against one model")
    reference = first
    ratios.setdefault(first, []).append(1.0)
    for number, record in enumerate(records[1:], start=2):
      speed = record.get(f"speed_vs_{first}")
      if not isinstance(speed, (int, float)) or speed <= 0:
        raise StepCostError(f"{path}: recipe_step line {number} "
                            f"({record.get('model')}) has no "
                            f"speed_vs_{first}")
      ratios.setdefault(record["model"], []).append(1.0 / speed)
  return {model: statistics.fmean(values) for model, values in ratios.items()}


def _json_lines(path: pathlib.Path) -> list[dict]:
  """The file's JSON objects, one per non-empty line."""
  out = []
  for number, line in enumerate(
      path.read_text(encoding="utf-8").splitlines(), start=1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise StepCostError(f"{path}:{number}: not a JSON line ({e.msg}); "
                          "give the output of m4moe-bench recipe_step") from e
    if isinstance(record, dict):
      out.append(record)
  return out


def reference_steps(curve: Sequence[tuple[int, float]], cost: float
                    ) -> list[tuple[float, float]]:
  """The dev CE curve ``[(step, ce)]`` on the reference-step axis."""
  return [(step * cost, ce) for step, ce in curve]


def common_budget(curves: Mapping[str, Sequence[tuple[int, float]]],
                  costs: Mapping[str, float]) -> float | None:
  """The most reference steps every costed curve reaches (None: none)."""
  ends = [curve[-1][0] * costs[name] for name, curve in curves.items()
          if curve and name in costs]
  return min(ends) if ends else None


def dev_ce_at(curve: Sequence[tuple[int, float]], *, cost: float,
              budget: float) -> float | None:
  """Dev CE at ``budget`` reference steps (None: outside the curve)."""
  return training_logs.interpolate(reference_steps(curve, cost), budget)
