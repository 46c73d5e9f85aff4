"""Writing a run directory: effective-config JSON, crash-safe checkpoints,
preemption.

The layout of a ``--model_dir`` and the reading of its ``config.json`` belong
to :mod:`m4moe.training.rundir`.

Crash safety: ``tf.train.CheckpointManager.save`` writes the data and index
files of ``ckpt-<step>`` first (into ``ckpt-<step>_temp/``, then renamed)
and only then (in a write callback) rewrites the ``checkpoint`` state file,
atomically (temp file + rename). A ``kill -9`` at any moment therefore leaves
``checkpoint`` naming the last *complete* checkpoint; a half-written
``ckpt-<step>`` is ignored and overwritten by the next save of that step. The
tests verify this ordering with a subprocess killed inside the save.

Damage (a disk error, a copy cut short, a file deleted or edited by hand) is
handled at start-up by :func:`recover_checkpoints`, before anything is
restored: it removes the leftovers of killed saves (their
``ckpt-<step>_temp/`` directories and, for a save killed while it was
renaming and indexing, the unfinished ``ckpt-<step>`` files that no state
file names), reads every tensor of the newest checkpoint (which checks the
CRC32C checksums TF stores in the index) and, if that fails, moves the
checkpoint's files into ``damaged/`` and tries the next older one. A
missing or unparsable ``checkpoint`` state file is rebuilt from the
``ckpt-<step>`` files on disk. A run that has no intact checkpoint left
but had some is never restarted from step 0 (:class:`CheckpointError` says
what to do), and neither is one whose ``metrics.jsonl`` shows checkpointed
progress (:func:`check_fresh_start`). A run whose first save was killed,
though, had nothing complete to lose: it starts over from step 0.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shutil
import signal
import tempfile
import threading
import time
from typing import Any, Mapping

import tensorflow as tf
from absl import logging
from google.protobuf import text_format
from tensorflow.python.checkpoint import checkpoint_management

from m4moe import config as config_lib
from m4moe import errors
from m4moe.training import metrics_log
from m4moe.training import rundir

CONFIG_FILENAME = rundir.CONFIG_FILENAME
STATE_FILENAME = rundir.STATE_FILENAME
DAMAGED_DIRNAME = rundir.DAMAGED_DIRNAME
BEST_DIRNAME = rundir.BEST_DIRNAME
PREFIX = rundir.PREFIX

# Exact names of what CheckpointManager.save writes for ckpt-<step>: the
# index, the data shards, and (during the save) the temp directory of the
# sharded writer with its part files, each first written as
# "<part file>.tempstate<random decimal>" and renamed when complete (TF's
# BundleWriter); TF's atomic write of the state file uses
# "<name>.tmp<uuid4 hex>".
_CKPT_FILE = re.compile(
    rf"^{PREFIX}-(\d+)\.(index|data-\d{{5}}-of-\d{{5}})$")
_TEMP_DIR = re.compile(rf"^{PREFIX}-(\d+)_temp$")
_TEMP_PART = re.compile(
    r"^part-\d{5}-of-\d{5}\.(index|data-\d{5}-of-\d{5})(\.tempstate\d+)?$")
_STATE_TEMP = re.compile(rf"^{STATE_FILENAME}\.tmp[0-9a-f]{{32}}$")
_DATA_SHARD = re.compile(r"\.data-(\d{5})-of-(\d{5})$")


class CheckpointError(RuntimeError):
  """The run's checkpoints cannot be resumed; the message says what to do."""


class CheckpointSaveError(CheckpointError):
  """A checkpoint save failed on a full disk; the message (one line) names
  the checkpoint, where, the intact previous one and the space needed."""


class ModelDirError(ValueError):
  """``--model_dir`` cannot be used; the message names the path and the fix."""


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
  diff = model_config_diff(model_dir, model_config)
  if diff:
    raise config_lib.ConfigError(
        f"{path} was written for a different model ({'; '.join(diff)}); "
        "use a fresh --model_dir or the original model flags")
  write_json_atomic(path, {"model": _as_stored(model_config), **sections})
  return path


