"""Adafactor (Shazeer & Stern, 2018) over plain ``tf.Variable``s.

This is the optimiser of the GShard paper (§4, A.2): factored second moments,
no first moment (beta1 = 0), second-moment decay ``1 - t^(-0.8)``, update
clipping at 1.0 and a learning rate of 1.0 with reciprocal-square-root decay
after 10k warm-up steps.

Why our own implementation: ``keras.optimizers.Adafactor`` fails on DTensor
variables (see the repository's toolchain notes) and always allocates a
full-size ``velocity`` slot per variable even when it factors. Here a
variable of rank >= 2 gets only its row and column factors over the last two
dimensions, so an expert weight ``<float32>[E, M, H]`` has slots
``<float32>[E, M]`` and ``<float32>[E, H]`` (factored per expert) and never a
full-size second moment. The tests check it step by step against Keras.

Learning-rate convention (the one of Lingvo / T5 / Mesh TensorFlow):
``lr(t) = learning_rate * rsqrt(max(t, warmup_steps))`` for ``t = 1, 2, ...``
(``schedule="rsqrt"``), so "lr 1.0, 10k warm-up" is a constant 0.01 for the
first 10k updates, then ``1/sqrt(t)`` -- exactly the Adafactor paper's relative
step ``min(1e-2, 1/sqrt(t))``. With ``multiply_by_parameter_scale`` the step is
additionally scaled by ``max(epsilon2, RMS(x))`` (the paper's relative step).

Differences from ``keras.optimizers.Adafactor`` (documented for the oracle
test): Keras always caps the rate at ``1/sqrt(t)`` (``rho_t = min(lr,
1/sqrt(t))``) and always multiplies by the parameter scale; its schedule is
called with the 0-based ``iterations`` while the update uses ``t =
iterations + 1``. Our rate is exactly the schedule (no hidden cap), and
parameter scaling is optional. With an rsqrt schedule (which never exceeds
``1/sqrt(t)``) passed to Keras as a schedule of ``iterations + 1`` the two
agree; that is the tested setting. Keras forms the full ``v = r c / mean(r)``;
we multiply ``g`` by the row and column factors instead (equal up to rounding).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import tensorflow as tf
from absl import flags
from tensorflow.python.ops import resource_variable_ops

from m4moe import errors
from m4moe import flagutil

SCHEDULES = ("rsqrt", "constant")


class OptimizerConfigError(errors.ConfigError):
  """An optimiser setting is invalid; the message names the flag and the fix."""


_require = functools.partial(errors.require, error=OptimizerConfigError)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdafactorConfig:
  """Adafactor hyper-parameters (defaults: GShard paper / Adafactor paper).

  Attributes:
    learning_rate: multiplier of the schedule (paper: 1.0).
    warmup_steps: updates at the constant rate ``learning_rate /
      sqrt(warmup_steps)`` before the rsqrt decay starts (paper: 10000).
    schedule: ``rsqrt`` (see module docstring) or ``constant``
      (``lr(t) = learning_rate``).
    decay_exponent: second-moment decay ``beta2_t = 1 - t^(-decay_exponent)``.
    beta1: first-moment (momentum on the clipped update) decay; 0 disables
      the first-moment slot entirely (paper: 0).
    clipping_threshold: update clipping ``d``: ``u / max(1, RMS(u) / d)``;
      0 disables clipping (paper: 1.0).
    epsilon1: added to squared gradients (paper: 1e-30).
    epsilon2: lower bound of the parameter scale (paper: 1e-3).
    multiply_by_parameter_scale: scale the step by ``max(epsilon2, RMS(x))``.
    factored: factor the second moment of rank >= 2 variables over their
      last two dimensions.
  """

  learning_rate: float = 1.0
  warmup_steps: int = 10000
  schedule: str = dataclasses.field(
      default="rsqrt",
      metadata=flagutil.metadata(flag="lr_schedule", enum=SCHEDULES))
  decay_exponent: float = 0.8
  beta1: float = 0.0
  clipping_threshold: float = 1.0
  epsilon1: float = 1e-30
  epsilon2: float = 1e-3
  multiply_by_parameter_scale: bool = True
  factored: bool = True

  def __post_init__(self) -> None:
    _require(self.learning_rate > 0, "learning_rate", self.learning_rate,
             "use a positive rate (the paper uses 1.0)")
    _require(self.warmup_steps >= 1, "warmup_steps", self.warmup_steps,
             "use at least 1 (the paper uses 10000)")
    _require(self.schedule in SCHEDULES, "lr_schedule", self.schedule,
             f"choose one of {', '.join(SCHEDULES)}")
    _require(0 < self.decay_exponent <= 1, "decay_exponent",
             self.decay_exponent, "use a value in (0, 1] (the paper uses 0.8)")
    _require(0 <= self.beta1 < 1, "beta1", self.beta1,
             "use a value in [0, 1); 0 means no first moment")
    _require(self.clipping_threshold >= 0, "clipping_threshold",
             self.clipping_threshold, "use 0 (off) or a positive threshold")
    _require(self.epsilon1 > 0, "epsilon1", self.epsilon1,
             "use a tiny positive value")
    _require(self.epsilon2 >= 0, "epsilon2", self.epsilon2,
             "use a non-negative value")

  def learning_rate_at(self, step: tf.Tensor) -> tf.Tensor:
    """The rate of update number ``step`` (1-based).

    Args:
      step: <int64 or float32>[] the 1-based update count t.

    Returns:
      <float32>[] the learning rate.
    """
    step = tf.cast(step, tf.float32)
    if self.schedule == "constant":
      return tf.constant(self.learning_rate, tf.float32)
    return self.learning_rate * tf.math.rsqrt(
        tf.maximum(step, float(self.warmup_steps)))


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """One absl flag per :class:`AdafactorConfig` field (``schedule`` is
  ``--lr_schedule``), defaulting to the paper's values."""
  flagutil.define_flags(AdafactorConfig, flag_values)


