"""Run directory, effective-config JSON, crash-safe checkpoints, preemption.

Layout of a ``--model_dir``::

  config.json             effective config (model, training, data), atomic
  checkpoint              TF's index file naming the latest complete ckpt
  ckpt-<step>.index/.data-*   model, optimiser slots, step, input iterator
  metrics.jsonl           see m4moe.training.metrics
  train/ eval/            TensorBoard event files

Crash safety: ``tf.train.CheckpointManager.save`` writes the data and index
files of ``ckpt-<step>`` first and only then (in a write callback) rewrites
the ``checkpoint`` index file, atomically (temp file + rename). A ``kill -9``
at any moment therefore leaves ``checkpoint`` naming the last *complete*
checkpoint; a half-written ``ckpt-<step>`` is ignored and overwritten by the
next save of that step. The tests verify this ordering with a subprocess
killed inside the save.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import tempfile
import threading
from typing import Any, Mapping

import tensorflow as tf
from absl import logging

from m4moe import config as config_lib

CONFIG_FILENAME = "config.json"


def write_json_atomic(path: str | os.PathLike[str], value: Any) -> None:
  """Writes ``value`` as indented JSON via a temp file and an atomic rename."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
  with os.fdopen(fd, "w", encoding="utf-8") as f:
    json.dump(value, f, indent=2, sort_keys=True)
    f.write("\n")
    f.flush()
    os.fsync(f.fileno())
  os.chmod(tmp, 0o644)  # mkstemp creates 0600
  os.replace(tmp, path)


def read_run_config(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
  """A run's whole ``config.json`` (keys ``model``, ``train``, ``data``)."""
  path = pathlib.Path(model_dir) / CONFIG_FILENAME
  if not path.is_file():
    raise FileNotFoundError(
        f"{path} not found: is --model_dir a directory written by m4moe-train?")
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def write_run_config(model_dir: str | os.PathLike[str], *,
                     model_config: config_lib.ModelConfig,
                     sections: Mapping[str, Any]) -> pathlib.Path:
  """Writes ``config.json``; refuses to change the model of an existing run.

  Args:
    model_dir: the run directory.
    model_config: the effective model config (stored under ``"model"``).
    sections: further JSON-serialisable sections (``"train"``, ``"data"``...).

  Raises:
    config_lib.ConfigError: ``model_dir`` already holds a run whose model
      config differs (restoring its checkpoints would fail or be wrong).
  """
  path = pathlib.Path(model_dir) / CONFIG_FILENAME
  new = model_config.to_dict()
  if path.is_file():
    old = read_run_config(model_dir).get("model", {})
    diff = _dict_diff(old, new)
    if diff:
      raise config_lib.ConfigError(
          f"{path} was written for a different model ({'; '.join(diff)}); "
          "use a fresh --model_dir or the original model flags")
  write_json_atomic(path, {"model": new, **sections})
  return path


def _dict_diff(old: Mapping[str, Any], new: Mapping[str, Any],
               prefix: str = "") -> list[str]:
  out = []
  for key in sorted(set(old) | set(new)):
    a, b = old.get(key), new.get(key)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
      out += _dict_diff(a, b, prefix=f"{prefix}{key}.")
    elif a != b:
      out.append(f"--{key}: checkpoint {a!r} vs now {b!r}")
  return out


class CheckpointKeeper:
  """``tf.train.Checkpoint`` + ``CheckpointManager`` numbered by step.

  Args:
    directory: where checkpoints go (the run's model_dir).
    max_to_keep: K, how many recent checkpoints to keep.
    **objects: trackables to save (model, optimizer, step, iterator...).
  """

  def __init__(self, directory: str, *, max_to_keep: int, **objects: Any):
    if max_to_keep < 1:
      raise ValueError(f"--keep_checkpoints={max_to_keep} is invalid: keep "
                       "at least 1 checkpoint")
    self.checkpoint = tf.train.Checkpoint(**objects)
    self.manager = tf.train.CheckpointManager(
        self.checkpoint, directory, max_to_keep=max_to_keep)

  @property
  def latest(self) -> str | None:
    return self.manager.latest_checkpoint

  def restore_latest(self) -> str | None:
    """Restores the latest complete checkpoint; returns its path or None."""
    path = self.manager.latest_checkpoint
    if path is None:
      return None
    try:
      self.checkpoint.restore(path).assert_existing_objects_matched()
    except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError) as e:
      if "iterator" not in str(e).lower():
        raise
      raise RuntimeError(
          f"{path}: cannot restore the input iterator (the input pipeline "
          "definition changed since the checkpoint was written). Resume "
          "with --nocheckpoint_input to skip the consumed batches instead "
          "(the data stream will then not be bit-identical).") from e
    logging.info("Restored %s", path)
    return path

  def save(self, step: int) -> str:
    path = self.manager.save(checkpoint_number=step)
    logging.info("Saved %s", path)
    return path


class PreemptionGuard:
  """Context manager turning SIGTERM into a "save and stop" request.

  TPU VMs (and most schedulers) send SIGTERM before killing a job; the loop
  polls :attr:`requested` after every step. Outside the main thread (where
  Python cannot install signal handlers) the guard is inactive.
  """

  def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM,)):
    self._signals = signals
    self._event = threading.Event()
    self._previous: dict[int, Any] = {}

  @property
  def requested(self) -> bool:
    return self._event.is_set()

  def _handle(self, signum, frame) -> None:  # pylint: disable=unused-argument
    logging.warning("Received signal %d: saving and stopping after this step",
                    signum)
    self._event.set()

  def __enter__(self) -> "PreemptionGuard":
    if threading.current_thread() is threading.main_thread():
      for sig in self._signals:
        self._previous[sig] = signal.signal(sig, self._handle)
    else:
      logging.warning("Not in the main thread: SIGTERM will not be handled")
    return self

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous.clear()