def _as_stored(model_config: config_lib.ModelConfig) -> dict[str, Any]:
  # Through JSON, as it is stored: tuples compare equal to the lists read
  # back.
  return json.loads(json.dumps(model_config.to_dict()))


def model_config_diff(model_dir: str | os.PathLike[str],
                      model_config: config_lib.ModelConfig) -> list[str]:
  """How ``model_config`` differs from the model of the run in
  ``model_dir`` (``--flag: checkpoint X vs now Y`` each); [] if it has no
  ``config.json`` yet."""
  if not (pathlib.Path(model_dir) / CONFIG_FILENAME).is_file():
    return []
  old = rundir.read_run_config(model_dir).get("model", {})
  try:  # Fields added since the run was written compare as their defaults.
    old = _as_stored(config_lib.config_from_dict(old))
  except (TypeError, ValueError, KeyError):
    pass  # Not this version's config: compared as stored.
  return _dict_diff(old, _as_stored(model_config))


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


def check_model_dir(model_dir: str | os.PathLike[str]) -> None:
  """Raises :class:`ModelDirError` unless ``model_dir`` is, or can become, a
  writable directory. Creates nothing."""
  path = pathlib.Path(model_dir)
  flag = f"--model_dir={model_dir}"
  if path.exists() and not path.is_dir():
    raise ModelDirError(
        f"{flag} is a file, not a directory: pass a directory (a new one, or "
        "the --model_dir of the run to resume)")
  existing = path
  while not existing.exists() and existing != existing.parent:
    existing = existing.parent
  if existing != path and not existing.is_dir():
    raise ModelDirError(f"{flag} cannot be created: {existing} is a file, not "
                        "a directory; choose another --model_dir")
  if not os.access(existing, os.W_OK | os.X_OK):
    where = ("is not writable" if existing == path else
             f"cannot be created: {existing} is not writable")
    raise ModelDirError(f"{flag} {where}; choose a directory you can write to "
                        "or fix its permissions")


def prepare_model_dir(model_dir: str | os.PathLike[str]) -> pathlib.Path:
  """Checks ``model_dir`` (:func:`check_model_dir`) and creates it."""
  check_model_dir(model_dir)
  path = pathlib.Path(model_dir)
  try:
    path.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise ModelDirError(
        f"--model_dir={model_dir} cannot be created ({e.strerror}: "
        f"{e.filename}); choose a directory you can write to") from e
  return path


@dataclasses.dataclass(frozen=True)
class DamagedCheckpoint:
  """A checkpoint that failed verification.

  Attributes:
    path: its prefix, ``MODEL_DIR/ckpt-<step>``.
    reason: what was wrong with it.
    moved_to: the directory its files were moved into (None: it had none).
  """
  path: str
  reason: str
  moved_to: str | None


@dataclasses.dataclass(frozen=True)
class Recovery:
  """What :func:`recover_checkpoints` found and did.

  Attributes:
    latest: prefix of the newest intact checkpoint (None: the run has none).
    damaged: the checkpoints skipped because they are damaged, newest first.
    removed: leftovers of killed saves that were removed.
    state_rebuilt: why the state file was rewritten (None: it was not).
    killed_saves: steps of the run's saves found killed before they
      finished (their leftovers are in ``removed``).
  """
  latest: str | None
  damaged: tuple[DamagedCheckpoint, ...] = ()
  removed: tuple[str, ...] = ()
  state_rebuilt: str | None = None
  killed_saves: tuple[int, ...] = ()


