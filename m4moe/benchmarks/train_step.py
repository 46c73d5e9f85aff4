"""Tokens/s of the real trainer's step: tiny/moe vs tiny/dense.

Both models are built like ``m4moe.training.loop`` builds them (Adafactor, the
default tf.distribute strategy) and stepped with
:class:`m4moe.training.step.StepRunner`'s ``train_step`` -- the trainer's own
compiled gradient and update functions, host syncs included. The batch is
synthetic: B rows of L random source and target tokens (no padding), so
tokens per step = 2*B*L.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Mapping
from unittest import mock

import numpy as np
import tensorflow as tf

from m4moe import config as config_lib
from m4moe.training import optimizer as optimizer_lib
from m4moe.benchmarks import timing
from m4moe.training import step as step_lib


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepPoint:
  """Batch shape and vocabulary of the synthetic training batch."""
  batch_size: int = 64
  length: int = 32
  vocab_size: int = 8000

  @property
  def tokens(self) -> int:
    return 2 * self.batch_size * self.length


def synthetic_batch(point: StepPoint) -> dict[str, tf.Tensor]:
  """``inputs``/``targets`` <int32>[B, L] of ids in [3, V)."""
  rng = np.random.default_rng(0)
  shape = (point.batch_size, point.length)
  return {k: tf.constant(rng.integers(3, point.vocab_size, size=shape),
                         tf.int32) for k in ("inputs", "targets")}


def step_case(config_name: str, *, vocab_size: int,
              batch: Mapping[str, tf.Tensor]) -> Callable[[], Any]:
  """One trainer step of zoo config ``config_name`` on ``batch``."""
  from m4moe.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.load_model_config(
      config_name, src_vocab_size=vocab_size, tgt_vocab_size=vocab_size)
  strategy = tf.distribute.get_strategy()
  tf.random.set_seed(0)
  model = model_lib.Transformer(config=config)
  variables = list(model.trainable_variables)
  optimizer = optimizer_lib.Adafactor(optimizer_lib.AdafactorConfig())
  optimizer.build(variables)
  runner = step_lib.StepRunner(model=model, optimizer=optimizer,
                               variables=variables, strategy=strategy,
                               label_smoothing=0.1)
  counter = iter(range(1 << 30))
  def call():
    seed = tf.constant([0, next(counter)], tf.int32)
    return runner.train_step([batch], seed=seed)
  return call


def step_with_and_without(config_name: str, *, point: StepPoint,
                          module: Any, attribute: str, replacement: Any
                          ) -> tuple[Callable[[], Any], Callable[[], Any]]:
  """Two trainer steps of ``config_name`` on one synthetic batch, traced.

  The first is traced with the code as it is; the second with
  ``module.attribute`` replaced by ``replacement`` while it is traced (the
  previous formulation of a function the step calls), so an A/B of the two
  runs interleaved in one process.

  Returns:
    (current, replaced) zero-argument step calls.
  """
  batch = synthetic_batch(point)
  current = step_case(config_name, vocab_size=point.vocab_size, batch=batch)
  current()
  replaced = step_case(config_name, vocab_size=point.vocab_size, batch=batch)
  with mock.patch.object(module, attribute, replacement):
    replaced()
  return current, replaced


def run(point: StepPoint, *, configs: tuple[str, str] = ("tiny/moe",
        "tiny/dense"), reps: int = 5,
        warmup: int = 2) -> Iterator[dict[str, Any]]:
  """Interleaved steps of ``configs``; yields one record per config.

  The first config's record has ``tokens_per_sec_vs_<second>``: how close
  the MoE step comes to the dense one of the same active FLOPs.
  """
  batch = synthetic_batch(point)
  cases = {name: step_case(name, vocab_size=point.vocab_size, batch=batch)
           for name in configs}
  times = timing.interleaved(cases, reps=reps, warmup=warmup)
  base = {"benchmark": "train_step", **dataclasses.asdict(point),
          "tokens_per_step": point.tokens, "reps": reps, **timing.machine()}
  for name in configs:
    record = {**base, "config": name, "median_sec": times.median(name),
              "tokens_per_sec": point.tokens / times.median(name),
              "seconds": times.seconds[name]}
    if name == configs[0]:
      record[f"tokens_per_sec_vs_{configs[1]}"] = times.ratio(configs[1], name)
    yield record
