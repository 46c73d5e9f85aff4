"""Whether a built corpus holds enough for its recipe to be reported on.

A corpus build that skipped sources still succeeds, and says what it lost
(:mod:`m4moe.data.corpus_coverage`). Training on it and publishing the
report would show BLEU of 8 test sentences as the recipe's result, so
``m4moe-run`` checks every language of the built corpus against the
recipe's minimums (:attr:`Recipe.min_train_pairs`,
:attr:`Recipe.min_eval_sentences`) before any stage after the corpus, and
stops with one message: the languages below them, what the build skipped,
and the ways out. ``--allow_reduced_corpus`` goes on anyway; the report's
header then says the data was reduced (``eval/report.py`` reads the
corpus report's ``reduced`` section).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Mapping, Sequence

from m4moe import jsonfile
from m4moe.pipeline.recipes import Recipe


@dataclasses.dataclass(frozen=True, kw_only=True)
class Shortfall:
  """A language below the recipe's minimums.

  Attributes:
    language: its code.
    train: training pairs built.
    eval_sentences: sentences of the recipe's scored split built.
  """

  language: str
  train: int
  eval_sentences: int


def read_corpus_report(corpus_dir: pathlib.Path) -> dict | None:
  """The corpus's ``report.json``; None when the corpus was not built."""
  path = corpus_dir / "report.json"
  if not path.is_file():
    return None
  return jsonfile.load(path, what="the corpus build report",
                       fix="re-run with --restart_from=corpus")


def shortfalls(recipe: Recipe, report: Mapping) -> list[Shortfall]:
  """The recipe's languages (all built ones if it names none) below its
  minimums; a requested language the build did not produce has 0."""
  built = report.get("languages", {})
  languages = recipe.languages or tuple(sorted(built))
  out = []
  for lang in languages:
    counts = built.get(lang, {})
    train = counts.get("train", 0)
    sentences = counts.get(recipe.eval_split, 0)
    if train < recipe.min_train_pairs or (
        sentences < recipe.min_eval_sentences):
      out.append(Shortfall(language=lang, train=train,
                           eval_sentences=sentences))
  return out


def _minimums(recipe: Recipe) -> str:
  return (f">= {recipe.min_train_pairs:,} training pairs and >= "
          f"{recipe.min_eval_sentences:,} {recipe.eval_split} sentences per "
          "language")


def describe(recipe: Recipe, found: Sequence[Shortfall]) -> str:
  """``kk (294 training pairs, 16 test sentences), ...``."""
  return ", ".join(
      f"{s.language} ({s.train:,} training pairs, {s.eval_sentences:,} "
      f"{recipe.eval_split} sentences)" for s in found)


def _ways_out(recipe: Recipe, report: Mapping) -> list[str]:
  """What the user can do, the recipe's own data first."""
  skipped = report.get("reduced", {}).get("skipped_sources", [])
  ways = [f"{s['fix']}, then re-run this command with "
          "--restart_from=corpus" for s in skipped]
  if not skipped:
    ways.append("build the languages from more sources, or name languages "
                "that have enough data in a recipe file of your own")
  if recipe.name != "demo_pypi" and any(
      s["kind"] == "debian" for s in skipped):
    ways.append("run the PyPI-only demo, which needs only pip: m4moe-run "
                "--recipe=demo_pypi --run_dir=<a new directory>")
  ways.append("go on anyway with --allow_reduced_corpus (the report's "
              "header then says the data was reduced)")
  return ways


def message(recipe: Recipe, *, found: Sequence[Shortfall], report: Mapping,
            corpus_dir: pathlib.Path) -> str:
  """The one message ``m4moe-run`` stops with."""
  skipped = report.get("reduced", {}).get("skipped_sources", [])
  why = (" Its build " + "; ".join(s["what"] for s in skipped) + "."
         if skipped else "")
  ways = "; ".join(f"({i}) {way}" for i, way in enumerate(
      _ways_out(recipe, report), start=1))
  return (f"m4moe-run: stopped before training: the corpus at {corpus_dir} "
          f"is below the minimums of recipe {recipe.name!r} "
          f"({_minimums(recipe)}) in {describe(recipe, found)}.{why} Ways "
          f"out: {ways}.")
