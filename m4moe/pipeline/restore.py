"""Seeds a run directory with runs already committed under ``results/``.

A run directory is not committed (checkpoints are too large), so on
another machine only what :mod:`m4moe.pipeline.landing` copied into a
results folder exists: stage records, eval JSONs, hypotheses, training
logs. A recipe whose runs are partly landed must still train only the
rest, and its report needs every run's hypotheses for the bootstrap
intervals. This tool puts the landed runs back into a run directory so
that ``m4moe-run`` skips them:

  python3 -m m4moe.pipeline.restore --results=results/study/v2 \\
      --run_dir=RUN_DIR

It must run after the corpus and vocab stages (``m4moe-run --recipe=study
--stop_after=vocab``): it first checks that the corpus files and
vocabularies built here are byte-identical to the ones the committed runs
used (``inputs.sha256``), since a new run must see the same test
sentences and pieces. A run is restored only whole: its train record and
both of its eval records with their outputs; anything partial is left to
train again. Nothing in the run directory is overwritten: a run that has a
stage record there already is left as it is. Records hold paths relative
to their run directory and are copied as they are; records that name
another run directory (older ones: absolute, or relative to the checkout)
have that directory rewritten to ``--run_dir``.

``--runs`` restores only the runs whose names match its patterns (e.g.
``--runs='bilingual_*'``).

``--from_run_dir`` seeds it instead from another *run directory* whose
corpus files are the same bytes and whose vocabularies hold the same
content (every file under ``corpus/`` and ``vocab/`` is compared): each
finished training run there (its train
stage record and model directory, checkpoints included) is copied with
paths rewritten, so a later recipe that trains the same run with the same
command (e.g. study v3's confirmation, whose baselines were trained by
``study3_baselines``) skips the training and only decodes. A
SentencePiece model records the path it was trained to, so vocabularies
rebuilt elsewhere differ in bytes only; a copied run's vocabulary
fingerprint is rewritten to name this directory's models, so that the
decoder's byte check accepts them. With
``--recipe``, every run to copy must have the exact training command that
recipe plans for ``--run_dir`` (any other is refused before anything is
copied)::

  python3 -m m4moe.pipeline.restore --from_run_dir=runs/study3b \
      --run_dir=NEW_RUN_DIR --runs='bilingual_*' --recipe=RECIPE
"""

from __future__ import annotations

import fnmatch
import pathlib
import shutil
import sys
from typing import Mapping, Sequence

from absl import app
from absl import flags

from m4moe import jsonfile
from m4moe.pipeline import landing

_SPLITS = landing.TEST_SPLITS
# Files of a model directory holding paths (rewritten when copied); the
# trainer's lock names the process that held it and is not copied.
_TEXT_SUFFIXES = (".json", ".jsonl")
_NOT_COPIED = ("train.lock",)


def check_inputs(results: pathlib.Path, run_dir: pathlib.Path) -> list[str]:
  """The manifest's files that are missing or differ under ``run_dir``."""
  bad = []
  manifest = results / "inputs.sha256"
  for number, line in enumerate(
      manifest.read_text(encoding="utf-8").splitlines(), 1):
    if not line.strip():
      continue
    digest, sep, name = line.partition("  ")
    if not sep or len(digest) != 64:
      raise ValueError(f"{manifest}:{number}: not a sha256sum line: {line!r}")
    path = run_dir / name
    if not path.is_file() or landing.input_digest(path) != digest:
      bad.append(name)
  return bad


def recorded_run_dir(results: pathlib.Path) -> str:
  """The run directory the committed runs were written in (corpus record):
  ``"."`` for records relative to their run directory."""
  record = jsonfile.load(results / "stages" / "corpus.json",
                         what="the corpus stage record",
                         fix="check out the committed study results again")
  for arg in record["command"]:
    if arg.startswith("--output_dir="):
      return str(pathlib.PurePath(arg.partition("=")[2]).parent)
  raise ValueError(f"{results / 'stages' / 'corpus.json'} records no "
                   "--output_dir")


