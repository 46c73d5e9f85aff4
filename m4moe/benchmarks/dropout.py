"""Seconds of the trainer step: 16-bit vs float32-uniform dropout masks.

``dropout_step`` traces the real trainer step of a zoo config
(:func:`m4moe.benchmarks.train_step.step_case`) twice: once with
:func:`m4moe.model.layers.dropout` (masks of 16-bit numbers, two per uint32 Philox
word, applied as ``x * mask_scale``) and once with :func:`uniform_dropout`,
the formulation it replaced (one float32 uniform per unit, compare, scale,
select: ``tf.nn.experimental.stateless_dropout``'s arithmetic), substituted
for ``layers.dropout`` while its step is traced. Residual, input and
attention dropout change; the experts' hidden-unit dropout
(``--expert_dropout_rate``, off in the tiny configs) is not substituted.
The two steps are timed interleaved in one process.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import tensorflow as tf

from m4moe.model import layers
from m4moe.parallel import sharding as sharding_lib
from m4moe.benchmarks import timing
from m4moe.benchmarks import train_step


def uniform_dropout(x: tf.Tensor, *, rate: float, training: bool,
                    seed: tf.Tensor | None,
                    sharding: sharding_lib.Sharding = sharding_lib.NO_SHARDING
                    ) -> tf.Tensor:
  """The baseline the 16-bit dropout masks are measured against: a
  uniform of ``x``'s dtype per unit, as ``tf.nn.experimental.
  stateless_dropout`` draws it (and ``layers.dropout`` did before the
  16-bit masks); kept for the ``dropout_step`` benchmark, never called by
  the trainer.

  Args:
    x: <any float>[...].
    rate: probability of zeroing a unit, in [0, 1).
    training: dropout is only applied when True.
    seed: <int32>[2]; required when ``training`` and ``rate > 0``.
    sharding: the draw is pinned under a mesh, as before.

  Returns:
    Same dtype and shape as ``x``: ``tf.nn.experimental.stateless_dropout``'s
    numbers (``x / (1 - rate)`` where a uniform of ``x``'s dtype is
    ``>= rate``, else 0).
  """
  if not training or rate == 0:
    return x
  if seed is None:
    raise ValueError(f"uniform_dropout(rate={rate}) needs seed=<int32>[2]")
  draws = sharding.pin_random(
      tf.random.stateless_uniform(tf.shape(x), seed=seed, dtype=x.dtype),
      name="dropout_draws")
  scaled = x * tf.convert_to_tensor(1 / (1 - rate), dtype=x.dtype)
  return tf.where(draws >= rate, scaled, tf.zeros([], x.dtype))


def run_step(point: train_step.StepPoint, *, config: str = "tiny/dense",
             reps: int = 5, warmup: int = 1,
             clock: str = "wall") -> Iterator[dict[str, Any]]:
  """Interleaved trainer steps of ``config``; one record per formulation.

  The ``16_bit`` record has ``speedup_vs_float_uniform``: median seconds of
  the ``float_uniform`` step over its own.
  """
  sixteen, old = train_step.step_with_and_without(
      config, point=point, module=layers, attribute="dropout",
      replacement=uniform_dropout)
  cases = {"16_bit": sixteen, "float_uniform": old}
  times = timing.interleaved(cases, reps=reps, warmup=warmup, clock=clock)
  base = {"benchmark": "dropout_step", "config": config,
          **dataclasses.asdict(point), "tokens_per_step": point.tokens,
          "clock": clock, "reps": reps, **timing.machine()}
  for case in cases:
    record = {**base, "formulation": case, "median_sec": times.median(case),
              "seconds": times.seconds[case]}
    if case == "16_bit":
      record["speedup_vs_float_uniform"] = times.ratio("float_uniform", case)
    yield record