def remove_stale_temp(model_dir: str | os.PathLike[str]) -> list[str]:
  """Removes what killed saves leave in ``model_dir``; returns their paths.

  Only TF's own temp names are touched: ``ckpt-<step>_temp/`` directories
  holding nothing but ``part-NNNNN-of-NNNNN.{index,data-*}`` files (the
  sharded writer's), and ``checkpoint.tmp<32 hex>`` files (the state file's
  atomic write). A temp-named directory holding anything else is left in
  place with a warning. Call it only while holding the run's lock: a running
  save's temp directory looks the same. What was removed is for the caller
  to report (the trainer's start line does: :mod:`m4moe.training.loop`).
  """
  removed = []
  for entry in sorted(pathlib.Path(model_dir).iterdir()):
    if (_TEMP_DIR.match(entry.name) and entry.is_dir() and
        not entry.is_symlink()):
      others = sorted(p.name for p in entry.iterdir()
                      if not (_TEMP_PART.match(p.name) and p.is_file()))
      if others:
        logging.warning(
            "Leaving %s in place: it is named like the temp directory of a "
            "killed checkpoint save but also holds %s, which the checkpoint "
            "writer does not create", entry, ", ".join(others[:5]))
        continue
      shutil.rmtree(entry)
      removed.append(str(entry))
    elif _STATE_TEMP.match(entry.name) and entry.is_file():
      entry.unlink()
      removed.append(str(entry))
  return removed


def _clear_killed_saves(directory: pathlib.Path,
                        listed: list[int] | None
                        ) -> tuple[list[str], set[int]]:
  """Removes the leftovers of saves killed before they finished.

  A save's temp directory ``ckpt-<step>_temp/`` outlives the save only if
  the save was killed before its merge step ended (the merge renames the
  data files to ``ckpt-<step>.data-*``, writes ``ckpt-<step>.index`` in
  place and only then deletes the temp directory). So when such a
  directory (of ours: :func:`remove_stale_temp`) is found for a step the
  state file does not list, that step's ``ckpt-<step>.*`` files are the
  killed save's too: they are removed unless they verify as complete (the
  kill came after the index was written). Nothing else is touched.

  Args:
    directory: the run's model directory (or its ``best/``).
    listed: the steps its state file lists (None: no usable state file).

  Returns:
    (paths removed, steps whose saves were killed).
  """
  removed = remove_stale_temp(directory)
  killed = {int(m.group(1)) for path in removed
            if (m := _TEMP_DIR.match(pathlib.Path(path).name))}
  for step in sorted(killed - set(listed or ())):
    files = _checkpoint_files(directory).get(step, [])
    if not files or verify_checkpoint(str(directory / f"{PREFIX}-{step}")) \
        is None:
      continue
    for path in files:
      path.unlink()
      removed.append(str(path))
  return removed, killed


def _short_error(error: BaseException) -> str:
  """A TF error's message without the op wrapper noise."""
  text = getattr(error, "message", None) or str(error)
  text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", text)
  text = re.sub(r"\s*\[Op:\w+\]", "", text)
  return f"{type(error).__name__}: {text.strip()}"


def verify_checkpoint(prefix: str) -> str | None:
  """None if checkpoint ``prefix`` is intact, else what is wrong with it.

  Opens the index and reads every tensor back from the data files (one at a
  time), so TF compares each tensor's bytes with the CRC32C stored in the
  index: a truncated, missing or altered file is found. Costs one read of
  the checkpoint.
  """
  index = f"{prefix}.index"
  if not os.path.isfile(index):
    return f"{os.path.basename(index)} is missing"
  try:
    reader = tf.train.load_checkpoint(prefix)
    for name, dtype in sorted(reader.get_variable_to_dtype_map().items()):
      tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[name],
                           shape_and_slices=[""], dtypes=[dtype])
  except (tf.errors.OpError, ValueError, RuntimeError) as e:
    return _short_error(e)
  return None