def _landed_runs(results: pathlib.Path) -> list[str]:
  """Runs whose train and eval records, eval JSONs, hypotheses and training
  log are all committed."""
  runs = []
  for train in sorted((results / "stages").glob("train_*.json")):
    run = train.stem.removeprefix("train_")
    parts = [results / "metrics" / f"{run}.jsonl"]
    for split in _SPLITS:
      parts += [results / "stages" / f"{split}_{run}.json",
                results / split / f"{run}.json"]
    if not all(p.exists() for p in parts):
      continue
    # Hypotheses are needed wherever the run decoded sentences (a split
    # with none, e.g. test_ood of ckb, leaves no .hyp and no directory).
    if all(results.joinpath(split, run).is_dir() or
           not _decoded_any(results / split / f"{run}.json")
           for split in _SPLITS):
      runs.append(run)
  return runs


def _decoded_any(eval_json: pathlib.Path) -> bool:
  languages = jsonfile.load(
      eval_json, what="eval JSON",
      fix="check out the committed study results again")["languages"]
  return any(v.get("num_segments", 0) > 0 for v in languages.values())


def _copy_text(src: pathlib.Path, dst: pathlib.Path, *, old: str,
               new: str, digests: Mapping[str, str] | None = None) -> None:
  """``src`` to ``dst`` with ``old`` paths replaced by ``new`` and each key
  of ``digests`` by its value (atomic)."""
  dst.parent.mkdir(parents=True, exist_ok=True)
  tmp = dst.with_name(dst.name + ".restoring")
  text = src.read_text(encoding="utf-8")
  if old not in ("", "."):  # "." : paths relative to the run directory
    text = text.replace(old, new)
  for was, now in (digests or {}).items():
    text = text.replace(was, now)
  tmp.write_text(text, encoding="utf-8")
  tmp.replace(dst)


def vocabulary_digests(source: pathlib.Path, run_dir: pathlib.Path
                       ) -> dict[str, str]:
  """sha256 of each ``vocab/*.model`` of ``source`` -> that of the same
  model of ``run_dir``, where the bytes differ but the content is equal
  (:func:`m4moe.data.vocab.model_digest`: a model records the path it was
  trained to). A copied run's vocabulary fingerprint names the source's
  bytes; rewritten with this map, it names the models it is decoded with
  here, which encode every text the same way."""
  mapping = {}
  for model in sorted((source / "vocab").glob("*.model")):
    here = run_dir / "vocab" / model.name
    if not here.is_file():
      continue
    was, now = landing.sha256(model), landing.sha256(here)
    if was != now and (landing.input_digest(model) ==
                       landing.input_digest(here)):
      mapping[was] = now
  return mapping


def _matches(run: str, patterns: Sequence[str]) -> bool:
  return any(fnmatch.fnmatchcase(run, pattern) for pattern in patterns)


def restore(results: pathlib.Path, run_dir: pathlib.Path, *,
            patterns: Sequence[str] = ("*",)) -> list[str]:
  """Copies every whole committed run whose name matches one of
  ``patterns`` into ``run_dir``; returns their names."""
  old = recorded_run_dir(results)
  new = str(run_dir)

  def copy_text(src: pathlib.Path, dst: pathlib.Path) -> None:
    _copy_text(src, dst, old=old, new=new)

  restored = []
  for run in _landed_runs(results):
    if not _matches(run, patterns):
      continue
    markers = [f"train_{run}.json", *(f"{s}_{run}.json" for s in _SPLITS)]
    if any((run_dir / "stages" / m).exists() for m in markers):
      continue  # this run directory has its own record of the run
    if (run_dir / "models" / run).exists():
      continue  # a run started here: let m4moe-run resume it
    copy_text(results / "metrics" / f"{run}.jsonl",
              run_dir / "models" / run / "metrics.jsonl")
    for split in _SPLITS:
      hyps = run_dir / split / run
      hyps.mkdir(parents=True, exist_ok=True)
      committed = results / split / run
      for hyp in sorted(committed.iterdir()) if committed.is_dir() else ():
        shutil.copyfile(hyp, hyps / hyp.name)
      copy_text(results / split / f"{run}.json", run_dir / split / f"{run}.json")
    # The stage records last: a record means its outputs are all in place.
    for marker in markers:
      copy_text(results / "stages" / marker, run_dir / "stages" / marker)
    restored.append(run)
  return restored


