"""m4moe's command-line tools, one absl app per module (``m4moe-<name>``).

Each module's ``run()`` is its console-script entry point and goes through
:func:`run_tool`, so ``--help`` prints the module's docstring and the flags
the tool defines, as ``python -m m4moe.cli.<name> --help`` does, and
:func:`exit_on_disk_full` turns a full disk into one line and exit 1.

* ``info``: parameter, expert and FLOP counts of a zoo config.
* ``build_corpus``: builds the X->English localisation corpus.
* ``split_keys``: extends the frozen test keys to bigger test sets.
* ``vocab``: trains the SentencePiece source and target vocabularies.
* ``train``: trains (or resumes) a model with Adafactor.
* ``average``: averages the weights of a run's last checkpoints.
* ``distill``: distils a trained MoE teacher into a dense student.
* ``decode``: translates text with a trained run.
* ``eval``: decodes a corpus's test split and scores it per language.
* ``export``: a SavedModel with a ``translate`` signature.
* ``report``: the ΔBLEU figure and tables from eval JSONs.
* ``run``: the main job, from nothing to a BLEU report, resumably.
* ``bench``: performance benchmarks, one JSON line per measurement.
* ``analyze_routing``: which experts each language uses.
* ``translation_flags``: the flags decode, eval and export share (not a
  tool).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import sys
from typing import Any, Callable, Iterator

from absl import app
from absl import flags

from m4moe import errors


def run_tool(main: Callable[[list[str]], Any], *, module: str,
             flags_parser: Callable[[list[str]], Any] | None = None) -> None:
  """Runs ``main`` as the absl app of the tool module named ``module``.

  A console script's ``__main__`` is a generated wrapper with no docstring
  and no flags of its own, so absl's ``--help`` would print only a usage
  line. This gives ``__main__`` the tool's docstring and makes every flag
  defined by an ``m4moe`` module (the tool's own, and those it generates
  from config dataclasses) a key flag of the program.
  """
  main_module = sys.modules["__main__"]
  if main_module is not sys.modules[module]:
    main_module.__doc__ = sys.modules[module].__doc__
    program = sys.argv[0]
    for name, defined in flags.FLAGS.flags_by_module_dict().items():
      if name.split(".")[0] == "m4moe":
        for flag in defined:
          flags.FLAGS.register_key_flag_for_module(program, flag)
  if flags_parser is None:
    app.run(main)
  else:
    app.run(main, flags_parser=flags_parser)


@contextlib.contextmanager
def exit_on_disk_full(*, tool: str, action: str,
                      path: str | os.PathLike[str], kept: str,
                      needed_bytes: int | None = None) -> Iterator[None]:
  """Exits 1 with :func:`m4moe.errors.disk_full_message` when the block
  fails on a full disk (``OSError(ENOSPC)`` or TensorFlow's op error);
  any other error passes through.

  Args:
    tool: the program, e.g. "m4moe-eval".
    action, path, kept, needed_bytes: see
      :func:`m4moe.errors.disk_full_message`.
  """
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    if not errors.is_disk_full(e):
      raise
    sys.exit(f"{tool}: error: " + errors.disk_full_message(
        action=action, path=path, kept=kept, needed_bytes=needed_bytes))


def tree_bytes(path: str | os.PathLike[str]) -> int | None:
  """Bytes of the files under ``path`` (or of the file; for checkpoint
  prefixes, of ``<prefix>.*``); None when nothing is there."""
  path = pathlib.Path(path)
  if path.is_file():
    return path.stat().st_size
  if path.is_dir():
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
  files = list(path.parent.glob(f"{path.name}.*")) if path.parent.is_dir() \
      else []
  return sum(p.stat().st_size for p in files) or None
