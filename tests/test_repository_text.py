"""The repository reads the same on any machine, and results read as reports.

Checked over the tracked files (``git ls-files``; skipped outside a git
checkout, e.g. in an installed package):

* no machine paths anywhere: a home, root or work directory of the
  machine a run happened on, or a virtualenv's interpreter, means nothing
  on another machine (run directories are written relative, ``runs/...``);
* no work-log words in the results' pages and scripts or in docs/:
  sessions, sittings and issue numbers say when and by whom, not what
  holds; a ``§`` is a paper's section only (GShard §3.2);
* no CPU model names: a benchmark names the ``lscpu`` flags that matter
  (e.g. AVX512-BF16), which another machine can compare;
* each ``results/**/README.md`` is at most 300 lines and opens with its
  question, the command that regenerates it and the answer, so a reader
  gets the finding in one screen (the rest goes to a linked page).
"""

from __future__ import annotations

import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_README_LINES = 300
# The Question, Command and Answer headings must all start in the
# README's first screen.
SCREEN_LINES = 45
OPENING = ("question", "command", "answer")

# Spelled in pieces so that this file does not match itself.
_MACHINE_PATH = re.compile(
    r"(?<![\w.~-])/(?:" + "|".join(["wo" + "rk", "ro" + "ot", "ho" + "me"])
    + r")/" + r"|\.py" + r"env/versions/" + r"|/ven" + r"v[\w.-]*/bin/")
_WORK_LOG = re.compile(
    r"\bsess" + r"ions?\b|\bsitt" + r"ings?\b|\bissues? #?\d+",
    re.IGNORECASE)
# A section sign is fine after a paper's name (GShard §3.2, Switch
# Transformer §4.2, V-MoE (Riquelme et al. 2021, §4.1), DeepSeek-V3 (2024,
# §2.1.2)); anything else is a reference to a work log.
_SECTION = re.compile(r"§")
_PAPER_BEFORE = re.compile(
    r"(GShard|Switch|Transformer|paper|et al\.|V-MoE|DeepSeek[\w-]*|"
    r"\(\d{4},?|Lepikhin)[^§]{0,30}$")
_CPU_MODEL = re.compile(
    r"\b(?:Xe" + r"on|EP" + r"YC|Ry" + r"zen|Core\(T" + r"M\)|"
    r"Inte" + r"l\(R\)|Sky" + r"lake|(?:Sapph" + r"ire|Emer" + r"ald|"
    r"Gran" + r"ite) Rapids|(?:Casc" + r"ade|Ic" + r"e|Coop" + r"er) Lake)(?!\w)")
# Decoded translations quote software strings ("this session").
_TRANSLATIONS = (".hyp", ".tsv")


def _tracked() -> list[str]:
  try:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT,
                         capture_output=True, check=True, timeout=60)
  except (OSError, subprocess.SubprocessError):
    pytest.skip("not a git checkout: the tracked files are unknown")
  names = [n for n in out.stdout.decode("utf-8").split("\0") if n]
  if not names:
    pytest.skip("not a git checkout: the tracked files are unknown")
  return names


def _text(name: str) -> str | None:
  try:
    data = (ROOT / name).read_bytes()
  except OSError:
    return None  # deleted in the work tree, not yet in the index
  if b"\0" in data:
    return None
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError:
    return None


def _hits(pattern: re.Pattern, names, *, keep=lambda line, m: True):
  found = []
  for name in names:
    text = _text(name)
    if text is None:
      continue
    for number, line in enumerate(text.splitlines(), 1):
      for match in pattern.finditer(line):
        if keep(line, match):
          found.append(f"{name}:{number}: {line.strip()[:120]}")
  return found


def _prose(names: list[str]) -> list[str]:
  """Hand-written pages and scripts of results/, and docs/."""
  return [n for n in names
          if (n.startswith("results/") and n.endswith((".md", ".sh", ".py"))
              and pathlib.PurePath(n).name != "report.md")
          or (n.startswith("docs/") and n.endswith(".md"))]


def _readmes(names: list[str]) -> list[str]:
  return [n for n in names
          if n.startswith("results/") and n.endswith("/README.md")]


def test_no_machine_paths_in_tracked_files():
  names = [n for n in _tracked() if not n.endswith(_TRANSLATIONS)]
  found = _hits(_MACHINE_PATH, names)
  assert not found, (
      f"{len(found)} machine path(s): write them relative to the run "
      "directory or the repository (runs/..., data/...), or as a flag "
      "the reader sets:\n" + "\n".join(found[:30]))


def test_no_work_log_words_in_results_and_docs():
  names = _prose(_tracked())
  found = _hits(_WORK_LOG, names)
  found += _hits(_SECTION, names, keep=lambda line, m: not _PAPER_BEFORE
                 .search(line[:m.start()]))
  assert not found, (
      f"{len(found)} work-log reference(s): say what holds and why; "
      "dates and commits go in a README's record section:\n"
      + "\n".join(found[:30]))


def test_no_cpu_model_names():
  names = [n for n in _tracked() if not n.endswith(_TRANSLATIONS)]
  found = _hits(_CPU_MODEL, names)
  assert not found, (
      f"{len(found)} CPU model name(s): name the lscpu flags that matter "
      "instead (e.g. AVX512-BF16):\n" + "\n".join(found[:30]))


def test_results_readmes_fit_their_limit():
  long = []
  for name in _readmes(_tracked()):
    text = _text(name) or ""
    if len(text.splitlines()) > MAX_README_LINES:
      long.append(f"{name}: {len(text.splitlines())} lines")
  assert not long, (
      f"results READMEs over {MAX_README_LINES} lines: move method details, "
      "tables and the record to a linked page of the same folder:\n"
      + "\n".join(long))


def opening_problem(text: str) -> str | None:
  """Why a README does not open with question, command and answer (None:
  it does)."""
  headings = [(number, line[3:].strip().lower())
              for number, line in enumerate(text.splitlines(), 1)
              if line.startswith("## ")]
  first = [title for _, title in headings[:3]]
  if len(first) < 3 or not all(
      title.startswith(want) for title, want in zip(first, OPENING)):
    return (f"its first '## ' headings are {first}, expected "
            "Question, Command, Answer")
  if headings[2][0] > SCREEN_LINES:
    return (f"its Answer starts at line {headings[2][0]}, after the first "
            f"screen ({SCREEN_LINES} lines)")
  command = text.splitlines()[headings[1][0]:headings[2][0] - 1]
  if not any(line.startswith(("```", "    ")) for line in command):
    return "its Command section has no command (a code block)"
  return None


def test_opening_rule_tells_a_report_from_a_work_log():
  report = ("# T\n\n## Question\n\nDoes X?\n\n## Command\n\n```sh\nrun\n```"
            "\n\n## Answer\n\nYes, +1.0 ±0.3.\n\n## Method\n")
  assert opening_problem(report) is None
  assert "expected" in opening_problem(
      "# T\n\n## Question\n\n## Record\n\n## Answer\n")
  assert "no command" in opening_problem(
      "# T\n\n## Question\n\n## Command\n\nsee below\n\n## Answer\n")
  assert "line" in opening_problem(
      "# T\n\n## Question\n\n## Command\n\n```\nx\n```\n"
      + "\n" * SCREEN_LINES + "## Answer\n")


def test_results_readmes_open_with_question_command_answer():
  bad = []
  for name in _readmes(_tracked()):
    problem = opening_problem(_text(name) or "")
    if problem:
      bad.append(f"{name}: {problem}")
  assert not bad, "results READMEs that are not reports yet:\n" + "\n".join(
      bad)
