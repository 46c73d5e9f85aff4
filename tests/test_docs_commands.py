"""The commands and paths the README and docs/ give are real.

Every fenced shell block of README.md and docs/**/*.md is split into
commands (continuation lines joined, ``&&``/``;``/``|`` split, redirections
and environment assignments dropped). Each command must name a tool that
exists: an ``m4moe-*`` console script of setup.py, a module of the package
(``python3 -m m4moe...``) or one of :data:`EXTERNAL`. For the package's own
tools, the arguments are parsed by the tool's absl flags, imported in one
subprocess for all of them (:data:`_PROBE`): an unknown flag, a value of
the wrong type, or a positional argument the tool refuses fails, naming
the page and line. Inline code that starts a command (`` `m4moe-eval
--split=dev` ``) has its tool and flag names checked (prose elides
values). Every repository path a command, a code span or a link names
must exist (placeholders in capitals or ``<...>`` are left alone), and no
command may write into a source directory. The commands that need nothing
but the package run (``m4moe-info``); the ones that train are run by the
slow own-data test (tests/test_own_data.py).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

import markdown_commands
from markdown_commands import Command, PYTHONS

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
# Tools the docs may name that are not the package's; only their repository
# paths are checked.
EXTERNAL = ("bazel", "gcloud", "pip", "pip3", "tensorboard", "tar",
            "dpkg-deb", "git", "apt-get", "sudo", "cd", "mkdir", "cp",
            "export", "tfds", "bash", "sh", "sed")
# Top-level entries a repository path starts with.
REPO_ROOTS = ("m4moe", "data", "eval", "configs", "tests", "docs",
              "results", ".ci", "README.md", "LICENSE", "setup.py",
              "pyproject.toml", "WORKSPACE")
# Flags whose value is something a command writes, not reads.
_OUTPUT_FLAG = re.compile(r"output|export_dir|model_dir|run_dir|profile_dir")
# Source directories no command may write into (results/ holds outputs).
SOURCE_DIRS = ("m4moe", "data", "eval", "configs", "tests")
# Commands known to fail today, keyed by (page, start of the command): their
# failures are expected (xfail). Each entry must still match a command of
# its page, and a command that runs must fail to run: remove the entry
# when the page is fixed.
KNOWN_FAILING: dict[tuple[str, str], str] = {}


def _prose(page: pathlib.Path) -> list[tuple[int, str]]:
  """(line, text) of the page outside fenced blocks, lines joined per
  paragraph so that code spans may wrap."""
  out, in_block, paragraph, start = [], False, [], 0
  for number, line in enumerate(page.read_text(encoding="utf-8")
                                .splitlines(), start=1):
    if re.match(r"^\s*```", line):
      in_block = not in_block
      continue
    if in_block:
      continue
    if not line.strip():
      if paragraph:
        out.append((start, " ".join(paragraph)))
      paragraph = []
      continue
    if not paragraph:
      start = number
    paragraph.append(line.strip())
  if paragraph:
    out.append((start, " ".join(paragraph)))
  return out


def _code_spans(page: pathlib.Path) -> list[tuple[int, str]]:
  return [(line, span) for line, text in _prose(page)
          for span in re.findall(r"`([^`]+)`", text)]


def _inline_commands(page: pathlib.Path) -> list[Command]:
  """Code spans in prose that give a tool with at least one flag."""
  rel = page.relative_to(ROOT).as_posix()
  out = []
  for line, span in _code_spans(page):
    if not re.match(r"(m4moe-[a-z-]+|python3? -m m4moe\.[\w.]+) .*--", span):
      continue
    if "..." in span or " -- " in span:
      continue  # an elided or wrapped command
    try:
      for words in markdown_commands.shell_words(span):
        words = markdown_commands.strip_prefix(words)
        out.append(Command(rel, line, tuple(words), False))
    except ValueError:
      continue  # not shell syntax (an unbalanced quote in prose)
  return out


FENCED = [c for page in PAGES for c in markdown_commands.fenced_commands(page)]
INLINE = [c for page in PAGES for c in _inline_commands(page)]


def _console_scripts() -> set[str]:
  setup = (ROOT / "setup.py").read_text(encoding="utf-8")
  names = re.search(r"for name in \((.*?)\)\s*\]", setup, re.S).group(1)
  return {"m4moe-" + n.replace("_", "-")
          for n in re.findall(r'"(\w+)"', names)}


def _known_failure(command: Command) -> str | None:
  text = " ".join(command.argv)
  for (page, prefix), reason in KNOWN_FAILING.items():
    if command.page == page and text.startswith(prefix):
      return reason
  return None


# Imports each tool once and, per command, parses its argv with the tool's
# flags; a command marked to run then runs as its console script does
# (exit code and output captured), in the same process.
_PROBE = r"""
import contextlib, importlib, io, json, sys
from absl import app, flags
FLAGS = flags.FLAGS
app.define_help_flags()  # as app.run does
jobs = json.load(sys.stdin)
out = {}

