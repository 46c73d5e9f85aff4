"""Dense -> MoE upcycling (Komatsuzaki et al. 2022, "Sparse Upcycling").

A fresh MoE run starts from a trained dense run instead of a random init:

* every MoE layer's E experts start as copies of the dense FFN it replaces
  (``ffn/wi <float32>[M, F]`` -> ``ffn/experts/wi <float32>[E, M, F]``, the
  same for ``wo``), which needs ``--expert_hidden_dim`` = the dense
  ``--d_ff`` = F;
* the routers (``ffn/router/wg``, and ``w_noise`` of ``noisy_topk``) keep
  their fresh initialisation;
* shared experts (``--num_shared_experts``; ``ffn/shared_experts/ffn/wi``
  and ``wo``), which the dense model has no counterpart of, keep their
  fresh ``wi`` and start with ``wo`` = 0: they add nothing at first, so
  the upcycled model still starts at the dense model's function, and the
  first update moves ``wo`` (its gradient is the nonzero hidden activation
  times the output's);
* every other variable is copied unchanged.

The mapping is by variable path: the model's attribute path (e.g.
``encoder_layers/1/ffn/experts/wi``) names the dense checkpoint's
``model/<path>/.ATTRIBUTES/VARIABLE_VALUE``. Any model variable without a
dense counterpart of the right shape, and any dense model variable left
unused, is an :class:`UpcycleError` listing them all.

With a router whose combine weights of a token sum to 1 (``top2``: g1 and g2
renormalised by g1 + g2; ``noisy_topk`` at eval: softmax over the chosen k)
and no capacity drops (eval, ``--eval_capacity_factor=0``), the upcycled
model computes exactly the dense model's function at initialisation. With
``top1`` the expert output is scaled by its gate (Switch), so it starts near,
not at, the dense function; ``expert_choice`` may leave tokens unprocessed.

Optionally (:func:`upcycle_optimizer`, ``--init_from_dense_optimizer``) the
Adafactor state is carried over too, as the paper allows: each variable's
slots (``vr``/``vc`` or ``v``, and ``m``) from the dense variable it was
copied from (E copies for the experts; the factored slots of an expert
weight ``[E, M, F]`` are ``[E, M]`` and ``[E, F]``, E copies of the dense
``[M]`` and ``[F]``), the router slots at zero, and ``iterations`` (so the
learning-rate schedule continues where the dense run stopped). Adafactor
stores slots by position in the variable list (``slots/<i>``), so the dense
model is rebuilt from its ``config.json`` to learn each path's position; the
optimiser flags that shape the slots (``--factored``, ``--beta1``) must match
the dense run's.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf
from absl import logging

from m4moe import config as config_lib
from m4moe.moe.upcycle_checks import config_problems
from m4moe.training import rundir

_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
_PREFIX = "model/"
# Variables of a MoE layer that keep their fresh initialisation: the
# routers, and the shared experts (whose output weights start at zero).
_FRESH = ("router", "shared_experts")


class UpcycleError(ValueError):
  """The dense run cannot initialise this MoE model; the message says why."""


@dataclasses.dataclass(frozen=True)
class UpcycleReport:
  """What :func:`upcycle_from_dense` did.

  Attributes:
    checkpoint: the dense checkpoint read.
    copied: model variable path -> dense path, copied unchanged.
    expanded: expert variable path -> dense FFN path it holds E copies of.
    fresh: router and shared-expert variable paths left at their
      initialisation (but see ``zeroed``).
    zeroed: the shared experts' output weights, set to zero.
  """

  checkpoint: str
  copied: Mapping[str, str]
  expanded: Mapping[str, str]
  fresh: tuple[str, ...]
  zeroed: tuple[str, ...] = ()


def variable_paths(module: tf.Module) -> dict[str, tf.Variable]:
  """``"encoder_layers/1/ffn/experts/wi"`` -> variable, for every variable.

  The paths are the module's attribute paths, which are also the object
  paths of a ``tf.train.Checkpoint(model=module)`` under ``model/``.
  """
  # pylint: disable=protected-access
  flat = module._flatten(predicate=lambda v: isinstance(v, tf.Variable),
                         with_path=True)
  return {"/".join(str(p) for p in path): var for path, var in flat}


def dense_checkpoint(dense_dir: str | pathlib.Path) -> str:
  """The latest checkpoint of a dense run directory.

  Raises:
    UpcycleError: no checkpoint, or the run is not dense.
  """
  dense_dir = pathlib.Path(dense_dir)
  path = tf.train.latest_checkpoint(str(dense_dir))
  if path is None:
    raise UpcycleError(
        f"--init_from_dense={dense_dir} has no checkpoint (no 'checkpoint' "
        "index file): pass the model_dir of a trained dense m4moe-train run")
  try:
    config = rundir.model_config_from_run(dense_dir)
  except FileNotFoundError:
    config = None  # checkpoints alone still map by path
  if config is not None and config.moe.enabled:
    raise UpcycleError(
        f"--init_from_dense={dense_dir} is an MoE run (--num_experts="
        f"{config.moe.num_experts}); pass a dense run (--num_experts=0)")
  return path


def _expert_source(path: str) -> str | None:
  """``.../ffn/experts/wi`` -> ``.../ffn/wi`` (None if not an expert weight)."""
  parts = path.split("/")
  if len(parts) >= 3 and parts[-3:-1] == ["ffn", "experts"]:
    return "/".join(parts[:-2] + parts[-1:])
  return None


def _is_fresh(path: str) -> bool:
  parts = path.split("/")
  return any(a == "ffn" and b in _FRESH for a, b in zip(parts, parts[1:]))


def _is_shared_output(path: str) -> bool:
  """A shared expert's output weight (``.../shared_experts/ffn/wo``)."""
  return "/shared_experts/" in f"/{path}" and path.endswith("/wo")