def config_from_flags(flag_values: flags.FlagValues = flags.FLAGS
                      ) -> AdafactorConfig:
  """The validated config from flags defined by :func:`define_flags`."""
  return flagutil.from_flags(AdafactorConfig, flag_values)


def present_flags(flag_values: flags.FlagValues = flags.FLAGS) -> list[str]:
  """The optimiser flags given explicitly on the command line, serialised."""
  return flagutil.present_flags(AdafactorConfig, flag_values)


def _rms(x: tf.Tensor) -> tf.Tensor:
  return tf.sqrt(tf.reduce_mean(tf.square(x)))


def _store(slot: tf.Variable, value: tf.Tensor) -> tf.Tensor:
  """Assigns ``value`` to ``slot`` and returns ``value`` (not a re-read).

  The update goes on with the tensor it computed, never with the read that
  ``slot.assign(value)`` returns. Inside a ``tf.function`` that read is
  ordered after the write only by the variable's side effects, not by a data
  dependency, and DTensor's all-reduce combining pass (on by default,
  ``DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION``) re-sorts a function
  by data dependencies alone: it moves independent all-reduces together and
  the ops that consume them after. When a slot's new value needs an
  all-reduce (a statistic reduced over a dimension split over the mesh,
  e.g. ``vr`` of the dense FFN's ``wi`` <[M, F]> split on F over ``model``,
  or ``m`` after the update clipping's RMS), the write moves behind the read,
  which then sees the old slot: zeros at step 1, so ``rsqrt(0 / 0)`` made
  every model-split weight NaN, and ``m`` lagged a step. Eager execution and
  one device are unaffected; ``tests/test_optimizer_mesh.py`` checks the
  updates of model-split weights against one device.

  Args:
    slot: <float32>[...] the slot variable.
    value: <float32>[...] its new value, same shape.

  Returns:
    ``value``.
  """
  slot.assign(value, read_value=False)
  return value


class _Slots(tf.Module):
  """One variable's slots: ``vr``/``vc`` (factored) or ``v``; ``m`` if beta1."""

  def __init__(self, variable: tf.Variable, *, config: AdafactorConfig,
               index: int):
    super().__init__(name=f"slots_{index}")
    shape = variable.shape.as_list()
    base = variable.name.split(":")[0]
    self.factored = config.factored and len(shape) >= 2

    def zeros(slot_shape, suffix):
      return tf.Variable(tf.zeros(slot_shape, tf.float32), trainable=False,
                         name=f"{base}/{suffix}")

    if self.factored:
      self.vr = zeros(shape[:-1], "vr")
      self.vc = zeros(shape[:-2] + shape[-1:], "vc")
      self.v = None
    else:
      self.vr = self.vc = None
      self.v = zeros(shape, "v")
    self.m = zeros(shape, "m") if config.beta1 > 0 else None