def run(loaded, argv):
  sys.argv, stdout, stderr, code = list(argv), io.StringIO(), io.StringIO(), 0
  try:
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
      loaded.run()
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    if not isinstance(e.code, int) and e.code is not None:
      stderr.write(str(e.code))
  FLAGS.unparse_flags()
  return {"code": code, "stdout": stdout.getvalue(),
          "stderr": stderr.getvalue()}

for module, commands in jobs.items():
  before = set(FLAGS)
  try:
    loaded = importlib.import_module(module)
    # Modules run with -m define their flags under __main__.
    getattr(loaded, "_define_flags", lambda: None)()
  except Exception as e:
    out[module] = {"import_error": f"{type(e).__name__}: {e}"}
    continue
  results = []
  for argv, execute in commands:
    try:
      with contextlib.redirect_stdout(io.StringIO()):
        results.append({"positional": FLAGS(argv)[1:]})
    except flags.Error as e:
      results.append({"error": f"{type(e).__name__}: {e}"})
    except SystemExit:  # --help, --helpfull: printed the flags
      results.append({"positional": []})
    FLAGS.unparse_flags()
    if execute and "error" not in results[-1]:
      results[-1]["ran"] = run(loaded, argv)
  out[module] = {"results": results, "flags": sorted(FLAGS),
                 "benchmarks": list(getattr(loaded, "BENCHMARKS", ()))}
  for name in set(FLAGS) - before:
    delattr(FLAGS, name)
  for name in [m for m in sys.modules if m.split(".")[0] == "m4moe"]:
    del sys.modules[name]
print(json.dumps(out))
"""


def _defined_flags(module: str) -> set[str]:
  """Flag names a module's source defines (also under ``__main__``)."""
  path = ROOT / (module.replace(".", "/") + ".py")
  if not path.is_file():
    return set()
  return set(re.findall(r"DEFINE_\w+\(\s*\"(\w+)\"",
                        path.read_text(encoding="utf-8")))


def _runs(command: Command) -> bool:
  """Whether the fast suite runs the command: it needs only the package."""
  return command.argv[0] == "m4moe-info" and not any(
      a.startswith("--help") for a in command.argv)  # help exits 1


