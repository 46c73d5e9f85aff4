"""The main job as resumable stages: corpus, vocabularies, training, eval, report.

A :class:`Recipe` names everything the job does; :func:`plan` turns it into
an ordered list of :class:`Stage`s, each a command line of one of the m4moe
tools. ``m4moe-run`` executes them in order and records each finished stage
in ``<run_dir>/stages/<name>.json``, so a re-run skips completed stages (and
``m4moe-train`` itself resumes from its last checkpoint if a run was killed
mid-training).

Recipes:

* ``demo``: the default offline corpus built from the packaged
  Debian/PyPI localisation recipe, a representative set of languages from
  high- to low-resource, SentencePiece vocabularies, the tiny MoE model,
  beam-search decoding of the test split, sacrebleu and the report.
* ``study``: the mini-M4 study v2 of ``results/study/``: 16 languages
  from 136k down to 1.7k training pairs, a 2+2-layer dense multilingual model
  and the MoE model of equal active FLOPs (8 experts), three seeds each, one
  dense bilingual baseline per language, every run trained to early
  stopping on dev; scored on the in-domain test (>= 500 sentences where the
  corpus has them) and on the out-of-domain test of held-out source
  packages, with seed spreads and 95% bootstrap intervals. Several hours on
  a 2-core machine in two lanes (results/study/README.md: about 7 on
  an Intel Xeon of these machines); every stage resumes.
* ``smoke``: the same stages on a small generated catalog tree (no
  downloads), with a micro model and a few steps: it checks the plumbing in
  about two minutes and is what the tests run.

Each stage runs as a child process through :func:`run_stage_process`, which
never leaves it behind as an orphan: SIGTERM, SIGINT and SIGHUP sent to the
job are forwarded to the stage (a training stage then saves and stops), and
on Linux the stage gets SIGTERM from the kernel if the job dies without
being able to forward anything (``kill -9``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
import threading
from typing import Any, Callable, Sequence


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
  max_train_seconds: float = 0.0

  def __post_init__(self) -> None:
    if self.max_train_seconds < 0:
      raise ValueError(f"model {self.name!r}: max_train_seconds must be >= 0 "
                       f"(0: no cap), got {self.max_train_seconds}")
    if self.lane is not None and self.lane < 0:
      raise ValueError(f"model {self.name!r}: lane must be >= 0 or None, "
                       f"got {self.lane}")
    if self.bilingual and len(self.languages) != 1:
      raise ValueError(f"bilingual model {self.name!r} needs exactly one "
                       f"language, got {self.languages}")
    if len(set(self.seeds)) != len(self.seeds) or any(
        s < 0 for s in self.seeds):
      raise ValueError(f"model {self.name!r}: seeds {self.seeds} must be "
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
    ood_eval_max_sentences: ``test_ood`` sentences per language (0: all;
      the held-out packages give up to ~16k per language, in a fixed
      shuffled order).
  """

  name: str
  description: str
  languages: tuple[str, ...]
  use_packaged_corpus_recipe: bool
  source_vocab_size: int
  target_vocab_size: int
  models: tuple[ModelRun, ...]
  baseline: ModelRun | None
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
  ood_eval_max_sentences: int = 1000

  def __post_init__(self) -> None:
    for field in ("baseline_steps", "baseline_seconds", "baseline_lanes",
                  "baseline_flags"):
      unknown = {lang for lang, _ in getattr(self, field)} - set(
          self.languages)
      if unknown:
        raise ValueError(f"recipe {self.name!r}: {field} names languages "
                         f"{sorted(unknown)} that the recipe does not train")
    if not self.models:
      raise ValueError(f"recipe {self.name!r} trains no model; add one")
    names = [m.name for m in self.models]
    if len(set(names)) != len(names):
      raise ValueError(f"recipe {self.name!r} repeats a model name: {names}")
    runs = [run for m in self.models for run, _ in m.runs()]
    if len(set(runs)) != len(runs):
      raise ValueError(f"recipe {self.name!r}: two runs share a directory "
                       f"name: {runs}; rename a model")
    if self.ood_test and not self.use_packaged_corpus_recipe:
      raise ValueError(f"recipe {self.name!r}: ood_test needs the packaged "
                       "corpus recipe (the out-of-domain packages are "
                       "recipe pins)")
    if self.baseline is not None and not self.languages:
      raise ValueError(f"recipe {self.name!r}: bilingual baselines need an "
                       "explicit language list")
    earlier: dict[str, ModelRun] = {}
    for model in self.models:
      if model.continue_from:
        self._check_continuation(model, earlier.get(model.continue_from))
      earlier[model.name] = model

  def _check_continuation(self, model: ModelRun,
                          source: ModelRun | None) -> None:
    where = (f"recipe {self.name!r}: model {model.name!r} continues "
             f"{model.continue_from!r}")
    if source is None:
      raise ValueError(f"{where}, which is not an earlier model of the "
                       "recipe; list that model first")
    for field in ("config", "extra_flags", "languages", "seeds", "lane"):
      if getattr(model, field) != getattr(source, field):
        raise ValueError(
            f"{where} but its {field} differs ({getattr(model, field)!r} vs "
            f"{getattr(source, field)!r}); a continued run keeps its "
            "model, data, seeds and lane")
    if model.train_steps <= source.train_steps:
      raise ValueError(
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


# The demo trains on 2048-token batches: at equal training tokens (twice
# the steps) they gained 2.3 BLEU over 4096-token ones in ablation round 2
# (results/peer/README.md, 1b: two seeds, pt, 2400 steps of 4096),
# at about the same tokens per second. The zoo's tiny recipe is tuned on
# 4096-token batches (peak 1e-3 held 1000 steps); at 2048 the same rate per
# token holds the peak for 2000 steps: learning_rate = 1e-3 * sqrt(2000).
_DEMO_BATCH_TOKENS = 2048
_DEMO_SCHEDULE = ("--warmup_steps=2000", "--learning_rate=0.044721")
_SMALL_DATA_DROPOUT = ("--dropout_rate=0.1", "--attention_dropout_rate=0.1")
# The demo's step budgets, sized so that the job takes under 40 minutes on a
# quiet 2-core machine (download included), leaving room for the install and
# a slower CPU inside the README's 45. Measured (results/demo/, quiet
# machine, 2026-11-24, 4096-token batches): 3000 steps for both took 46.5
# minutes, the critical lane being the pt and kk baselines (0.45 and 0.43 s
# per step); 2750 and 2400 steps took 38.5. At 2048 tokens a step takes
# about 0.53x as long (ablation round 2: 5% fewer tokens per second), so
# the budgets are 5200 and 4400 steps (2600 and 2200 of 4096 tokens). The
# MoE's lane has the idle time, so it trains longer than the baselines' cap:
# 5200 steps shared among four languages against at most 4400 steps on one
# language for each baseline.
_DEMO_MOE_STEPS = 5200
_DEMO_BASELINE_MAX_STEPS = 4400
# Those step budgets fit 45 minutes on the CPU they were measured on (an AMD
# EPYC; training loops of 1158 s for the MoE, 949 and 979 s for the pt and
# kk baselines, 367 and 271 s for si and ia, about 0.22 s per step). These
# machines also come with an Intel Xeon, on which the study's 2+2 models
# took 0.87 s per 4096-token step (2026-11-26, one core per lane, dropout
# 0.1), about twice the EPYC's time for such a step: in steps alone the job
# would run well past 45 minutes there. So every training run also has a
# wall-clock cap a few
# percent above its measured time there: on such a CPU nothing changes, on a
# slower one the runs stop at the cap ("time_budget" in the report's
# stopping table) and each lane still trains for at most 2000 s (33 min),
# leaving the corpus, vocabularies, decoding and the install about 12.
_DEMO_SECONDS = {"moe": 1200.0, "pt": 1000.0, "kk": 1000.0, "si": 430.0,
                 "ia": 370.0}

# Languages from the offline corpus spanning its resource range (training
# pairs measured on the 2026-11 build: pt 136k, kk 17k, si 6.3k, ia 1.4k).
_DEMO_LANGUAGES = ("pt", "kk", "si", "ia")

# The study's languages: 5 high (>= 50k pairs), 5 mid (10k-50k) and 6 low
# (< 10k, down to 1.7k) resource languages of the 2026-11 build, in several
# scripts and families, each with >= 60 test sentences. Training pairs:
# pt 136k, de 101k, ru 90k, ja 70k, fi 67k, ar 40k, is 31k, hi 23k, kk 18k,
# ka 12k, my 7.7k, si 6.3k, az 5.7k, uz 3.5k, sd 2.2k, ckb 1.7k.
_STUDY_PAIRS = {"pt": 135844, "de": 101231, "ru": 90446, "ja": 69850,
                "fi": 67470, "ar": 40107, "is": 31037, "hi": 22575,
                "kk": 17525, "ka": 12082, "my": 7660, "si": 6333, "az": 5746,
                "uz": 3527, "sd": 2174, "ckb": 1728}
_STUDY_LANGUAGES = tuple(_STUDY_PAIRS)
# Study v2 (issue 12 §3): the main comparison, the shallow (2+2-layer) tiny
# dense model against the tiny MoE model of equal active FLOPs per token (8
# experts, top-2, every other FFN; 5.02M active parameters each), each
# trained with three seeds until dev cross-entropy flattens: dev CE every
# 150 steps, stop after 4 evaluations (600 steps) without lowering the best
# by more than 0.005 nats, at most 3000 steps. The zoo's tiny entries carry
# the small-model optimiser recipe (results/peer/). Study v1 (600 steps,
# the paper's Adafactor, one seed) found 2+2 layers ahead of 4+4 at this
# budget; its 4+4 and 32-expert models are not re-run.
_STUDY_SEEDS = (1, 2, 3)
_STUDY_MAX_STEPS = 3000
_SHALLOW = ("--num_encoder_layers=2", "--num_decoder_layers=2")
# Study v2's optimiser is the zoo's small-model recipe (configs/tiny/*: peak
# 1e-3 held 1000 steps, rsqrt decay, Adam-like) with dropout 0.1 for every
# model. The zoo's dropout 0 won on pt alone (134k pairs), but overfits
# bilingual runs on 15k pairs or fewer (the demo), and the multilingual
# models' temperature sampling (T = 5) shows ckb's 1.6k pairs about ten times
# in 3000 steps; one dropout for every model keeps the comparison about
# routing and data, not regularisation. Its first sitting (2026-11-24/25)
# ran the recipe before ablation round 2 (peak held 300 steps) and never
# reached flat dev CE in 3000 steps; those runs' scores are kept in
# results/study/v2_recipe1/ (no hypotheses survived, so no intervals).
_STUDY_OPTIMISER = _SMALL_DATA_DROPOUT
_STUDY_FLAGS = (*_SHALLOW, *_STUDY_OPTIMISER)
_STUDY_STOPPING = dict(eval_every=150, early_stopping_patience=4)
_STUDY_MIN_DELTA = ("--early_stopping_min_delta=0.005",)
# Bilingual baselines: the same 2+2-layer dense model per language, dev CE
# every 100 steps, stopped after 3 evaluations without a new best (the
# small languages overfit within a few hundred steps), at most 3000 steps.
_STUDY_BASELINE_STOPPING = dict(eval_every=100, early_stopping_patience=3)

# The smoke recipe's micro models.
_SMOKE_DIMS = ("--d_model=32", "--d_kv=8", "--d_ff=64", "--num_encoder_layers=2",
               "--num_decoder_layers=2", "--warmup_steps=10")

RECIPES: dict[str, Recipe] = {
    "demo": Recipe(
        name="demo",
        description=("offline localisation corpus, 4 languages X->en, tiny "
                     "MoE (8 experts, top-2) vs tiny dense bilingual "
                     "baselines trained to early stopping on dev, beam "
                     "search, sacrebleu, report"),
        languages=_DEMO_LANGUAGES,
        use_packaged_corpus_recipe=True,
        source_vocab_size=8000,
        target_vocab_size=8000,
        # The zoo entries carry the small-model optimiser recipe
        # (results/peer/), its schedule scaled to the demo's batches
        # (_DEMO_SCHEDULE). Two lanes, one core each: the MoE (2+2 layers, which train faster per step and beat
        # 4+4 at this budget), then the two smallest baselines; beside it the
        # pt and kk baselines.
        models=(ModelRun(name="moe", config="tiny/moe",
                         train_steps=_DEMO_MOE_STEPS, eval_every=500,
                         extra_flags=(*_SHALLOW, *_DEMO_SCHEDULE), lane=0,
                         max_train_seconds=_DEMO_SECONDS["moe"]),),
        # Baselines sized by a stopping rule on dev, not by a step count:
        # dev CE every 400 steps, stop after 2 evaluations without a new
        # best, at most 4400 steps (fewer than the multilingual model, which
        # shares its steps among four languages). The 2+2-layer tiny dense
        # model beat 4+4 at this budget in the study.
        baseline=ModelRun(name="bilingual", config="tiny/dense",
                          train_steps=_DEMO_BASELINE_MAX_STEPS, eval_every=400,
                          early_stopping_patience=2,
                          extra_flags=(*_SHALLOW, *_DEMO_SCHEDULE), lane=1),
        baseline_lanes=(("si", 0), ("ia", 0)),
        baseline_seconds=tuple(
            (lang, _DEMO_SECONDS[lang]) for lang in _DEMO_LANGUAGES),
        # Dropout 0 (the zoo's) won on pt's 134k pairs but overfits the
        # small languages' baselines: in the first run of this recipe the
        # kk baseline's best dev CE was 3.67 at 800 steps (dropout 0.1:
        # 2.81 at 3600) and si's 4.35 at 400 (0.1: 3.69 at 800), and their
        # test BLEU 11.0 and 4.8 below dropout 0.1's
        # (results/demo/README.md). So the baselines of kk, si and ia
        # (15k, 6k and 1.4k pairs) keep 0.1.
        baseline_flags=tuple(
            (lang, _SMALL_DATA_DROPOUT) for lang in ("kk", "si", "ia")),
        # 300k sampled source sentences instead of 1M: half the CPU time
        # and a third of the memory (1.4 GB -> 0.5 GB peak RSS).
        vocab_flags=("--max_sentences=300000",),
        report_flags=("--ce_thresholds=4.0,3.0,2.5",),
        batch_tokens=_DEMO_BATCH_TOKENS,
        sequence_length=64,
        eval_max_sentences=200,
        beam_size=4,
    ),
    "study": Recipe(
        name="study",
        description=("offline localisation corpus, 16 languages X->en: "
                     "2+2-layer dense vs MoE (8 experts, equal active "
                     "FLOPs), 3 seeds each, vs dense bilingual baselines, "
                     "all trained to early stopping on dev; in-domain and "
                     "out-of-domain test"),
        languages=_STUDY_LANGUAGES,
        use_packaged_corpus_recipe=True,
        source_vocab_size=16000,
        target_vocab_size=8000,
        models=(
            ModelRun(name="dense_L2", config="tiny/dense",
                     train_steps=_STUDY_MAX_STEPS, seeds=_STUDY_SEEDS,
                     extra_flags=(*_STUDY_FLAGS, *_STUDY_MIN_DELTA),
                     lane=0, **_STUDY_STOPPING),
            ModelRun(name="moe_E8_L2", config="tiny/moe",
                     train_steps=_STUDY_MAX_STEPS, seeds=_STUDY_SEEDS,
                     extra_flags=(*_STUDY_FLAGS, *_STUDY_MIN_DELTA),
                     lane=1, **_STUDY_STOPPING),
        ),
        baseline=ModelRun(name="bilingual", config="tiny/dense",
                          train_steps=_STUDY_MAX_STEPS,
                          extra_flags=_STUDY_FLAGS,
                          lane=0, **_STUDY_BASELINE_STOPPING),
        # Two lanes of one core each (1.39x the throughput of one two-core
        # process, results/demo/lanes_benchmark.py): the dense seeds
        # and the MoE seeds side by side, then the baselines alternating
        # between the lanes in order of size (larger ones train longer).
        baseline_lanes=tuple((lang, 1) for lang in _STUDY_LANGUAGES[1::2]),
        report_flags=("--ce_thresholds=4.0,3.0,2.5",),
        batch_tokens=4096,
        sequence_length=64,
        # Every in-domain test sentence: 156-3,429 per language, >= 500 in
        # 13 of 16 (data/splits/split_keys.txt version 2; the test files are
        # in catalog order, so a prefix would over-represent some
        # packages); the first 500 test_ood sentences per language (a
        # random sample: the builder shuffles test_ood; up to 15.7k, 71k in
        # all), which halves the decode time of the first sitting's 1000.
        eval_max_sentences=0,
        ood_eval_max_sentences=500,
        beam_size=4,
        ood_test=True,
    ),
    "smoke": Recipe(
        name="smoke",
        description=("generated catalogs, micro MoE, a few steps: checks "
                     "every stage end to end in minutes, offline"),
        languages=(),
        use_packaged_corpus_recipe=False,
        source_vocab_size=400,
        target_vocab_size=320,
        # Two lanes, as the demo: the micro MoE and a micro dense model
        # train side by side.
        models=(ModelRun(name="moe", config="tiny/moe", train_steps=20,
                         extra_flags=(*_SMOKE_DIMS, "--expert_hidden_dim=32",
                                      "--num_experts=4", "--group_size=64"),
                         lane=0),
                ModelRun(name="dense", config="tiny/dense", train_steps=20,
                         extra_flags=_SMOKE_DIMS, lane=1)),
        baseline=None,
        batch_tokens=512,
        sequence_length=32,
        eval_max_sentences=8,
        beam_size=2,
    ),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Stage:
  """One resumable step of the job: a tool and its arguments.

  ``lane``: the :attr:`ModelRun.lane` of the model a train/eval stage
  belongs to (None: the stage runs alone).
  """

  name: str
  description: str
  tool: str
  args: tuple[str, ...]
  lane: int | None = None

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
    if recipe.ood_test:
      args.append("--ood_packages=packaged")
      description += " (out-of-domain packages held out as test_ood)"
  else:
    args += ["--norecipe", f"--sources={run_dir / 'fixture_catalogs'}",
             "--split_keys=", "--dev_groups=10", "--test_groups=10"]
    description = "build a corpus from generated fixture catalogs"
  return Stage(name="corpus", description=description, tool="build_corpus",
               args=tuple(args))


def plan(recipe: Recipe, *, run_dir: pathlib.Path,
         cache_dir: pathlib.Path) -> list[Stage]:
  """The ordered stages of ``recipe`` writing under ``run_dir``."""
  corpus = run_dir / "corpus"
  vocab = run_dir / "vocab"
  langs = _languages_flag(recipe)
  stages = [
      _corpus_stage(recipe, run_dir, cache_dir),
      Stage(name="vocab", description="train SentencePiece vocabularies",
            tool="vocab",
            args=(f"--corpus_dir={corpus}", f"--output_dir={vocab}", *langs,
                  f"--source_vocab_size={recipe.source_vocab_size}",
                  f"--target_vocab_size={recipe.target_vocab_size}",
                  *recipe.vocab_flags)),
  ]
  eval_jsons, baseline_jsons = [], []
  ood_jsons, ood_baseline_jsons = [], []
  # Continuations train after the baselines: the baselines complete the
  # comparison at the first budget before any run is extended.
  fresh = tuple(m for m in recipe.models if not m.continue_from)
  continued = tuple(m for m in recipe.models if m.continue_from)
  sources = {m.name: m for m in recipe.models}
  for model in fresh + recipe.baselines() + continued:
    model_langs = ([f"--languages={','.join(model.languages)}"]
                   if model.languages else langs)
    # A continued run copies its source model's run of the same seed (the
    # Recipe checks that both have the same seeds).
    source_run = ({seed: run for run, seed in
                   sources[model.continue_from].runs()}
                  if model.continue_from else {})
    for run, seed in model.runs():
      model_dir = run_dir / "models" / run
      seed_note = "" if seed is None else f", seed {seed}"
      continuation = []
      if model.continue_from:
        seed_note += f", continuing {source_run[seed]}"
        source_dir = run_dir / "models" / source_run[seed]
        continuation = [f"--continue_from={source_dir}"]
      stages.append(Stage(
          name=f"train_{run}",
          description=f"train {run} ({model.config}, "
                      f"{model.train_steps} steps{seed_note})",
          tool="train", lane=model.lane,
          args=(f"--config={model.config}", f"--corpus_dir={corpus}",
                f"--vocab_dir={vocab}", f"--model_dir={model_dir}",
                *model_langs,
                f"--train_steps={model.train_steps}",
                f"--batch_tokens={recipe.batch_tokens}",
                f"--sequence_length={recipe.sequence_length}",
                f"--checkpoint_every={max(1, model.train_steps // 5)}",
                f"--eval_every={model.eval_every or max(1, model.train_steps // 5)}",
                f"--log_every={max(1, model.train_steps // 30)}",
                *([f"--early_stopping_patience={model.early_stopping_patience}"]
                  if model.early_stopping_patience else []),
                *([f"--seed={seed}"] if seed is not None else []),
                *([f"--max_train_seconds={model.max_train_seconds:g}"]
                  if model.max_train_seconds else []),
                *continuation,
                *model.extra_flags)))
      splits = [("test", "eval", eval_jsons, baseline_jsons,
                 recipe.eval_max_sentences)]
      if recipe.ood_test:
        splits.append(("test_ood", "eval_ood", ood_jsons,
                       ood_baseline_jsons, recipe.ood_eval_max_sentences))
      for split, out, jsons, bjsons, max_sentences in splits:
        eval_json = run_dir / out / f"{run}.json"
        (bjsons if model.bilingual else jsons).append(eval_json)
        stages.append(Stage(
            name=f"{out}_{run}",
            description=f"decode the {split} split with {run} and score it",
            tool="eval", lane=model.lane,
            args=(f"--model_dir={model_dir}", f"--vocab_dir={vocab}",
                  f"--corpus_dir={corpus}", f"--output={eval_json}",
                  *model_langs, f"--model_name={model.name}",
                  f"--kind={'bilingual' if model.bilingual else 'multilingual'}",
                  *([f"--split={split}"] if split != "test" else []),
                  f"--max_sentences={max_sentences}",
                  f"--beam_size={recipe.beam_size}",
                  # The weights of the best dev evaluation: an early-stopped
                  # run is scored where dev was best, not `patience`
                  # evaluations later (results/demo/stopping/README.md).
                  "--checkpoint=best",
                  f"--hypotheses_dir={run_dir / out / run}")))
  # Seeds of one model share its name: the report reads the first seed's
  # training log (as it shows the first seed's examples).
  logs = ",".join(
      f"{m.name}={run_dir / 'models' / m.runs()[0][0] / 'metrics.jsonl'}"
      for m in recipe.models)
  reports = [("report", "test", eval_jsons, baseline_jsons,
              "write the BLEU report")]
  if recipe.ood_test:
    reports.append(("report_ood", "test_ood", ood_jsons, ood_baseline_jsons,
                    "write the BLEU report of the out-of-domain test"))
  for name, split, jsons, bjsons, description in reports:
    baselines = ([f"--baselines={','.join(str(p) for p in bjsons)}"]
                 if bjsons else [])
    title = f"m4moe {recipe.name}: {recipe.description}"
    if split != "test":
      title += f" ({split}: out-of-domain test)"
    stages.append(Stage(
        name=name, description=description, tool="report",
        args=(f"--models={','.join(str(p) for p in jsons)}", *baselines,
              f"--output_dir={run_dir / name}", f"--corpus_dir={corpus}",
              f"--training_logs={logs}", f"--title={title}",
              *recipe.report_flags)))
  return stages


def parallel_blocks(stages: Sequence[Stage]) -> list[list[list[Stage]]]:
  """Groups the ordered stages into blocks that run one after the other.

  A maximal run of consecutive stages that have a lane is one block: a list
  of lanes (ascending lane number), each the block's stages of that lane in
  their original order; the lanes of a block run concurrently. A stage
  without a lane is a block of one lane holding just it. Since a model's
  eval stage follows its train stage in the same lane, and the report has
  no lane, every stage still runs after the stages whose outputs it reads.
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


def lane_environment(cpus: Sequence[int]) -> dict[str, str]:
  """This process's environment with TF's thread pool sized to ``cpus``."""
  threads = str(len(cpus))
  return {**os.environ, "TF_NUM_INTRAOP_THREADS": threads,
          "OMP_NUM_THREADS": threads}


# Linux prctl(2) option: the signal the calling process gets when its parent
# dies.
_PR_SET_PDEATHSIG = 1
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclasses.dataclass(frozen=True)
class StageExit:
  """How a stage's process ended.

  Attributes:
    returncode: its exit code (negative: killed by that signal).
    interrupted_by: the signal this job received and forwarded to it while
      it ran (None: none); the job must stop after such a stage.
  """
  returncode: int
  interrupted_by: int | None


def _die_with_parent(*, cpus: Sequence[int] = ()
                     ) -> Callable[[], None] | None:
  """A ``preexec_fn`` giving the child SIGTERM when this process dies.

  With ``cpus``, the child is also pinned to those cores.

  libc is loaded here, in the parent: loading libraries between fork and
  exec is unsafe. The child also checks that its parent is still the one
  that forked it, since a parent killed before ``prctl`` ran would never
  signal it. None off Linux (no PR_SET_PDEATHSIG there).
  """
  if not sys.platform.startswith("linux"):
    return None
  libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6",
                     use_errno=True)
  parent = os.getpid()

  def preexec() -> None:
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
      os.write(2, b"m4moe-run: prctl(PR_SET_PDEATHSIG) failed\n")
      os._exit(125)  # pylint: disable=protected-access
    if os.getppid() != parent:
      os.kill(os.getpid(), signal.SIGTERM)
    if cpus:
      os.sched_setaffinity(0, cpus)

  return preexec


class StageProcesses:
  """Runs stage commands as children without ever leaving an orphan.

  Used as a context manager: while it is open, SIGTERM, SIGINT and SIGHUP
  received by this process are forwarded to every running child (the same
  signal) instead of ending this process; the caller waits for the children
  and must then stop (:attr:`interrupted_by`). Each child runs in its own
  process group, so a terminal's Ctrl-C reaches it once, through this
  process, not twice. On Linux each child is also set up to receive SIGTERM
  when this process dies, so ``kill -9`` of this process does not orphan it
  (``m4moe-train`` saves a checkpoint and exits on SIGTERM). Signal
  forwarding needs the main thread; elsewhere only the parent-death signal
  applies.
  """

  def __init__(self) -> None:
    self._running: list[subprocess.Popen] = []
    self._received: list[int] = []
    self._previous: dict[int, Any] = {}

  @property
  def interrupted_by(self) -> int | None:
    """The first signal received and forwarded (None: none)."""
    return self._received[0] if self._received else None

  def _forward(self, signum, frame) -> None:  # pylint: disable=unused-argument
    self._received.append(signum)
    for child in self._running:
      if child.poll() is None:
        child.send_signal(signum)

  def __enter__(self) -> "StageProcesses":
    if threading.current_thread() is threading.main_thread():
      for sig in FORWARDED_SIGNALS:
        self._previous[sig] = signal.signal(sig, self._forward)
    return self

  def __exit__(self, *exc_info) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)

  def start(self, command: Sequence[str], *, cpus: Sequence[int] = (),
            env: dict[str, str] | None = None,
            stdout: Any = None) -> subprocess.Popen:
    """Starts ``command``; ``cpus`` pins it to those cores (Linux)."""
    # Its own process group: a terminal's Ctrl-C (sent to the foreground
    # group) reaches only this process, which forwards it once.
    child = subprocess.Popen(
        list(command), process_group=0, env=env, stdout=stdout,
        stderr=subprocess.STDOUT if stdout is not None else None,
        preexec_fn=_die_with_parent(cpus=cpus))
    self._running.append(child)
    if self._received:  # arrived between installing the handlers and the fork
      child.send_signal(self._received[0])
    return child

  def wait_any(self) -> tuple[subprocess.Popen, int]:
    """Waits until one running child exits: (child, its exit code)."""
    while True:
      for child in self._running:
        returncode = child.poll()
        if returncode is not None:
          self._running.remove(child)
          return child, returncode
      if not self._running:
        raise RuntimeError("wait_any() with no running stage")
      try:  # wakes early when the first child exits; polls the others
        self._running[0].wait(timeout=0.2)
      except subprocess.TimeoutExpired:
        pass

  def terminate_all(self) -> None:
    """SIGTERM to every running child (training saves and stops)."""
    for child in self._running:
      if child.poll() is None:
        child.send_signal(signal.SIGTERM)


def run_stage_process(command: Sequence[str]) -> StageExit:
  """Runs ``command`` as a child and waits for it, without leaving orphans.

  See :class:`StageProcesses` for how signals reach the child; the caller
  must stop after a stage that was interrupted
  (:attr:`StageExit.interrupted_by`).
  """
  with StageProcesses() as processes:
    child = processes.start(command)
    while True:
      done, returncode = processes.wait_any()
      if done is child:
        break
  return StageExit(returncode=returncode,
                   interrupted_by=processes.interrupted_by)
