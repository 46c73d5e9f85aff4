"""Named device meshes: parsing ``--mesh=data:2,expert:4`` and validation.

A mesh is an ordered tuple of named axes with sizes, e.g. ``data:2,expert:4``
is a 2 x 4 grid of 8 devices (device ``i`` sits at row-major coordinates of
``i``). Axis names come from a fixed vocabulary (:data:`KNOWN_AXES`):

* ``data``: groups / batch rows are split over it (data parallelism);
* ``expert``: the E experts of every MoE layer are split over it;
* ``model``: tensor (Megatron-style) parallelism: attention heads, the dense
  FFN hidden width d_ff and the experts' hidden width H are split over it.

Model code annotates tensors with axis *names*; an axis absent from the mesh
counts as size 1, so the same model code runs on ``data:8`` (pure data
parallelism), ``expert:4``, ``data:2,expert:4`` or ``data:2,expert:2,model:2``.

This module is pure Python (no TensorFlow import) so that command-line tools
can parse and validate a mesh before TensorFlow initialises its devices.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
  from m4moe.config import ModelConfig

KNOWN_AXES = ("data", "expert", "model")

# One entry per tensor dimension: a mesh axis name, or None (not split).
PartitionSpec = tuple[str | None, ...]

_AXIS_RE = re.compile(r"^([a-z_]+):([0-9]+)$")


class MeshError(ValueError):
  """A mesh or a sharding request is invalid; the message says how to fix it."""


@dataclasses.dataclass(frozen=True)
class MeshShape:
  """An ordered, named device mesh shape such as ``data:2,expert:4``.

  Attributes:
    axes: ``((name, size), ...)`` in mesh order (row-major over devices).
  """

  axes: tuple[tuple[str, int], ...]

  def __post_init__(self) -> None:
    if not self.axes:
      raise MeshError("a mesh needs at least one axis, e.g. --mesh=data:1")
    names = [name for name, _ in self.axes]
    for name, size in self.axes:
      if name not in KNOWN_AXES:
        raise MeshError(f"mesh axis {name!r} is unknown; use names from "
                        f"{', '.join(KNOWN_AXES)} (e.g. --mesh=data:2,expert:4)")
      if not isinstance(size, int) or size < 1:
        raise MeshError(f"mesh axis {name}:{size} needs a positive integer size")
    if len(set(names)) != len(names):
      raise MeshError(f"mesh axes {names} repeat a name; give each axis once")

  @classmethod
  def parse(cls, text: str, *, flag: str = "mesh") -> "MeshShape":
    """Parses ``"data:2,expert:4"``; ``flag`` names the source in errors."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
      raise MeshError(f"--{flag}={text!r} is empty; use e.g. "
                      f"--{flag}=data:2,expert:4 (axes {', '.join(KNOWN_AXES)})")
    axes = []
    for part in parts:
      match = _AXIS_RE.match(part)
      if not match:
        raise MeshError(f"--{flag}={text!r}: {part!r} is not 'name:size'; use "
                        f"e.g. --{flag}=data:2,expert:4")
      axes.append((match.group(1), int(match.group(2))))
    try:
      return cls(tuple(axes))
    except MeshError as e:
      raise MeshError(f"--{flag}={text!r}: {e}") from None

  @classmethod
  def single_device(cls) -> "MeshShape":
    return cls((("data", 1),))

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(name for name, _ in self.axes)

  @property
  def sizes(self) -> tuple[int, ...]:
    return tuple(size for _, size in self.axes)

  @property
  def size(self) -> int:
    """Number of devices."""
    return math.prod(self.sizes)

  def axis_size(self, name: str) -> int:
    """Size of axis ``name``; 1 if the mesh has no such axis."""
    check_axis_name(name)
    return dict(self.axes).get(name, 1)

  def axis_index(self, name: str) -> int | None:
    """Position of axis ``name`` in the mesh, or None if absent."""
    check_axis_name(name)
    return self.names.index(name) if name in self.names else None

  def __str__(self) -> str:
    return ",".join(f"{name}:{size}" for name, size in self.axes)

  @property
  def batch_axis(self) -> str:
    """The axis that splits batch rows and MoE dispatch groups.

    ``"data"``, except on a mesh with an ``expert`` axis > 1 and no ``data``
    axis > 1 (``expert:D``, ``data:1,expert:D``, ``expert:D,model:M``):
    there the same devices hold the tokens and the experts, as in GShard,
    and the rows are split over ``expert``. A tensor dimension maps to one
    mesh axis (DTensor layouts), so on a ``data`` x ``expert`` mesh the
    rows are split over ``data`` only.
    """
    if self.axis_size("data") == 1 and self.axis_size("expert") > 1:
      return "expert"
    return "data"

  def mesh_axes_of(self, spec: PartitionSpec) -> tuple[str | None, ...]:
    """``spec`` with the axes absent from this mesh replaced by None."""
    check_spec(spec)
    return tuple(a if a in self.names else None for a in spec)


