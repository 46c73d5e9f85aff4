"""Continue a finished run in a new directory (``m4moe-train --continue_from``).

A run stopped at its ``--train_steps`` cap while dev cross-entropy was still
falling can be trained further without touching it: its run directory is
copied to the new ``--model_dir`` (checkpoints with optimiser slots, step,
clock, early-stopping state and input iterator; ``best/``; ``config.json``;
``metrics.jsonl`` and the TensorBoard events), and the trainer then resumes
the copy exactly as it would resume the original with a larger
``--train_steps``. The original keeps its results at the smaller budget, so a
study can report both budgets of the same runs (``m4moe.pipeline.plan``,
``ModelRun.continue_from``).

The copy is made in a hidden sibling directory and renamed into place, so a
crash or kill during it leaves no half-copied ``--model_dir``; the next
attempt removes that sibling (this module's own, by name) and copies again.
Once ``--model_dir`` holds a checkpoint it is never copied over: a re-run
resumes its own checkpoints.
"""

from __future__ import annotations

import os
import pathlib
import shutil

from m4moe import config as config_lib
from m4moe.training import checkpointing
from m4moe.training import rundir

# The trainer's lock file of a run in progress: never copied (the new run
# takes its own).
_LOCK_FILENAME = "train.lock"
_PARTIAL_SUFFIX = ".continue.partial"


class ContinuationError(ValueError):
  """``--continue_from`` cannot be used; the message names the fix."""


def _partial_dir(model_dir: pathlib.Path) -> pathlib.Path:
  return model_dir.parent / f".{model_dir.name}{_PARTIAL_SUFFIX}"


def check(*, source: str | os.PathLike[str],
          model_dir: str | os.PathLike[str],
          model_config: config_lib.ModelConfig | None = None) -> int | None:
  """Validates a continuation without changing anything.

  Returns:
    The step ``source``'s run would be continued from, or None if
    ``model_dir`` already holds a checkpoint (the run resumes its own and
    ``source`` is not read).

  Raises:
    ContinuationError: ``source`` has no checkpoint or is ``model_dir``
      itself, ``model_config`` (if given) is not the model ``source``
      trained, or ``model_dir`` holds files but no checkpoint.
  """
  source, model_dir = pathlib.Path(source), pathlib.Path(model_dir)
  flag = f"--continue_from={source}"
  if rundir.checkpoint_steps(model_dir):
    return None
  if source.resolve() == model_dir.resolve():
    raise ContinuationError(
        f"{flag} is --model_dir itself: give the finished run's directory "
        "and a new --model_dir")
  steps = rundir.checkpoint_steps(source)
  if not steps:
    raise ContinuationError(
        f"{flag} holds no ckpt-<step> checkpoint: give the --model_dir of a "
        "run m4moe-train has saved")
  diff = (checkpointing.model_config_diff(source, model_config)
          if model_config is not None else [])
  if diff:
    raise ContinuationError(
        f"{flag} trained another model ({'; '.join(diff)}): continue it with "
        "its own model flags")
  leftovers = ([p.name for p in model_dir.iterdir()]
               if model_dir.is_dir() else [])
  if leftovers:
    raise ContinuationError(
        f"--model_dir={model_dir} holds files but no checkpoint "
        f"({', '.join(sorted(leftovers)[:5])}): {flag} copies a run into a "
        "new or empty directory; give one, or drop --continue_from")
  return steps[-1]


def copy_run(*, source: str | os.PathLike[str],
             model_dir: str | os.PathLike[str],
             model_config: config_lib.ModelConfig | None = None
             ) -> int | None:
  """Copies ``source``'s run directory to ``model_dir`` (see :func:`check`).

  Returns:
    The latest checkpoint step copied, or None if ``model_dir`` already
    holds a checkpoint (nothing is copied).

  Raises:
    ContinuationError: as :func:`check`.
  """
  step = check(source=source, model_dir=model_dir, model_config=model_config)
  if step is None:
    return None
  source, model_dir = pathlib.Path(source), pathlib.Path(model_dir)
  partial = _partial_dir(model_dir)
  if partial.exists():  # Our own, from an interrupted copy.
    shutil.rmtree(partial)
  model_dir.parent.mkdir(parents=True, exist_ok=True)
  shutil.copytree(source, partial,
                  ignore=shutil.ignore_patterns(_LOCK_FILENAME))
  if model_dir.is_dir():  # Empty (check() said so).
    model_dir.rmdir()
  os.replace(partial, model_dir)
  return step