class Adafactor(tf.Module):
  """Adafactor with factored second moments; checkpointable via tf.train.

  Usage::

    opt = Adafactor(AdafactorConfig())
    opt.build(model.trainable_variables)   # creates slots (outside tf.function)
    opt.apply_gradients(grads, model.trainable_variables)

  ``iterations`` (<int64>[]) counts applied updates; the update uses
  ``t = iterations + 1``. Slots live in ``self.slots`` (one module per
  variable, in the order given to :meth:`build`), so a ``tf.train.Checkpoint``
  holding the optimiser saves and restores them.
  """

  def __init__(self, config: AdafactorConfig = AdafactorConfig(), *,
               name: str = "adafactor", compile_updates: bool = True):
    """Creates the optimiser (slots come with :meth:`build`).

    Args:
      config: the hyper-parameters.
      name: module name.
      compile_updates: update each plain (one-device) variable with one XLA
        computation (:func:`_compiled_update`) where that is faster
        (:func:`_compiling_pays`); False keeps the op-by-op update
        everywhere. Mesh and replicated variables always take the op-by-op
        update.
    """
    super().__init__(name=name)
    self.config = config
    self.compile_updates = compile_updates
    self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False,
                                  name="iterations")
    self.slots: list[_Slots] = []
    self._variable_refs: list = []

  @property
  def built(self) -> bool:
    return bool(self._variable_refs)

  def build(self, variables: Sequence[tf.Variable]) -> None:
    """Creates the slots of ``variables`` (idempotent for the same list)."""
    refs = [v.ref() for v in variables]
    if self.built:
      if refs != self._variable_refs:
        raise ValueError("Adafactor.build was already called with a different "
                         "variable list; build one optimiser per model")
      return
    with tf.init_scope():
      self.slots = [_Slots(v, config=self.config, index=i)
                    for i, v in enumerate(variables)]
    self._variable_refs = refs

  def learning_rate(self) -> tf.Tensor:
    """<float32>[] the rate the next update will use."""
    return self.config.learning_rate_at(self.iterations + 1)

  def apply_gradients(self, gradients: Sequence[tf.Tensor],
                      variables: Sequence[tf.Variable]) -> tf.Tensor:
    """Applies one update to every variable.

    Args:
      gradients: dense gradients, one per variable, same shapes (None skips
        the variable this step).
      variables: the variables given to :meth:`build`, in the same order.

    Returns:
      <float32>[] the learning rate used.
    """
    if [v.ref() for v in variables] != self._variable_refs:
      raise ValueError("apply_gradients needs exactly the variables given to "
                       "build(), in the same order")
    step = self.iterations + 1
    lr = self.config.learning_rate_at(step)
    beta2 = 1.0 - tf.pow(tf.cast(step, tf.float32), -self.config.decay_exponent)
    for grad, var, slots in zip(gradients, variables, self.slots):
      if grad is not None:
        self._update_one(tf.convert_to_tensor(grad), var, slots, lr=lr,
                         beta2=beta2)
    self.iterations.assign_add(1)
    return lr

  def _update_one(self, grad: tf.Tensor, var: tf.Variable, slots: _Slots, *,
                  lr: tf.Tensor, beta2: tf.Tensor) -> None:
    if (self.compile_updates and _compiling_pays(self.config) and
        _compilable(var, slots)):
      _compiled_update(self.config)(grad, var, slots.v, slots.vr, slots.vc,
                                    slots.m, lr, beta2)
      return
    value, new_slots = _updated_values(
        self.config, grad, tf.cast(var, tf.float32), slots=_slot_values(slots),
        lr=lr, beta2=beta2)
    for slot, new in zip(_slot_list(slots), new_slots):
      if slot is not None:
        _store(slot, new)
    var.assign(tf.cast(value, var.dtype), read_value=False)


def _slot_list(slots: _Slots) -> tuple[tf.Variable | None, ...]:
  """(v, vr, vc, m), None for the slots this variable does not have."""
  return slots.v, slots.vr, slots.vc, slots.m


def _slot_values(slots: _Slots) -> tuple[tf.Tensor | None, ...]:
  """The current values of :func:`_slot_list`'s slots, read once."""
  return tuple(None if s is None else tf.convert_to_tensor(s)
               for s in _slot_list(slots))


