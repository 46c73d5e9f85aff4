"""A recipe checked whole before its first stage runs.

:class:`~m4moe.pipeline.recipes.Recipe` checks a recipe's structure when it
is loaded; this module checks what only the tools would find, minutes or
hours into a job: that every model's zoo config resolves (and its model
flags give a valid model), that every language is a known corpus code,
that the output directories can be written, and that every flag the recipe
passes to a tool (``extra_flags`` and the ``[baselines.<lang>]`` flags to
``m4moe-train``, ``vocab_flags`` to ``m4moe-vocab``, ``report_flags`` to
``m4moe-report``) is a flag of that tool and parses, with the configs the
trainer builds from its command line valid. ``m4moe-run`` calls
:func:`check_recipe` before it runs anything; the first problem is a
:class:`~m4moe.pipeline.recipes.RecipeError` naming the recipe file, the
model (or key) and the fix.

The tools' flags are parsed by the tools' own modules, each in a child
process (``python -m m4moe.pipeline.recipe_check TOOL``, the command lines
as JSON on stdin): the modules define their flags globally and two tools
share flag names, and ``m4moe-run`` itself stays free of TensorFlow. A
passed check is recorded in ``<run_dir>/.recipe_check.json`` (the
commands' digest), so a re-run of the same job does not pay for it again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import pathlib
import subprocess
import sys
from typing import Any, Iterable, Sequence

from m4moe.pipeline import plan as plan_lib
from m4moe.pipeline.recipes import ModelRun, Recipe, RecipeError

RECORD = ".recipe_check.json"


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Command:
  """One command line to parse: the plan's part and the recipe's flags.

  Attributes:
    tool: the ``m4moe.cli`` module (``train``, ``vocab``, ``report``).
    base: the arguments the plan writes.
    extra: the flags the recipe adds (checked one by one on an error).
    owner: who gave ``extra``, for the message (``model 'moe'``).
    key: the recipe key holding ``extra`` (``extra_flags``).
  """
  tool: str
  base: tuple[str, ...]
  extra: tuple[str, ...]
  owner: str
  key: str


def check_recipe(recipe: Recipe, *, source: str | os.PathLike[str],
                 stages: Sequence[plan_lib.Stage], run_dir: pathlib.Path,
                 cache_dir: pathlib.Path, record: bool = True) -> None:
  """Raises the first problem of ``recipe``; see the module docstring.

  Args:
    recipe: the loaded recipe.
    source: its file, named in every message.
    stages: its plan (:func:`m4moe.pipeline.plan.plan`).
    run_dir, cache_dir: the job's output directories.
    record: write the record of a passed check (False: change nothing,
      as ``--dry_run``).

  Raises:
    RecipeError: naming ``source``, the model or key, and the fix.
  """
  models = _models(recipe)
  for owner, model in models:
    _check_config(source, owner, model)
  _check_languages(source, recipe)
  for flag, path in (("--run_dir", run_dir), ("--cache_dir", cache_dir)):
    problem = writable_problem(path)
    if problem:
      raise RecipeError(f"{flag}={path} {problem}; nothing was run")
  commands = _commands(recipe, stages=stages, models=models)
  digest = hashlib.sha256(json.dumps(
      [sys.executable, [dataclasses.astuple(c) for c in commands]]
  ).encode()).hexdigest()
  done = run_dir / RECORD
  if done.is_file() and _recorded(done) == digest:
    return
  if commands:
    _check_commands(source, commands)
  if record:  # atomically, and two jobs started together do not collide
    done.parent.mkdir(parents=True, exist_ok=True)
    tmp = done.with_name(f"{done.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"commands_sha256": digest}) + "\n")
    tmp.replace(done)


def _recorded(path: pathlib.Path) -> str | None:
  try:
    return json.loads(path.read_text(encoding="utf-8"))["commands_sha256"]
  except (OSError, ValueError, KeyError, TypeError):
    return None  # unreadable: checked again


def _models(recipe: Recipe) -> list[tuple[str, ModelRun]]:
  """(how a message names it, model) of every model and baseline."""
  out = [(f"model {m.name!r}", m) for m in recipe.models]
  overridden = {lang for lang, _ in recipe.baseline_flags}
  for model in recipe.baselines():
    lang = model.languages[0]
    where = "[baseline]" + (f" and [baselines.{lang}]" if lang in overridden
                            else "")
    out.append((f"model {model.name!r} (from {where})", model))
  return out


def _check_config(source: Any, owner: str, model: ModelRun) -> None:
  """The zoo config resolves and its model flags give a valid model."""
  from m4moe import config as config_lib  # pylint: disable=g-import-not-at-top
  try:
    config_lib.resolve_config_path(model.config)
  except config_lib.ConfigError as e:
    raise RecipeError(
        f"{source}: {owner}: config = {model.config!r}: {e}; fix the "
        "recipe's config key. Nothing was run") from None
  try:
    config_lib.peek_model_config(model.config, model.extra_flags)
  except (config_lib.ConfigError, ValueError) as e:
    raise RecipeError(
        f"{source}: {owner}: its config {model.config!r} with its "
        f"extra_flags gives no valid model: {e}; fix the flag in "
        "extra_flags. Nothing was run") from None


def _check_languages(source: Any, recipe: Recipe) -> None:
  """Every language is a corpus language code as the corpus writes it."""
  from m4moe.data import languages as languages_lib  # pylint: disable=g-import-not-at-top
  named = [("languages", lang) for lang in recipe.languages] + [
      (f"model {m.name!r}: languages", lang) for m in recipe.models
      for lang in m.languages]
  for key, lang in named:
    try:
      code = languages_lib.normalize_language(lang)
    except languages_lib.UnknownLanguageError as e:
      raise RecipeError(f"{source}: {key}: {lang!r} is not a known language "
                        f"({e}); fix or remove it. Nothing was run") from None
    if code != lang:
      fix = (f"write {code!r}" if code else "remove it (English is the "
             "target side, and pseudo-locales are not languages)")
      raise RecipeError(f"{source}: {key}: {lang!r} is not a corpus language "
                        f"code ({'it is ' + repr(code) if code else 'none'} "
                        f"in the corpus); {fix}. Nothing was run")


def writable_problem(path: pathlib.Path) -> str | None:
  """Why ``path`` cannot be (or become) a writable directory; None if it
  can. Creates nothing."""
  if path.exists() and not path.is_dir():
    return "is a file, not a directory; choose a directory"
  existing = path
  while not existing.exists() and existing != existing.parent:
    existing = existing.parent
  if not existing.is_dir():
    return f"cannot be created: {existing} is a file; choose another path"
  if not os.access(existing, os.W_OK | os.X_OK):
    where = ("is not writable" if existing == path else
             f"cannot be created: {existing} is not writable")
    return (f"{where}; choose a directory you can write to or fix its "
            "permissions")
  return None


def _commands(recipe: Recipe, *, stages: Sequence[plan_lib.Stage],
              models: Iterable[tuple[str, ModelRun]]) -> list[_Command]:
  """The command lines that carry the recipe's flags, split into the plan's
  part and the recipe's flags (one train stage per model: its seeds differ
  only in ``--seed`` and the run directory)."""
  by_name = {s.name: s for s in stages}
  out = []
  for owner, model in models:
    stage = by_name.get(f"train_{model.runs()[0][0]}")
    if stage is not None:  # (a plan cut down for a test may lack it)
      out.append(_split(stage, extra=model.extra_flags, owner=owner,
                        key="extra_flags"))
  for name, key, extra in (("vocab", "vocab_flags", recipe.vocab_flags),
                           ("report", "report_flags", recipe.report_flags)):
    if name in by_name:
      out.append(_split(by_name[name], extra=extra, owner="", key=key))
  return out


def _split(stage: plan_lib.Stage, *, extra: tuple[str, ...], owner: str,
           key: str) -> _Command:
  """``stage``'s arguments as the plan's part and ``extra`` (at its end)."""
  args = stage.args
  if extra and args[len(args) - len(extra):] == extra:
    args = args[:len(args) - len(extra)]
  return _Command(tool=stage.tool, base=tuple(args), extra=tuple(extra),
                  owner=owner, key=key)


def _check_commands(source: Any, commands: Sequence[_Command]) -> None:
  """Parses every command with its tool's flags, one child per tool (run
  together); raises the first problem in the commands' order."""
  children = {  # started together: each imports its tool meanwhile
      tool: subprocess.Popen(  # pylint: disable=consider-using-with
          [sys.executable, "-m", __name__, tool], stdin=subprocess.PIPE,
          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
      for tool in sorted({c.tool for c in commands})}
  verdicts = {}
  for tool, child in children.items():
    out, err = child.communicate(json.dumps(
        [{"base": c.base, "extra": c.extra} for c in commands
         if c.tool == tool]))
    if child.returncode != 0:
      raise RecipeError(
          f"{source}: could not check the m4moe-{tool} flags (the checker "
          f"exited {child.returncode}: {err.strip()[-500:]})")
    verdicts[tool] = iter(json.loads(out))
  for command in commands:
    problem, entry = next(verdicts[command.tool])
    if problem is None:
      continue
    where = f"{source}: " + (f"{command.owner}: " if command.owner else "")
    if entry is None:
      raise RecipeError(
          f"{where}its m4moe-{command.tool} command line is invalid: "
          f"{problem}; fix the recipe value or the flag in {command.key}. "
          "Nothing was run")
    raise RecipeError(
        f"{where}{command.key} entry {entry!r} is not a valid "
        f"m4moe-{command.tool} flag ({problem}); fix or remove it. Nothing "
        "was run")


def _parse(argv: Sequence[str]) -> str | None:
  """Parses ``argv`` with the global flags; the error or None."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.FLAGS.unparse_flags()
  try:
    rest = flags.FLAGS(["m4moe", *argv])
  except flags.Error as e:
    return str(e)
  if rest[1:]:
    return f"{' '.join(rest[1:])} is not a --flag"
  return None


def _train_configs() -> None:
  """Builds every config ``m4moe-train`` builds from its parsed flags.

  Raises:
    ValueError: an invalid value (the config's message names the flag).
  """
  from absl import flags  # pylint: disable=g-import-not-at-top
  from m4moe import config as config_lib  # pylint: disable=g-import-not-at-top
  from m4moe import flagutil  # pylint: disable=g-import-not-at-top
  from m4moe.training import inputs  # pylint: disable=g-import-not-at-top
  from m4moe.training import loop as train_lib  # pylint: disable=g-import-not-at-top
  from m4moe.training import optimizer as optimizer_lib  # pylint: disable=g-import-not-at-top
  values, name = flags.FLAGS, flags.FLAGS["config"].value
  if name:
    config_lib.load_model_config(name, config_lib.present_model_flags(values))
    optimizer = config_lib.load_optimizer_config(
        name, optimizer_lib.present_flags(values))
  else:
    config_lib.model_config_from_flags(values)
    optimizer = optimizer_lib.config_from_flags(values)
  data = flagutil.from_flags(inputs.DataConfig, values)
  flagutil.from_flags(train_lib.TrainConfig, values,
                      batch_tokens=data.batch_tokens, optimizer=optimizer)


def _verdict(tool: str, base: Sequence[str],
             extra: Sequence[str]) -> tuple[str | None, str | None]:
  """(problem, the recipe flag at fault or None) of one command line."""
  problem = _parse([*base, *extra])
  if problem is not None:
    for i, entry in enumerate(extra):
      if _parse([*base, *extra[:i + 1]]) is not None:
        return problem, entry
    return problem, None
  if tool == "train":
    try:
      _train_configs()
    except (ValueError, TypeError) as e:
      return str(e), None
  return None, None


def _main(tool: str) -> None:
  """The child: parses the JSON command lines on stdin with ``tool``'s
  flags and prints a JSON list of [problem, entry] pairs."""
  importlib.import_module(f"m4moe.cli.{tool}")
  commands = json.load(sys.stdin)
  json.dump([_verdict(tool, c["base"], c["extra"]) for c in commands],
            sys.stdout)


if __name__ == "__main__":
  _main(sys.argv[1])
