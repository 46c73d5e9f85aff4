"""GShard-style sharding annotations (paper §3.2) over a named device mesh.

Model code is written as for one huge device and calls three annotations on
a :class:`Sharding` object that it received at construction (there is no
global "current mesh"):

* ``sharding.replicate(t)``: every device holds all of ``t``;
* ``sharding.split(t, dim=d, axis="expert")``: dimension ``d`` of ``t`` is
  split evenly over the mesh axis ``"expert"``, other dimensions are whole;
* ``sharding.shard(t, spec)``: several dimensions at once; ``spec`` has one
  entry per leading dimension, a mesh axis name or None, e.g.
  ``("data", None, "model")``. Missing trailing entries mean None.

Annotations never change a tensor's logical shape or values. An axis name
that the mesh lacks means "not split" (so ``split(x, dim=0, axis="expert")``
is a no-op on ``--mesh=data:8``). With :data:`NO_SHARDING` every annotation
returns its input unchanged.

Backends (``Sharding.backend``):

* ``"none"``: annotations are identities (one device, or no mesh given).
* ``"dtensor"``: TensorFlow DTensor. Annotations are ``dtensor.relayout``;
  variables created through :meth:`Sharding.variable` or inside
  :meth:`Sharding.variable_scope` are ``DVariable``s with a layout, so each
  device stores only its shard (e.g. E/n experts). Works on virtual CPU
  devices (:func:`configure_virtual_cpus`), GPUs and TPUs.
* ``"xla"``: annotations become XLA ``Sharding`` custom-calls
  (``sharding={devices=[...]}`` in the HLO) inside ``jit_compile`` functions,
  the input of XLA's SPMD partitioner (TPU). Outside XLA they are identities.

Dimensions of the annotation points (glossary letters, :mod:`m4moe`):

  G: groups; S: group size; E: experts; C: capacity; M: d_model;
  H: expert hidden; B: batch rows; L: length; A: heads; D: d_kv; F: d_ff.

Annotations (GShard Algorithm 2): inputs <[G, S, M]>: split(dim=0,
axis=batch axis); router weight <[M, E]>: replicate; dispatched
<[E, G, C, M]>: split(dim=0, axis="expert") (GShard's AllToAll on
``expert:D``; on data x expert meshes see below); expert weights
<[E, M, H]>, <[E, H, M]>: split on E over "expert" and on H over "model";
expert outputs <[E, G, C, M]>: split(dim=0, axis="expert"); combined
outputs <[G, S, M]>: split(dim=0, axis=batch axis).

The batch axis (:attr:`Sharding.batch_axis`) splits batch rows and dispatch
groups: ``data``, or ``expert`` on a mesh without a ``data`` axis
(``expert:D``, ``data:1,expert:D``, ``expert:D,model:M``). There, as in
GShard, the same D devices hold the tokens (B and G split over ``expert``)
and the experts (E split over ``expert``): every dense layer runs on B/D
rows, and the MoE dispatch moves the buffers <[E, G, C, M]> from G-split
to E-split with one AllToAll, and back for the combine.

Tensor parallelism (Megatron-style; the ``model`` axis; Switch §5's
data + model + expert mixtures): on a mesh with a ``model`` axis,
``MultiHeadAttention`` annotates q/k/v <[B, L, A, D]> and the context split on
A over ``model`` (``wq``/``wk``/``wv`` <[M, A, D]> column-split, ``wo``
<[A, D, M]> row-split) and its output <[B, L, M]> whole on ``model``;
``DenseFfn`` annotates its hidden <[B, L, F]> split on F (``wi`` <[M, F]>
column-split, ``wo`` <[F, M]> row-split) and its output whole;
``FeedForwardExperts`` annotates the hidden <[E, G, C, H]> split on H. So
each block computes head-/column-local up to the row-split projection, and
the partitioner inserts one all-reduce over ``model`` per block in the
forward pass (one more, on the block's input gradient, backwards). B stays
on ``data`` where ``data`` divides it. The ``model`` axis size must divide
``--num_heads``, ``--d_ff`` and ``--expert_hidden_dim``
(:func:`m4moe.parallel.mesh.validate_mesh`). Without a ``model`` axis these
annotations are skipped. Tested: on ``model:2``, ``data:2,model:2`` and
``data:2,expert:2,model:2`` the loss, gradients and updated weights of one
training step equal one device grouping per data shard
(``tests/test_sharding_train_step.py``), and Adafactor's update of
model-split weights equals one device (``tests/test_optimizer_mesh.py``;
it once read its slots before DTensor had written them, see
``m4moe.training.optimizer._store``).

Where the model calls it (``MoeLayer(..., sharding=s)``, threaded from
``Transformer(..., sharding=s)``): the batch's tokens, as D = size of the
batch axis shards ``<[D, N/D, M]>``, are split on D over it
(``shard_tokens``); after grouping, ``grouped`` and its mask are split on G
over the batch axis; in ``FeedForwardExperts`` the dispatched
buffers ``<[E, G, C, M]>`` are split on E over ``expert``, with G kept on
``data`` on a data x expert mesh (so it does not repeat an expert's work
per data row) and whole on ``expert:D`` (the AllToAll), ``wi``/``wo`` on
E, the expert outputs likewise and then back to G on the batch axis (the
reverse AllToAll); the combined output is split on G over the batch axis.
A G that the batch axis does not divide (an odd eval batch, a decoding
step) is left whole. Under a mesh the experts use the batched
einsums (an unstack over E would gather every expert on every device), and
``--dispatch=index`` (or ``sorted``) runs the per-group gathers
(``grouped_index``, :func:`m4moe.moe.dispatch.resolve_dispatch`) on either
backend, whose every gather stays within a device's groups; under DTensor
the expert-choice router dispatches with the one-hot einsums.

What DTensor emits (read from its MLIR after ``DTensorSPMDExpansion``,
dumped with ``TF_CPP_VMODULE=dtensor_mlir_passes=4`` and
``TF_DUMP_GRAPH_PREFIX``; ``tests/test_sharding_dtensor.py``): on
``expert:4`` and ``expert:8`` the MoE layer's forward and backward pass
have four ``DTensorAllToAll`` (dispatch, combine and their gradients; later
lowered to ``CollectiveAllToAllV2``) and no ``DTensorAllGather``. On a
data x expert mesh (both axes > 1) the groups are split on ``data`` only:
a DTensor layout maps one tensor dimension to one mesh axis, so G (and B)
cannot be split over ``data`` and ``expert`` at once, and every device of
a ``data`` row holds the same groups. Going to the E-split buffers is then
a local slice (``DTensorAllScatter``) and the way back an all-gather of the
expert outputs over ``expert`` (``DTensorAllGather``), not GShard's
AllToAll; for GShard's layout on D devices use ``--mesh=expert:D``.

Local group dispatching (GShard §3.2; ``MoeLayer._group``): each shard of
the batch axis forms its groups from its own tokens. With D = size of the
batch axis dividing the batch's B rows (``MoeLayer.group_shards``), the N = B*L
tokens are D shards of B/D whole rows; within each shard the real tokens
move to the front and the shard is cut into G_local groups, G = D*G_local,
group g from shard g // G_local. The compaction (a stable sort per shard)
and the gathers are batched over D, so no op moves a token to another data
shard (under DTensor each op's layout stays split on ``data``, checked in
``tests/test_sharding_dtensor.py``). The grouping depends on D, as GShard's
groups are per device: with padding, a ``data:2`` mesh routes some tokens
differently from one device grouping the whole batch. A one-device
reference with the mesh's grouping is the same model built with
``make_sharding(mesh, backend="xla")`` and run outside XLA (the
annotations are identities there). D = 1 (no mesh, no ``data`` axis, or a
B the axis does not divide, e.g. an odd eval batch) groups the whole batch.

Randomness: DTensor draws a stateless random op per shard of its output
layout, so every random draw of the model (dropout, attention dropout, the
routers' policies/jitter/noise, expert dropout) goes through
:meth:`Sharding.pin_random`, which makes it the single-device draw on any
mesh.

Training on a mesh (what ``m4moe-train --mesh`` does; see
``m4moe.training.loop.train(sharding=...)`` and ``tests/test_train_mesh.py``)::

  m4moe-train --config=tiny/moe --synthetic_data --model_dir=runs/mesh \
      --num_cpu_devices=8 --mesh=data:2,expert:4 --train_steps=100

builds ``make_sharding(mesh)`` over all local devices (DTensor), creates the
Transformer and Adafactor inside :meth:`Sharding.variable_scope` (the layouts
of :func:`default_variable_rules`: expert weights split on E and H,
attention on heads and the dense FFN on d_ff over ``model``, their factored
slots following, the rest replicated), puts each
batch with its rows split over ``data``, relayouts gradients like their
variables (:meth:`Sharding.like_variables`) and checkpoints DVariables;
such a checkpoint restores on any mesh or on one device (the input iterator
is not checkpointed on a mesh: a resumed run skips the consumed batches).
In a library program::

  sharding_lib.configure_virtual_cpus(8)       # first thing in the process
  s = sharding_lib.make_sharding("data:2,expert:4")
  with s.variable_scope():                      # experts -> E-split DVariables
    model = Transformer(config=config, sharding=s)
    optimizer = Adafactor(...); optimizer.build(model.trainable_variables)
  batch = {k: s.put(v, ("data",)) for k, v in batch.items()}
  # (with "data:2,expert:2,model:2", wq <[M, A, D]> is stored as
  # <[M, A/2, D]> per device, experts' wi <[E, M, H]> as <[E/2, M, H/2]>)
  # then StepRunner(..., sharding=s), or ordinary tf.functions, with
  # s.like_variables(grads, variables) before the optimiser update.

Known DTensor (TF 2.21) limitation: indexing that adds an axis while leaving
trailing dimensions implicit, e.g. ``t[:, tf.newaxis]`` or ``t[None]`` on a
rank >= 2 tensor, crashes layout propagation (segfault or "ComputeLayoutForward
error"); write ``tf.expand_dims(t, 1)`` or spell out every dimension
(``t[:, tf.newaxis, :]``). ``t[..., tf.newaxis]`` is fine.

TPU VM recipe (XLA backend; not runnable here, no TPU)::

  # On a Cloud TPU VM (e.g. a v3-8, 8 cores: the mesh below multiplies to
  # the core count TensorFlow reports), same TensorFlow version as here:
  pip install tensorflow-tpu==2.21.0 -f \
      https://storage.googleapis.com/libtpu-tf-releases/index.html
  pip install -e /path/to/m4moe
  # Data: the TFDS dataset m4moe-build-corpus --tfds_data_dir wrote, in a
  # GCS bucket in the TPU's region (gs:// is read directly); checkpoints
  # and metrics on the VM's disk (copied to the bucket afterwards,
  # docs/tpu.md).
  m4moe-train --config=gshard/moe_128e_12l --tpu=local \
      --tfds_name=m4moe_corpus \
      --tfds_data_dir=gs://BUCKET/tensorflow_datasets \
      --model_dir=$HOME/runs/moe128 --mesh=data:2,expert:4

With ``--tpu`` and ``--mesh``, ``m4moe-train`` builds a ``TPUStrategy``
with one replica spanning all cores (``DeviceAssignment.build(topology,
computation_shape=topology.mesh_shape, num_replicas=1)``) and
``experimental_spmd_xla_partitioning=True``, and
``make_sharding(mesh, backend="xla")``: every annotation becomes an HLO
``sharding={devices=[...]}`` custom-call that XLA's SPMD partitioner uses
(:func:`hlo_shardings` reads them back from
``f.experimental_get_compiler_ir(*args)(stage="hlo")``; the tests check the
annotated train step's HLO on CPU). Off TPU, TensorFlow's ``jit_compile``
builds one XLA partition (its ``GetExecutableBuildOptions`` sets neither
``num_partitions`` nor ``use_spmd_partitioning``), so on CPU the SPMD
partitioner never runs: the optimized HLO has no collectives and the
annotations are dropped (``tests/test_local_groups.py`` asserts both).
The mesh must use every core. Nothing
of the TPU path has run on a TPU: variables are not split by the XLA
backend (only activations and the expert einsums' operands are annotated),
so expect to add ``strategy.experimental_split_to_logical_devices`` for the
expert weights there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor
from tensorflow.python.compiler.xla.experimental import xla_sharding

from m4moe.parallel.mesh import KNOWN_AXES, MeshError, MeshShape, PartitionSpec
from m4moe.parallel.mesh import check_divisible, check_spec, validate_mesh

__all__ = [
    "BACKENDS", "KNOWN_AXES", "MeshError", "MeshShape", "NO_SHARDING",
    "PartitionSpec", "Sharding", "VariableRule", "configure_virtual_cpus",
    "default_variable_rules", "export_unsharded", "hlo_shardings",
    "make_sharding", "slot_specs", "validate_mesh",
]

BACKENDS = ("none", "dtensor", "xla")

# (regular expression searched in the variable's full name, spec).
VariableRule = tuple[str, PartitionSpec]


# Adafactor (:class:`m4moe.training.optimizer.Adafactor`) names a variable's slots
# ``<variable>/vr`` (row statistics, the last dimension reduced),
# ``<variable>/vc`` (column statistics, the second-to-last reduced), ``/v``
# and ``/m`` (the variable's shape).
_ROW_SLOT, _COL_SLOT, _FULL_SLOTS = "/vr", "/vc", ("/v", "/m")

# (variable name pattern, the weight's full spec): the Megatron/GShard layout.
_WEIGHT_SPECS: tuple[VariableRule, ...] = (
    # Experts: wi <[E, M, H]> on E and H, wo <[E, H, M]> on E and H.
    (r"(^|/)experts?/wi", ("expert", None, "model")),
    (r"(^|/)experts?/wo", ("expert", "model", None)),
    # Attention: wq/wk/wv <[M, A, D]> column-split on heads A, wo <[A, D, M]>
    # row-split on A.
    (r"(^|/)\w*attention/w[qkv]", (None, "model", None)),
    (r"(^|/)\w*attention/wo", ("model", None, None)),
    # Dense FFN: wi <[M, F]> column-split on F, wo <[F, M]> row-split on F.
    (r"(^|/)ffn/wi", (None, "model")),
    (r"(^|/)ffn/wo", ("model", None)),
)


def slot_specs(spec: PartitionSpec) -> dict[str, PartitionSpec]:
  """Specs of Adafactor's slots of a weight laid out by a full-rank ``spec``.

  The row statistics drop the weight's last dimension, the column statistics
  its second-to-last, so each slot stays split like the dimensions it keeps:
  e.g. experts' wi ``("expert", None, "model")`` <[E, M, H]> gives
  ``vr`` <[E, M]> ``("expert", None)`` and ``vc`` <[E, H]>
  ``("expert", "model")``.
  """
  spec = tuple(spec)
  specs = {_ROW_SLOT: spec[:-1], _COL_SLOT: spec[:-2] + spec[-1:]}
  specs.update({suffix: spec for suffix in _FULL_SLOTS})
  return specs


def default_variable_rules() -> tuple[VariableRule, ...]:
  """Layout rules for the model's variables and their optimiser slots.

  Expert weights ``wi`` <float32>[E, M, H] and ``wo`` <float32>[E, H, M] are
  split on E over ``expert`` and on H over ``model``; attention ``wq``,
  ``wk``, ``wv`` <float32>[M, A, D] on the heads A over ``model`` and its
  output ``wo`` <float32>[A, D, M] on A; the dense FFN's ``wi``
  <float32>[M, F] on F (columns) and ``wo`` <float32>[F, M] on F (rows).
  Adafactor's slots of each (named ``<weight>/vr``, ``/vc``, ``/v``, ``/m``)
  follow the dimensions they keep (:func:`slot_specs`). Other variables under
  an ``experts`` scope are split on their leading dimension over ``expert``;
  everything else (embeddings, layer norms, the router <float32>[M, E]) is
  replicated. An axis absent from the mesh means "not split", so on
  ``data:2,expert:4`` only the experts' E is split.
  """
  rules: list[VariableRule] = []
  for pattern, spec in _WEIGHT_SPECS:
    for suffix, slot_spec in slot_specs(spec).items():
      rules.append((f"{pattern}{re.escape(suffix)}$", slot_spec))
    rules.append((f"{pattern}$", spec))
  rules.append((r"(^|/)experts?(/|$)|(^|/)expert_w[io]", ("expert",)))
  return tuple(rules)


@dataclasses.dataclass(frozen=True)
class Sharding:
  """An immutable sharding context held by modules; see the module docstring.

  Build it with :func:`make_sharding`. Attributes:
    mesh: the named mesh shape, None for no sharding.
    backend: one of :data:`BACKENDS`.
    device_mesh: the backend's mesh (``dtensor.Mesh`` for DTensor, a numpy
      device-id array shaped like the mesh for XLA), None otherwise.
  """

  mesh: MeshShape | None = None
  backend: str = "none"
  device_mesh: Any = dataclasses.field(default=None, compare=False, repr=False)

  def __post_init__(self) -> None:
    if self.backend not in BACKENDS:
      raise MeshError(f"sharding backend {self.backend!r} is unknown; choose "
                      f"one of {', '.join(BACKENDS)}")
    if (self.backend == "none") != (self.mesh is None):
      raise MeshError("backend 'none' goes with mesh=None and vice versa; "
                      "build Sharding objects with make_sharding()")

  @property
  def enabled(self) -> bool:
    return self.backend != "none"

  @property
  def batch_axis(self) -> str:
    """The mesh axis that splits batch rows and dispatch groups.

    :attr:`m4moe.parallel.mesh.MeshShape.batch_axis`: ``"data"``, except on a mesh
    without a ``data`` axis > 1 but with an ``expert`` axis > 1 (``expert:D``,
    ``data:1,expert:D``, ``expert:D,model:M``): there the rows and groups
    are split over ``expert``, the devices that also hold the experts, as in
    GShard (G and E both split over all D devices; the dispatch is an
    AllToAll from the G-split to the E-split buffers). A DTensor layout maps
    one tensor dimension to one mesh axis, so on a ``data`` x ``expert`` mesh
    (both > 1) the rows and groups are split over ``data`` only. ``"data"``
    without a mesh (an absent axis means "not split").
    """
    return "data" if self.mesh is None else self.mesh.batch_axis

  # --- annotations --------------------------------------------------------

  def replicate(self, t: tf.Tensor, *, name: str | None = None) -> tf.Tensor:
    """Annotates ``t`` (any dtype/shape) as fully replicated."""
    return self.shard(t, (), name=name or "replicate")

  def pin_random(self, t: tf.Tensor, *, name: str | None = None) -> tf.Tensor:
    """Annotates a fresh stateless random draw so it is the same on any mesh.

    DTensor expands a stateless random op (``tf.random.stateless_uniform``,
    ``stateless_normal``, ...) per shard of the output layout that layout
    propagation gives it, with the seed folded with the shard, so a sharded
    consumer (e.g. a G-split router, a B-split dropout) would see other
    numbers than one device. Replicating the draw directly after the op
    makes every device draw the whole tensor from the same seed: the
    single-device values whatever the mesh, at the price of computing (not
    storing: consumers take their slice) the full draw on each device. Call
    it on the random op's output, before any arithmetic.

    Args:
      t: <any>[...] the output of a stateless random op.
      name: name of the annotation.

    Returns:
      ``t``, annotated replicated (unchanged without a mesh).
    """
    return self.replicate(t, name=name or "random")

  @tf.autograph.experimental.do_not_convert
  def divides(self, size: int | None, axis: str) -> bool:
    """Whether a dimension of static ``size`` can be split over ``axis``.

    True without a mesh or for an axis the mesh lacks; False for an
    unknown (None) size under a mesh axis of size > 1.
    """
    if self.mesh is None:
      return True
    parts = self.mesh.axis_size(axis)
    return parts == 1 or (size is not None and size % parts == 0)

  def split(self, t: tf.Tensor, *, dim: int, axis: str,
            name: str | None = None) -> tf.Tensor:
    """Annotates dimension ``dim`` of ``t`` as split over mesh axis ``axis``."""
    rank = t.shape.rank
    if dim < 0:
      dim += rank
    if not 0 <= dim < rank:
      raise MeshError(f"split: dim={dim} is out of range for rank {rank}")
    spec = [None] * rank
    spec[dim] = axis
    return self.shard(t, tuple(spec), name=name or f"split_{axis}")

  def shard(self, t: tf.Tensor, spec: Sequence[str | None], *,
            name: str | None = None) -> tf.Tensor:
    """Annotates ``t`` with a partition spec (one entry per leading dim)."""
    check_spec(spec)
    if not self.enabled:
      return t
    spec = self._full_spec(spec, t.shape.rank)
    check_divisible(t.shape.as_list(), spec, self.mesh,
                    what=f"sharding annotation {name or 'shard'!r}")
    if self.backend == "dtensor":
      return dtensor.relayout(self._on_mesh(t), self.layout(spec))
    return self._xla_annotate(t, spec, name=name or "shard")

  # --- helpers ---------------------------------------------------------------

  def _full_spec(self, spec: Sequence[str | None], rank: int) -> PartitionSpec:
    if len(spec) > rank:
      raise MeshError(f"partition spec {tuple(spec)} is longer than the "
                      f"tensor's rank {rank}")
    return self.mesh.mesh_axes_of(tuple(spec) + (None,) * (rank - len(spec)))

  def layout(self, spec: Sequence[str | None], *,
             rank: int | None = None) -> dtensor.Layout:
    """The DTensor layout of ``spec`` (padded with None to ``rank``)."""
    self._require("dtensor", "layout")
    rank = len(spec) if rank is None else rank
    full = self._full_spec(spec, rank)
    return dtensor.Layout([a or dtensor.UNSHARDED for a in full],
                          self.device_mesh)

  def _on_mesh(self, t: tf.Tensor) -> tf.Tensor:
    """Puts an eager non-DTensor on the mesh, replicated."""
    if tf.executing_eagerly() and not dtensor.is_dtensor(t):
      t = tf.convert_to_tensor(t)
      return dtensor.copy_to_mesh(
          t, dtensor.Layout.replicated(self.device_mesh, t.shape.rank))
    return t

  def _xla_annotate(self, t: tf.Tensor, spec: PartitionSpec, *,
                    name: str) -> tf.Tensor:
    if tf.executing_eagerly():
      return t
    with tf.name_scope(name):
      if all(a is None for a in spec):
        return xla_sharding.replicate(t, use_sharding_op=True)
      mapping = [-1 if a is None else self.mesh.names.index(a) for a in spec]
      return xla_sharding.mesh_split(t, self.device_mesh, mapping,
                                     use_sharding_op=True)

  def _require(self, backend: str, what: str) -> None:
    if self.backend != backend:
      raise MeshError(f"{what} needs the {backend!r} sharding backend, this "
                      f"one is {self.backend!r}")

  # --- data and variables ----------------------------------------------------

  def put(self, t: Any, spec: Sequence[str | None] = ()) -> tf.Tensor:
    """Places a host value on the mesh with ``spec`` (DTensor); else as is.

    Use it for model inputs, e.g. ``put(batch["inputs"], ("data",))``.
    """
    t = tf.convert_to_tensor(t)
    if self.backend != "dtensor":
      return t
    return self.shard(self._on_mesh(t), spec, name="put")

  def gather(self, t: tf.Tensor) -> tf.Tensor:
    """The whole value of a (possibly sharded) tensor as a regular tensor."""
    if isinstance(t, tf.Variable):
      t = t.read_value()
    if self.backend == "dtensor" and dtensor.is_dtensor(t):
      rank = t.shape.rank
      t = dtensor.relayout(t, dtensor.Layout.replicated(self.device_mesh, rank))
      part = dtensor.unpack(t)[0]
      with tf.device(part.device):  # also inside dtensor.default_mesh
        return tf.identity(part)
    return t

  def like_variables(self, tensors: Sequence[tf.Tensor | None],
                     variables: Sequence[tf.Variable]) -> list[Any]:
    """Relayouts each tensor (e.g. a gradient) to its variable's layout.

    DTensor may leave a gradient as unreduced per-device partial sums (e.g.
    an expert weight's gradient summed over the ``data`` axis); pass the
    gradients through this before an optimiser does non-linear arithmetic on
    them. Identity for other backends and for None entries.
    """
    if self.backend != "dtensor":
      return list(tensors)
    return [t if t is None or not hasattr(v, "layout") else
            dtensor.relayout(tf.convert_to_tensor(t), v.layout)
            for t, v in zip(tensors, variables)]

  def local_shapes(self, t: tf.Tensor) -> list[list[int]]:
    """Per-device shard shapes of a DTensor or DVariable (device order)."""
    self._require("dtensor", "local_shapes")
    if isinstance(t, tf.Variable):
      t = t.read_value()
    return [s.shape.as_list() for s in dtensor.unpack(t)]

  def variable(self, initial_value: Any, *, spec: Sequence[str | None] = (),
               name: str | None = None, trainable: bool = True,
               dtype: tf.DType | None = None) -> tf.Variable:
    """A variable laid out by ``spec``: a DVariable under DTensor.

    ``initial_value``: a tensor, numpy array or zero-argument callable.
    """
    if callable(initial_value):
      initial_value = initial_value()
    value = tf.convert_to_tensor(initial_value, dtype=dtype)
    if self.backend != "dtensor":
      return tf.Variable(value, name=name, trainable=trainable)
    if not dtensor.is_dtensor(value):
      value = self.shard(self._on_mesh(value), spec, name=name)
    return dtensor.DVariable(value, name=name, trainable=trainable)

  @contextlib.contextmanager
  def variable_scope(
      self, rules: Sequence[VariableRule] | None = None) -> Iterator[None]:
    """Makes every ``tf.Variable(...)`` created inside a laid-out variable.

    Under DTensor, a variable whose initial value already is a DTensor keeps
    that layout (optimiser slots built from ``zeros_like(var)``); others take
    the spec of the first rule whose pattern is found (``re.search``) in the
    full scoped name, else replicated. Other backends: no effect.

    Args:
      rules: ``(pattern, spec)`` pairs; default :func:`default_variable_rules`.
    """
    if self.backend != "dtensor":
      yield
      return
    rules = tuple(default_variable_rules() if rules is None else rules)
    with tf.variable_creator_scope(self._creator(rules)):
      yield

  def _creator(self, rules: tuple[VariableRule, ...]) -> Callable[..., Any]:
    def creator(next_creator, **kwargs):
      del next_creator  # DVariables replace ordinary variables entirely.
      value = kwargs["initial_value"]
      if callable(value):
        value = value()
      value = tf.convert_to_tensor(value, dtype=kwargs.get("dtype"))
      local = kwargs.get("name") or "Variable"
      scope = tf.get_current_name_scope()
      full = f"{scope}/{local}" if scope else local
      spec = self.spec_for(full, rules=rules)
      if not dtensor.is_dtensor(value):
        value = self.shard(self._on_mesh(value), spec[:value.shape.rank],
                           name=full)
      return dtensor.DVariable(value, name=local,
                               trainable=kwargs.get("trainable", True))
    return creator

  def spec_for(self, name: str, *,
               rules: Sequence[VariableRule] | None = None) -> PartitionSpec:
    """The spec of the first rule matching variable ``name``; else ()."""
    rules = default_variable_rules() if rules is None else rules
    for pattern, spec in rules:
      if re.search(pattern, name):
        return tuple(spec)
    return ()


NO_SHARDING = Sharding()

_HLO_SHARDING_RE = re.compile(
    r'custom_call_target="Sharding", sharding=(\{[^}]*\}).*?'
    r'op_name="([^"]*)/XlaSharding(?:_\d+)?"')


def hlo_shardings(hlo_text: str) -> dict[str, str]:
  """Maps annotation names to their HLO shardings.

  Args:
    hlo_text: ``f.experimental_get_compiler_ir(*args)(stage="hlo")`` of a
      ``jit_compile`` function annotated with the ``"xla"`` backend.

  Returns:
    ``{name scope of the annotation: "{devices=[...]...}" or "{replicated}"}``
    e.g. ``{"moe/dispatched": "{devices=[4,1,1,1,2]0,4,1,5,2,6,3,7
    last_tile_dim_replicate}"}``; the backward pass's copies appear under
    ``gradient_tape/...``.
  """
  return {name: sharding
          for sharding, name in _HLO_SHARDING_RE.findall(hlo_text)}


def make_sharding(mesh: str | MeshShape | None, *, backend: str = "dtensor",
                  devices: Sequence[str] | None = None,
                  device_type: str = "CPU") -> Sharding:
  """Builds a :class:`Sharding` from ``--mesh`` text (or a MeshShape).

  Args:
    mesh: e.g. ``"data:2,expert:4"``; None or ``""`` gives NO_SHARDING.
    backend: ``"dtensor"`` or ``"xla"`` (``"none"`` also gives NO_SHARDING).
    devices: DTensor only: the devices to use (e.g. ``["CPU:0", "CPU:1"]``);
      default all devices of ``device_type``, whose count must equal the
      mesh size: the local ones, or with several DTensor clients (processes
      started with DTensor's ``DTENSOR_CLIENT_ID``, ``DTENSOR_NUM_CLIENTS``,
      ``DTENSOR_JOB_NAME``, ``DTENSOR_JOBS`` and
      ``dtensor.initialize_accelerator_system``) those of all clients.
    device_type: ``"CPU"``, ``"GPU"`` or ``"TPU"`` (DTensor).

  Raises:
    MeshError: bad mesh text, unknown backend, or device-count mismatch.
  """
  if mesh is None or mesh == "" or backend == "none":
    return NO_SHARDING
  shape = mesh if isinstance(mesh, MeshShape) else MeshShape.parse(mesh)
  if backend == "xla":
    ids = np.arange(shape.size).reshape(shape.sizes)
    return Sharding(mesh=shape, backend="xla", device_mesh=ids)
  if backend != "dtensor":
    raise MeshError(f"sharding backend {backend!r} is unknown; choose one of "
                    f"{', '.join(BACKENDS)}")
  if devices is None and dtensor.num_clients() > 1:
    # Multi-client (several processes/hosts, after
    # dtensor.initialize_accelerator_system): the mesh spans all clients.
    validate_mesh(shape, num_devices=dtensor.num_global_devices(device_type))
    dmesh = dtensor.create_distributed_mesh(list(shape.axes),
                                            device_type=device_type)
    return Sharding(mesh=shape, backend="dtensor", device_mesh=dmesh)
  if devices is None:
    local = tf.config.list_logical_devices(device_type)
    validate_mesh(shape, num_devices=len(local))
    devices = [d.name for d in local]
  elif len(devices) != shape.size:
    validate_mesh(shape, num_devices=len(devices))
  dmesh = dtensor.create_mesh(list(shape.axes), devices=list(devices),
                              device_type=device_type)
  return Sharding(mesh=shape, backend="dtensor", device_mesh=dmesh)


def export_unsharded(source: str, dest: str) -> str:
  """Rewrites a (possibly mesh-sharded) checkpoint as one unsharded file.

  A ``tf.train.Checkpoint`` of DVariables is written as one data file per
  device, each holding that device's shard (every expert once). This reads
  every saved tensor whole (``tf.train.load_checkpoint``) and writes them,
  with the object graph, as a single-shard checkpoint that restores into
  plain ``tf.Variable``s or into DVariables on any mesh. Variables only: no
  model code or mesh is needed.

  Args:
    source: checkpoint prefix, e.g. ``.../ckpt-1000``.
    dest: prefix to write, e.g. ``.../unsharded/ckpt-1000``.

  Returns:
    ``dest``.

  Raises:
    MeshError: ``source`` is not a readable checkpoint.
  """
  try:
    reader = tf.train.load_checkpoint(source)
  except (tf.errors.NotFoundError, ValueError) as e:
    raise MeshError(f"cannot read checkpoint {source!r}: {e}; pass a prefix "
                    "such as model_dir/ckpt-1000 (without .index)") from e
  keys = sorted(reader.get_variable_to_dtype_map())
  with tf.device("CPU:0"):
    tensors = [tf.constant(reader.get_tensor(k)) for k in keys]
    tf.io.gfile.makedirs(os.path.dirname(os.path.abspath(dest)))
    tf.raw_ops.SaveV2(prefix=dest, tensor_names=keys,
                      shape_and_slices=[""] * len(keys), tensors=tensors)
  return dest


def configure_virtual_cpus(num_devices: int) -> None:
  """Splits the host CPU into ``num_devices`` logical devices.

  Must run before TensorFlow executes any op in this process (TensorFlow
  fixes its devices at first use). Tests therefore do it in a subprocess.

  Raises:
    MeshError: if TensorFlow is already initialised with another count.
  """
  cpus = tf.config.list_physical_devices("CPU")
  config = [tf.config.LogicalDeviceConfiguration()] * num_devices
  try:
    tf.config.set_logical_device_configuration(cpus[0], config)
  except RuntimeError as e:
    have = len(tf.config.list_logical_devices("CPU"))
    if have == num_devices:
      return
    raise MeshError(
        f"cannot create {num_devices} virtual CPUs: TensorFlow already runs "
        f"with {have}; call configure_virtual_cpus before any TensorFlow op "
        "(e.g. first thing in main, or in a fresh subprocess)") from e