def differing_inputs(source: pathlib.Path, run_dir: pathlib.Path
                     ) -> list[str]:
  """Files under ``corpus/`` and ``vocab/`` of either run directory that
  the other lacks or holds with other bytes (relative paths, sorted)."""
  mine, theirs = (landing.input_digests(source),
                  landing.input_digests(run_dir))
  return sorted(name for name in set(mine) | set(theirs)
                if mine.get(name) != theirs.get(name))


def finished_runs(source: pathlib.Path) -> list[str]:
  """Runs of a run directory whose training finished: a train stage record
  (m4moe-run writes it last) and a model directory."""
  return [record.stem.removeprefix("train_")
          for record in sorted((source / "stages").glob("train_*.json"))
          if (source / "models" / record.stem.removeprefix("train_")).is_dir()]


def _copy_model_dir(src: pathlib.Path, dst: pathlib.Path, *, old: str,
                    new: str, digests: Mapping[str, str]) -> None:
  for path in sorted(src.rglob("*")):
    if path.is_dir() or path.name in _NOT_COPIED:
      continue
    target = dst / path.relative_to(src)
    if path.suffix in _TEXT_SUFFIXES or path.name == "checkpoint":
      _copy_text(path, target, old=old, new=new, digests=digests)
      continue
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".restoring")
    shutil.copyfile(path, tmp)
    tmp.replace(target)


def _recorded_command(record: pathlib.Path, *, old: str,
                      new: str) -> list[str]:
  command = jsonfile.load(record, what="stage record",
                          fix="re-run that stage in its run directory")[
                              "command"]
  return [arg.replace(old, new) for arg in command]


def import_runs(source: pathlib.Path, run_dir: pathlib.Path, *,
                patterns: Sequence[str] = ("*",),
                expected: Mapping[str, Sequence[str]] | None = None
                ) -> list[str]:
  """Copies the finished training runs of ``source`` matching ``patterns``
  into ``run_dir`` (model directory first, stage record last); returns
  their names. Paths are rewritten to ``run_dir``, and so are the
  digests of vocabulary models equal in content
  (:func:`vocabulary_digests`). A run that ``run_dir`` has a record or
  model directory of is left alone. ``expected``: stage name -> the
  command a recipe plans for ``run_dir``; every run to copy must have it
  (the Python executable aside).

  Raises:
    ValueError: with ``expected``, runs it does not plan or plans with
      another command, all named; nothing is copied then.
  """
  old, new = str(source), str(run_dir)
  chosen = [run for run in finished_runs(source) if _matches(run, patterns)
            and not (run_dir / "stages" / f"train_{run}.json").exists()
            and not (run_dir / "models" / run).exists()]
  if expected is not None:
    wrong = []
    for run in chosen:
      ran = _recorded_command(source / "stages" / f"train_{run}.json",
                              old=old, new=new)
      want = expected.get(f"train_{run}")
      if want is None:
        wrong.append(f"{run} (the recipe has no such run)")
        continue
      # Both as a record holds them: paths relative to run_dir.
      ran = jsonfile.relative_command(ran, start=run_dir)
      want = jsonfile.relative_command(want, start=run_dir)
      if ran[1:] != want[1:]:
        wrong.append(f"{run} (trained with {' '.join(ran[1:])}; the recipe "
                     f"plans {' '.join(list(want)[1:])})")
    if wrong:
      raise ValueError(f"{len(wrong)} run(s) of {source} are not the runs "
                       "the recipe would train: " + "; ".join(wrong))
  digests = vocabulary_digests(source, run_dir)
  for run in chosen:
    _copy_model_dir(source / "models" / run, run_dir / "models" / run,
                    old=old, new=new, digests=digests)
    _copy_text(source / "stages" / f"train_{run}.json",
               run_dir / "stages" / f"train_{run}.json", old=old, new=new)
  return chosen


def _expected_commands(recipe_name: str, run_dir: pathlib.Path
                       ) -> dict[str, list[str]]:
  # Imported here: the plan pulls in the recipe loader, which plain
  # restores do not need.
  from m4moe.pipeline import plan as plan_lib  # pylint: disable=g-import-not-at-top
  from m4moe.pipeline import recipes  # pylint: disable=g-import-not-at-top
  try:
    recipe = recipes.load_recipe(recipe_name)
  except recipes.RecipeError as e:
    raise app.UsageError(str(e)) from None
  stages = plan_lib.plan(recipe, run_dir=run_dir, cache_dir=run_dir / "cache")
  return {stage.name: stage.command() for stage in stages}