def _updated_values(config: AdafactorConfig, grad: tf.Tensor,
                    value: tf.Tensor, *, slots: tuple[tf.Tensor | None, ...],
                    lr: tf.Tensor, beta2: tf.Tensor,
                    ) -> tuple[tf.Tensor, tuple[tf.Tensor | None, ...]]:
  """One variable's update as a function of tensors: no variable is touched.

  Every slot is read before any is written and each new value is the
  computed tensor (the rule of :func:`_store`), so the op-by-op path and
  the compiled path (:func:`_compiled_update`) run this same function.

  Args:
    config: the hyper-parameters.
    grad: <dtype>[...] the gradient; value: <float32>[...] the variable.
    slots: (v, vr, vc, m) current slot values (<float32>, None if absent).
    lr: <float32>[] the rate; beta2: <float32>[] the second-moment decay.

  Returns:
    (<float32>[...] the new variable value, the new (v, vr, vc, m)).
  """
  v, vr, vc, m = slots
  grad = tf.cast(grad, tf.float32)
  grad_sq = tf.square(grad) + config.epsilon1
  if vr is not None:
    vr = beta2 * vr + (1 - beta2) * tf.reduce_mean(grad_sq, axis=-1)
    vc = beta2 * vc + (1 - beta2) * tf.reduce_mean(grad_sq, axis=-2)
    row = tf.math.rsqrt(vr / tf.reduce_mean(vr, axis=-1, keepdims=True))
    col = tf.math.rsqrt(vc)
    update = grad * row[..., :, tf.newaxis] * col[..., tf.newaxis, :]
  else:
    v = beta2 * v + (1 - beta2) * grad_sq
    update = grad / tf.sqrt(v)
  if config.clipping_threshold > 0:
    update /= tf.maximum(1.0, _rms(update) / config.clipping_threshold)
  if m is not None:
    m = config.beta1 * m + (1 - config.beta1) * update
    update = m
  step_size = lr
  if config.multiply_by_parameter_scale:
    step_size = lr * tf.maximum(config.epsilon2, _rms(value))
  return value - step_size * update, (v, vr, vc, m)


def _compiling_pays(config: AdafactorConfig) -> bool:
  """Whether :func:`_compiled_update` is faster than the op-by-op update.

  Without a reduction over the whole variable, it is: the zoo's small-model
  recipe (unfactored, ``beta1``, no clipping or parameter scale) 2.3-2.6x,
  factored second moments alone 1.7x (their reductions are over rows and
  columns). The update clipping's and the parameter scale's RMS over the
  whole variable make XLA:CPU slower than TensorFlow's reduction kernels
  (the paper's setting 0.97x, unfactored with both 0.76x), so those configs
  keep the op-by-op update. One core, expert- and embedding-sized weights:
  ``results/benchmarks/adafactor_update_probe.py``.
  """
  return (config.clipping_threshold == 0 and
          not config.multiply_by_parameter_scale)


def _compilable(var: tf.Variable, slots: _Slots) -> bool:
  """Whether the update of ``var`` may run as one XLA computation.

  Plain resource variables only: a DTensor ``DVariable`` (a mesh) or a
  ``tf.distribute`` variable (one copy per replica) keeps the op-by-op
  update, whose layouts and replica semantics those types define.
  """
  plain = resource_variable_ops.ResourceVariable
  return all(type(v) is plain for v in (var,) + _slot_list(slots)
             if v is not None)


@functools.lru_cache(maxsize=None)
def _compiled_update(config: AdafactorConfig) -> Callable[..., None]:
  """The update of one variable and its slots, compiled with XLA, in place.

  Why: TensorFlow runs each elementwise op of the update as its own pass
  over the variable (about a dozen for the unfactored recipe with
  momentum: square, add, scale, ..., assign), so the update is bound by
  memory traffic, which grows with the parameter count -- 2.6x to 7.6x
  the dense model's for the MoE candidates. XLA fuses the passes into one
  loop: 2.3-2.6x faster updates on one core for the small-model recipe
  (:func:`_compiling_pays` says for which configs it pays;
  ``results/benchmarks/moe-step-overhead-round2.md``). Same formulas as
  :func:`_updated_values` (XLA may round differently, within a few ulps).
  One function per config, traced once per variable shape.
  """
  def update(grad, var, v, vr, vc, m, lr, beta2):
    slots = (v, vr, vc, m)
    value, new_slots = _updated_values(
        config, grad, tf.cast(var, tf.float32),
        slots=tuple(None if s is None else tf.convert_to_tensor(s)
                    for s in slots), lr=lr, beta2=beta2)
    for slot, new in zip(slots, new_slots):
      if slot is not None:
        slot.assign(new, read_value=False)
    var.assign(tf.cast(value, var.dtype), read_value=False)
  return tf.function(update, jit_compile=True, autograph=False)
