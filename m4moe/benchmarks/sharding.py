"""Per-device memory of the real sharded training step as E and D grow.

GShard's claim (Lepikhin et al., 2020, §5 and Table 1): with E = c*D
experts on D devices and a fixed number of tokens per device, every device
keeps the same activations and the same expert weights whatever D is. This
measures it on D virtual CPU devices (one process per D, since TensorFlow
fixes its device count at start: :func:`measure_in_subprocess` starts
``python -m m4moe.benchmarks.sharding`` once per D).

Sizes: ``devices`` (the mesh size, the paper's D); E =
``experts_per_device`` * devices experts per MoE layer; B rows of L tokens
in the global batch, ``tokens_per_device`` = B*L / devices source tokens
(as many target tokens); M d_model.

What runs: the trainer's own step (:class:`m4moe.training.step.StepRunner`
``train_step``: forward, loss, gradients, Adafactor update) of a tiny MoE
Transformer built inside :meth:`m4moe.parallel.sharding.Sharding.variable_scope`, on
the DTensor mesh ``expert:D`` (``layout="expert"``: experts split, the
GShard layout) or ``data:D`` (``layout="data"``: rows split, experts
replicated), with ``tf.config.run_functions_eagerly`` so that every op's
output is a DTensor whose layout says what each device holds. The sizes are
read from those layouts, never from :mod:`m4moe.cost.model`:

* ``per_device_activation_bytes``: the peak, over the step, of the bytes of
  the live tensors produced while the gradient tape records (the forward
  pass and the loss), each counted by its local shard shape
  (``Layout.local_shape_from_global_shape``); the peak is where the backward
  pass starts, so it is what the tape keeps for the gradients plus what the
  forward code still holds. Weight reads and their casts/relayouts are not
  activations (XLA aliases them with the variable) and are left out.
* ``per_device_expert_weight_bytes``: local shards of the expert
  ``DVariable``s; ``per_device_weight_bytes``: of all trainable variables;
  ``per_device_gradient_bytes``: the same (``StepRunner`` relays every
  gradient out like its variable before the update);
  ``per_device_optimizer_bytes``: local shards of Adafactor's variables.
* ``per_device_total_bytes``: weights + gradients + optimiser + activations
  (the sum :class:`m4moe.cost.model.DeviceEstimate` estimates as ``total_bytes``).

``cost_model_*`` are :func:`m4moe.cost.model.estimate_device` for the same model,
mesh axes and batch, for both executions (:data:`m4moe.cost.model.EXECUTIONS`):
``cost_model_activation_bytes`` / ``cost_model_total_bytes`` are the
``fused`` estimate (what a compiled XLA/TPU program keeps, one tensor per
sub-layer); ``cost_model_unfused_*`` the ``unfused`` one (every tensor
TensorFlow's kernel-by-kernel tape keeps, :mod:`m4moe.cost.unfused`), the
execution this benchmark measures: eager DTensor keeps what the eager tape
keeps, so ``cost_model_unfused_activations_vs_measured`` is the check of the
model, and the measured activations are an upper bound of a compiled
step's.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import subprocess
import sys
import weakref
from typing import Any, Sequence

LAYOUTS = ("expert", "data")

# Ops that only re-express a weight (no new activation): their output is
# counted as a weight copy when their first input is one.
_WEIGHT_VIEW_OPS = frozenset({
    "ReadVariableOp", "Identity", "Cast", "Relayout", "RelayoutLike",
    "CopyToMesh", "Reshape"})
# Ops whose output may be the same buffer as their input (see
# _LiveActivations).
_ALIAS_OPS = frozenset({"Identity", "Relayout"})


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardingPoint:
  """One mesh size of the sweep (tiny MoE dimensions).

  Attributes:
    devices: D, virtual CPU devices and mesh size.
    experts_per_device: E / D.
    tokens_per_device: T source tokens per device (B*L/D; as many targets).
    sequence_length: L; T must be a multiple of it.
    layout: ``"expert"`` (mesh ``expert:D``) or ``"data"`` (``data:D``).
    d_model, num_heads, d_kv, d_ff, expert_hidden_dim, num_layers,
      vocab_size: model size (num_layers per stack, every other FFN an MoE
      layer). The defaults are the tiny model of runs 1-3 in
      ``results/benchmarks.md``.
  """

  devices: int
  experts_per_device: int = 4
  tokens_per_device: int = 64
  sequence_length: int = 8
  layout: str = "expert"
  d_model: int = 32
  num_heads: int = 2
  d_kv: int = 16
  d_ff: int = 64
  expert_hidden_dim: int = 64
  num_layers: int = 2
  vocab_size: int = 64

  def __post_init__(self) -> None:
    # Named by m4moe-bench's flags (--hidden_dim sets F and H).
    sizes = (("model_dim", self.d_model), ("num_heads", self.num_heads),
             ("d_kv", self.d_kv), ("hidden_dim", self.d_ff),
             ("hidden_dim", self.expert_hidden_dim),
             ("sequence_length", self.sequence_length),
             ("vocab_size", self.vocab_size), ("num_layers", self.num_layers))
    for name, value in sizes:
      if value < 1:
        raise ValueError(f"--{name}={value} must be >= 1")
    if self.devices < 1 or self.experts_per_device < 1:
      raise ValueError(f"devices={self.devices} and experts_per_device="
                       f"{self.experts_per_device} must be >= 1")
    if self.layout not in LAYOUTS:
      raise ValueError(f"--sharding_layouts: {self.layout!r} is unknown; use "
                       f"{' or '.join(LAYOUTS)}")
    if (self.tokens_per_device < self.sequence_length or
        self.tokens_per_device % self.sequence_length):
      raise ValueError(
          f"--tokens_per_device={self.tokens_per_device} must be a positive "
          f"multiple of --sequence_length={self.sequence_length}")

  @property
  def experts(self) -> int:
    return self.experts_per_device * self.devices

  @property
  def rows(self) -> int:
    """B, rows of the global batch."""
    return self.devices * self.tokens_per_device // self.sequence_length

  @property
  def mesh(self) -> str:
    return f"{self.layout}:{self.devices}"

  def model_flags(self) -> tuple[str, ...]:
    """Flags over ``tiny/moe``: one dispatch group of T tokens per device."""
    return (f"--d_model={self.d_model}", f"--num_heads={self.num_heads}",
            f"--d_kv={self.d_kv}",
            f"--d_ff={self.d_ff}", f"--num_encoder_layers={self.num_layers}",
            f"--num_decoder_layers={self.num_layers}",
            f"--num_experts={self.experts}",
            f"--expert_hidden_dim={self.expert_hidden_dim}",
            f"--group_size={self.tokens_per_device}",
            f"--src_vocab_size={self.vocab_size}",
            f"--tgt_vocab_size={self.vocab_size}",
            f"--max_length={self.sequence_length}", "--dispatch=einsum",
            # pin_random draws every random tensor whole on each device (see
            # m4moe.parallel.sharding), a D-proportional term that is not the MoE's.
            "--dropout_rate=0", "--attention_dropout_rate=0",
            "--expert_dropout_rate=0")


def _local_bytes(t: Any) -> int:
  """Bytes one device holds of ``t`` (its DTensor shard, or all of it)."""
  from tensorflow.experimental import dtensor  # pylint: disable=g-import-not-at-top
  shape = t.shape.as_list()
  if dtensor.is_dtensor(t):
    shape = dtensor.fetch_layout(t).local_shape_from_global_shape(shape)
  size = 1
  for n in shape:
    size *= int(n)
  return size * t.dtype.size


class _LiveActivations:
  """Op callback: running and peak local bytes of forward-pass tensors.

  Every output of an op executed while a gradient tape records is counted
  until Python frees it (a weak reference's callback subtracts it), unless
  it is a view of a variable (a read and its casts, reshapes, relayouts).
  The output of an ``Identity`` or ``Relayout`` (a sharding annotation) that
  keeps its input's local shape shares its input's buffer, as in a compiled
  program: the bytes count once, until the last of them is freed.
  """

  def __init__(self) -> None:
    self.live = 0
    self.peak = 0
    self.tensors = 0
    # Live bytes by the op type that produced them, and their copy at the peak.
    self.live_by_op: dict[str, int] = {}
    self.peak_by_op: dict[str, int] = {}
    # id(tensor) -> (weak reference, buffer [bytes, holders, op type]).
    self._buffers: dict[int, tuple[weakref.ref, list[Any]]] = {}
    self._weights: dict[int, weakref.ref] = {}

  def _is_weight(self, t: Any) -> bool:
    ref = self._weights.get(id(t))
    return ref is not None and ref() is t

  def _buffer(self, t: Any) -> list[Any] | None:
    entry = self._buffers.get(id(t))
    return entry[1] if entry is not None and entry[0]() is t else None

  def __call__(self, op_type, inputs, attrs, outputs, op_name=None,
               graph=None):
    del attrs, op_name
    from tensorflow.python.eager import record  # pylint: disable=g-import-not-at-top
    if graph is not None or not record.could_possibly_record():
      return None
    if isinstance(op_type, bytes):
      op_type = op_type.decode()
    # A view of a tensor the step did not compute (a DVariable's read runs in
    # DTensor's device, out of sight of op callbacks) is a weight view too.
    weight_view = op_type in _WEIGHT_VIEW_OPS and (
        op_type == "ReadVariableOp" or (inputs and (
            self._is_weight(inputs[0]) or self._buffer(inputs[0]) is None)))
    for out in outputs:
      key = id(out)
      if weight_view:
        self._weights[key] = weakref.ref(
            out, lambda _, k=key: self._weights.pop(k, None))
        continue
      size = _local_bytes(out)
      buffer = None
      if op_type in _ALIAS_OPS and inputs:
        buffer = self._buffer(inputs[0])
        if buffer is not None and buffer[0] != size:
          buffer = None
      if buffer is None:
        buffer = [size, 0, op_type]
        self.live += size
        self.live_by_op[op_type] = self.live_by_op.get(op_type, 0) + size
        self.tensors += 1
        if self.live > self.peak:
          self.peak = self.live
          self.peak_by_op = dict(self.live_by_op)
      buffer[1] += 1
      self._buffers[key] = (weakref.ref(
          out, lambda _, k=key, b=buffer: self._dead(k, b)), buffer)
    return None

  def _dead(self, key: int, buffer: list[Any]) -> None:
    self._buffers.pop(key, None)
    buffer[1] -= 1
    if not buffer[1]:
      self.live -= buffer[0]
      self.live_by_op[buffer[2]] -= buffer[0]


def _build_step(point: ShardingPoint):
  """(model config, sharding, variables, optimiser, step runner) of the
  trainer's own step on the point's mesh, so the measured memory is the
  trainer's and not a stand-in's."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from m4moe import config as config_lib  # pylint: disable=g-import-not-at-top
  from m4moe.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  from m4moe.parallel import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  from m4moe.training import optimizer as optimizer_lib  # pylint: disable=g-import-not-at-top
  from m4moe.training import step as step_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.load_model_config("tiny/moe", point.model_flags())
  sharding = sharding_lib.make_sharding(
      point.mesh, devices=[f"CPU:{i}" for i in range(point.devices)])
  tf.random.set_seed(0)
  with sharding.variable_scope():
    model = model_lib.Transformer(config=config, sharding=sharding)
    variables = list(model.trainable_variables)
    optimizer = optimizer_lib.Adafactor(optimizer_lib.AdafactorConfig())
    optimizer.build(variables)
  runner = step_lib.StepRunner(
      model=model, optimizer=optimizer, variables=variables,
      strategy=tf.distribute.get_strategy(), label_smoothing=0.1,
      sharding=sharding)
  return config, sharding, variables, optimizer, runner


def _counted_step(point: ShardingPoint, runner, sharding):
  """(step result, activation counter) of one eager step on random tokens.

  Eager, so that every op's output is a DTensor whose layout says what each
  device holds (a compiled function hides its intermediate tensors).
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.experimental import dtensor  # pylint: disable=g-import-not-at-top
  from tensorflow.python.framework import op_callbacks  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  shape = (point.rows, point.sequence_length)
  batch = {k: rng.integers(3, point.vocab_size, size=shape).astype(np.int32)
           for k in ("inputs", "targets")}
  counter = _LiveActivations()
  tf.config.run_functions_eagerly(True)
  gc.collect()
  op_callbacks.add_op_callback(counter)
  try:
    with dtensor.default_mesh(sharding.device_mesh):
      result = runner.train_step([batch],
                                 seed=tf.constant([0, 1], tf.int32))
  finally:
    op_callbacks.remove_op_callback(counter)
    tf.config.run_functions_eagerly(False)
  return result, counter


def _state_bytes(variables, optimizer, sharding) -> tuple[int, int, int]:
  """Per-device (weight, expert weight, optimiser) bytes, read from the
  variables' local shards."""
  # Split over "expert" (the variable rules also split dense weights over
  # "model").
  experts = [v for v in variables
             if "expert" in tuple(sharding.spec_for(v.name.split(":")[0])
                                  or ())]
  weight_bytes = sum(_local_bytes(v.read_value()) for v in variables)
  expert_bytes = sum(_local_bytes(v.read_value()) for v in experts)
  optimizer_bytes = sum(_local_bytes(v.read_value())
                        for v in optimizer.variables)
  return weight_bytes, expert_bytes, optimizer_bytes


def _cost_model_fields(config, point: ShardingPoint, *, measured_total: int,
                       measured_activations: int) -> dict[str, Any]:
  """The cost model's estimates of the same step, fused and unfused, and
  their ratios to the measurement (the check of the cost model)."""
  from m4moe.cost import model as cost  # pylint: disable=g-import-not-at-top
  estimate, unfused = (cost.estimate_device(
      config, data_axis=point.devices if point.layout == "data" else 1,
      expert_axis=point.devices if point.layout == "expert" else 1,
      batch_tokens=point.devices * point.tokens_per_device,
      sequence_length=point.sequence_length, execution=execution)
                       for execution in ("fused", "unfused"))
  return {
      "cost_model_activation_bytes": estimate.activation_bytes,
      "cost_model_expert_weight_bytes":
          4 * estimate.expert_params_per_device,
      "cost_model_total_bytes": estimate.total_bytes,
      "cost_model_total_vs_measured": estimate.total_bytes / measured_total,
      "cost_model_unfused_activation_bytes": unfused.activation_bytes,
      "cost_model_unfused_total_bytes": unfused.total_bytes,
      "cost_model_unfused_activations_vs_measured":
          unfused.activation_bytes / measured_activations,
      "cost_model_unfused_total_vs_measured":
          unfused.total_bytes / measured_total,
  }


def measure(point: ShardingPoint) -> dict[str, Any]:
  """Runs one real sharded training step; returns the JSON record.

  The process must have ``point.devices`` CPU devices
  (:func:`m4moe.parallel.sharding.configure_virtual_cpus`, first thing).
  """
  from m4moe.benchmarks import timing  # pylint: disable=g-import-not-at-top
  config, sharding, variables, optimizer, runner = _build_step(point)
  result, counter = _counted_step(point, runner, sharding)
  weight_bytes, expert_bytes, optimizer_bytes = _state_bytes(
      variables, optimizer, sharding)
  total = 2 * weight_bytes + optimizer_bytes + counter.peak
  return {
      "benchmark": "sharding", **dataclasses.asdict(point),
      "mesh": point.mesh, "experts": point.experts, "rows": point.rows,
      "per_device_activation_bytes": counter.peak,
      "activation_tensors": counter.tensors,
      "activation_bytes_by_op": dict(sorted(
          ((op, n) for op, n in counter.peak_by_op.items() if n),
          key=lambda item: -item[1])),
      "per_device_expert_weight_bytes": expert_bytes,
      "per_device_weight_bytes": weight_bytes,
      "per_device_gradient_bytes": weight_bytes,
      "per_device_optimizer_bytes": optimizer_bytes,
      "per_device_total_bytes": total,
      **_cost_model_fields(config, point, measured_total=total,
                           measured_activations=counter.peak),
      "loss": result.objective, "update_applied": result.applied,
      **timing.machine(),
  }


def measure_in_subprocess(point: ShardingPoint, *,
                          timeout: float = 1800.0) -> dict[str, Any]:
  """:func:`measure` in a fresh process with ``point.devices`` CPU devices.

  Raises:
    RuntimeError: the process failed or printed no record (its exit code
      and the tail of its stderr are in the message).
  """
  try:
    proc = subprocess.run(
        [sys.executable, "-m", "m4moe.benchmarks.sharding",
         json.dumps(dataclasses.asdict(point))],
        capture_output=True, text=True, timeout=timeout, check=False)
  except subprocess.TimeoutExpired:
    raise RuntimeError(f"sharding benchmark on {point.mesh} took more than "
                       f"{timeout:.0f} s; it was stopped") from None
  lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
  if proc.returncode or not lines:
    raise RuntimeError(f"sharding benchmark on {point.mesh} failed (exit "
                       f"{proc.returncode}): {proc.stderr[-3000:]}")
  return json.loads(lines[-1])


def _main(argv: Sequence[str]) -> None:
  """Child process: ``python -m m4moe.benchmarks.sharding '<point json>'``."""
  point = ShardingPoint(**json.loads(argv[1]))
  from m4moe.parallel import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  sharding_lib.configure_virtual_cpus(point.devices)
  from m4moe.benchmarks import timing  # pylint: disable=g-import-not-at-top
  timing.emit(measure(point))


if __name__ == "__main__":
  _main(sys.argv)