def plan(model_variables: dict[str, tuple[int, ...]],
         dense_variables: dict[str, tuple[int, ...]]
         ) -> tuple[dict[str, str], dict[str, str], list[str]]:
  """Matches model variables to dense variables by path and shape.

  Args:
    model_variables: MoE model path -> shape.
    dense_variables: dense model path (checkpoint key without ``model/`` and
      the attribute suffix) -> shape.

  Returns:
    (copied: path -> dense path, expanded: expert path -> dense FFN path,
    fresh: router and shared-expert paths).

  Raises:
    UpcycleError: listing every model variable without a usable dense
      counterpart and every dense variable left unused.
  """
  copied, expanded, fresh, problems = {}, {}, [], []
  reported = set()  # dense variables already named in a problem
  for path, shape in sorted(model_variables.items()):
    if _is_fresh(path):
      fresh.append(path)
      continue
    source = _expert_source(path)
    if source is not None:
      dense_shape = dense_variables.get(source)
      if dense_shape is None:
        problems.append(f"{path}: no dense FFN {source} in the checkpoint")
      elif tuple(dense_shape) != tuple(shape[1:]):
        reported.add(source)
        problems.append(
            f"{path} {list(shape)} cannot hold E copies of {source} "
            f"{list(dense_shape)}: the expert hidden width must equal the "
            f"dense d_ff; set --expert_hidden_dim="
            f"{_hidden_dim(source, dense_shape)} (and the dense run's "
            "other model flags)")
      else:
        expanded[path] = source
      continue
    dense_shape = dense_variables.get(path)
    if dense_shape is None:
      problems.append(f"{path}: not in the dense checkpoint")
    elif tuple(dense_shape) != tuple(shape):
      reported.add(path)
      problems.append(f"{path}: shape {list(shape)} here, {list(dense_shape)} "
                      "in the dense checkpoint (use the dense run's model "
                      "flags: --d_model, --num_heads, --d_kv, vocabularies)")
    else:
      copied[path] = path
  used = set(copied.values()) | set(expanded.values()) | reported
  unused = sorted(set(dense_variables) - used)
  problems += [f"{path}: dense variable with no place in the MoE model"
               for path in unused]
  if problems:
    raise UpcycleError(
        f"cannot upcycle: {len(problems)} unmatched variable(s):\n  " +
        "\n  ".join(problems))
  return copied, expanded, fresh


def _hidden_dim(source: str, dense_shape: Sequence[int]) -> int:
  """The dense FFN's hidden width: wi is [M, F], wo is [F, M]."""
  return int(dense_shape[-1] if source.endswith("wi") else dense_shape[0])


