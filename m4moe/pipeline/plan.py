"""The main job as resumable stages: corpus, vocabularies, training, eval, report.

A :class:`~m4moe.pipeline.recipes.Recipe` (a TOML file under
``configs/recipes/``) names everything the job does; :func:`plan` turns it
into an ordered list of :class:`Stage`s, each a command line of one of the
m4moe tools. ``m4moe-run`` executes them (``m4moe.pipeline.supervisor``
runs the processes) and records each finished stage in
``<run_dir>/stages/<name>.json``, so a re-run skips completed stages (and
``m4moe-train`` itself resumes from its last checkpoint if a run was killed
mid-training).

Packaged recipes:

* ``demo``: the offline corpus built from the packaged Debian/PyPI
  localisation recipe, four languages from high- to low-resource,
  SentencePiece vocabularies, the tiny MoE model against tiny dense
  bilingual baselines, beam-search decoding of the test split, sacrebleu
  and the report.
* ``study``: the 16-language mini-M4 study of ``results/study/``: a
  2+2-layer dense multilingual model and the MoE model of equal active
  FLOPs, three seeds each, one dense bilingual baseline per language, every
  run trained to early stopping on dev; scored on the in-domain test and on
  the out-of-domain test of held-out source packages. Several hours of a
  2-core machine in two lanes; every stage resumes.
* ``demo_pypi``: the demo's stages and budget on the PyPI half of the
  recipe only, so it runs wherever pip does (no apt); four languages the
  PyPI catalogs cover well enough for the minimums (results/demo_pypi/).
* ``smoke``: the same stages on a small generated catalog tree (no
  downloads), with micro models and a few steps: it checks the plumbing in
  about two minutes and is what the tests run.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from typing import Sequence

from m4moe.pipeline.recipes import ModelRun, Recipe


@dataclasses.dataclass(frozen=True, kw_only=True)
class Stage:
  """One resumable step of the job: a tool and its arguments.

  ``lane``: the :attr:`ModelRun.lane` of the model a train/eval stage
  belongs to (None: the stage runs alone).
  ``after``: names of earlier stages whose outputs it reads beyond what
  the plan order and its lane already guarantee: an upcycled run's
  training waits for its source run's (:attr:`ModelRun.init_from`), which
  may train in another lane of the same block.
  """

  name: str
  description: str
  tool: str
  args: tuple[str, ...]
  lane: int | None = None
  after: tuple[str, ...] = ()

  def command(self) -> list[str]:
    """The command line: the tool's module run by this Python."""
    return [sys.executable, "-m", f"m4moe.cli.{self.tool}", *self.args]

  def flag_values(self) -> dict[str, str]:
    """``{"model_dir": "...", ...}`` of the ``--name=value`` arguments."""
    out = {}
    for arg in self.args:
      name, _, value = arg.lstrip("-").partition("=")
      out[name] = value
    return out


def _languages_flag(recipe: Recipe) -> list[str]:
  return [f"--languages={','.join(recipe.languages)}"] if recipe.languages else []


def _corpus_stage(recipe: Recipe, run_dir: pathlib.Path,
                  cache_dir: pathlib.Path) -> Stage:
  args = [f"--output_dir={run_dir / 'corpus'}", f"--cache_dir={cache_dir}",
          *_languages_flag(recipe)]
  if recipe.use_packaged_corpus_recipe:
    description = "build the offline corpus from the packaged recipe"
    if recipe.corpus_recipe_parts:
      args.append(f"--recipe_parts={','.join(recipe.corpus_recipe_parts)}")
      description += f" ({' and '.join(recipe.corpus_recipe_parts)} only)"
    if recipe.ood_test or recipe.ood_holdout:
      args.append("--ood_packages=packaged")
      description += " (out-of-domain packages held out as test_ood)"
  else:
    args += ["--norecipe", f"--sources={run_dir / 'fixture_catalogs'}",
             "--split_keys=", "--dev_groups=10", "--test_groups=10"]
    description = "build a corpus from generated fixture catalogs"
  return Stage(name="corpus", description=description, tool="build_corpus",
               args=tuple(args))


@dataclasses.dataclass
class _EvalJsons:
  """The eval JSONs of one split, for its report: models and baselines."""
  models: list[pathlib.Path] = dataclasses.field(default_factory=list)
  baselines: list[pathlib.Path] = dataclasses.field(default_factory=list)


