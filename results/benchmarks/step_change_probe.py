"""Each change of the second MoE step-overhead round, undone one at a time.

Builds study v3 screening models as ``m4moe-bench recipe_step`` does (the
trainer's ``StepRunner.train_step``, the zoo's optimiser recipe, packed
batches of the recipe's shape) and, for each MoE model, one case per change
with that change undone while the step is traced (``mock.patch``): the
Adafactor update op by op instead of compiled, the combine's weighted sums
as a product and a reduction instead of batched matmuls, and the
elementwise finiteness check of every gradient. All cases run interleaved
in one process (CPU seconds); one JSON line per case with its speed
relative to the same model with every change (< 1: the change helps).
``--undo_all`` adds, for every model (dense included), a case with all the
changes undone at once and prints each MoE model's ``speed_vs_dense``
before (all undone, against the dense model with all undone) and after:
a before/after in one process, immune to the load differences between
processes.

Usage (from the repository, its venv active):
  taskset -c 1 python3 results/benchmarks/step_change_probe.py --reps=5 \\
      dense moe_E64k8_every moe_E128_every_lr4x
  taskset -c 1 python3 results/benchmarks/step_change_probe.py --reps=5 \\
      --undo_all --noeach dense moe_E64k8_every moe_E32_every_lr4x \\
      moe_E128_every_lr4x
"""

from __future__ import annotations

import argparse
import contextlib
import json
from unittest import mock

import tensorflow as tf

from m4moe.benchmarks import timing
from m4moe.benchmarks import train_step
from m4moe.moe import dispatch as dispatch_lib
from m4moe.pipeline import recipes
from m4moe.training import optimizer as optimizer_lib
from m4moe.training import step as step_lib


def _old_combine():
  """The combine before: a product and a reduction over [N, K, M]."""
  @tf.custom_gradient
  def gather_combine(expert_rows, weights, token_slots, slot_rows,
                     slot_weights):
    picked = tf.gather(expert_rows, token_slots)
    combined = tf.reduce_sum(picked * tf.expand_dims(weights, -1), axis=1)
    def grad(d_combined):
      d_weights = tf.reduce_sum(picked * tf.expand_dims(d_combined, 1),
                                axis=-1)
      d_rows = (tf.gather(d_combined, slot_rows) *
                tf.expand_dims(slot_weights, -1))
      return d_rows, d_weights, None, None, None
    return combined, grad
  return gather_combine


def _old_finite_and_norm(grads):
  return (tf.stack([tf.reduce_all(tf.math.is_finite(g)) for g in grads]),
          tf.linalg.global_norm(grads))


UNDO = {
    "ops_update": (optimizer_lib, "_compiling_pays", lambda config: False),
    "old_combine": (dispatch_lib, "_permuted_combine", _old_combine()),
    "old_finite": (step_lib, "finite_and_global_norm", _old_finite_and_norm),
}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--recipe", default="study3_screen")
  parser.add_argument("--undo_all", action="store_true")
  parser.add_argument("--noeach", dest="each", action="store_false",
                      help="skip the one-change-undone cases")
  parser.add_argument("models", nargs="+")
  args = parser.parse_args()
  recipe = recipes.load_recipe(args.recipe)
  cases = {}
  for model in args.models:
    _, built = train_step.recipe_cases(recipe, [model])
    cases[model] = built[model]
    cases[model]()  # traced with every change
    undo = dict(UNDO) if args.each and not model.startswith("dense") else {}
    if args.undo_all:
      undo["all_undone"] = None
    for name, patch in undo.items():
      _, built = train_step.recipe_cases(recipe, [model])
      patches = list(UNDO.values()) if patch is None else [patch]
      with contextlib.ExitStack() as stack:
        for module, attribute, old in patches:
          stack.enter_context(mock.patch.object(module, attribute, old))
        built[model]()  # traced with the change(s) undone
      cases[f"{model}:{name}"] = built[model]
  times = timing.interleaved(cases, reps=args.reps, warmup=1, clock="cpu")
  for case in cases:
    model = case.split(":")[0]
    print(json.dumps({"case": case, "median_sec": round(times.median(case), 4),
                      "speed_vs_all_changes": round(
                          times.ratio(model, case), 4),
                      "seconds": [round(s, 4) for s in times.seconds[case]],
                      **timing.machine()}))
  dense = args.models[0]
  if args.undo_all and dense.startswith("dense"):
    for model in args.models[1:]:
      print(json.dumps({
          "model": model, "speed_vs_dense_before": round(times.ratio(
              f"{dense}:all_undone", f"{model}:all_undone"), 4),
          "speed_vs_dense_after": round(times.ratio(dense, model), 4)}))


if __name__ == "__main__":
  main()