def upcycle_from_dense(*, model: tf.Module,
                       dense_dir: str | pathlib.Path) -> UpcycleReport:
  """Initialises ``model`` (an MoE Transformer) from a dense run.

  Args:
    model: the freshly built model (variables created).
    dense_dir: the dense run's model directory (its latest checkpoint).

  Returns:
    The :class:`UpcycleReport`.

  Raises:
    UpcycleError: no dense checkpoint, an MoE run, or unmatched variables.
  """
  checkpoint = dense_checkpoint(dense_dir)
  reader = tf.train.load_checkpoint(checkpoint)
  dense = {key[len(_PREFIX):-len(_SUFFIX)]: tuple(shape)
           for key, shape in reader.get_variable_to_shape_map().items()
           if key.startswith(_PREFIX) and key.endswith(_SUFFIX)}
  variables = variable_paths(model)
  copied, expanded, fresh = plan(
      {p: tuple(v.shape) for p, v in variables.items()}, dense)
  for path, source in copied.items():
    variables[path].assign(reader.get_tensor(_PREFIX + source + _SUFFIX))
  for path, source in expanded.items():
    value = reader.get_tensor(_PREFIX + source + _SUFFIX)
    num_experts = variables[path].shape[0]
    variables[path].assign(np.broadcast_to(value, (num_experts, *value.shape)))
  zeroed = tuple(p for p in fresh if _is_shared_output(p))
  for path in zeroed:
    variables[path].assign(tf.zeros_like(variables[path]))
  config = getattr(model, "config", None)
  if config is not None and (
      config.moe.router in ("top1", "expert_choice") or
      not config.moe.renormalize_combine_weights):
    logging.warning(
        "--router=%s does not renormalise the combine weights to 1: the "
        "upcycled model starts near, not at, the dense model's function",
        config.moe.router)
  logging.info("Upcycled from %s: %d variables copied, %d expert weights "
               "from dense FFNs, %d router and shared-expert variables fresh "
               "(%d shared-expert outputs zeroed)", checkpoint, len(copied),
               len(expanded), len(fresh), len(zeroed))
  return UpcycleReport(checkpoint=checkpoint, copied=copied,
                       expanded=expanded, fresh=tuple(fresh), zeroed=zeroed)


_SLOT_NAMES = ("vr", "vc", "v", "m")


def upcycle_optimizer(*, optimizer: Any, model: tf.Module,
                      report: UpcycleReport,
                      dense_dir: str | pathlib.Path) -> int:
  """Copies the dense run's Adafactor state into ``optimizer``.

  Args:
    optimizer: the MoE run's built :class:`m4moe.training.optimizer.Adafactor`
      (slots in the order of ``model.trainable_variables``).
    model: the upcycled model.
    report: what :func:`upcycle_from_dense` did.
    dense_dir: the dense run's model directory (its ``config.json``).

  Returns:
    The number of slot variables copied.

  Raises:
    UpcycleError: no optimiser state in the checkpoint, or slots that do
      not match (listing them and the flags to set).
  """
  paths = variable_paths(model)
  refs = [v.ref() for v in model.trainable_variables]
  if [v.ref() for v in paths.values()] != refs or len(
      optimizer.slots) != len(refs):
    raise UpcycleError("the optimiser's slots do not follow the model's "
                       "variables; build it with model.trainable_variables")
  reader = tf.train.load_checkpoint(report.checkpoint)
  shapes = reader.get_variable_to_shape_map()
  iterations = "optimizer/iterations" + _SUFFIX
  if iterations not in shapes:
    raise UpcycleError(f"{report.checkpoint} holds no optimiser state: "
                       "drop --init_from_dense_optimizer")
  plans = _slot_plans(optimizer, paths=paths, report=report, shapes=shapes,
                      position=_dense_positions(dense_dir))
  for slot, key, expand in plans:
    value = reader.get_tensor(key)
    slot.assign(np.broadcast_to(value, slot.shape) if expand else value)
  optimizer.iterations.assign(reader.get_tensor(iterations))
  logging.info("Copied %d optimiser slots and iterations=%d from %s",
               len(plans), int(optimizer.iterations.numpy()),
               report.checkpoint)
  return len(plans)


def _dense_positions(dense_dir: str | pathlib.Path) -> dict[str, int]:
  """variable path -> index of its slots in the dense run's optimiser.

  The checkpoint numbers Adafactor's slots by position, not by name, so the
  dense model is rebuilt (from its config.json) to learn the order.
  """
  from m4moe.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  dense_config = rundir.model_config_from_run(dense_dir)
  with tf.init_scope():
    dense_model = model_lib.Transformer(config=dense_config)
  return {path: i for i, path in enumerate(variable_paths(dense_model))}


def _slot_plans(optimizer: Any, *, paths: Mapping[str, tf.Variable],
                report: UpcycleReport, shapes: Mapping[str, Sequence[int]],
                position: Mapping[str, int]
                ) -> list[tuple[tf.Variable, str, bool]]:
  """(slot, checkpoint key, broadcast over experts) of every slot to copy.

  Every slot is checked before any is written, so a mismatch leaves the
  optimiser untouched and lists all the offending slots at once.

  Raises:
    UpcycleError: slots that do not match (listing them and the flags).
  """
  sources = {**report.copied, **report.expanded}
  plans, problems = [], []
  for i, path in enumerate(paths):
    if path not in sources:
      continue  # a fresh router or shared expert: its slots stay at zero
    j = position.get(sources[path])
    if j is None:
      problems.append(f"{path}: {sources[path]} is not a variable of the "
                      "dense run's model (config.json)")
      continue
    for name in _SLOT_NAMES:
      slot = getattr(optimizer.slots[i], name)
      key = f"optimizer/slots/{j}/{name}{_SUFFIX}"
      if slot is None:
        continue
      want = tuple(slot.shape[1:] if path in report.expanded else slot.shape)
      if key not in shapes or tuple(shapes[key]) != want:
        problems.append(
            f"{path}/{name}: the dense checkpoint has "
            f"{list(shapes[key]) if key in shapes else 'no such slot'}, "
            f"expected {list(want)}")
        continue
      plans.append((slot, key, path in report.expanded))
  if problems:
    raise UpcycleError(
        f"cannot copy the optimiser state: {len(problems)} slot(s) do not "
        "match (use the dense run's --factored and --beta1, or drop "
        "--init_from_dense_optimizer):\n  " + "\n  ".join(problems))
  return plans


