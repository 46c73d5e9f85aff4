"""One writer per run directory: an advisory lock on ``MODEL_DIR/train.lock``.

Two trainers on one ``--model_dir`` would interleave checkpoints, rewrite
each other's state file and metrics, and remove each other's in-progress
saves as "stale". :class:`RunLock` takes ``fcntl.flock(LOCK_EX | LOCK_NB)``
on ``train.lock`` for as long as the run is open. The other tools that own
a directory take the same kind of lock on their own file (``m4moe-run``:
``RUN_DIR/run.lock``; ``m4moe-vocab``, ``m4moe-report`` and
``m4moe-build-corpus``: see :data:`TOOL_LOCKS`), so one mechanism, one
message format and one ``kill -9`` behaviour serve them all; it sits at the
package's root, below ``data`` and ``training``, which both use it. The
kernel drops the lock when its owner exits, however it exits (``kill -9``
included), so a dead owner never leaves the directory stuck; the file
itself stays (removing a lock file races with the next locker) and only
records the current owner (pid, host, start time, command) for the error
message of the next comer.

flock works on local file systems and on Linux NFS clients (emulated with
byte-range locks); on file systems without locking the acquisition fails
with the OS error, which :class:`RunLockedError` does not hide.
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import json
import os
import pathlib
import socket
import sys
import time
from typing import Any

LOCK_FILENAME = "train.lock"
# How long a refused process waits for the holder's record (see _read_owner).
OWNER_WAIT_SECONDS = 5.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class LockRole:
  """Which tool a lock serves, for the message the next comer reads.

  Attributes:
    filename: the lock file's name in the locked directory.
    rule: what the lock enforces, e.g. "only one m4moe-train may write a
      --model_dir".
    advice: what the refused user can do.
  """

  filename: str
  rule: str
  advice: str


TRAIN = LockRole(
    filename=LOCK_FILENAME,
    rule="only one m4moe-train may write a --model_dir",
    advice="Wait for it to finish, stop it (SIGTERM saves a checkpoint "
    "first), or use another --model_dir.")
RUN = LockRole(
    filename="run.lock",
    rule="only one m4moe-run job may use a --run_dir",
    advice="Wait for that job to finish, stop it (kill -TERM <pid>: its "
    "running stage stops, a training stage after saving a checkpoint) and "
    "re-run this command to resume, or use another --run_dir.")
VOCAB = LockRole(
    filename="vocab.lock",
    rule="only one m4moe-vocab may write an --output_dir",
    advice="Wait for it to finish, or use another --output_dir.")
# Kept beside the corpus directory (``.<name>.lock``), which a build
# replaces by renaming: a lock inside it would go with the old directory.
CORPUS = LockRole(
    filename="",
    rule="only one m4moe-build-corpus may build an --output_dir (a second "
    "build would delete the first one's temporary directory as stale)",
    advice="Wait for it to finish, or use another --output_dir.")
REPORT = LockRole(
    filename="report.lock",
    rule="only one m4moe-report may write an --output_dir",
    advice="Wait for it to finish, or use another --output_dir.")


class RunLockedError(RuntimeError):
  """Another process holds the run directory's lock; the message names it."""


def _describe(owner: dict[str, Any]) -> str:
  if not owner.get("pid"):
    return "another process (it has not written its pid yet)"
  where = f" on {owner['host']}" if owner.get("host") else ""
  since = f", running since {owner['since']}" if owner.get("since") else ""
  command = f" ({owner['command']})" if owner.get("command") else ""
  return f"pid {owner['pid']}{where}{since}{command}"


def _alive(pid: Any) -> bool:
  try:
    os.kill(int(pid), 0)
  except PermissionError:
    return True
  except (OSError, ValueError, TypeError):
    return False
  return True


def _read_owner(path: pathlib.Path) -> dict[str, Any]:
  """The lock holder's record, waiting briefly for a holder still writing it.

  A holder writes its record just after it takes the lock, so a refused
  process can read the file in between: empty (a new file) or the previous,
  dead holder's record (the file is rewritten, not removed). Either way the
  record is re-read for up to :data:`OWNER_WAIT_SECONDS` until it names a
  live process of this host; what is read last is described otherwise.
  """
  deadline = time.monotonic() + OWNER_WAIT_SECONDS
  while True:
    try:
      owner = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
      owner = {}
    if not isinstance(owner, dict):
      owner = {}
    settled = owner.get("pid") and (
        owner.get("host") != socket.gethostname() or _alive(owner["pid"]))
    if settled or time.monotonic() >= deadline:
      return owner
    time.sleep(0.02)


class RunLock:
  """Context manager holding the exclusive lock of a run directory.

  Args:
    directory: the run directory (it must exist).
    role: the tool it serves (lock file name and message); the trainer's
      by default.
    filename: overrides ``role.filename`` (a lock kept beside a directory
      that is replaced by renaming, e.g. the corpus's).
    subject: what is locked, for the message (default: ``directory``).

  Raises (on enter):
    RunLockedError: another process, or another RunLock of this process,
      holds it.
  """

  def __init__(self, directory: str | os.PathLike[str], *,
               role: LockRole = TRAIN, filename: str | None = None,
               subject: str | os.PathLike[str] | None = None):
    self.path = pathlib.Path(directory) / (filename or role.filename)
    self.role = role
    self.subject = str(subject if subject is not None else directory)
    self._file = None

  def __enter__(self) -> "RunLock":
    # Append mode: opening never truncates the current owner's record.
    f = open(self.path, "a+", encoding="utf-8")  # pylint: disable=R1732
    try:
      fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      f.close()
      owner = _read_owner(self.path)
      raise RunLockedError(
          f"{self.subject} is in use by {_describe(owner)}, which holds "
          f"{self.path}: {self.role.rule}. {self.role.advice}") from None
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
