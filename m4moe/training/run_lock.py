"""One writer per run directory: an advisory lock on ``MODEL_DIR/train.lock``.

Two trainers on one ``--model_dir`` would interleave checkpoints, rewrite
each other's state file and metrics, and remove each other's in-progress
saves as "stale". :class:`RunLock` takes ``fcntl.flock(LOCK_EX | LOCK_NB)``
on ``train.lock`` for as long as the run is open. The kernel drops the lock
when its owner exits, however it exits (``kill -9`` included), so a dead
owner never leaves the directory stuck; the file itself stays (removing a
lock file races with the next locker) and only records the current owner
(pid, host, start time, command) for the error message of the next comer.

flock works on local file systems and on Linux NFS clients (emulated with
byte-range locks); on file systems without locking the acquisition fails
with the OS error, which :class:`RunLockedError` does not hide.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import pathlib
import socket
import sys
from typing import Any

LOCK_FILENAME = "train.lock"


class RunLockedError(RuntimeError):
  """Another process holds the run directory's lock; the message names it."""


def _describe(owner: dict[str, Any]) -> str:
  if not owner.get("pid"):
    return "another process (it has not written its pid yet)"
  where = f" on {owner['host']}" if owner.get("host") else ""
  since = f", running since {owner['since']}" if owner.get("since") else ""
  command = f" ({owner['command']})" if owner.get("command") else ""
  return f"pid {owner['pid']}{where}{since}{command}"


class RunLock:
  """Context manager holding the exclusive lock of a run directory.

  Args:
    directory: the run directory (it must exist).

  Raises (on enter):
    RunLockedError: another process, or another RunLock of this process,
      holds it.
  """

  def __init__(self, directory: str | os.PathLike[str]):
    self.path = pathlib.Path(directory) / LOCK_FILENAME
    self._file = None

  def __enter__(self) -> "RunLock":
    # Append mode: opening never truncates the current owner's record.
    f = open(self.path, "a+", encoding="utf-8")  # pylint: disable=R1732
    try:
      fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      f.seek(0)
      try:
        owner = json.loads(f.read() or "{}")
      except ValueError:
        owner = {}
      f.close()
      raise RunLockedError(
          f"{self.path.parent} is in use by {_describe(owner)}, which holds "
          f"{self.path}: only one m4moe-train may write a --model_dir. Wait "
          "for it to finish, stop it (SIGTERM saves a checkpoint first), or "
          "use another --model_dir.") from None
    except BaseException:
      f.close()
      raise
    f.seek(0)
    f.truncate()
    json.dump({"pid": os.getpid(), "host": socket.gethostname(),
               "since": datetime.datetime.now(datetime.timezone.utc)
               .isoformat(timespec="seconds"),
               "command": " ".join(sys.argv)}, f)
    f.write("\n")
    f.flush()
    self._file = f
    return self

  def __exit__(self, *exc) -> None:
    if self._file is not None:
      fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
      self._file.close()
      self._file = None
