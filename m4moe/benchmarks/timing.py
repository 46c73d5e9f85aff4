"""Interleaved timing and JSON-line output shared by the sub-benchmarks.

This machine's speed drifts (up to 2x over minutes; other processes share the
cores), so compared cases are always timed round-robin in one process and
reported as the median over repetitions, after warm-up calls.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from typing import Any, Callable, Mapping, TextIO
import sys


@dataclasses.dataclass(frozen=True)
class Timings:
  """Seconds per call of each case, R repetitions each, interleaved.

  Attributes:
    seconds: case name -> list of R durations (seconds).
  """
  seconds: Mapping[str, list[float]]

  def median(self, name: str) -> float:
    return statistics.median(self.seconds[name])

  def ratio(self, slow: str, fast: str) -> float:
    """median(slow) / median(fast): the speed of ``fast`` relative to slow."""
    return self.median(slow) / self.median(fast)


# What ``interleaved`` measures: wall-clock seconds, or the CPU seconds of
# this process (all its threads; other processes' load does not add to it,
# only their contention for caches and memory bandwidth does).
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def interleaved(cases: Mapping[str, Callable[[], Any]], *, reps: int,
                warmup: int = 1, clock: str = "wall") -> Timings:
  """Times ``cases`` round-robin: warm-up calls, then ``reps`` rounds.

  Args:
    cases: name -> zero-argument callable; it must block until its work is
      done (e.g. end with ``.numpy()``).
    reps: R, timed calls per case (>= 1).
    warmup: untimed calls per case first (tracing, compilation, caches).
    clock: a key of :data:`CLOCKS`, "wall" or "cpu".

  Returns:
    The :class:`Timings`.
  """
  if reps < 1:
    raise ValueError(f"--reps={reps} must be >= 1")
  if clock not in CLOCKS:
    raise ValueError(f"--clock={clock}: use {' or '.join(CLOCKS)}")
  now = CLOCKS[clock]
  for _ in range(warmup):
    for fn in cases.values():
      fn()
  seconds = {name: [] for name in cases}
  for _ in range(reps):
    for name, fn in cases.items():
      start = now()
      fn()
      seconds[name].append(now() - start)
  return Timings(seconds=seconds)


def machine() -> dict[str, Any]:
  """nproc, load average and TF version, for every JSON line's context."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return {"nproc": os.cpu_count(), "loadavg_1m": os.getloadavg()[0],
          "tf": tf.__version__}


def emit(record: Mapping[str, Any], *, stream: TextIO | None = None) -> None:
  """Prints one JSON line (floats rounded to 6 significant digits)."""
  def clean(v):
    if isinstance(v, float):
      return float(f"{v:.6g}")
    if isinstance(v, Mapping):
      return {k: clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
      return [clean(x) for x in v]
    return v
  print(json.dumps(clean(dict(record))), file=stream or sys.stdout,
        flush=True)