def _train_stage(recipe: Recipe, model: ModelRun, *, run: str,
                 seed: int | None, run_dir: pathlib.Path,
                 languages: Sequence[str], continuation: Sequence[str],
                 note: str, after: tuple[str, ...] = ()) -> Stage:
  """``m4moe-train`` of one run (one seed) of ``model``."""
  every = max(1, model.train_steps // 5)
  model_dir = run_dir / "models" / run
  steps = f"{model.train_steps} steps" + (
      " after upcycling" if model.init_from else "")
  return Stage(
      name=f"train_{run}",
      description=f"train {run} ({model.config}, {steps}{note})",
      tool="train", lane=model.lane, after=after,
      args=(f"--config={model.config}", f"--corpus_dir={run_dir / 'corpus'}",
            f"--vocab_dir={run_dir / 'vocab'}", f"--model_dir={model_dir}",
            *languages, f"--train_steps={model.train_steps}",
            f"--batch_tokens={recipe.batch_tokens}",
            f"--sequence_length={recipe.sequence_length}",
            f"--checkpoint_every={every}",
            f"--eval_every={model.eval_every or every}",
            f"--log_every={max(1, model.train_steps // 30)}",
            *([f"--early_stopping_patience={model.early_stopping_patience}"]
              if model.early_stopping_patience else []),
            *([f"--seed={seed}"] if seed is not None else []),
            *([f"--max_train_seconds={model.max_train_seconds:g}"]
              if model.max_train_seconds else []),
            *continuation, *model.extra_flags))


def _eval_stage(recipe: Recipe, model: ModelRun, *, run: str, split: str,
                out: str, run_dir: pathlib.Path,
                languages: Sequence[str]) -> Stage:
  """``m4moe-eval`` of one run on ``split``, writing ``<out>/<run>.json``."""
  max_sentences = (recipe.ood_eval_max_sentences if split == "test_ood"
                   else recipe.eval_max_sentences)
  return Stage(
      name=f"{out}_{run}",
      description=f"decode the {split} split with {run} and score it",
      tool="eval", lane=model.lane,
      args=(f"--model_dir={run_dir / 'models' / run}",
            f"--vocab_dir={run_dir / 'vocab'}",
            f"--corpus_dir={run_dir / 'corpus'}",
            f"--output={run_dir / out / f'{run}.json'}",
            *languages, f"--model_name={model.name}",
            f"--kind={'bilingual' if model.bilingual else 'multilingual'}",
            *([f"--split={split}"] if split != "test" else []),
            f"--max_sentences={max_sentences}",
            f"--beam_size={recipe.beam_size}",
            # The weights of the best dev evaluation: an early-stopped run
            # is scored where dev was best, not `patience` evaluations later.
            "--checkpoint=best",
            f"--hypotheses_dir={run_dir / out / run}"))


def _splits(recipe: Recipe) -> tuple[tuple[str, str], ...]:
  """(split, output directory name) of every split the recipe scores."""
  if recipe.eval_split == "dev":
    return (("dev", "eval_dev"),)
  return (("test", "eval"),) + (
      (("test_ood", "eval_ood"),) if recipe.ood_test else ())


def _model_stages(recipe: Recipe, model: ModelRun, *, run_dir: pathlib.Path,
                  sources: dict[str, ModelRun],
                  jsons: dict[str, _EvalJsons]) -> list[Stage]:
  """Train and eval stages of every run (seed) of ``model``."""
  languages = ([f"--languages={','.join(model.languages)}"]
               if model.languages else _languages_flag(recipe))
  # A continued run copies, an upcycled one starts from, its source model's
  # run of the same seed (the Recipe checks that the source has them).
  source = model.continue_from or model.init_from
  source_run = ({seed: run for run, seed in sources[source].runs()}
                if source else {})
  stages = []
  for run, seed in model.runs():
    note, continuation = "" if seed is None else f", seed {seed}", []
    after: tuple[str, ...] = ()
    if model.continue_from:
      note += f", continuing {source_run[seed]}"
      continuation = [f"--continue_from={run_dir / 'models' / source_run[seed]}"]
    elif model.init_from:
      note += f", from {source_run[seed]}"
      continuation = [
          f"--init_from_dense={run_dir / 'models' / source_run[seed]}"]
      after = (f"train_{source_run[seed]}",)
    stages.append(_train_stage(recipe, model, run=run, seed=seed,
                               run_dir=run_dir, languages=languages,
                               continuation=continuation, note=note,
                               after=after))
    for split, out in _splits(recipe):
      target = jsons[split]
      (target.baselines if model.bilingual else target.models).append(
          run_dir / out / f"{run}.json")
      stages.append(_eval_stage(recipe, model, run=run, split=split,
                                out=out, run_dir=run_dir,
                                languages=languages))
  return stages


def _report_stages(recipe: Recipe, *, run_dir: pathlib.Path,
                   jsons: dict[str, _EvalJsons]) -> list[Stage]:
  """One ``m4moe-report`` per scored split."""
  # Seeds of one model share its name: each seed's log is named, in the
  # order its eval JSON is listed.
  logs = ",".join(
      f"{m.name}={run_dir / 'models' / run / 'metrics.jsonl'}"
      for m in recipe.models for run, _ in m.runs())
  stages = []
  for split, out in _splits(recipe):
    name = {"test": "report", "test_ood": "report_ood",
            "dev": "report_dev"}[split]
    title = f"m4moe {recipe.name}: {recipe.description}"
    description = "write the BLEU report"
    if split == "test_ood":
      title += f" ({split}: out-of-domain test)"
      description += " of the out-of-domain test"
    elif split == "dev":
      title += " (dev: selection only)"
      description += " of the dev split (selection)"
    found = jsons[split]
    baselines = ([f"--baselines={','.join(str(p) for p in found.baselines)}"]
                 if found.baselines else [])
    stages.append(Stage(
        name=name, description=description, tool="report",
        args=(f"--models={','.join(str(p) for p in found.models)}",
              *baselines, f"--output_dir={run_dir / name}",
              f"--corpus_dir={run_dir / 'corpus'}",
              f"--training_logs={logs}", f"--title={title}",
              *recipe.report_flags)))
  return stages


def _model_order(recipe: Recipe) -> tuple[tuple[ModelRun, ...],
                                          tuple[ModelRun, ...]]:
  """(models planned before the baselines, models planned after them).

  Continuations train after the baselines: the baselines complete the
  comparison at the first budget before any run is extended. A model
  upcycled from a continuation follows it there; other upcycled models
  keep their place (their sources are listed before them). Both keep the
  recipe's order.
  """
  late: set[str] = set()
  for model in recipe.models:
    if model.continue_from or model.init_from in late:
      late.add(model.name)
  return (tuple(m for m in recipe.models if m.name not in late),
          tuple(m for m in recipe.models if m.name in late))


def plan(recipe: Recipe, *, run_dir: pathlib.Path,
         cache_dir: pathlib.Path) -> list[Stage]:
  """The ordered stages of ``recipe`` writing under ``run_dir``."""
  stages = [
      _corpus_stage(recipe, run_dir, cache_dir),
      Stage(name="vocab", description="train SentencePiece vocabularies",
            tool="vocab",
            args=(f"--corpus_dir={run_dir / 'corpus'}",
                  f"--output_dir={run_dir / 'vocab'}",
                  *_languages_flag(recipe),
                  f"--source_vocab_size={recipe.source_vocab_size}",
                  f"--target_vocab_size={recipe.target_vocab_size}",
                  *recipe.vocab_flags)),
  ]
  jsons = {split: _EvalJsons() for split, _ in _splits(recipe)}
  fresh, late = _model_order(recipe)
  sources = {m.name: m for m in recipe.models}
  for model in fresh + recipe.baselines() + late:
    stages += _model_stages(recipe, model, run_dir=run_dir, sources=sources,
                            jsons=jsons)
  return stages + _report_stages(recipe, run_dir=run_dir, jsons=jsons)


def parallel_blocks(stages: Sequence[Stage]) -> list[list[list[Stage]]]:
  """Groups the ordered stages into blocks that run one after the other.

  A maximal run of consecutive stages that have a lane is one block: a list
  of lanes (ascending lane number), each the block's stages of that lane in
  their original order; the lanes of a block run concurrently. A stage
  without a lane is a block of one lane holding just it. Since a model's
  eval stage follows its train stage in the same lane, and the report has
  no lane, every stage still runs after the stages whose outputs it reads,
  except a stage's :attr:`Stage.after` in another lane of its block: the
  runner starts it only when those have finished.
  """
  blocks: list[list[list[Stage]]] = []
  pending: dict[int, list[Stage]] = {}
  for stage in stages:
    if stage.lane is None:
      if pending:
        blocks.append([pending[k] for k in sorted(pending)])
        pending = {}
      blocks.append([[stage]])
    else:
      pending.setdefault(stage.lane, []).append(stage)
  if pending:
    blocks.append([pending[k] for k in sorted(pending)])
  return blocks


def lane_cpus(num_lanes: int, cpus: Sequence[int]) -> list[tuple[int, ...]]:
  """Splits ``cpus`` into ``num_lanes`` contiguous, near-equal shares.

  Raises:
    ValueError: fewer cores than lanes (run the lanes one after the other).
  """
  cpus = sorted(cpus)
  if num_lanes < 1 or len(cpus) < num_lanes:
    raise ValueError(f"{num_lanes} lane(s) need at least as many cores, "
                     f"have {len(cpus)}")
  share, extra = divmod(len(cpus), num_lanes)
  out, start = [], 0
  for lane in range(num_lanes):
    size = share + (1 if lane < extra else 0)
    out.append(tuple(cpus[start:start + size]))
    start += size
  return out
