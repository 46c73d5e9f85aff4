"""Line input and file output of the translation tools.

Input (m4moe-decode): strict UTF-8, language column, progress bar.

Output (m4moe-decode, m4moe-eval, m4moe-export, m4moe-report): every
output path is checked with :func:`check_output_file` /
:func:`check_output_dir` *before* any decoding starts, and written with
:func:`write_text_atomic` / :func:`write_bytes_atomic` (a temporary file in
the same directory, fsync, ``os.replace``), so a failure or kill never
leaves a partial or 0-byte file under the final name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import sys
import tempfile
import time
from typing import BinaryIO, Iterator, TextIO


class InputError(ValueError):
  """Bad input; the message names the line."""


class OutputError(ValueError):
  """An output path cannot be written; the message names the flag and path."""


@dataclasses.dataclass(frozen=True)
class InputLine:
  """One input line: its 1-based number, source language and text."""

  number: int
  lang: str | None
  text: str


def read_lines(stream: BinaryIO, *, name: str = "<stdin>",
               lang_column: bool = False) -> list[InputLine]:
  """Reads every line; ``lang<TAB>text`` lines when ``lang_column``.

  Raises:
    InputError: invalid UTF-8 or a missing language column, naming the line.
  """
  out = []
  for number, raw in enumerate(stream, start=1):
    raw = raw.rstrip(b"\n").rstrip(b"\r")
    try:
      text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
      raise InputError(
          f"{name}: line {number} is not valid UTF-8 (byte "
          f"0x{raw[e.start]:02x} at byte offset {e.start}); re-encode the "
          "input as UTF-8 (e.g. iconv -t utf-8)") from e
    lang = None
    if lang_column and text:
      lang, tab, text = text.partition("\t")
      if not tab or not lang:
        raise InputError(f"{name}: line {number} has no 'lang<TAB>text' "
                         "column (--lang_column is set)")
    out.append(InputLine(number, lang, text))
  return out


class Progress:
  """A one-line progress bar with sentences/s on a text stream.

  Redraws at most every ``interval`` seconds; silent when ``enabled`` is
  False.
  """

  def __init__(self, total: int, *, stream: TextIO = sys.stderr,
               enabled: bool = True, interval: float = 0.5, width: int = 30):
    self.total, self.stream, self.enabled = total, stream, enabled
    self.interval, self.width = interval, width
    self.done = 0
    self.start = time.time()
    self._last = 0.0

  def rate(self) -> float:
    return self.done / max(time.time() - self.start, 1e-9)

  def line(self) -> str:
    filled = int(self.width * self.done / max(self.total, 1))
    bar = "=" * filled + " " * (self.width - filled)
    return (f"[{bar}] {self.done}/{self.total} sentences, "
            f"{self.rate():.1f} sentences/s")

  def __call__(self, count: int) -> None:
    self.done += count
    now = time.time()
    if self.enabled and (now - self._last >= self.interval or
                         self.done >= self.total):
      self._last = now
      self.stream.write("\r" + self.line())
      self.stream.flush()

  def close(self) -> None:
    if self.enabled:
      self.stream.write("\r" + self.line() + "\n")
      self.stream.flush()


def _nearest_existing(path: pathlib.Path) -> pathlib.Path:
  """``path`` or its closest existing ancestor."""
  path = pathlib.Path(os.path.abspath(path))
  while not path.exists() and path != path.parent:
    path = path.parent
  return path


def _check_creatable_dir(directory: pathlib.Path, *, what: str) -> None:
  """Raises OutputError unless ``directory`` exists or can be created."""
  existing = _nearest_existing(directory)
  if not existing.is_dir():
    raise OutputError(f"{what}: {existing} is a file, not a directory; "
                      "choose another path")
  if not os.access(existing, os.W_OK | os.X_OK):
    raise OutputError(f"{what}: {existing} is not writable; choose a "
                      "directory you can write to")


def check_output_file(path: str | os.PathLike[str], *,
                      flag: str) -> pathlib.Path:
  """Checks that a file can be written at ``path`` (before the work).

  The file may exist (it is replaced) but must not be a directory; its
  directory must exist or be creatable, and be writable.

  Args:
    path: the output file.
    flag: the flag naming it (for the message), e.g. ``--output``.

  Raises:
    OutputError: naming the flag, the path and what to do.
  """
  path = pathlib.Path(path)
  what = f"{flag}={path}"
  if path.is_dir():
    raise OutputError(f"{what} is a directory; give a file name (e.g. "
                      f"{path / 'out.txt'})")
  if path.exists() and not os.access(path, os.W_OK):
    raise OutputError(f"{what} exists and is not writable; choose another "
                      "file or fix its permissions")
  _check_creatable_dir(path.parent, what=what)
  return path


def check_output_dir(path: str | os.PathLike[str], *, flag: str,
                     must_be_empty: bool = False) -> pathlib.Path:
  """Checks that ``path`` is (or can become) a writable directory.

  Args:
    path: the output directory.
    flag: the flag naming it, e.g. ``--output_dir``.
    must_be_empty: also refuse an existing non-empty directory (outputs
      that replace the whole directory, which would delete its files).

  Raises:
    OutputError: naming the flag, the path and what to do.
  """
  path = pathlib.Path(path)
  what = f"{flag}={path}"
  if path.exists() and not path.is_dir():
    raise OutputError(f"{what} is a file, not a directory; choose another "
                      "path")
  if must_be_empty and path.is_dir() and any(path.iterdir()):
    raise OutputError(f"{what} exists and is not empty; choose a new "
                      "directory (it is never overwritten) or remove it")
  _check_creatable_dir(path, what=what)
  return path


@contextlib.contextmanager
def _atomic_file(path: pathlib.Path, mode: str, **kwargs) -> Iterator:
  """Yields a temporary file next to ``path``; renamed onto it on success."""
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                             suffix=".tmp")
  try:
    with os.fdopen(fd, mode, **kwargs) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, 0o644)  # mkstemp creates 0600
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(tmp)
    raise


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
  """Writes UTF-8 ``text`` to ``path`` via a temp file + ``os.replace``."""
  with _atomic_file(pathlib.Path(path), "w", encoding="utf-8",
                    newline="") as f:
    f.write(text)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
  """Writes ``data`` to ``path`` via a temp file + ``os.replace``."""
  with _atomic_file(pathlib.Path(path), "wb") as f:
    f.write(data)