def check_axis_name(name: str) -> None:
  if name not in KNOWN_AXES:
    raise MeshError(f"axis {name!r} is unknown; use one of "
                    f"{', '.join(KNOWN_AXES)}")


def check_spec(spec: Sequence[str | None]) -> None:
  """Checks that ``spec`` names known axes, each at most once."""
  used = [a for a in spec if a is not None]
  for name in used:
    check_axis_name(name)
  if len(set(used)) != len(used):
    raise MeshError(f"partition spec {tuple(spec)} splits two dimensions over "
                    "the same mesh axis; use each axis at most once")


def validate_mesh(mesh: MeshShape, *, num_devices: int | None = None,
                  num_experts: int | None = None,
                  num_groups: int | None = None,
                  batch_size: int | None = None,
                  num_heads: int | None = None,
                  d_ff: int | None = None,
                  expert_hidden_dim: int | None = None,
                  shared_width: int | None = None) -> None:
  """Checks a mesh against the devices, the model and the batch.

  Args:
    mesh: the mesh to check.
    num_devices: devices available (e.g. ``len(tf.config.list_logical_devices
      ('CPU'))``); the mesh must use exactly this many.
    num_experts: E of the model (``--num_experts``); must be divisible by the
      ``expert`` axis. 0 (dense) requires an ``expert`` axis of size 1.
    num_groups: G, dispatch groups per step; divisible by ``data`` axis.
    batch_size: sentences per step; divisible by the ``data`` axis.
    num_heads, d_ff, expert_hidden_dim: the widths the ``model`` axis splits
      (attention heads, dense FFN hidden, expert hidden); each must be
      divisible by it. Pass None for a width the model lacks (d_ff of a model
      without dense FFN layers, H of a dense model).
    shared_width: the shared experts' hidden width, ``--num_shared_experts``
      x their hidden width (one FFN the ``model`` axis splits like d_ff);
      None without shared experts.

  Raises:
    MeshError: naming the flag and the fix.
  """
  if num_devices is not None and mesh.size != num_devices:
    raise MeshError(
        f"--mesh={mesh} uses {mesh.size} devices but {num_devices} are "
        f"available; make the axis sizes multiply to {num_devices} (e.g. "
        f"--mesh=data:{num_devices}), or on CPU create {mesh.size} virtual "
        "devices with sharding.configure_virtual_cpus before TensorFlow runs")
  _check_expert_axis(mesh, num_experts=num_experts)
  _check_model_axis(mesh, num_heads=num_heads, d_ff=d_ff,
                    expert_hidden_dim=expert_hidden_dim,
                    shared_width=shared_width)
  data = mesh.axis_size("data")
  for value, what, flag in ((num_groups, "groups per step (G)", "group_size"),
                            (batch_size, "sentences per batch", "batch_size")):
    if value is not None and value % data:
      raise MeshError(
          f"{value} {what} is not divisible by the mesh's data:{data} axis "
          f"(--mesh={mesh}); change --{flag} or the data axis so it divides")


