"""Shell commands in Markdown pages: fenced blocks split into commands.

A command is a simple command of a fenced block whose info string is a
shell (or empty): continuation lines joined, ``&&``/``;``/``|`` split,
redirections, environment assignments and wrappers (``taskset -c 1``)
dropped. Used by the docs tests (tests/test_docs_commands.py,
tests/test_own_data.py).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shlex

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHELL_LANGUAGES = ("", "sh", "bash", "shell", "console")
# Wrappers whose (fixed-arity) options precede the real command.
WRAPPERS = {"taskset": 2, "nice": 2, "time": 0, "env": 0}
PYTHONS = ("python", "python3", "python3.11")


def fenced_blocks(page: pathlib.Path) -> list[tuple[str, int, str]]:
  """(info string, first line number, text) of every fenced block."""
  out, language, start, lines, inside = [], "", 0, [], False
  for number, line in enumerate(page.read_text(encoding="utf-8")
                                .splitlines(), start=1):
    fence = re.match(r"^\s*```(\S*)", line)
    if fence and not inside:
      inside, language, start, lines = True, fence.group(1), number + 1, []
    elif fence:
      inside = False
      out.append((language, start, "\n".join(lines) + "\n"))
    elif inside:
      lines.append(line)
  return out


@dataclasses.dataclass(frozen=True)
class Command:
  """One command of a page: argv after wrappers and environment."""

  page: str  # repository-relative
  line: int
  argv: tuple[str, ...]
  fenced: bool

  @property
  def id(self) -> str:
    return f"{self.page}:{self.line}:{' '.join(self.argv)[:60]}"

  @property
  def tool(self) -> str | None:
    """The package module that parses this command's flags, if any."""
    if self.argv[0].startswith("m4moe-"):
      return "m4moe.cli." + self.argv[0][len("m4moe-"):].replace("-", "_")
    if self.argv[0] in PYTHONS and self.argv[1:2] == ("-m",):
      module = self.argv[2] if len(self.argv) > 2 else ""
      return module if module.startswith("m4moe.") else None
    return None

  @property
  def tool_args(self) -> list[str]:
    """argv as the tool's absl parser sees it (program name first)."""
    args = self.argv if self.argv[0].startswith("m4moe-") else self.argv[2:]
    # Optional arguments of a usage line: "[--seeds=0]".
    return [a.strip("[]") if a.startswith("[--") else a for a in args]


def shell_words(text: str) -> list[list[str]]:
  """``text`` as simple commands: lists of words, without redirections."""
  lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|<>")
  lexer.whitespace_split = True
  commands, words, skip = [], [], False
  for token in lexer:
    if skip:
      skip = False
    elif token in (";", "&&", "||", "|", "&"):
      commands.append(words)
      words = []
    elif token in ("<", ">", ">>", "2>", ">&"):
      skip = True  # the redirection's target
    else:
      words.append(token)
  commands.append(words)
  return [c for c in commands if c]


def strip_prefix(words: list[str]) -> list[str]:
  """Drops environment assignments and wrappers (``taskset -c 1``)."""
  while words:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
      words = words[1:]
    elif words[0] in WRAPPERS:
      words = words[1 + WRAPPERS[words[0]]:]
    else:
      return words
  return words


def fenced_commands(page: pathlib.Path) -> list[Command]:
  """The commands of the page's shell blocks, in order."""
  rel = page.relative_to(ROOT).as_posix()
  out = []
  for language, first, text in fenced_blocks(page):
    if language not in SHELL_LANGUAGES:
      continue
    pending, start = "", first
    for number, line in enumerate(text.splitlines(), start=first):
      if not pending:
        start = number
      pending += line.rstrip()
      if pending.endswith("\\"):
        pending = pending[:-1] + " "
        continue
      for words in shell_words(pending):
        words = strip_prefix(words)
        if words:
          out.append(Command(rel, start, tuple(words), True))
      pending = ""
  return out