def _read_state(model_dir: pathlib.Path
                ) -> tuple[list[int] | None, str | None, dict[int, float]]:
  """(listed steps oldest first, problem, {step: save time}) of the state
  file; steps is None if the file is missing or unusable."""
  path = model_dir / STATE_FILENAME
  if not path.exists():
    return None, "missing", {}
  try:
    state = checkpoint_management.CheckpointState()
    text_format.Merge(path.read_text(encoding="utf-8"), state)
  except (OSError, UnicodeDecodeError, text_format.ParseError) as e:
    return None, f"unreadable ({type(e).__name__}: {e})", {}
  paths = list(state.all_model_checkpoint_paths)
  if state.model_checkpoint_path and (
      not paths or paths[-1] != state.model_checkpoint_path):
    paths.append(state.model_checkpoint_path)
  if not paths:
    return None, "unreadable (it names no checkpoint)", {}
  steps = []
  for name in paths:
    match = re.fullmatch(rf"{PREFIX}-(\d+)", os.path.basename(name))
    if match is None:
      return None, (f"unreadable (it names {name!r}, not a {PREFIX}-<step> "
                    "checkpoint)"), {}
    steps.append(int(match.group(1)))
  times = list(state.all_model_checkpoint_timestamps)
  stamps = dict(zip(steps, times)) if len(times) == len(steps) else {}
  return sorted(set(steps)), None, stamps


def _checkpoint_files(model_dir: pathlib.Path) -> dict[int, list[pathlib.Path]]:
  """{step: its ckpt-<step>.index / .data-* files} on disk."""
  out: dict[int, list[pathlib.Path]] = {}
  for entry in sorted(model_dir.iterdir()):
    match = _CKPT_FILE.match(entry.name)
    if match and entry.is_file():
      out.setdefault(int(match.group(1)), []).append(entry)
  return out


def _move_aside(model_dir: pathlib.Path, step: int,
                files: list[pathlib.Path]) -> str | None:
  """Moves a damaged checkpoint's files into ``damaged/ckpt-<step>[.n]/``."""
  if not files:
    return None
  base = model_dir / DAMAGED_DIRNAME / f"{PREFIX}-{step}"
  target, n = base, 1
  while target.exists():
    n += 1
    target = base.with_name(f"{base.name}.{n}")
  target.mkdir(parents=True)
  for path in files:
    os.replace(path, target / path.name)
  return str(target)


def _earlier_damaged(model_dir: pathlib.Path) -> list[str]:
  damaged = model_dir / DAMAGED_DIRNAME
  return sorted(str(p) for p in damaged.iterdir()) if damaged.is_dir() else []


def recover_checkpoints(model_dir: str | os.PathLike[str]) -> Recovery:
  """Makes ``model_dir``'s checkpoints safe to resume; see the module doc.

  Removes leftovers of killed saves; takes the checkpoints the state file
  lists (or, if it is missing or unparsable, every ``ckpt-<step>`` on disk)
  and verifies them newest first until one is intact, moving each damaged
  one's files into ``damaged/``; rewrites the state file if it was missing,
  unparsable or named a damaged checkpoint. Checkpoints on disk that an
  intact state file does not list are, if newer than its latest, saves
  killed before their commit: they are left alone (the next save of that
  step overwrites them); older ones (beyond ``max_to_keep`` of an earlier
  run, or copied back from a backup) are tried only when every listed one
  newer than them is damaged. Call it only while holding the run's lock
  (:mod:`m4moe.run_lock`).

  Returns:
    Recovery; ``latest`` is None for a run without checkpoints.

  Raises:
    CheckpointError: the run had checkpoints but none is intact.
  """
  model_dir = pathlib.Path(model_dir)
  listed, problem, stamps = _read_state(model_dir)
  removed, killed = _clear_killed_saves(model_dir, listed)
  best = model_dir / BEST_DIRNAME
  if best.is_dir():
    removed += _clear_killed_saves(best, _read_state(best)[0])[0]
  on_disk = _checkpoint_files(model_dir)
  state_path = model_dir / STATE_FILENAME
  if listed is None:
    candidates = sorted(on_disk)
  else:
    candidates = sorted(set(listed) | {s for s in on_disk if s < listed[-1]})
  rebuilt = None
  if listed is None and candidates:
    names = ", ".join(f"{PREFIX}-{s}" for s in candidates)
    rebuilt = (f"{state_path} is {problem}; rebuilt it from the checkpoint "
               f"files on disk ({names})")
    logging.warning("%s", rebuilt)
  latest, damaged = _newest_intact(model_dir, candidates=candidates,
                                   on_disk=on_disk)
  if latest is None:
    earlier = _earlier_damaged(model_dir)
    if damaged or earlier or (listed is None and problem != "missing"):
      raise CheckpointError(_no_intact_message(
          model_dir, damaged=damaged, earlier=earlier,
          state_problem=None if listed is not None else problem))
    return Recovery(latest=None, removed=tuple(removed),
                    killed_saves=tuple(sorted(killed)))
  if damaged and rebuilt is None:
    rebuilt = (f"{state_path} named damaged checkpoints "
               f"({', '.join(d.path for d in damaged)}); rewrote it")
  if rebuilt is not None:
    # Listed (or, without a usable state file, found) and not damaged; an
    # unlisted older checkpoint joins only as the one resumed from.
    _write_state(model_dir, latest=latest, stamps=stamps,
                 known=candidates if listed is None else listed)
  path = str(model_dir / f"{PREFIX}-{latest}")
  if damaged:
    logging.warning("Resuming from %s, the newest intact checkpoint", path)
  return Recovery(latest=path, damaged=tuple(damaged), removed=tuple(removed),
                  state_rebuilt=rebuilt, killed_saves=tuple(sorted(killed)))


