"""Line input for m4moe-decode: strict UTF-8, language column, progress."""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import BinaryIO, TextIO


class InputError(ValueError):
  """Bad input; the message names the line."""


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
