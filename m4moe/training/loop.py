"""The training loop: Adafactor steps, exact resume, preemption safety, metrics.

Library entry point of ``m4moe-train`` (see :mod:`m4moe.cli.train`)::

  result = train(model_fn=lambda: Transformer(config=model_config),
                 train_dataset=ds, dev_datasets={"de": dev_de},
                 config=TrainConfig(model_dir=..., train_steps=...),
                 model_config=model_config)

What a run guarantees:

* Checkpoints (``ckpt-<step>``) hold the model, the optimiser slots and
  counters, the step, tokens seen and the input iterator's state; randomness
  is ``fold_in([seed, 0], step)``, so nothing random lives outside them. With
  op determinism on, N steps straight equal N/2 + restart + N/2 bitwise.
* SIGTERM, SIGINT (Ctrl-C) or SIGHUP: finish the current step, save, return
  with ``preempted=True`` (a second Ctrl-C stops at once, without saving).
* ``kill -9`` at any time: the ``checkpoint`` index only ever names complete
  checkpoints (see :mod:`m4moe.training.checkpointing`); the next start
  removes the killed save's leftovers (its ``ckpt-<step>_temp/`` directory
  and unfinished files), resumes from the last complete checkpoint (step 0
  if the first save was the one killed) and cuts ``metrics.jsonl`` back to
  that step, saying so in one line.
* Damaged checkpoints (truncated, missing or altered files, a missing or
  garbage ``checkpoint`` state file): the start verifies the newest
  checkpoint's checksums, moves damaged ones into ``model_dir/damaged/`` and
  resumes from the newest intact one; it never silently starts over a run
  that had checkpoints (see
  :func:`m4moe.training.checkpointing.recover_checkpoints`).
* One writer per ``model_dir`` (:mod:`m4moe.run_lock`): a second
  trainer stops with an error naming the first one's pid.
* A non-finite loss or gradient skips the update (counted, logged with the
  offending tensors); ``max_consecutive_nonfinite`` skips in a row raise
  :class:`NonFiniteError` without saving, so the last good checkpoint stays.

When a run stops (:func:`stop_reason`): at ``train_steps``; when the
training loop's wall-clock, summed over resumes, reaches
``max_train_seconds`` (a budget: equal-time comparisons); when the
training steps' own CPU seconds, summed over resumes, reach
``max_train_cpu_seconds`` (the budget of equal-cost model comparisons: the
CPU time that ``step_cpu_sec`` logs, which other processes on the machine
inflate less than the wall clock); or, with
``early_stopping_patience = P``, when ``P`` dev evaluations in a row have not
lowered the best token-weighted dev cross-entropy by ``early_stopping_min_delta``.
The clock, the best dev CE and the evaluations since it are checkpointed, so a
resumed run stops where an uninterrupted one would, and a finished run does
not train further when its command is repeated.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import time
from typing import Any, Callable, Mapping

import numpy as np
import tensorflow as tf
from absl import logging

from m4moe import config as config_lib
from m4moe import errors
from m4moe import flagutil
from m4moe import jsonfile
from m4moe import run_lock
from m4moe.training import optimizer as optimizer_lib
from m4moe.parallel import sharding as sharding_lib
from m4moe.training import checkpointing
from m4moe.training import distribute
from m4moe.training import metrics as metrics_lib
from m4moe.training import metrics_log
from m4moe.training import remat as remat_lib
from m4moe.training import step as step_lib


class NonFiniteError(RuntimeError):
  """Too many consecutive non-finite steps; the message names the step."""


class MetricsDiskFullError(checkpointing.CheckpointError):
  """Appending to ``metrics.jsonl`` failed on a full disk; the message (one
  line) names the file, the free space and the checkpoint the next start
  resumes from (a CheckpointError: ``m4moe-train`` prints it, exits 1)."""


# Below this many dev target tokens, early stopping gets a warning: the demo's
# ia dev set (137 tokens) moved by more between evaluations than training
# changed it (results/archive/demo_stopping/README.md).
MIN_STOPPING_DEV_TOKENS = 1000


class TrainConfigError(errors.ConfigError):
  """A training setting is invalid; the message names the flag and the fix."""


_require = functools.partial(errors.require, error=TrainConfigError)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
  """Settings of a training run (each is an ``m4moe-train`` flag,
  :mod:`m4moe.flagutil`; ``batch_tokens`` is copied from the data config).

  Attributes:
    model_dir: checkpoints, config.json, metrics.jsonl, TensorBoard events.
    train_steps: stop after this many steps (a step is one optimiser update
      attempt over ``grad_accum_steps`` micro-batches).
    seed: base seed: model init (tf.random.set_seed) and per-step seeds
      (m4moe-train's data config shares it as its shuffling seed).
    label_smoothing: epsilon of the training cross-entropy (0.1, as in
      Vaswani et al. 2017 and the small-model recipe).
    grad_accum_steps: micro-batches per update (k).
    remat: recompute each Transformer layer's activations in the backward
      pass (tf.recompute_grad) to save memory.
    checkpoint_every: save every N steps (and at the end).
    keep_checkpoints: K, checkpoints kept.
    eval_every: per-language dev cross-entropy every N steps (0: at the end
      only; a run always evaluates at its end).
    log_every: console / TensorBoard / JSONL train record every N steps.
    max_consecutive_nonfinite: stop after this many skipped steps in a row.
    max_train_seconds: stop once the training loop has run this long (wall
      clock summed over resumes: steps, checkpoints and dev evaluations,
      not process start-up); 0: no budget.
    max_train_cpu_seconds: stop once the training steps have used this
      much CPU time of the process (all its threads; summed over resumes;
      steps only, as ``step_cpu_sec`` in metrics.jsonl); 0: no budget.
    early_stopping_patience: stop after this many dev evaluations in a row
      without a new best dev cross-entropy (0: off; needs ``eval_every``).
    early_stopping_min_delta: an evaluation is a new best only if it lowers
      the best dev cross-entropy by more than this (nats per token).
    keep_best: at every dev evaluation that sets a new best dev
      cross-entropy (by more than ``early_stopping_min_delta``), save the
      model weights in ``model_dir/best/`` (one checkpoint, no optimiser
      state; ``--checkpoint=best`` of m4moe-eval/decode/export reads it), so
      an early-stopped run is evaluated where dev was best, not
      ``early_stopping_patience`` evaluations later.
    checkpoint_input: save the input iterator in checkpoints (not on a
      device mesh, whose DTensor checkpoints cannot hold it); if False a
      resumed run skips the batches already consumed instead (for pipelines
      whose iterators cannot be checkpointed).
    batch_tokens: the configured tokens per batch, recorded in the metrics.
    optimizer: Adafactor settings.
  """

  model_dir: str
  train_steps: int = 10000
  seed: int = 0
  label_smoothing: float = 0.1
  grad_accum_steps: int = 1
  remat: bool = False
  checkpoint_every: int = 1000
  keep_checkpoints: int = 5
  eval_every: int = 1000
  log_every: int = 100
  max_consecutive_nonfinite: int = 10
  max_train_seconds: float = 0.0
  max_train_cpu_seconds: float = 0.0
  early_stopping_patience: int = 0
  early_stopping_min_delta: float = 0.0
  keep_best: bool = True
  checkpoint_input: bool = True
  batch_tokens: int = dataclasses.field(default=0, metadata=flagutil.metadata(
      not_a_flag="m4moe-train copies the data config's --batch_tokens"))
  optimizer: optimizer_lib.AdafactorConfig = dataclasses.field(
      default_factory=optimizer_lib.AdafactorConfig)

  def __post_init__(self) -> None:
    _require(bool(self.model_dir), "model_dir", self.model_dir,
             "pass a directory for checkpoints")
    _require(self.train_steps >= 1, "train_steps", self.train_steps,
             "use at least 1")
    _require(0 <= self.label_smoothing < 1, "label_smoothing",
             self.label_smoothing, "use a value in [0, 1) (0.1 is usual)")
    for name in ("grad_accum_steps", "checkpoint_every", "keep_checkpoints",
                 "log_every", "max_consecutive_nonfinite"):
      value = getattr(self, name)
      _require(value >= 1, name, value, "use a positive integer")
    _require(self.eval_every >= 0, "eval_every", self.eval_every,
             "use 0 (evaluate at the end only) or a positive step count")
    for name in ("max_train_seconds", "max_train_cpu_seconds"):
      _require(getattr(self, name) >= 0, name, getattr(self, name),
               "use 0 (no budget) or a positive number of seconds")
    _require(self.early_stopping_patience >= 0, "early_stopping_patience",
             self.early_stopping_patience, "use 0 (off) or a positive number "
             "of dev evaluations")
    _require(not self.early_stopping_patience or self.eval_every > 0,
             "early_stopping_patience", self.early_stopping_patience,
             "early stopping needs periodic dev evaluations: set --eval_every")
    _require(self.early_stopping_min_delta >= 0, "early_stopping_min_delta",
             self.early_stopping_min_delta, "use a non-negative value")

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class TrainResult:
  """Outcome of :func:`train`.

  Attributes:
    step: the last completed step.
    preempted: stopped early by SIGTERM, SIGINT or SIGHUP (after saving).
    stopped_by: why training ended: ``train_steps``, ``time_budget``,
      ``cpu_budget``, ``early_stopping`` or ``preempted``.
    last_checkpoint: path of the last saved checkpoint.
    train_ce: plain train cross-entropy of the last logging interval.
    dev_ce: {language: dev cross-entropy} of the last evaluation.
    nonfinite_skipped: total skipped steps of the run (incl. earlier runs).
  """
  step: int
  preempted: bool
  last_checkpoint: str | None
  train_ce: float | None
  dev_ce: Mapping[str, float] | None
  nonfinite_skipped: int
  stopped_by: str = "train_steps"


@dataclasses.dataclass
class _Counters:
  """Checkpointed scalars of the loop.

  ``train_millis`` is the loop's wall-clock so far, ``train_cpu_millis``
  the training steps' CPU time so far; ``best_dev_ce_micro`` the
  best token-weighted dev CE in micro-nats (-1: none yet) and
  ``evals_since_best`` the dev evaluations since it (early stopping).
  Checkpoints written before these existed restore them as 0 / -1.
  """
  step: tf.Variable
  tokens_seen: tf.Variable
  source_tokens_seen: tf.Variable
  nonfinite_skipped: tf.Variable
  train_millis: tf.Variable
  best_dev_ce_micro: tf.Variable
  evals_since_best: tf.Variable
  train_cpu_millis: tf.Variable

  @classmethod
  def create(cls) -> "_Counters":
    make = lambda name: tf.Variable(-1 if name == "best_dev_ce_micro" else 0,
                                    dtype=tf.int64, trainable=False, name=name)
    return cls(*(make(f.name) for f in dataclasses.fields(cls)))

  def trackables(self) -> dict[str, tf.Variable]:
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


class _Loop:
  """State of one call of :func:`train` (kept small: see ``train``)."""

  def __init__(self, *, config: TrainConfig, strategy, model, runner,
               counters: _Counters, keeper, iterator, dev_datasets,
               metrics_log: metrics_log.MetricsLog,
               best_keeper: checkpointing.CheckpointKeeper | None = None,
               devices: int = 1):
    self.config = config
    self.best_keeper = best_keeper
    self.devices = devices
    self.warned_small_dev = False
    self.warned_empty_dev = False
    self.strategy = strategy
    self.model = model
    self.runner = runner
    self.counters = counters
    self.keeper = keeper
    self.iterator = iterator
    self.dev_datasets = dev_datasets or {}
    self.log = metrics_log
    self.interval = metrics_lib.Interval()
    self.consecutive_nonfinite = 0
    self.started = time.time()
    self.last_train_ce = None
    self.last_dev_ce = None
    model_dir = pathlib.Path(config.model_dir)
    self.train_writer = tf.summary.create_file_writer(str(model_dir / "train"))
    self.eval_writer = tf.summary.create_file_writer(str(model_dir / "eval"))
    self.base_seed = tf.constant([config.seed, 0], tf.int32)
    self.clock = time.perf_counter()

  @property
  def step(self) -> int:
    return int(self.counters.step.numpy())

  def tick(self) -> None:
    """Adds the wall-clock since the last tick to the checkpointed clock."""
    now = time.perf_counter()
    self.counters.train_millis.assign_add(int(round((now - self.clock) * 1e3)))
    self.clock = now

  @property
  def train_seconds(self) -> float:
    return int(self.counters.train_millis.numpy()) / 1e3

  @property
  def train_cpu_seconds(self) -> float:
    return int(self.counters.train_cpu_millis.numpy()) / 1e3

  def _next_microbatches(self) -> list[Mapping[str, tf.Tensor]]:
    try:
      return [next(self.iterator) for _ in range(self.config.grad_accum_steps)]
    except StopIteration as e:
      raise RuntimeError(
          f"the training data ran out at step {self.step}; make the dataset "
          "repeat (the m4moe.data pipeline does) or lower --train_steps") from e

  def run_step(self, after_step: Callable[[int], None] | None) -> None:
    began, began_cpu = time.perf_counter(), time.process_time()
    batches = self._next_microbatches()
    seed = tf.random.experimental.stateless_fold_in(self.base_seed, self.step)
    result = self.runner.train_step(batches, seed=seed)
    self.counters.step.assign_add(1)
    self._account(result)
    cpu_seconds = time.process_time() - began_cpu
    self.counters.train_cpu_millis.assign_add(int(round(cpu_seconds * 1e3)))
    self.interval.add(ce_sum=result.ce_sum, objective=result.objective,
                      target_tokens=result.target_tokens,
                      source_tokens=result.source_tokens,
                      seconds=time.perf_counter() - began,
                      cpu_seconds=cpu_seconds)
    if self.step % self.config.log_every == 0:
      self._log_train(result)
    if after_step is not None:
      after_step(self.step)

  def _account(self, result: step_lib.StepResult) -> None:
    if result.applied:
      self.consecutive_nonfinite = 0
      self.counters.tokens_seen.assign_add(int(result.target_tokens))
      self.counters.source_tokens_seen.assign_add(int(result.source_tokens))
      return
    self.consecutive_nonfinite += 1
    self.counters.nonfinite_skipped.assign_add(1)
    names = ", ".join(result.nonfinite[:10])
    more = len(result.nonfinite) - 10
    logging.warning("step %d: non-finite %s%s; update skipped (%d in a row)",
                    self.step, names, f" and {more} more" if more > 0 else "",
                    self.consecutive_nonfinite)
    if self.consecutive_nonfinite >= self.config.max_consecutive_nonfinite:
      raise NonFiniteError(
          f"step {self.step}: {self.consecutive_nonfinite} consecutive steps "
          f"with a non-finite loss or gradient (last: {names}); stopping "
          f"without saving. Last good checkpoint: {self.keeper.latest}. "
          "Lower the learning rate, check the data, or raise "
          "--max_consecutive_nonfinite")

  def _log_train(self, result: step_lib.StepResult) -> None:
    record = {
        "kind": "train", "step": self.step, "time": time.time(),
        "elapsed_sec": time.time() - self.started,
        "tokens_seen": int(self.counters.tokens_seen.numpy()),
        "source_tokens_seen": int(self.counters.source_tokens_seen.numpy()),
        **self.interval.summary(),
        "moe_loss": result.moe_loss, "aux_loss": result.aux_loss,
        "z_loss": result.z_loss, "learning_rate": result.learning_rate,
        "grad_norm": result.grad_norm,
        "nonfinite_skipped": int(self.counters.nonfinite_skipped.numpy()),
        "devices": self.devices,
        "device_kind": distribute.device_kind(self.strategy),
        "batch_tokens": self.config.batch_tokens,
        "grad_accum_steps": self.config.grad_accum_steps,
        "router": metrics_lib.router_scalars(result.router),
        "expert_compute": metrics_lib.expert_compute_means(result.router),
    }
    self.interval.reset()
    self.last_train_ce = record["train_ce"]
    self.log.write(record)
    metrics_lib.log_console(record, train_steps=self.config.train_steps)
    with self.train_writer.as_default():
      for name in ("train_ce", "train_loss", "moe_loss", "aux_loss", "z_loss",
                   "learning_rate", "grad_norm", "step_time_sec",
                   "tokens_per_sec", "nonfinite_skipped"):
        tag = "cross_entropy" if name == "train_ce" else name.removeprefix(
            "train_")
        metrics_lib.write_scalar(f"train/{tag}", record[name], step=self.step)
      metrics_lib.write_router_summaries(result.router, step=self.step)
    self.train_writer.flush()

  def _track_best(self, mean: float) -> bool:
    """Updates the early-stopping state; True if ``mean`` is a new best."""
    best = int(self.counters.best_dev_ce_micro.numpy())
    margin = self.config.early_stopping_min_delta
    if best < 0 or mean < best / 1e6 - margin:
      self.counters.best_dev_ce_micro.assign(int(round(mean * 1e6)))
      self.counters.evals_since_best.assign(0)
      return True
    self.counters.evals_since_best.assign_add(1)
    return False

  def stop_reason(self) -> str | None:
    """Why training must stop now (None: go on); see the module docstring."""
    config = self.config
    if self.step >= config.train_steps:
      return "train_steps"
    if config.max_train_seconds and self.train_seconds >= config.max_train_seconds:
      return "time_budget"
    if (config.max_train_cpu_seconds and self.train_cpu_seconds >=
        config.max_train_cpu_seconds):
      return "cpu_budget"
    if (config.early_stopping_patience and
        int(self.counters.evals_since_best.numpy()) >=
        config.early_stopping_patience):
      return "early_stopping"
    return None

  def _warn_empty_dev(self, empty: list[str], *, any_left: bool) -> None:
    """Warns once about dev sets without target tokens."""
    if empty and not self.warned_empty_dev:
      self.warned_empty_dev = True
      logging.warning(_empty_dev_message(empty, any_left=any_left))

  def evaluate(self, *, track_best: bool = True) -> None:
    """Per-language dev CE: logged, and (``track_best``) early-stopping state."""
    if not self.dev_datasets:
      return
    ce, tokens, reliance, empty = {}, {}, {}, []
    for lang, dataset in sorted(self.dev_datasets.items()):
      total, count, gap = self.runner.evaluate_with_source_reliance(dataset)
      if count <= 0:  # no target tokens: no cross-entropy, not a 0.0
        empty.append(lang)
        continue
      ce[lang], tokens[lang] = total / count, count
      if np.isfinite(gap):
        reliance[lang] = gap
    self._warn_empty_dev(empty, any_left=bool(ce))
    if not ce:
      return
    total = sum(tokens.values())
    mean = sum(ce[l] * tokens[l] for l in ce) / total
    if (self.config.early_stopping_patience and not self.warned_small_dev
        and total < MIN_STOPPING_DEV_TOKENS):
      self.warned_small_dev = True
      logging.warning(
          "Early stopping watches a dev set of only %d target tokens (%s): "
          "its cross-entropy moves by noise between evaluations, so the run "
          "may stop at a random point. Use a larger dev split, or a fixed "
          "--train_steps without --early_stopping_patience.", int(total),
          ", ".join(f"{l} {int(n)}" for l, n in sorted(tokens.items())))
    self.last_dev_ce = ce
    record = {"kind": "eval", "step": self.step, "time": time.time(),
              "tokens_seen": int(self.counters.tokens_seen.numpy()),
              "dev_ce": ce, "dev_tokens": tokens, "dev_ce_mean": mean,
              "source_reliance": reliance, "empty_dev": empty}
    if track_best:
      record["new_best"] = self._track_best(mean)
      if record["new_best"] and self.best_keeper is not None:
        self.best_keeper.save(self.step)
    self.log.write(record)
    logging.info("step %d dev cross-entropy %.4f (%s)", self.step, mean,
                 ", ".join(f"{l} {v:.3f}" for l, v in ce.items()))
    with self.eval_writer.as_default():
      for lang, value in ce.items():
        metrics_lib.write_scalar(f"dev/cross_entropy/{lang}", value,
                                 step=self.step)
      metrics_lib.write_scalar("dev/cross_entropy", mean, step=self.step)
      for lang, value in reliance.items():
        metrics_lib.write_scalar(f"dev/source_reliance/{lang}", value,
                                 step=self.step)
    self.eval_writer.flush()


def _empty_dev_message(empty: list[str], *, any_left: bool) -> str:
  """The one warning for dev sets without target tokens."""
  names = ", ".join(empty)
  if any_left:
    return (f"Dev sets without target tokens: {names}; their languages are "
            "left out of the dev cross-entropy (each evaluation lists them "
            "as empty_dev in metrics.jsonl). Give them dev pairs to watch "
            "them.")
  return (f"Every dev set is empty ({names}): no dev cross-entropy, so no "
          "best-on-dev checkpoint and no early stopping. Give the run dev "
          "pairs, or train a fixed --train_steps.")


def _device_count(strategy, sharding: sharding_lib.Sharding) -> int:
  """Devices a step runs on: the mesh's, else the strategy's replicas."""
  if sharding.enabled:
    return sharding.mesh.size
  return strategy.num_replicas_in_sync


def _restore(keeper: checkpointing.CheckpointKeeper, *, config: TrainConfig,
             dataset: tf.data.Dataset, counters: _Counters, iterator):
  """Restores the latest checkpoint; returns (path, iterator to use).

  Without iterator state in the checkpoints, the iterator is created only
  now, skipping the consumed batches (one iterator per dataset object, since
  a reshuffling dataset gives each new iterator a new order).
  """
  path = keeper.restore_latest()
  if iterator is None:
    consumed = int(counters.step.numpy()) * config.grad_accum_steps
    if consumed:
      logging.info("Skipping %d already consumed batches", consumed)
    iterator = iter(dataset.skip(consumed) if consumed else dataset)
  return path, iterator


def _has_iterator(latest: str | None) -> bool | None:
  """Whether checkpoint ``latest`` holds input iterator state (None: none)."""
  if latest is None:
    return None
  keys = tf.train.load_checkpoint(latest).get_variable_to_shape_map()
  return any(k.startswith("iterator/") for k in keys)


def _build(model_fn, *, strategy, config: TrainConfig,
           sharding: sharding_lib.Sharding, token_loss=None):
  """Model, optimiser, counters and step runner, under the strategy scope.

  Under a mesh, the model's and the optimiser's variables are created in
  ``sharding.variable_scope()`` (DVariables: expert weights and their slots
  split on E, the rest replicated); the loop counters stay host variables.
  """
  tf.random.set_seed(config.seed)
  with strategy.scope():
    with sharding.variable_scope():
      model = model_fn()
      variables = list(model.trainable_variables)
      if not variables:
        raise ValueError("model_fn() returned a model without trainable "
                         "variables; create them in __init__")
      optimizer = optimizer_lib.Adafactor(config.optimizer)
      optimizer.build(variables)
    counters = _Counters.create()
  if config.remat:
    remat_lib.apply_remat(model)
  runner = step_lib.StepRunner(model=model, optimizer=optimizer,
                               variables=variables, strategy=strategy,
                               label_smoothing=config.label_smoothing,
                               sharding=sharding, token_loss=token_loss)
  return model, optimizer, counters, runner


def train(*, model_fn: Callable[[], tf.Module], train_dataset: tf.data.Dataset,
          config: TrainConfig,
          dev_datasets: Mapping[str, tf.data.Dataset] | None = None,
          model_config: config_lib.ModelConfig | None = None,
          run_sections: Mapping[str, Any] | None = None,
          strategy: tf.distribute.Strategy | None = None,
          sharding: sharding_lib.Sharding = sharding_lib.NO_SHARDING,
          after_step: Callable[[int], None] | None = None,
          warm_start: Callable[[tf.Module, Any], Any] | None = None,
          token_loss: Callable[..., tf.Tensor] | None = None
          ) -> TrainResult:
  """Trains (or resumes training) until ``config.train_steps``.

  Args:
    model_fn: builds the model, under the strategy scope after
      ``tf.random.set_seed(config.seed)``.
    train_dataset: repeating dataset of global batches (dicts with
      "inputs"/"targets" <int32>[B, L] and optional packing features).
    config: the run settings.
    dev_datasets: {language: finite dataset of batches} for dev CE.
    model_config: written to ``config.json``, so decode/eval can rebuild the
      model and resuming with a different model fails.
    run_sections: further ``config.json`` sections (e.g. "data").
    strategy: defaults to the current (default) strategy.
    sharding: a device mesh: variables are laid out on it and batches split
      over its ``data`` axis; ``model_fn`` must pass it to the model for the
      GShard annotations. Use it with the default strategy.
    after_step: test hook called with the step number after every step.
    warm_start: ``warm_start(model, optimizer)`` before the first step of a
      fresh run, e.g. dense -> MoE upcycling (:mod:`m4moe.moe.upcycle`); a
      resumed run ignores it (logged). A mapping it returns (JSON values)
      is the ``warm_start`` of the metrics log's ``start`` record, so the
      run says where it started from.
    token_loss: replaces the label-smoothed cross-entropy
      (:class:`m4moe.training.step.StepRunner`), e.g. distillation
      (:mod:`m4moe.training.distill`); a function of the batch and the
      logits only (no state of its own), so a resumed run repeats it exactly.

  Returns:
    TrainResult.

  Raises:
    checkpointing.ModelDirError: ``config.model_dir`` is a file or cannot be
      created.
    run_lock.RunLockedError: another process is training in ``model_dir``.
    checkpointing.CheckpointError: the run had checkpoints (or checkpointed
      metrics) but none is intact; nothing was changed except moving the
      damaged files into ``model_dir/damaged/``.
    MetricsDiskFullError: appending to ``metrics.jsonl`` hit a full disk.
  """
  strategy = strategy or tf.distribute.get_strategy()
  _check_strategy(strategy, sharding)
  model_dir = checkpointing.prepare_model_dir(config.model_dir)
  with run_lock.RunLock(model_dir):
    recovery = _recover(model_dir, config=config, model_config=model_config,
                        run_sections=run_sections)
    loop = _start(model_fn, train_dataset=train_dataset, config=config,
                  dev_datasets=dev_datasets, strategy=strategy,
                  sharding=sharding, warm_start=warm_start,
                  token_loss=token_loss, recovery=recovery)
    return _finish(loop, after_step=after_step)


def _finish(loop: _Loop, *, after_step) -> TrainResult:
  """Runs the loop to its end and summarises it; the metrics log is closed
  even when a step raises, so its last record is on disk."""
  try:
    stopped_by = _run_loop(loop, after_step=after_step)
  except metrics_log.MetricsWriteError as e:
    if not errors.is_disk_full(e):
      raise
    raise MetricsDiskFullError(_log_full_message(loop, e)) from None
  finally:
    loop.log.close()
  return TrainResult(
      step=loop.step, preempted=stopped_by == "preempted",
      last_checkpoint=loop.keeper.latest,
      train_ce=loop.last_train_ce, dev_ce=loop.last_dev_ce,
      nonfinite_skipped=int(loop.counters.nonfinite_skipped.numpy()),
      stopped_by=stopped_by)


def _log_full_message(loop: _Loop, error: OSError) -> str:
  """The one line of a metrics append that failed on a full disk.

  The log was cut back to its last whole record, and a resume cuts it back
  to the restored checkpoint's step, so the checkpoint and the log agree
  on the next start.
  """
  latest = loop.keeper.latest
  kept = (f"the log is whole up to its last record, and the next start "
          f"resumes from {pathlib.Path(latest).name} and cuts the log back "
          "to it" if latest else "the log is whole up to its last record; "
          "no checkpoint was saved yet, so the next start begins at step 0")
  return errors.disk_full_message(
      action=f"appending to {error.filename}",
      path=pathlib.Path(error.filename).parent, kept=kept)


def _check_strategy(strategy: tf.distribute.Strategy,
                    sharding: sharding_lib.Sharding) -> None:
  """Refuses a mesh combined with a replicating strategy: both would split
  the batch, and the mesh already does the data parallelism."""
  if sharding.enabled and strategy.num_replicas_in_sync > 1:
    raise TrainConfigError(
        f"a device mesh (--mesh={sharding.mesh}) replaces the "
        f"{type(strategy).__name__}'s {strategy.num_replicas_in_sync} "
        "replicas; train on a mesh with the default strategy")


def _recover(model_dir: pathlib.Path, *, config: TrainConfig,
             model_config: config_lib.ModelConfig | None,
             run_sections: Mapping[str, Any] | None
             ) -> checkpointing.Recovery:
  """Recovers the checkpoints and (re)writes ``config.json``.

  Runs under the run lock, before anything is restored: nobody else is
  saving, so temp directories are stale, and a run whose checkpoints are
  all gone is refused rather than restarted from step 0. ``config.json`` is
  written before the first step so that a run cut short can still be
  decoded, and so that resuming with a different model fails here.
  """
  recovery = checkpointing.recover_checkpoints(model_dir)
  if recovery.latest is None:
    checkpointing.check_fresh_start(
        model_dir, checkpoint_every=config.checkpoint_every,
        killed_saves=recovery.killed_saves)
  if model_config is not None:
    checkpointing.write_run_config(
        model_dir, model_config=model_config,
        sections={"train": config.to_dict(), **(run_sections or {})})
  return recovery


def _restore_or_warm_start(model_fn, *, train_dataset: tf.data.Dataset,
                           config: TrainConfig, strategy,
                           sharding: sharding_lib.Sharding, warm_start,
                           token_loss, latest: str | None):
  """Builds the model and optimiser and restores the latest checkpoint, or
  warm-starts a fresh run; returns (keeper, resumed path, iterator, model,
  counters, runner, warm start record: what ``warm_start`` returned if it
  ran and returned a mapping, else None).

  A DTensor checkpoint cannot hold the (host) iterator state; on a mesh a
  resumed run skips the consumed batches instead (as
  ``checkpoint_input=False``), and so does a run resuming a mesh run's
  checkpoint without a mesh.
  """
  model, optimizer, counters, runner = _build(
      model_fn, strategy=strategy, config=config, sharding=sharding,
      token_loss=token_loss)
  with_iterator = (config.checkpoint_input and not sharding.enabled and
                   _has_iterator(latest) is not False)
  iterator = iter(train_dataset) if with_iterator else None
  trackables = dict(model=model, optimizer=optimizer, **counters.trackables())
  if iterator is not None:
    trackables["iterator"] = iterator
  keeper = checkpointing.CheckpointKeeper(
      str(pathlib.Path(config.model_dir)), max_to_keep=config.keep_checkpoints,
      **trackables)
  resumed, iterator = _restore(keeper, config=config, dataset=train_dataset,
                               counters=counters, iterator=iterator)
  started = None
  if warm_start is not None and resumed is None:
    started = warm_start(model, optimizer)
  elif warm_start is not None:
    logging.warning("Resuming from %s: the warm start (--init_from_dense "
                    "or the distillation student's init) is ignored",
                    resumed)
  record = dict(started) if isinstance(started, Mapping) else None
  return keeper, resumed, iterator, model, counters, runner, record


def _start(model_fn, *, train_dataset: tf.data.Dataset, config: TrainConfig,
           dev_datasets, strategy, sharding: sharding_lib.Sharding,
           warm_start, token_loss, recovery: checkpointing.Recovery
           ) -> _Loop:
  """The loop state of a started (or resumed) run, its start logged.

  The ``start`` record says where the run resumed from and which damaged
  checkpoints were moved aside, so the metrics log explains a resume.
  """
  model_dir = pathlib.Path(config.model_dir)
  (keeper, resumed, iterator, model, counters, runner,
   warm_record) = _restore_or_warm_start(
      model_fn, train_dataset=train_dataset, config=config,
      strategy=strategy, sharding=sharding, warm_start=warm_start,
      token_loss=token_loss, latest=recovery.latest)
  log = metrics_log.MetricsLog(model_dir / metrics_log.METRICS_FILENAME,
                               resume_step=int(counters.step.numpy()))
  line = _start_line(model_dir, recovery=recovery, resumed=resumed,
                     cut=log.cut, path=log.path)
  if line:
    logging.warning("%s", line)
  best = (checkpointing.best_keeper(model_dir, model=model)
          if config.keep_best and dev_datasets else None)
  loop = _Loop(config=config, strategy=strategy, model=model,
               runner=runner, counters=counters, keeper=keeper,
               iterator=iterator, dev_datasets=dev_datasets,
               metrics_log=log, best_keeper=best,
               devices=_device_count(strategy, sharding))
  log.write({"kind": "start", "step": loop.step, "time": time.time(),
             "devices": loop.devices,
             "mesh": str(sharding.mesh) if sharding.enabled else None,
             "device_kind": distribute.device_kind(strategy),
             "num_params": int(sum(np.prod(v.shape)
                                   for v in runner.variables)),
             "resumed_from": _relative(resumed, model_dir),
             # What a fresh run's warm start did (e.g. upcycling: the
             # dense run and step it started from); None on a resume.
             "warm_start": _relative_warm_start(warm_record, model_dir),
             "damaged_checkpoints": [
                 {"path": _relative(d.path, model_dir), "reason": d.reason,
                  "moved_to": _relative(d.moved_to, model_dir)}
                 for d in recovery.damaged],
             # Leftovers of killed saves removed, and what was cut from
             # this log, at this start (relative to the model directory).
             "removed_leftovers": [_relative(p, model_dir)
                                   for p in recovery.removed],
             "metrics_cut": dataclasses.asdict(log.cut) if log.cut else None})
  return loop


def _relative(path: str | None, model_dir: pathlib.Path) -> str | None:
  """A path for metrics.jsonl: relative to the model directory, since the
  log is copied into results/ and read on other machines."""
  return None if path is None else jsonfile.relative_path(path,
                                                          start=model_dir)


def _relative_warm_start(record: dict | None,
                         model_dir: pathlib.Path) -> dict | None:
  if record is None:
    return None
  return {key: (_relative(value, model_dir)
                if key in ("init_from_dense", "checkpoint") else value)
          for key, value in record.items()}


def _start_line(model_dir: pathlib.Path, *,
                recovery: checkpointing.Recovery, resumed: str | None,
                cut: metrics_log.Cut | None,
                path: pathlib.Path) -> str | None:
  """One line saying where the run starts, which leftovers of killed saves
  were removed and what was cut from its metrics log (None: nothing to
  say: a fresh run, or a clean resume)."""
  removed = ", ".join(pathlib.Path(p).name for p in recovery.removed)
  if resumed is None and recovery.killed_saves:
    steps = ", ".join(f"ckpt-{s}" for s in recovery.killed_saves)
    head = (f"No complete checkpoint in {model_dir}: the save of {steps} "
            f"was killed before it finished; removed its leftovers "
            f"({removed}), starting from step 0")
  elif resumed is None:
    if cut is None:
      return None
    head = (f"No checkpoint in {model_dir} (the run stopped before its "
            "first one): starting from step 0")
  else:
    head = f"Resuming from {resumed}"
    if removed:
      head += f"; removed the leftovers of killed saves ({removed})"
    elif cut is None:
      return None
  return head + (f"; {cut.describe(path)}" if cut else "")


def _run_loop(loop: _Loop, *, after_step) -> str:
  """Steps until a stop rule fires or a stop signal; returns the reason."""
  config = loop.config
  saved_at = loop.step if loop.keeper.latest else None
  evaluated_at = None
  ran_steps = False
  with checkpointing.PreemptionGuard() as guard:
    while (reason := loop.stop_reason()) is None and not guard.requested:
      ran_steps = True
      loop.run_step(after_step)
      if config.eval_every and loop.step % config.eval_every == 0:
        loop.evaluate()
        evaluated_at = loop.step
      loop.tick()
      if loop.step % config.checkpoint_every == 0:
        loop.keeper.save(loop.step)
        saved_at = loop.step
    if reason is None:
      reason = "preempted"
    final_eval = reason != "preempted" and evaluated_at != loop.step
    if final_eval and ran_steps:
      # Evaluated before the final save, so the save holds the stop state.
      loop.evaluate()
    if saved_at != loop.step:
      loop.tick()
      loop.keeper.save(loop.step)
  if final_eval and not ran_steps:
    # A finished run started again: report its dev CE, change nothing.
    loop.evaluate(track_best=False)
  loop.log.write({"kind": "end", "step": loop.step, "time": time.time(),
                  "reason": "preempted" if reason == "preempted" else "done",
                  "stopped_by": reason, "train_seconds": loop.train_seconds,
                  "train_cpu_seconds": loop.train_cpu_seconds})
  return reason