@pytest.fixture(name="parsed", scope="module")
def fixture_parsed() -> dict[str, dict]:
  """{command id: the probe's result} for every fenced command of a package
  tool, and {tool module: its flag names} for every tool named."""
  jobs: dict[str, list] = {}
  owners: list[tuple[str, int, Command]] = []
  for command in FENCED:
    if command.tool:
      jobs.setdefault(command.tool, []).append(
          (command.tool_args, _runs(command)))
      owners.append((command.tool, len(jobs[command.tool]) - 1, command))
  for command in INLINE:
    if command.tool:
      jobs.setdefault(command.tool, [])
  proc = subprocess.run(
      [sys.executable, "-c", _PROBE], input=json.dumps(jobs), cwd=ROOT,
      capture_output=True, text=True, timeout=600, check=False,
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
  assert proc.returncode == 0, proc.stderr[-3000:]
  found = json.loads(proc.stdout.strip().splitlines()[-1])
  out = {}
  for tool, index, command in owners:
    entry = found[tool]
    out[command.id] = ({"error": entry["import_error"]}
                       if "import_error" in entry else
                       {**entry["results"][index],
                        "benchmarks": entry["benchmarks"]})
  for tool, entry in found.items():
    out[tool] = sorted(set(entry.get("flags", [])) | _defined_flags(tool))
  return out


def test_the_pages_have_commands():
  assert len(FENCED) > 40 and len(INLINE) > 20
  assert {c.page for c in FENCED} >= {"README.md", "docs/cli.md"}


def _expect_none(command: Command, problems: list[str]) -> None:
  """Fails on ``problems`` unless the command is known to fail today."""
  known = _known_failure(command)
  if known and problems:
    pytest.xfail(f"{known}: {problems}")
  assert not problems, f"{command.page}:{command.line}: {'; '.join(problems)}"


def _tool_problems(command: Command, parsed: dict) -> list[str]:
  program = command.argv[0]
  if program.startswith("m4moe-") and program not in _console_scripts():
    return [f"{program} is not a console script in setup.py"]
  if command.tool is None:
    known = program in PYTHONS + EXTERNAL or (ROOT / program).exists()
    return [] if known else [f"unknown program {program}"]
  result = parsed[command.id]
  if "error" in result:
    return [result["error"]]
  positional, benchmarks = result["positional"], result["benchmarks"]
  if benchmarks:
    if not positional or positional[0] not in benchmarks:
      return [f"m4moe-bench needs one of {benchmarks}, got {positional}"]
    if len(positional) > 1 and positional[0] != "peak_rss":
      return [f"m4moe-bench {positional[0]} takes no arguments"]
  elif positional:
    return [f"{program} takes flags only, got {positional}"]
  return []


@pytest.mark.parametrize("command", FENCED, ids=lambda c: c.id)
def test_command_names_a_tool_with_those_flags(command, parsed):
  _expect_none(command, _tool_problems(command, parsed))


@pytest.mark.parametrize("command", INLINE, ids=lambda c: c.id)
def test_inline_command_names_flags_of_its_tool(command, parsed):
  """Prose mentions flags (``--init_from_dense``) and placeholders
  (``--model_dim=M``): only the tool and the flag names are checked."""
  problems = []
  if command.argv[0].startswith("m4moe-") and \
      command.argv[0] not in _console_scripts():
    problems.append(f"{command.argv[0]} is not a console script in setup.py")
  names = set(parsed.get(command.tool, ()))
  if not names:
    problems.append(f"{command.tool} did not import")
  for word in command.tool_args[1:]:
    name = word.split("=")[0][2:] if word.startswith("--") else None
    if names and name and name not in names and not (
        name.startswith("no") and name[2:] in names):
      problems.append(f"{command.argv[0]} has no flag --{name}")
  _expect_none(command, problems)


def _repo_path(text: str) -> str | None:
  """``text`` if it names a path inside the repository, without
  placeholders; else None."""
  text = text.split("#")[0].rstrip(".,:;)")
  if not re.fullmatch(r"[\w./*{},+-]+", text) or "//" in text:
    return None
  first = text.split("/")[0]
  if first not in REPO_ROOTS or ("/" not in text and "." not in first):
    return None
  if re.search(r"[*{}]|\bDIR\b|[A-Z]{3,}", text.split("/", 1)[-1]):
    return None  # a pattern or a placeholder
  return text


def _command_paths(command: Command) -> list[str]:
  out = []
  for word in command.argv[1:]:
    flag, _, value = word.partition("=")
    if value and flag.startswith("--"):
      if _OUTPUT_FLAG.search(flag):
        continue
      if re.search(r"config$", flag) and not value.endswith(".flags"):
        value = f"configs/{value}.flags"  # a zoo entry
      elif flag == "--recipe" and "/" not in value and "." not in value:
        value = f"configs/recipes/{value}.toml"
      words = value.split(",")
    else:
      words = [word]
    out += [p for p in map(_repo_path, words) if p]
  return out


@pytest.mark.parametrize("command", FENCED + INLINE, ids=lambda c: c.id)
def test_command_paths_exist(command):
  _expect_none(command, [f"{path} does not exist"
                         for path in _command_paths(command)
                         if not (ROOT / path).exists()])


@pytest.mark.parametrize("command", FENCED + INLINE, ids=lambda c: c.id)
def test_command_writes_outside_the_source_tree(command):
  """A run's outputs next to the package's own files would be mistaken for
  (or shadow) them: ``--output=eval/x.json`` writes into the package
  ``m4moe.eval``'s source directory."""
  problems = []
  for word in command.argv[1:]:
    flag, _, value = word.partition("=")
    top = pathlib.PurePosixPath(value).parts[:1]
    if flag.startswith("--") and _OUTPUT_FLAG.search(flag) and top and \
        top[0] in SOURCE_DIRS:
      problems.append(f"{word} writes into the source directory {top[0]}/; "
                      "use another directory")
  _expect_none(command, problems)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_paths_and_links_of_the_page_exist(page):
  missing = []
  for line, span in _code_spans(page):
    path = _repo_path(span)
    if path and not (ROOT / path).exists():
      missing.append(f"{line}: `{span}`")
  for line, text in _prose(page):
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
      if re.match(r"[a-z]+:", target) or target.startswith("#"):
        continue
      path = (page.parent / target.split("#")[0]).resolve()
      if not path.exists():
        missing.append(f"{line}: link {target}")
  assert not missing, f"{page.relative_to(ROOT)}: " + "; ".join(missing)


RUNNABLE = [c for c in FENCED if _runs(c)]


def test_known_failures_still_name_a_command():
  for page, prefix in KNOWN_FAILING:
    assert any(c.page == page and " ".join(c.argv).startswith(prefix)
               for c in FENCED), (
        f"KNOWN_FAILING names no command of {page} starting {prefix!r}: "
        "remove the entry")


@pytest.mark.parametrize("command", RUNNABLE, ids=lambda c: c.id)
def test_offline_command_runs(command, parsed):
  """Ran as its console script (in the probe); a ``--mesh`` must give the
  per-device estimate the docs show it for."""
  ran = parsed[command.id].get("ran")
  assert ran, f"{command.id}: did not run: {parsed[command.id]}"
  assert ran["code"] or ran["stdout"].strip(), "ran but printed nothing"
  problems = []
  if ran["code"]:
    problems.append(f"exit {ran['code']}: {ran['stderr'][-1500:]}")
  elif any(a.startswith("--mesh") for a in command.argv) and \
      "device." not in ran["stdout"] and '"device"' not in ran["stdout"]:
    problems.append("prints no per-device estimate for its --mesh")
  known = _known_failure(command)
  if known:
    assert problems, (f"{command.page}:{command.line} passes now: remove "
                      "its KNOWN_FAILING entry")
    pytest.xfail(known)
  assert not problems, f"{command.page}:{command.line}: {problems}"


# The --check_config commands on the smoke corpus (own_data.md's run on its
# own example, in tests/test_own_data.py).
CHECKS = [c for c in FENCED
          if c.argv[0] == "m4moe-train" and "--check_config" in c.argv
          and c.page != "docs/own_data.md"]


@pytest.fixture(name="smoke_data", scope="module")
def fixture_smoke_data(tmp_path_factory) -> pathlib.Path:
  """A directory holding the smoke recipe's ``corpus/`` and ``vocab/``,
  where the docs' ``--corpus_dir=corpus --vocab_dir=vocab`` find them, and
  the corpus as TFDS in ``bucket/tensorflow_datasets`` (``gs://BUCKET`` of
  the docs), as ``m4moe-build-corpus --tfds_data_dir`` writes it."""
  root = tmp_path_factory.mktemp("smoke")
  script = ("import sys; sys.argv = ['m4moe-run', '--recipe=smoke', "
            "'--run_dir=run', '--stop_after=vocab', '--nolanes']; "
            "from m4moe.cli.run import run; run()")
  proc = subprocess.run([sys.executable, "-c", script], cwd=root,
                        capture_output=True, text=True, timeout=1800,
                        check=False,
                        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
  assert proc.returncode == 0, proc.stderr[-3000:]
  for name in ("corpus", "vocab"):
    (root / name).symlink_to(root / "run" / name)
  from m4moe.data import tfds_corpus  # pylint: disable=g-import-not-at-top
  tfds_corpus.write_corpus_dataset(
      root / "corpus", str(root / "bucket" / "tensorflow_datasets"))
  return root


def _offline(word: str, root: pathlib.Path) -> str:
  """``word`` with ``gs://BUCKET`` and ``$HOME`` as local folders."""
  return word.replace("gs://BUCKET", str(root / "bucket")).replace(
      "$HOME", str(root))


@pytest.mark.slow
@pytest.mark.parametrize("command", CHECKS, ids=lambda c: c.id)
def test_check_config_command_passes_on_the_smoke_corpus(command,
                                                         smoke_data):
  """``--check_config`` needs no accelerator (``--tpu=local`` is checked
  offline), so each documented check runs here as written, on the smoke
  corpus and vocabularies."""
  argv = [_offline(word, smoke_data) for word in command.argv]
  script = (f"import sys; sys.argv = {argv!r}; "
            "from m4moe.cli.train import run; run()")
  proc = subprocess.run([sys.executable, "-c", script], cwd=smoke_data,
                        capture_output=True, text=True, timeout=900,
                        check=False,
                        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
  problems = [] if proc.returncode == 0 else [
      f"exit {proc.returncode}: {proc.stdout[-800:]} {proc.stderr[-1500:]}"]
  _expect_none(command, problems)
