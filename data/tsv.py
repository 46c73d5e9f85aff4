"""Corpus TSV lines: what a well-formed ``english<TAB>translation`` line is.

A built corpus stores each split and language as ``<split>/<lang>.tsv``, one
pair per line: valid UTF-8, exactly one tab, lines ended by ``\\n`` (a
``\\r`` before it is ignored, as the tf.data readers do). Any other line is
malformed: invalid UTF-8, no tab, more than two fields, or empty. A corpus
written by ``m4moe-build-corpus`` has none, but hand-edited or foreign files
may; the training pipeline skips and counts them (:mod:`pipeline`),
``m4moe-train --check_config`` reports them as ``file:line: problem``.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
from typing import Mapping

# Malformed lines whose message a scan keeps (all are counted).
MAX_EXAMPLES = 20
# A line with two or more tabs.
_TWO_TABS = re.compile(rb"\t[^\n]*\t")


@dataclasses.dataclass(frozen=True)
class TsvProblem:
  """One malformed line: file, 1-based line number, what is wrong."""

  path: pathlib.Path
  line: int
  message: str

  def __str__(self) -> str:
    return f"{self.path}:{self.line}: {self.message}"


def line_problem(raw: bytes) -> str | None:
  """What is wrong with one line (terminator stripped), or None if valid."""
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    return (f"invalid UTF-8 (byte 0x{raw[e.start]:02x} at byte offset "
            f"{e.start}); re-encode the file as UTF-8")
  if not text:
    return "empty line; expected 'english<TAB>translation'"
  tabs = text.count("\t")
  if tabs == 0:
    return "no tab; expected 'english<TAB>translation'"
  if tabs > 1:
    return (f"{tabs + 1} tab-separated fields; expected 2 "
            "('english<TAB>translation')")
  return None


def _strip(raw: bytes) -> bytes:
  raw = raw[:-1] if raw.endswith(b"\n") else raw
  return raw[:-1] if raw.endswith(b"\r") else raw


@dataclasses.dataclass(frozen=True)
class TsvScan:
  """The result of checking every line of one corpus TSV file.

  Attributes:
    path: the file.
    lines: number of lines.
    bad_lines: 1-based numbers of the malformed lines, ascending.
    examples: the first :data:`MAX_EXAMPLES` problems with messages.
  """

  path: pathlib.Path
  lines: int
  bad_lines: tuple[int, ...]
  examples: tuple[TsvProblem, ...]

  @property
  def valid(self) -> int:
    """Well-formed lines (the pairs the pipeline reads)."""
    return self.lines - len(self.bad_lines)

  def describe(self) -> list[str]:
    """Human-readable problems: the examples and a count of the rest."""
    out = [str(p) for p in self.examples]
    hidden = len(self.bad_lines) - len(self.examples)
    if hidden:
      out.append(f"{self.path}: {hidden} more malformed line(s)")
    return out


def _blocks(f, size: int):
  """Blocks of whole lines (each ending with ``\n``, the last may not)."""
  rest = b""
  while block := f.read(size):
    block = rest + block
    cut = block.rfind(b"\n") + 1
    if cut:
      yield block[:cut]
    rest = block[cut:]
  if rest:
    yield rest


def scan_tsv(path: str | os.PathLike[str], *,
             block_size: int = 1 << 23) -> TsvScan:
  """Checks every line of ``path`` (:func:`line_problem`).

  Blocks of lines are checked at C speed (tab and newline counts, one
  regular expression and one UTF-8 decode per ``block_size`` bytes); only a
  block that fails is checked line by line.

  Raises:
    OSError: the file cannot be read.
  """
  path = pathlib.Path(path)
  bad, examples, count = [], [], 0
  with open(path, "rb") as f:
    for block in _blocks(f, block_size):
      whole = block if block.endswith(b"\n") else block + b"\n"
      lines = whole.count(b"\n")
      # As many tabs as lines and none with two: one tab on every line.
      if whole.count(b"\t") == lines and not _TWO_TABS.search(whole):
        try:
          whole.decode("utf-8")
          count += lines
          continue
        except UnicodeDecodeError:
          pass
      for raw in whole.split(b"\n")[:-1]:
        count += 1
        problem = line_problem(_strip(raw))
        if problem is not None:
          bad.append(count)
          if len(examples) < MAX_EXAMPLES:
            examples.append(TsvProblem(path, count, problem))
  return TsvScan(path=path, lines=count, bad_lines=tuple(bad),
                 examples=tuple(examples))


def read_pairs(path: str | os.PathLike[str]
               ) -> tuple[list[tuple[str, str]], TsvScan]:
  """The well-formed ``(english, translation)`` pairs of a file and its scan.

  Malformed lines are skipped; they are listed in the returned scan.
  """
  path = pathlib.Path(path)
  pairs, bad, examples, count = [], [], [], 0
  with open(path, "rb") as f:
    for count, raw in enumerate(f, start=1):
      raw = _strip(raw)
      problem = line_problem(raw)
      if problem is None:
        english, other = raw.decode("utf-8").split("\t")
        pairs.append((english, other))
        continue
      bad.append(count)
      if len(examples) < MAX_EXAMPLES:
        examples.append(TsvProblem(path, count, problem))
  return pairs, TsvScan(path=path, lines=count, bad_lines=tuple(bad),
                        examples=tuple(examples))


def skipped_counts(scans: Mapping[str, TsvScan] | list[TsvScan]
                   ) -> dict[str, int]:
  """{file: malformed lines} of the scans that found any."""
  items = scans.values() if isinstance(scans, Mapping) else scans
  return {str(s.path): len(s.bad_lines) for s in items if s.bad_lines}
