"""Seconds of the training loss: one-pass vs log-softmax cross-entropy.

Two comparisons, each timed interleaved in one process:

* ``loss``: the output projection ``[B, L, M] x [M, V]``, the plain and the
  label-smoothed cross-entropy and the gradient of the latter into the
  projection's input and weights -- once with :func:`m4moe.model.losses.
  per_token_losses` (one pass, hand-written gradient) and once with
  :func:`log_softmax_losses`, the textbook formulation (a
  ``log_softmax`` and a ``gather`` for each of the two losses, automatic
  gradient) that the one-pass loss replaced.
* ``loss_step``: the real trainer step of a zoo config
  (:func:`m4moe.benchmarks.train_step.step_case`) traced once with each
  formulation (the baseline substituted for ``losses.per_token_losses``
  while its step is traced: :func:`~m4moe.benchmarks.train_step.
  step_with_and_without`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import numpy as np
import tensorflow as tf

from m4moe.model import losses
from m4moe.benchmarks import timing
from m4moe.benchmarks import train_step


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossPoint:
  """Shapes of the output layer: B rows of L targets, M model dims, V ids."""
  batch_size: int = 64
  length: int = 64
  model_dim: int = 128
  vocab_size: int = 8000
  label_smoothing: float = 0.1


def log_softmax_losses(logits: tf.Tensor, targets: tf.Tensor, *,
                       label_smoothing: float = 0.0,
                       fused: bool = False) -> losses.TokenLosses:
  """The baseline the one-pass loss is measured against: a gather from
  ``log_softmax`` for each loss, with automatic gradients.

  It is the textbook formulation (and the trainer's before the one-pass
  loss), kept here because the ``loss`` and ``loss_step`` benchmarks
  measure the one-pass loss as a speedup over it; the trainer never
  calls it.

  Args:
    logits: <float32 or bfloat16>[B, L, V].
    targets: <int32>[B, L].
    label_smoothing: eps in [0, 1).
    fused: the trainer's argument of :func:`m4moe.model.losses.
      per_token_losses`; this formulation has one form, so it is unused.

  Returns:
    TokenLosses of <float32>[B, L]; each loss has its own log_softmax (one
    call each).
  """
  del fused  # one form only
  def one(eps):
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
    nll = -tf.gather(log_probs, targets, axis=-1,
                     batch_dims=targets.shape.rank)
    if not eps:
      return nll
    return (1.0 - eps) * nll - eps * tf.reduce_mean(log_probs, axis=-1)
  return losses.TokenLosses(nll=one(0.0), smoothed=one(label_smoothing))


def _layer_case(point: LossPoint, loss_fn) -> Any:
  rng = np.random.default_rng(0)
  x = tf.constant(rng.normal(size=(point.batch_size, point.length,
                                   point.model_dim)).astype(np.float32))
  kernel = tf.Variable(rng.normal(
      scale=point.model_dim ** -0.5,
      size=(point.model_dim, point.vocab_size)).astype(np.float32))
  targets = tf.constant(rng.integers(
      3, point.vocab_size, size=(point.batch_size, point.length)), tf.int32)

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      tape.watch(x)
      logits = tf.einsum("blm,mv->blv", x, kernel)
      out = loss_fn(logits, targets, label_smoothing=point.label_smoothing)
      objective = tf.reduce_sum(out.smoothed)
    grads = tape.gradient(objective, [x, kernel])
    return tf.reduce_sum(out.nll), objective, grads

  return lambda: tf.nest.map_structure(lambda t: t.numpy(), step())


def run_layer(point: LossPoint, *, reps: int = 5, warmup: int = 1,
              clock: str = "wall") -> Iterator[dict[str, Any]]:
  """Interleaved loss-layer calls; yields one record per formulation."""
  cases = {"one_pass": _layer_case(point, losses.per_token_losses),
           "log_softmax": _layer_case(point, log_softmax_losses)}
  times = timing.interleaved(cases, reps=reps, warmup=warmup, clock=clock)
  yield from _records("loss", times, {**dataclasses.asdict(point),
                                      "clock": clock}, reps)


def run_step(point: train_step.StepPoint, *, config: str = "tiny/dense",
             reps: int = 5, warmup: int = 1,
             clock: str = "wall") -> Iterator[dict[str, Any]]:
  """Interleaved trainer steps of ``config``; one record per formulation."""
  one_pass, old = train_step.step_with_and_without(
      config, point=point, module=losses, attribute="per_token_losses",
      replacement=log_softmax_losses)
  times = timing.interleaved({"one_pass": one_pass, "log_softmax": old},
                             reps=reps, warmup=warmup, clock=clock)
  yield from _records("loss_step", times,
                      {"config": config, **dataclasses.asdict(point),
                       "tokens_per_step": point.tokens, "clock": clock}, reps)


def _records(name: str, times: timing.Timings, base: dict[str, Any],
             reps: int) -> Iterator[dict[str, Any]]:
  base = {"benchmark": name, **base, "reps": reps, **timing.machine()}
  for case in ("one_pass", "log_softmax"):
    record = {**base, "formulation": case, "median_sec": times.median(case),
              "seconds": times.seconds[case]}
    if case == "one_pass":
      record["speedup_vs_log_softmax"] = times.ratio("log_softmax", case)
    yield record