def _newest_intact(model_dir: pathlib.Path, *, candidates: list[int],
                   on_disk: Mapping[int, list[pathlib.Path]]
                   ) -> tuple[int | None, list[DamagedCheckpoint]]:
  """Verifies ``candidates`` newest first until one is intact.

  Each damaged one's files are moved into ``damaged/`` on the way, so the
  next run (and TF's own ``latest_checkpoint``) never picks it again, yet
  its bytes stay for inspection.

  Args:
    model_dir: the run's model directory.
    candidates: steps to try, ascending.
    on_disk: {step: its files}, from :func:`_checkpoint_files`.

  Returns:
    (the newest intact step or None, the damaged ones newest first).
  """
  damaged: list[DamagedCheckpoint] = []
  for step in reversed(candidates):
    prefix = str(model_dir / f"{PREFIX}-{step}")
    files = on_disk.get(step, [])
    reason = (verify_checkpoint(prefix) if files else
              f"the state file names it but no {PREFIX}-{step}.* file exists")
    if reason is None:
      return step, damaged
    moved = _move_aside(model_dir, step, files)
    damaged.append(DamagedCheckpoint(path=prefix, reason=reason,
                                     moved_to=moved))
    logging.warning("Skipping damaged checkpoint %s: %s.%s", prefix, reason,
                    f" Its files were moved to {moved}." if moved else "")
  return None, damaged


def _write_state(model_dir: pathlib.Path, *, latest: int, known: list[int],
                 stamps: Mapping[int, float]) -> None:
  """Rewrites the state file to list ``latest`` and the ``known`` steps
  before it, with their save times.

  The times are kept (from the old file, else the index file's mtime) so
  the rewritten file says what the lost or damaged one said about the
  checkpoints that are left; ``tf.train.CheckpointManager`` reads them back
  with the paths.
  """
  kept = sorted({s for s in known if s < latest} | {latest})
  times = [_save_time(model_dir, s, stamps) for s in kept]
  checkpoint_management.update_checkpoint_state_internal(
      save_dir=str(model_dir), model_checkpoint_path=f"{PREFIX}-{latest}",
      all_model_checkpoint_paths=[f"{PREFIX}-{s}" for s in kept],
      save_relative_paths=True, all_model_checkpoint_timestamps=times,
      last_preserved_timestamp=max(times))


def _save_time(model_dir: pathlib.Path, step: int,
               stamps: Mapping[int, float]) -> float:
  """When ``ckpt-<step>`` was saved: from the old state file, else its index."""
  if step in stamps:
    return stamps[step]
  index = model_dir / f"{PREFIX}-{step}.index"
  return os.path.getmtime(index) if index.exists() else time.time()


