"""Checkpoint averaging: the element-wise mean of a run's last k checkpoints.

Vaswani et al. (2017) report their Transformers with the average of the last
5 (base) or 20 (big) checkpoints; averaging smooths the noise of the last
updates at no training cost. :func:`average_checkpoints` reads the model
weights of k ``ckpt-<step>`` checkpoints of a run directory, averages them
(in float64, stored as the variables' dtype) and writes the result beside
the best-on-dev weights::

  <model_dir>/averaged/ckpt-<step>.*   model weights only (<step>: the newest
                                       averaged step)
  <model_dir>/averaged/averaged.json   {"steps": [...], "checkpoint": name}

``--checkpoint=averaged`` of m4moe-eval, m4moe-decode and m4moe-export reads
it (:func:`m4moe.training.rundir.resolve_checkpoint`). The new directory is written
as ``.averaged.partial`` and renamed into place, so a kill leaves the
previous average whole; the run's own checkpoints are only read.

A run keeps ``--keep_checkpoints`` checkpoints (5 by default), written every
``--checkpoint_every`` steps: to average the last k, train with
``--keep_checkpoints`` >= k and checkpoints close enough together that the
k span the end of training only.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
from typing import Sequence

import numpy as np

from m4moe import jsonfile
from m4moe.training import checkpointing
from m4moe.training import rundir

RECORD_FILENAME = "averaged.json"


class AveragingError(ValueError):
  """The run has no such checkpoints, or they are not of its model."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class AveragedCheckpoint:
  """What :func:`average_checkpoints` wrote.

  Attributes:
    path: prefix of the averaged checkpoint (``.../averaged/ckpt-<step>``).
    steps: the averaged checkpoints' steps, ascending.
  """

  path: str
  steps: tuple[int, ...]


def choose_steps(kept: Sequence[int], *, last: int = 0,
                 steps: Sequence[int] = (), model_dir: str = "") -> tuple[
                     int, ...]:
  """The checkpoints to average: ``steps`` if given, else the ``last`` ones.

  Raises:
    AveragingError: fewer than 2 steps or kept checkpoints, a step the run
      does not have, or fewer kept checkpoints than ``last`` (the message
      lists those kept).
  """
  have = (f"it keeps {', '.join(f'ckpt-{s}' for s in kept)}" if kept
          else "it has no ckpt-<step> checkpoints")
  if steps:
    missing = sorted(set(steps) - set(kept))
    if missing:
      raise AveragingError(
          f"{model_dir} has no checkpoint of step(s) "
          f"{', '.join(map(str, missing))} ({have}); pass kept steps")
    chosen = tuple(sorted(set(steps)))
  elif len(kept) < 2:
    raise AveragingError(
        f"{model_dir}: {have}, and averaging needs at least 2; train with "
        "--keep_checkpoints=2 or more and --checkpoint_every below "
        "--train_steps")
  else:
    if len(kept) < last:
      raise AveragingError(
          f"{model_dir}: cannot average the last {last} checkpoints, {have}; "
          f"pass --last={len(kept)} or fewer, or train with "
          f"--keep_checkpoints={last} or more")
    chosen = tuple(kept[-last:]) if last > 0 else ()
  if len(chosen) < 2:
    raise AveragingError(
        f"averaging needs at least 2 checkpoints, got {len(chosen)}: pass "
        "--last=2 or more (or two --steps)")
  return chosen


def average_checkpoints(*, model_dir: str | os.PathLike[str], last: int = 5,
                        steps: Sequence[int] = ()) -> AveragedCheckpoint:
  """Averages checkpoints of a run into ``<model_dir>/averaged/``.

  Args:
    model_dir: a run directory written by m4moe-train.
    last: average the newest ``last`` checkpoints (ignored with ``steps``).
    steps: average exactly these steps instead.

  Returns:
    The averaged checkpoint's prefix and the steps it averages.

  Raises:
    AveragingError: see :func:`choose_steps`; or a checkpoint does not hold
      the run's model (damaged, or another model).
    m4moe.training.rundir.RunDirError: no readable config.json.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from m4moe.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  model_dir = pathlib.Path(model_dir)
  config = rundir.model_config_from_run(model_dir)  # first: is it a run?
  chosen = choose_steps(rundir.checkpoint_steps(model_dir), last=last,
                        steps=steps, model_dir=str(model_dir))
  model = model_lib.Transformer(config=config)
  variables = list(model.variables)
  sums = [np.zeros(v.shape, np.float64) for v in variables]
  for step in chosen:
    prefix = str(model_dir / f"{rundir.PREFIX}-{step}")
    try:
      status = tf.train.Checkpoint(model=model).read(prefix)
      status.expect_partial().assert_existing_objects_matched()
    except (tf.errors.OpError, AssertionError, ValueError) as e:
      detail = (str(e).strip().splitlines() or [""])[0][:300]
      raise AveragingError(
          f"{prefix}: cannot read the model ({type(e).__name__}: {detail}); "
          "the checkpoint is damaged or not of this run's config.json model: "
          "leave it out with --steps") from e
    for total, v in zip(sums, variables):
      total += v.numpy()
  for total, v in zip(sums, variables):
    # Non-float variables (none in today's models) keep the newest value.
    if v.dtype.is_floating:
      v.assign((total / len(chosen)).astype(v.dtype.as_numpy_dtype))
  final = model_dir / rundir.AVERAGED_DIRNAME
  partial = model_dir / f".{rundir.AVERAGED_DIRNAME}.partial"
  if partial.exists():
    shutil.rmtree(partial)  # our own leftover of a killed run
  keeper = checkpointing.CheckpointKeeper(str(partial), max_to_keep=1,
                                          model=model)
  name = pathlib.Path(keeper.save(chosen[-1])).name
  checkpointing.write_json_atomic(
      partial / RECORD_FILENAME, {"steps": list(chosen), "checkpoint": name})
  _replace_dir(final, partial)
  return AveragedCheckpoint(path=str(final / name), steps=chosen)


def _replace_dir(final: pathlib.Path, partial: pathlib.Path) -> None:
  """Moves ``partial`` to ``final``, replacing an earlier average."""
  old = final.with_name(f".{final.name}.old")
  if old.exists() and not final.exists():
    old.rename(final)  # a kill between the renames below: undo the first
  if old.exists():
    shutil.rmtree(old)
  if final.exists():
    final.rename(old)
  partial.rename(final)
  if old.exists():
    shutil.rmtree(old)


def read_record(model_dir: str | os.PathLike[str]) -> dict | None:
  """``averaged/averaged.json`` of a run (None: never averaged)."""
  path = (pathlib.Path(model_dir) / rundir.AVERAGED_DIRNAME /
          RECORD_FILENAME)
  if not path.is_file():
    return None
  return jsonfile.load(path, what="the averaged checkpoint's record",
                       fix="re-run m4moe-average to rewrite it")
