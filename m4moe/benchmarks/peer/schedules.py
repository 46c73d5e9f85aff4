"""Learning-rate schedules of the peer yardstick, and the check of a run's.

A recipe screened at one budget and reported at another measures the
budget: a linear warmup longer than the run never reaches its peak, and a
run stopped early never decays. So every candidate states its warmup as a
fraction of the run's planned steps (the token budget over its batch
size), the schedule is built for that plan, and the final comparison
checks each run against it (:func:`check`): did the rate reach its peak,
and did the run train every planned step?

The rates are the ones each toolkit logs at step ``t`` (``t = 1, 2, ...``):

* ``hold_rsqrt`` (m4moe-train): ``peak`` for ``t <= warmup``, then
  ``peak * sqrt(warmup / t)`` (``--learning_rate = peak * sqrt(warmup)``,
  ``--warmup_steps = warmup``; the peak is reached at step 1).
* ``linear_rsqrt`` (OpenNMT-tf ``InvSqrtDecay``): ``peak * t / warmup``
  up to ``warmup``, then ``peak * sqrt(warmup / t)``.
* ``linear_cosine`` (OpenNMT-tf ``CosineAnnealing``, ``eta_min`` 0,
  ``max_step`` = the planned steps): ``peak * t / warmup`` below
  ``warmup``, then ``peak * (1 + cos(pi * t / planned)) / 2``, which is 0
  at the planned end. The cosine runs over the whole plan, warmup
  included, so the rate rises to ``peak * (warmup - 1) / warmup`` and then
  continues on the cosine below it: the nominal peak is never logged, and
  "reaching the peak" means training to the end of the warmup.

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

SHAPES = ("hold_rsqrt", "linear_rsqrt", "linear_cosine")
# A logged rate within this relative distance of the peak has reached it.
PEAK_TOLERANCE = 1e-3


@dataclasses.dataclass(frozen=True, kw_only=True)
class Schedule:
  """One run's planned learning-rate schedule.

  Attributes:
    shape: one of :data:`SHAPES`.
    peak: the highest rate.
    warmup_steps: steps of the hold (``hold_rsqrt``) or linear warmup.
    planned_steps: the steps the budget gives this run.
  """

  shape: str
  peak: float
  warmup_steps: int
  planned_steps: int

  def __post_init__(self) -> None:
    if self.shape not in SHAPES:
      raise ValueError(f"schedule shape {self.shape!r}: use one of "
                       f"{', '.join(SHAPES)}")
    if self.peak <= 0:
      raise ValueError(f"peak rate {self.peak}: use a positive rate")
    if not 1 <= self.warmup_steps < self.planned_steps:
      raise ValueError(
          f"warmup of {self.warmup_steps} steps does not fit inside the "
          f"{self.planned_steps} planned steps: lower the candidate's "
          "warmup fraction or raise --budget_tokens")

  def rate_at(self, step: int) -> float:
    """The rate the toolkit logs at ``step`` (1-based)."""
    t, w = max(step, 1), self.warmup_steps
    if self.shape == "hold_rsqrt":
      return self.peak * math.sqrt(w / max(t, w))
    if t < w or (t == w and self.shape == "linear_rsqrt"):
      return self.peak * t / w
    if self.shape == "linear_rsqrt":
      return self.peak * math.sqrt(w / t)
    return self.peak * 0.5 * (1 + math.cos(math.pi * min(t, self.planned_steps)
                                           / self.planned_steps))

  def peak_step(self) -> int:
    """The first step logged at the peak rate."""
    return 1 if self.shape == "hold_rsqrt" else self.warmup_steps

  def to_dict(self) -> dict[str, Any]:
    return {**dataclasses.asdict(self),
            "rate_at_planned_end": self.rate_at(self.planned_steps)}


def warmup_steps(fraction: float, planned_steps: int) -> int:
  """The warmup of ``fraction`` of ``planned_steps``, at least one step."""
  return max(1, round(fraction * planned_steps))


def check(schedule: Schedule, *, steps: int,
          logged_rate: float | None = None) -> dict[str, Any]:
  """What a run that trained ``steps`` steps did of its ``schedule``.

  Args:
    schedule: the run's plan.
    steps: the steps it trained (from its own log).
    logged_rate: the last rate its log reports, if any (kept beside the
      computed one so that a reader can compare them).

  Returns:
    ``steps``, ``planned_steps``, ``peak_reached`` (the run trained to the
    step the peak is reached), ``schedule_complete`` (it trained every
    planned step), ``final_learning_rate`` (the schedule's rate at its last
    step), ``logged_learning_rate`` and ``flagged`` (either check failed).
  """
  peak_reached = steps >= schedule.peak_step()
  complete = steps >= schedule.planned_steps
  return {"steps": steps, "planned_steps": schedule.planned_steps,
          "warmup_steps": schedule.warmup_steps, "shape": schedule.shape,
          "peak_learning_rate": schedule.peak,
          "peak_reached": peak_reached, "schedule_complete": complete,
          "final_learning_rate": schedule.rate_at(steps),
          "logged_learning_rate": logged_rate,
          "flagged": not (peak_reached and complete)}