def _no_intact_message(model_dir: pathlib.Path, *,
                       damaged: list[DamagedCheckpoint], earlier: list[str],
                       state_problem: str | None) -> str:
  parts = []
  if state_problem is not None:
    parts.append(f"its state file {model_dir / STATE_FILENAME} is "
                 f"{state_problem} and no {PREFIX}-<step> files are left")
  for d in damaged:
    parts.append(f"{d.path} is {'damaged' if d.moved_to else 'gone'} "
                 f"({d.reason})" +
                 (f", its files were moved to {d.moved_to}" if d.moved_to
                  else ""))
  earlier = [e for e in earlier if e not in {d.moved_to for d in damaged}]
  if earlier:
    parts.append(f"damaged checkpoints kept from earlier starts: "
                 f"{', '.join(earlier)}")
  return (f"--model_dir={model_dir} has no intact checkpoint left: "
          f"{'; '.join(parts)}. Nothing was deleted, and training did not "
          "start over (it would overwrite the run's metrics). To resume, "
          f"copy an intact {PREFIX}-<step>.index and its .data-* files (e.g. "
          "from a backup) into the directory and run again; to train from "
          "step 0 instead, use a fresh --model_dir.")


def check_fresh_start(model_dir: str | os.PathLike[str], *,
                      checkpoint_every: int,
                      killed_saves: tuple[int, ...] = ()) -> None:
  """Refuses to start from step 0 over a run that had checkpoints.

  Called when :func:`recover_checkpoints` found none. A start from step 0
  drops the records of every later step from ``metrics.jsonl``; that is
  right for a run stopped before its first checkpoint was complete (its
  steps are redone) but would silently erase a run whose checkpoints were
  lost: an ``end`` record, a resumed ``start`` or a step at or past
  ``checkpoint_every`` (the smaller of this run's and the one in
  ``config.json``) means a checkpoint was written, unless the leftovers
  of a killed save (``killed_saves``, from :class:`Recovery`) show that
  the save of that step, the run's first, never finished.

  Raises:
    CheckpointError: the metrics show checkpointed progress.
  """
  model_dir = pathlib.Path(model_dir)
  path = model_dir / metrics_log.METRICS_FILENAME
  if not path.is_file():
    return
  records = metrics_log.read_metrics(path)
  last = max((int(r.get("step") or 0) for r in records), default=0)
  if last == 0:
    return
  every = checkpoint_every
  try:
    every = min(every, int(rundir.read_run_config(model_dir)["train"][
        "checkpoint_every"]))
  except (rundir.RunDirError, KeyError, TypeError, ValueError):
    pass
  # The save of the step logged last was the first one, and it was killed.
  first_save_killed = bool(killed_saves) and last <= max(killed_saves) <= every
  saved = (last >= every and not first_save_killed) or any(
      r.get("kind") == "end" or (r.get("kind") == "start" and r.get("step"))
      for r in records)
  if saved:
    raise CheckpointError(
        f"{path} records training up to step {last}, but --model_dir="
        f"{model_dir} holds no checkpoint (no {PREFIX}-<step> files and no "
        f"{STATE_FILENAME} state file), so that progress is lost or was "
        "moved away. Not starting over: that would overwrite the metrics. "
        f"Put the run's {STATE_FILENAME} and {PREFIX}-<step> files back to "
        "resume, or use a fresh --model_dir (or move metrics.jsonl away) to "
        "train from step 0.")


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
    self._objects = dict(objects)
    self.checkpoint = tf.train.Checkpoint(**objects)
    self.manager = tf.train.CheckpointManager(
        self.checkpoint, directory, max_to_keep=max_to_keep)

  @property
  def latest(self) -> str | None:
    return self.manager.latest_checkpoint

  def restore_latest(self) -> str | None:
    """Restores the latest complete checkpoint; returns its path or None.

    The state file is trusted here: run :func:`recover_checkpoints` on the
    directory first (as :func:`m4moe.training.loop.train` does), so that it names
    only intact checkpoints.
    """
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
    """Saves ``ckpt-<step>``; returns its path.

    Raises:
      CheckpointSaveError: the disk is full (the state file still names the
        previous complete checkpoint, which the next start resumes from).
    """
    previous = self.manager.latest_checkpoint
    try:
      path = self.manager.save(checkpoint_number=step)
    except (tf.errors.OpError, OSError) as e:
      if not errors.is_disk_full(e):
        raise
      kept = (f"the previous checkpoint {pathlib.Path(previous).name} is "
              "intact and the next start resumes from it" if previous else
              "no earlier checkpoint exists, so the next start begins at "
              "step 0")
      raise CheckpointSaveError(errors.disk_full_message(
          action=f"saving checkpoint ckpt-{step}",
          path=self.manager.directory, kept=kept,
          needed_bytes=self.checkpoint_bytes())) from None
    logging.info("Saved %s", path)
    return path

  def checkpoint_bytes(self) -> int:
    """Bytes one checkpoint of these objects takes: the newest one's files
    on disk, else the sum of the variables' sizes."""
    latest = self.manager.latest_checkpoint
    if latest:
      prefix = pathlib.Path(latest)
      files = list(prefix.parent.glob(f"{prefix.name}.*"))
      if files:
        return sum(f.stat().st_size for f in files)
    seen, total = set(), 0
    for variable in self.checkpoint_variables():
      if id(variable) not in seen:
        seen.add(id(variable))
        total += variable.shape.num_elements() * variable.dtype.size
    return total

  def checkpoint_variables(self) -> list[Any]:
    """The variables of the saved objects (model, optimiser, counters)."""
    out = []
    for obj in self._objects.values():
      if isinstance(obj, tf.Variable):
        out.append(obj)
        continue
      variables = getattr(obj, "variables", None)
      if callable(variables):
        variables = variables()
      out.extend(v for v in variables or () if hasattr(v, "dtype"))
    return out


