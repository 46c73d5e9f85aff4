"""Training throughput of both systems, measured the same way.

Two toolkits' own "tokens/s" lines differ in what they count (ours source
+ target over summed step times, OpenNMT-tf's source + target over the
wall time between log lines, checkpoint saving included), so neither is
compared with the other. Here both come from per-interval records of the
same shape, :class:`Interval`, read from each system's own log:

* m4moe: ``metrics.jsonl`` ``train`` records (:func:`m4moe_intervals`):
  the interval's target tokens are the growth of ``tokens_seen``, its
  step seconds ``step_time_sec`` times the steps since the previous
  record.
* OpenNMT-tf: the driver's ``steps.jsonl`` (:func:`peer_intervals`),
  written from inside its step generator: each step's non-padding target
  tokens (the Trainer's own target word counter) and the time the
  generator took to produce the step (the batch and the update).

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Mapping, Sequence

DEFINITION = (
    "real (non-padding) target tokens per second of training-step time: "
    "the target tokens of the logged intervals after the first (which "
    "holds graph tracing) over the seconds of their training steps "
    "(fetching the batch and the update; not logging, checkpointing or "
    "evaluation), from each system's own log: m4moe's metrics.jsonl, the "
    "OpenNMT-tf driver's steps.jsonl")
PEER_STEPS_FILENAME = "steps.jsonl"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Interval:
  """The steps between two log records.

  Attributes:
    step: the last step of the interval.
    steps: how many steps it holds.
    target_tokens: their non-padding target tokens.
    step_seconds: their training-step seconds.
    learning_rate: the rate the log gives at ``step`` (None: not logged).
  """

  step: int
  steps: int
  target_tokens: float
  step_seconds: float
  learning_rate: float | None = None


def target_tokens_per_sec(intervals: Sequence[Interval]) -> float:
  """:data:`DEFINITION` over ``intervals`` (all of them if only one).

  Raises:
    ValueError: no interval, or no step seconds.
  """
  kept = list(intervals[1:]) or list(intervals)
  seconds = sum(i.step_seconds for i in kept)
  if not kept or seconds <= 0:
    raise ValueError("no logged training interval with step time: the run "
                     "logged nothing (train longer than one log interval)")
  return sum(i.target_tokens for i in kept) / seconds


def m4moe_intervals(records: Sequence[Mapping[str, Any]]) -> list[Interval]:
  """The ``train`` records of an m4moe-train ``metrics.jsonl`` as intervals.

  Raises:
    ValueError: a train record lacks ``tokens_seen`` or ``step_time_sec``.
  """
  out, step, seen = [], 0, 0
  for record in records:
    if record.get("kind") != "train":
      continue
    try:
      steps = int(record["step"]) - step
      tokens = float(record["tokens_seen"]) - seen
      seconds = float(record["step_time_sec"]) * steps
    except KeyError as e:
      raise ValueError(f"metrics.jsonl train record at step "
                       f"{record.get('step')} lacks {e}") from e
    out.append(Interval(step=int(record["step"]), steps=steps,
                        target_tokens=tokens, step_seconds=seconds,
                        learning_rate=record.get("learning_rate")))
    step, seen = int(record["step"]), float(record["tokens_seen"])
  return out


def peer_intervals(path: pathlib.Path) -> list[Interval]:
  """The OpenNMT-tf driver's ``steps.jsonl`` as intervals.

  Raises:
    ValueError: a line is not a JSON interval (names the file and line).
  """
  out = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, start=1):
      try:
        out.append(Interval(**json.loads(line)))
      except (ValueError, TypeError) as e:
        raise ValueError(f"{path}:{number}: not an interval record of the "
                         f"driver ({e}); re-run the training") from e
  return out


def summary(intervals: Sequence[Interval]) -> dict[str, Any]:
  """Target tokens/s, the tokens trained and the last logged rate."""
  last = intervals[-1] if intervals else None
  return {"target_tokens_per_sec": round(target_tokens_per_sec(intervals), 1),
          "target_tokens": round(sum(i.target_tokens for i in intervals)),
          "logged_learning_rate": last.learning_rate if last else None,
          "logged_learning_rate_step": last.step if last else None}