def _import_main(source: pathlib.Path, run_dir: pathlib.Path) -> None:
  if not (source / "stages").is_dir() or not (source / "corpus").is_dir():
    raise app.UsageError(f"--from_run_dir={source} is not a run directory "
                         "with a corpus and stage records (m4moe-run writes "
                         "them); name the directory a recipe ran in")
  if not (run_dir / "corpus").is_dir():
    sys.exit(f"restore: {run_dir} has no corpus yet: build it and the "
             f"vocabularies first (m4moe-run --recipe=... --run_dir={run_dir}"
             " --stop_after=vocab)")
  differ = differing_inputs(source, run_dir)
  if differ:
    sys.exit(f"restore: {len(differ)} corpus/vocabulary file(s) differ "
             f"between {source} and {run_dir} or exist in one only (e.g. "
             f"{', '.join(differ[:3])}): runs trained on other data cannot "
             "be reused. Build both from the same recipe, or train the runs "
             "here.")
  expected = (_expected_commands(flags.FLAGS.recipe, run_dir)
              if flags.FLAGS.recipe else None)
  try:
    copied = import_runs(source, run_dir, patterns=flags.FLAGS.runs,
                         expected=expected)
  except ValueError as e:
    sys.exit(f"restore: refused, nothing was copied: {e}")
  print(f"restore: {len(copied)} finished run(s) of {source} copied into "
        f"{run_dir}" + (f": {', '.join(copied)}" if copied else ""))


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  values = flags.FLAGS
  if not values.run_dir:
    raise app.UsageError("--run_dir is required")
  run_dir = pathlib.Path(values.run_dir).resolve()
  if values.from_run_dir:
    _import_main(pathlib.Path(values.from_run_dir).resolve(), run_dir)
    return
  if values.recipe:
    raise app.UsageError("--recipe checks runs copied with --from_run_dir; "
                         "committed results (--results) are checked by "
                         "their inputs.sha256 instead: drop --recipe")
  if not values.results:
    raise app.UsageError("give --results (committed study results, e.g. "
                         "results/study/v2) or --from_run_dir")
  results = pathlib.Path(values.results).resolve()
  if not (results / "inputs.sha256").is_file():
    print(f"restore: {results} has no inputs.sha256 (no run has landed): "
          "nothing to restore")
    return
  bad = check_inputs(results, run_dir)
  if bad and not any((run_dir / name).is_file() for name in bad):
    sys.exit(f"restore: {run_dir} has none of the {len(bad)} corpus/"
             f"vocabulary file(s) listed in {results / 'inputs.sha256'} "
             f"(e.g. {bad[0]}): build them first with m4moe-run "
             f"--recipe=study --run_dir={run_dir} --stop_after=vocab")
  if bad:
    sys.exit(f"restore: {len(bad)} corpus/vocabulary file(s) under {run_dir} "
             f"differ from those the committed runs used "
             f"({results / 'inputs.sha256'}), e.g. {', '.join(bad[:3])}: "
             "new runs would not be comparable with the committed ones. Build "
             "the corpus and vocabularies from the same recipe and split keys "
             "(m4moe-run --recipe=study --stop_after=vocab), or start the "
             "study afresh in another results directory.")
  restored = restore(results, run_dir, patterns=values.runs)
  print(f"restore: {len(restored)} committed run(s) restored into {run_dir}"
        + (f": {', '.join(restored)}" if restored else ""))


if __name__ == "__main__":
  # Defined here, not at import: the tests import this file beside the
  # m4moe tools, which define --run_dir too.
  flags.DEFINE_string("results", None,
                      "The committed study results to restore (a results "
                      "directory with inputs.sha256, e.g. results/study/v2).")
  flags.DEFINE_string("from_run_dir", None,
                      "Copy finished training runs from this run directory "
                      "instead (same corpus and vocabularies required).")
  flags.DEFINE_list("runs", ["*"],
                    "Only the runs whose names match one of these patterns "
                    "(fnmatch, e.g. 'bilingual_*').")
  flags.DEFINE_string("recipe", None,
                      "With --from_run_dir: the recipe (name or .toml) that "
                      "will run in --run_dir; every copied run must have the "
                      "training command it plans.")
  flags.DEFINE_string("run_dir", None, "The run directory to seed.")
  app.run(main)