def best_keeper(model_dir: str | os.PathLike[str], *,
                model: Any) -> CheckpointKeeper:
  """The run's best-on-dev weights: ``<model_dir>/best/ckpt-<step>``.

  Model weights only (no optimiser state, counters or input iterator), one
  checkpoint: the trainer saves it at every dev evaluation that sets a new
  best dev cross-entropy, and ``--checkpoint=best`` of m4moe-eval,
  m4moe-decode and m4moe-export reads it (:func:`m4moe.training.rundir.find_run_files`).
  A save killed half-way leaves the previous best named by the state file.
  """
  return CheckpointKeeper(str(pathlib.Path(model_dir) / BEST_DIRNAME),
                          max_to_keep=1, model=model)


class PreemptionGuard:
  """Context manager turning SIGTERM, SIGINT or SIGHUP into "save and stop".

  TPU VMs (and most schedulers) send SIGTERM before killing a job, a
  terminal sends SIGINT (Ctrl-C) or SIGHUP; the loop polls
  :attr:`requested` after every step. A second SIGINT after the request
  raises ``KeyboardInterrupt`` at once (the last checkpoint stays intact).
  Outside the main thread (where Python cannot install signal handlers) the
  guard is inactive.
  """

  def __init__(self, signals: tuple[int, ...] = (
      signal.SIGTERM, signal.SIGINT, signal.SIGHUP)):
    self._signals = signals
    self._event = threading.Event()
    self._previous: dict[int, Any] = {}

  @property
  def requested(self) -> bool:
    return self._event.is_set()

  def _handle(self, signum, frame) -> None:  # pylint: disable=unused-argument
    if signum == signal.SIGINT and self._event.is_set():
      raise KeyboardInterrupt("second Ctrl-C: stopping without saving")
    logging.warning("Received signal %d: saving and stopping after this step"
                    "%s", signum, " (Ctrl-C again: stop without saving)"
                    if signum == signal.SIGINT else "")
    self._event.set()

  def __enter__(self) -> "PreemptionGuard":
    if threading.current_thread() is threading.main_thread():
      for sig in self._signals:
        self._previous[sig] = signal.signal(sig, self._handle)
    else:
      logging.warning("Not in the main thread: SIGTERM/SIGINT/SIGHUP will "
                      "not be handled")
    return self

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous.clear()
