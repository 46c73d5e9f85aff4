"""One error family for bad settings, and the one helper that raises it.

Every config dataclass validates itself at construction and reports a bad
value as ``--flag=value is invalid: how to fix it``, naming the absl flag the
user sets (the field name, or its flag name where they differ). The
subclasses (:class:`m4moe.training.optimizer.OptimizerConfigError`,
:class:`m4moe.training.loop.TrainConfigError`,
:class:`m4moe.training.inputs.DataConfigError`) say which config it was; a
tool catches :class:`ConfigError` (a ``ValueError``) for all of them.

:func:`is_disk_full` and :func:`disk_full_message` give every tool that
writes (checkpoints, eval outputs, exports, vocabularies, corpora) the same
one-line account of a full disk: which write failed, where, how much space
is free there, what survived and what the write needs.
"""

from __future__ import annotations

import errno
import os
import pathlib
import shutil
from typing import Any

_NO_SPACE = "No space left on device"


class ConfigError(ValueError):
  """A configuration value is invalid; the message names the flag and the fix."""


def require(condition: bool, flag: str, value: Any, fix: str, *,
            error: type[ConfigError] = ConfigError) -> None:
  """Raises ``error("--flag=value is invalid: fix")`` unless ``condition``.

  Args:
    condition: True when the value is fine.
    flag: the flag name, without dashes.
    value: the bad value (shown with ``repr``).
    fix: what to do instead, e.g. "use a positive integer".
    error: the :class:`ConfigError` subclass to raise.
  """
  if not condition:
    raise error(f"--{flag}={value!r} is invalid: {fix}")


def is_disk_full(error: BaseException) -> bool:
  """Whether ``error`` is a full disk (or quota): an ``OSError`` with
  ``ENOSPC``/``EDQUOT``, or a TensorFlow op error (e.g. SaveV2's
  ``ResourceExhaustedError``) whose message is the OS's."""
  if isinstance(error, OSError) and error.errno in (errno.ENOSPC,
                                                    errno.EDQUOT):
    return True
  return _NO_SPACE in str(error) or "Disk quota exceeded" in str(error)


def megabytes(num_bytes: float) -> str:
  """``num_bytes`` as "12.3 MB" (decimal megabytes, as df -H shows)."""
  return f"{num_bytes / 1e6:.1f} MB"


def free_space(path: str | os.PathLike[str]) -> int | None:
  """Bytes free for this user on ``path``'s file system (its nearest
  existing ancestor); None when that cannot be read."""
  path = pathlib.Path(path).absolute()
  for candidate in (path, *path.parents):
    if candidate.exists():
      try:
        return shutil.disk_usage(candidate).free
      except OSError:
        return None
  return None


def disk_full_message(*, action: str, path: str | os.PathLike[str],
                      kept: str, needed_bytes: int | None = None) -> str:
  """One line for a write that failed on a full disk.

  Args:
    action: what failed, e.g. "saving checkpoint ckpt-400".
    path: where it was writing.
    kept: what is intact, e.g. "the previous checkpoint ckpt-200 is intact".
    needed_bytes: how much the write needs (None: unknown).
  """
  free = free_space(path)
  free_text = f" ({megabytes(free)} free there)" if free is not None else ""
  need = (f"; it needs about {megabytes(needed_bytes)}"
          if needed_bytes is not None else "")
  return (f"{action} failed: no space left on device at {path}{free_text}; "
          f"{kept}{need}. Free some space (or choose a directory on another "
          "disk) and re-run the same command")