def _check_expert_axis(mesh: MeshShape, *, num_experts: int | None) -> None:
  """:func:`validate_mesh`'s check of the ``expert`` axis against E."""
  experts = mesh.axis_size("expert")
  if num_experts is None:
    return
  if num_experts == 0 and experts > 1:
    raise MeshError(f"--mesh={mesh} has expert:{experts} but the model is "
                    "dense (--num_experts=0); move those devices to data")
  if num_experts and num_experts % experts:
    raise MeshError(
        f"--num_experts={num_experts} is not divisible by the mesh's "
        f"expert:{experts} axis (--mesh={mesh}); use an expert axis size "
        f"that divides {num_experts} (e.g. {math.gcd(num_experts, experts)})")


def _check_model_axis(mesh: MeshShape, *, num_heads: int | None,
                      d_ff: int | None, expert_hidden_dim: int | None,
                      shared_width: int | None) -> None:
  """:func:`validate_mesh`'s check of the ``model`` axis against the widths."""
  model = mesh.axis_size("model")
  for value, flag in ((num_heads, "num_heads"), (d_ff, "d_ff"),
                      (expert_hidden_dim, "expert_hidden_dim")):
    if value is not None and value % model:
      raise MeshError(
          f"--{flag}={value} is not divisible by the mesh's model:{model} "
          f"axis (--mesh={mesh}); the model axis splits --num_heads, --d_ff "
          f"and --expert_hidden_dim, so use a model axis size that divides "
          f"{value} (e.g. model:{math.gcd(value, model)}) or change --{flag}")
  if shared_width is not None and shared_width % model:
    raise MeshError(
        f"the shared experts' hidden width {shared_width} (--num_shared_"
        "experts x --shared_expert_hidden_dim, or x --expert_hidden_dim if "
        f"that is 0) is not divisible by the mesh's model:{model} axis "
        f"(--mesh={mesh}), which splits it; use a model axis size that "
        f"divides {shared_width} (e.g. model:{math.gcd(shared_width, model)})"
        " or change --shared_expert_hidden_dim")


def model_widths(config: "ModelConfig") -> dict[str, Any]:
  """:func:`validate_mesh`'s model arguments for ``config``.

  ``num_experts``, ``num_heads``, and ``d_ff`` only if some layer is a dense
  FFN, ``expert_hidden_dim`` only if the model has experts, ``shared_width``
  only if it has shared experts.
  """
  moe = config.moe
  shared = moe.num_shared_experts * moe.shared_hidden_dim
  layers = (config.num_encoder_layers, config.num_decoder_layers)
  dense = any(len(config.moe_layer_indices(n)) < n for n in layers)
  return {"num_experts": config.moe.num_experts,
          "num_heads": config.num_heads,
          "d_ff": config.d_ff if dense else None,
          "expert_hidden_dim": (moe.expert_hidden_dim
                                if moe.enabled else None),
          "shared_width": shared if moe.enabled and shared else None}


def check_divisible(shape: Sequence[int | None], spec: PartitionSpec,
                    mesh: MeshShape, *, what: str) -> None:
  """Raises MeshError if a split dimension is not divisible by its axis."""
  if len(spec) > len(shape):
    raise MeshError(f"{what}: partition spec {tuple(spec)} has more entries "
                    f"than the tensor's rank {len(shape)} (shape {list(shape)})")
  for dim, axis in enumerate(spec):
    size = shape[dim]
    if axis is None or size is None:
      continue
    parts = mesh.axis_size(axis)
    if size % parts:
      raise MeshError(
          f"{what}: dimension {dim} of shape {list(shape)} has size {size}, "
          f"not divisible by mesh axis {axis}:{parts} (--mesh={mesh}); change "
          "the mesh or the size (e.g. the batch, --group_size or --num_experts)")
