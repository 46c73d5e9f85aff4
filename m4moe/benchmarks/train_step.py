"""Tokens/s of the real trainer's step: tiny/moe vs tiny/dense, or a recipe.

Both models are built like ``m4moe.training.loop`` builds them (Adafactor, the
default tf.distribute strategy) and stepped with
:class:`m4moe.training.step.StepRunner`'s ``train_step`` -- the trainer's own
compiled gradient and update functions, host syncs included. The batch is
synthetic: B rows of L random source and target tokens (no padding), so
tokens per step = 2*B*L.

:func:`run_recipe` (``m4moe-bench recipe_step``) times the models of a
training recipe (:mod:`m4moe.pipeline.recipes`) as ``m4moe-run`` trains
them: each model's zoo config with its ``extra_flags`` (dropout included),
the zoo's optimiser recipe, the recipe's vocabulary sizes, and packed
batches of the recipe's shape (``batch_tokens / sequence_length`` rows of
``sequence_length`` tokens, several segments per row and some trailing
padding, as the packer makes them). The first model is the reference of the
ratios (``speed_vs_<name>``: its median seconds over the model's), so a MoE
candidate's overhead over the dense model is measured at the screening's
shapes, interleaved in one process.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import tensorflow as tf

from m4moe import config as config_lib
from m4moe.training import optimizer as optimizer_lib
from m4moe.benchmarks import timing
from m4moe.training import step as step_lib

if TYPE_CHECKING:
  from m4moe.pipeline import recipes


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepPoint:
  """Batch shape and vocabulary of the synthetic training batch."""
  batch_size: int = 64
  length: int = 32
  vocab_size: int = 8000

  @property
  def tokens(self) -> int:
    return 2 * self.batch_size * self.length


def synthetic_batch(point: StepPoint) -> dict[str, tf.Tensor]:
  """``inputs``/``targets`` <int32>[B, L] of ids in [3, V)."""
  rng = np.random.default_rng(0)
  shape = (point.batch_size, point.length)
  return {k: tf.constant(rng.integers(3, point.vocab_size, size=shape),
                         tf.int32) for k in ("inputs", "targets")}


def step_case(config_name: str, *, vocab_size: int,
              batch: Mapping[str, tf.Tensor],
              extra_flags: Sequence[str] = (),
              source_vocab_size: int | None = None,
              zoo_optimizer: bool = False) -> Callable[[], Any]:
  """One trainer step of zoo config ``config_name`` on ``batch``.

  Args:
    config_name: zoo entry or flagfile.
    vocab_size: target vocabulary (and source, unless given).
    batch: the model batch every call steps on.
    extra_flags: model flags on top of the config (as ``m4moe-train``'s).
    source_vocab_size: source vocabulary; None: ``vocab_size``.
    zoo_optimizer: the optimiser recipe of the zoo entry (what m4moe-train
      uses) instead of the paper's Adafactor defaults.
  """
  from m4moe.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.load_model_config(
      config_name, extra_flags, src_vocab_size=source_vocab_size or vocab_size,
      tgt_vocab_size=vocab_size)
  strategy = tf.distribute.get_strategy()
  tf.random.set_seed(0)
  model = model_lib.Transformer(config=config)
  variables = list(model.trainable_variables)
  optimizer_config = (config_lib.load_optimizer_config(config_name,
                                                       extra_flags)
                      if zoo_optimizer else optimizer_lib.AdafactorConfig())
  optimizer = optimizer_lib.Adafactor(optimizer_config)
  optimizer.build(variables)
  runner = step_lib.StepRunner(model=model, optimizer=optimizer,
                               variables=variables, strategy=strategy,
                               label_smoothing=0.1)
  counter = iter(range(1 << 30))
  def call():
    seed = tf.constant([0, next(counter)], tf.int32)
    return runner.train_step([batch], seed=seed)
  return call


def step_with_and_without(config_name: str, *, point: StepPoint,
                          module: Any, attribute: str, replacement: Any
                          ) -> tuple[Callable[[], Any], Callable[[], Any]]:
  """Two trainer steps of ``config_name`` on one synthetic batch, traced.

  The first is traced with the code as it is; the second with
  ``module.attribute`` replaced by ``replacement`` while it is traced (a
  baseline formulation of a function the step calls), so an A/B of the two
  runs interleaved in one process. A ``tf.function`` runs the Python of
  its body once, when it is traced, and keeps the graph that call built:
  the replaced step keeps calling the baseline after the module attribute
  is put back, and the model code needs no switch for it.

  Returns:
    (current, replaced) zero-argument step calls, both already traced.

  Raises:
    AttributeError: ``module`` has no ``attribute``.
  """
  original = getattr(module, attribute)
  batch = synthetic_batch(point)
  current = step_case(config_name, vocab_size=point.vocab_size, batch=batch)
  current()
  replaced = step_case(config_name, vocab_size=point.vocab_size, batch=batch)
  setattr(module, attribute, replacement)
  try:
    replaced()
  finally:
    setattr(module, attribute, original)
  return current, replaced


def run(point: StepPoint, *, configs: tuple[str, str] = ("tiny/moe",
        "tiny/dense"), reps: int = 5,
        warmup: int = 2) -> Iterator[dict[str, Any]]:
  """Interleaved steps of ``configs``; yields one record per config.

  The first config's record has ``tokens_per_sec_vs_<second>``: how close
  the MoE step comes to the dense one of the same active FLOPs.
  """
  batch = synthetic_batch(point)
  cases = {name: step_case(name, vocab_size=point.vocab_size, batch=batch)
           for name in configs}
  times = timing.interleaved(cases, reps=reps, warmup=warmup)
  base = {"benchmark": "train_step", **dataclasses.asdict(point),
          "tokens_per_step": point.tokens, "reps": reps, **timing.machine()}
  for name in configs:
    record = {**base, "config": name, "median_sec": times.median(name),
              "tokens_per_sec": point.tokens / times.median(name),
              "seconds": times.seconds[name]}
    if name == configs[0]:
      record[f"tokens_per_sec_vs_{configs[1]}"] = times.ratio(configs[1], name)
    yield record


def packed_batch(*, rows: int, length: int, source_vocab_size: int,
                 target_vocab_size: int, seed: int = 0
                 ) -> dict[str, tf.Tensor]:
  """A synthetic packed batch: every key of a packed training batch.

  Each row holds segments of 4 to 24 tokens until the next one would not
  fit, then padding (the packer's layout: segment ids 1, 2, ... and
  positions restarting at 0 per segment, 0 at padding), so attention masks
  and the MoE layers' padding compaction do the trainer's work.

  Returns:
    {inputs, targets, *_segment_ids, *_positions}: <int32>[rows, length];
    ids in [3, V) of each side's vocabulary.
  """
  rng = np.random.default_rng(seed)
  batch = {}
  for side, vocab in (("inputs", source_vocab_size),
                      ("targets", target_vocab_size)):
    segment_ids = np.zeros((rows, length), np.int32)
    positions = np.zeros((rows, length), np.int32)
    for row in range(rows):
      start, segment = 0, 1
      while True:
        n = int(rng.integers(4, 25))
        if start + n > length:
          break
        segment_ids[row, start:start + n] = segment
        positions[row, start:start + n] = np.arange(n)
        start, segment = start + n, segment + 1
    ids = np.where(segment_ids > 0, rng.integers(3, vocab, (rows, length)), 0)
    batch[side] = tf.constant(ids, tf.int32)
    batch[f"{side}_segment_ids"] = tf.constant(segment_ids)
    batch[f"{side}_positions"] = tf.constant(positions)
  return batch


# m4moe-train flags a recipe model may carry that say when training stops
# and nothing about a step (a recipe that selects at equal CPU time gives
# every model --max_train_cpu_seconds).
BUDGET_FLAGS = ("max_train_seconds", "max_train_cpu_seconds")


def recipe_models(recipe: recipes.Recipe, specs: Sequence[str]
                  ) -> dict[str, tuple[str, tuple[str, ...]]]:
  """``{spec: (config, extra flags)}`` of recipe models named by ``specs``.

  A spec is a model name, optionally followed by further flags joined with
  ``+`` (``moe_E32_every+--dispatch=index``): the same model with those
  flags after its own, for an A/B of one option in one process. The
  model's budget flags (:data:`BUDGET_FLAGS`: when training stops, not
  what a step does) are left out of the step's flags.

  Raises:
    ValueError: a spec names no model of the recipe.
  """
  by_name = {model.name: model for model in recipe.models}
  out = {}
  for spec in specs:
    name, *flags = spec.split("+")
    if name not in by_name:
      raise ValueError(f"--recipe_models: {recipe.name} has no model {name!r};"
                       f" use any of {','.join(by_name)}")
    model = by_name[name]
    own = tuple(flag for flag in model.extra_flags
                if flag.split("=", 1)[0].lstrip("-") not in BUDGET_FLAGS)
    out[spec] = (model.config, own + tuple(flags))
  return out


def recipe_cases(recipe: recipes.Recipe, specs: Sequence[str]
                 ) -> tuple[StepPoint, dict[str, Callable[[], Any]]]:
  """The point (batch shape) and one trainer-step call per model spec.

  Every model steps on the same packed batch of the recipe's shape with the
  recipe's vocabulary sizes (:func:`recipe_models` reads the specs).
  """
  point = StepPoint(batch_size=recipe.batch_tokens // recipe.sequence_length,
                    length=recipe.sequence_length,
                    vocab_size=recipe.target_vocab_size)
  batch = packed_batch(rows=point.batch_size, length=point.length,
                       source_vocab_size=recipe.source_vocab_size,
                       target_vocab_size=recipe.target_vocab_size)
  cases = {
      spec: step_case(config, vocab_size=recipe.target_vocab_size,
                      source_vocab_size=recipe.source_vocab_size, batch=batch,
                      extra_flags=flags, zoo_optimizer=True)
      for spec, (config, flags) in recipe_models(recipe, specs).items()}
  return point, cases


def run_recipe(recipe: recipes.Recipe, *, specs: Sequence[str],
               reps: int = 5, warmup: int = 2,
               clock: str = "wall") -> Iterator[dict[str, Any]]:
  """Interleaved trainer steps of a recipe's models; one record per spec.

  Every record after the first has ``speed_vs_<first spec>``: the first
  model's median seconds over its own (< 1: slower than the reference).
  """
  point, cases = recipe_cases(recipe, specs)
  times = timing.interleaved(cases, reps=reps, warmup=warmup, clock=clock)
  models = recipe_models(recipe, specs)
  base = {"benchmark": "recipe_step", "recipe": recipe.name,
          "batch_size": point.batch_size, "sequence_length": point.length,
          "source_vocab_size": recipe.source_vocab_size,
          "target_vocab_size": recipe.target_vocab_size, "clock": clock,
          "reps": reps, **timing.machine()}
  reference = specs[0]
  for spec in specs:
    record = {**base, "model": spec, "config": models[spec][0],
              "extra_flags": list(models[spec][1]),
              "median_sec": times.median(spec), "seconds": times.seconds[spec]}
    if spec != reference:
      record[f"speed_vs_{reference}"] = times.ratio(reference, spec)
    yield record
