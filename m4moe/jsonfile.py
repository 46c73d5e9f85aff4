"""The JSON files tools hand to each other: one reader, one path rule.

A corpus ``report.json``, a run's ``config.json``, ``m4moe-run``'s stage
records, eval JSONs and the averaging record are all read through
:func:`load`, so a damaged file (truncated by a full disk, hand-edited, of
another kind) gives one message naming the file, what is wrong with it
(line and column of a syntax error, and whether the text simply ends
early) and what to do, instead of a ``JSONDecodeError`` traceback.

It is a module of its own rather than part of :mod:`m4moe.errors`, which
is about flag values and is imported by every config dataclass: file
reading is a different concern with its own callers. Its error is a
``ValueError``, so a tool's existing ``except ValueError`` catches it.

These files are copied into ``results/`` and read on other machines, so
the paths a tool writes into them are relative (:func:`relative_path`,
:func:`relative_command`): an absolute path would name a directory of the
machine the run happened on, which a reader elsewhere does not have.
Each tool's docstring says what its paths are relative to (the run
directory, or the JSON file's own directory).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from typing import Any, Sequence


class JSONFileError(ValueError):
  """A JSON file is missing, unreadable, not JSON or of the wrong shape.

  The message names the file, what is wrong and what to do.
  """


def _syntax(path: pathlib.Path, text: str,
            error: json.JSONDecodeError) -> str:
  if not text.strip():
    return "is empty"
  # The parser stopped at the end, or inside a string never closed: the
  # text was cut short rather than miswritten.
  if (error.pos >= len(text.rstrip()) or
      error.msg.startswith("Unterminated string")):
    return (f"ends early at line {error.lineno} column {error.colno} "
            f"({len(text.encode('utf-8'))} bytes: truncated, e.g. by a full "
            "disk or a killed writer)")
  return (f"is not valid JSON: {error.msg} at line {error.lineno} column "
          f"{error.colno}")


def load(path: str | os.PathLike[str], *, what: str, fix: str,
         expect: type | None = dict) -> Any:
  """Parses the JSON file ``path``.

  Args:
    path: the file.
    what: what the file is, for the message, e.g. "the corpus build report".
    fix: what the user should do, e.g. "rebuild the corpus with
      m4moe-build-corpus".
    expect: the type the top-level value must have (None: any).

  Returns:
    The parsed value.

  Raises:
    JSONFileError: ``path`` is missing, unreadable, not UTF-8, not JSON or
      not an ``expect``; the message is
      ``"<path>: <what> <problem>; <fix>"``.
  """
  path = pathlib.Path(path)

  def fail(problem: str, cause: BaseException | None = None):
    raise JSONFileError(f"{path}: {what} {problem}; {fix}") from cause

  try:
    data = path.read_bytes()
  except FileNotFoundError as e:
    fail("does not exist", e)
  except IsADirectoryError as e:
    fail("is a directory, not a file", e)
  except OSError as e:
    fail(f"cannot be read ({e.strerror or e})", e)
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    fail(f"is not UTF-8 text (byte {e.start} is {data[e.start]:#04x}): it "
         "is damaged or another kind of file", e)
  try:
    value = json.loads(text)
  except json.JSONDecodeError as e:
    fail(_syntax(path, text, e), e)
  except RecursionError as e:
    fail("is nested too deeply to read", e)
  if expect is not None and not isinstance(value, expect):
    fail(f"holds a JSON {type(value).__name__}, expected a JSON "
         f"{'object' if expect is dict else expect.__name__}")
  return value


# What a recorded command names its interpreter: the virtualenv's path says
# nothing about the run, and differs on every machine.
INTERPRETER = "python3"


def relative_path(path: str | os.PathLike[str], *,
                  start: str | os.PathLike[str]) -> str:
  """``path`` relative to the directory ``start`` (both may be relative
  to the working directory), e.g. ``"../models/moe"``."""
  return os.path.relpath(os.path.abspath(path), os.path.abspath(start))


def relative_command(command: Sequence[str], *,
                     start: str | os.PathLike[str]) -> list[str]:
  """A command line as a record holds it: a Python interpreter in first
  place as :data:`INTERPRETER`, and every absolute path (an argument, or
  a ``--flag=`` value, each item of a comma-separated list, and the path
  of a ``name=path`` item) relative to ``start``. Relative arguments are
  kept, so a command already in this form comes back unchanged."""
  def item(value: str) -> str:
    if os.path.isabs(value):
      return relative_path(value, start=start)
    name, sep, rest = value.partition("=")
    if sep and os.path.isabs(rest):
      return f"{name}={relative_path(rest, start=start)}"
    return value
  def arg(value: str) -> str:
    flag, sep, rest = value.partition("=")
    if sep and flag.startswith("-"):
      return f"{flag}={','.join(item(v) for v in rest.split(','))}"
    return item(value)
  if not command:
    return []
  first = command[0]
  if os.path.basename(first).startswith("python"):
    first = INTERPRETER
  return [arg(first), *(arg(a) for a in command[1:])]


# An absolute path inside a text: not preceded by a word character, a dot,
# a colon or a slash (so neither "1/8" nor a URL's "//host"), up to a
# blank, a quote, a colon (e.g. "file.po:3") or a closing bracket.
_ABSOLUTE_IN_TEXT = re.compile(r"(?<![\w./:~-])/(?!/)[^\s'\",;:)\]]+")


def relative_paths_in(value: Any, *, start: str | os.PathLike[str]) -> Any:
  """``value`` (parsed JSON) with every absolute path inside its strings,
  messages included (e.g. ``"CatalogError: /x/a.po: bad"``), made
  relative to ``start``; numbers and the structure are kept. For a report
  whose messages quote the files they are about."""
  if isinstance(value, str):
    return _ABSOLUTE_IN_TEXT.sub(
        lambda m: relative_path(m.group(0), start=start), value)
  if isinstance(value, list):
    return [relative_paths_in(item, start=start) for item in value]
  if isinstance(value, dict):
    return {relative_paths_in(key, start=start):
            relative_paths_in(item, start=start)
            for key, item in value.items()}
  return value