def _optimizer_problems(dense_dir: str, optimizer: Any) -> list[str]:
  """Optimiser flags whose slots would not fit the dense run's."""
  theirs = rundir.read_run_config(dense_dir).get("train", {}).get(
      "optimizer", {})
  # What shapes the slots: factoring, and whether there is a momentum.
  fits = {"factored": theirs.get("factored") == optimizer.factored,
          "beta1": (theirs.get("beta1", 0) > 0) == (optimizer.beta1 > 0)}
  return [f"--init_from_dense_optimizer: --{name}={getattr(optimizer, name)} "
          f"does not fit the dense run's {name}={theirs[name]} slots: set "
          f"--{name}={theirs[name]} or drop the flag"
          for name, fit in fits.items() if name in theirs and not fit]


def prepare(*, dense_dir: str, model_dir: str, copy_optimizer: bool,
            config: config_lib.ModelConfig, optimizer: Any, mesh: bool
            ) -> tuple[Callable[[tf.Module, Any], None] | None, list[str],
                       str | None]:
  """``m4moe-train --init_from_dense``: checks, then the warm start.

  Args:
    dense_dir: ``--init_from_dense`` ("" = off).
    model_dir: the new run's ``--model_dir``.
    copy_optimizer: ``--init_from_dense_optimizer``.
    config: the new (MoE) model config.
    optimizer: the new run's ``AdafactorConfig``.
    mesh: whether the run uses ``--mesh``.

  Returns:
    (``warm_start(model, optimizer)`` for :func:`m4moe.training.loop.train` or None,
    problems (each names the flag to fix), a notice to print or None).
  """
  if not dense_dir:
    problems = (["--init_from_dense_optimizer needs --init_from_dense"]
                if copy_optimizer else [])
    return None, problems, None
  resumed = tf.train.latest_checkpoint(model_dir)
  if resumed:
    return None, [], (f"resuming {resumed}: --init_from_dense={dense_dir} "
                      "is ignored")
  if mesh:
    return None, ["--init_from_dense is not supported with --mesh: upcycle "
                  "on one device, then resume that run on the mesh"], None
  try:
    dense_checkpoint(dense_dir)
    dense = rundir.model_config_from_run(dense_dir)
  except UpcycleError as e:
    return None, [str(e)], None
  except FileNotFoundError:
    return None, [f"--init_from_dense={dense_dir} has no config.json: pass "
                  "the model_dir of an m4moe-train run"], None
  problems = config_problems(config=config, dense=dense)
  if copy_optimizer:
    problems += _optimizer_problems(dense_dir, optimizer)

  def warm_start(model: tf.Module, optimizer_: Any) -> dict[str, Any]:
    report = upcycle_from_dense(model=model, dense_dir=dense_dir)
    if copy_optimizer:
      upcycle_optimizer(optimizer=optimizer_, model=model, report=report,
                        dense_dir=dense_dir)
    return start_record(report=report, dense_dir=dense_dir,
                        optimizer_iterations=int(
                            optimizer_.iterations.numpy()))

  return warm_start, problems, None


def start_record(*, report: UpcycleReport, dense_dir: str | pathlib.Path,
                 optimizer_iterations: int) -> dict[str, Any]:
  """The ``warm_start`` of an upcycled run's ``start`` metrics record.

  The run's own step counter (``--train_steps``, ``--eval_every``, the
  metrics' ``step``) starts at 0 at the upcycling: ``dense_step`` is how
  many steps the dense run had trained before, and ``optimizer_iterations``
  where the learning-rate schedule starts (the dense run's updates with
  ``--init_from_dense_optimizer``, else 0).
  """
  reader = tf.train.load_checkpoint(report.checkpoint)
  key = "step" + _SUFFIX
  dense_step = (int(reader.get_tensor(key))
                if key in reader.get_variable_to_shape_map() else None)
  return {"kind": "upcycled", "init_from_dense": str(dense_dir),
          "checkpoint": report.checkpoint, "dense_step": dense_step,
          "optimizer_iterations": optimizer_iterations,
          "steps": "counted from the upcycling (dense_step not included)"}
