"""Each change of the sparse-step round, undone one at a time, in one process.

Its output is quoted in sparse-step-cost.md, beside this file.

Builds study v3 screening models as ``m4moe-bench recipe_step`` does (the
trainer's step, the zoo's optimiser recipe, packed batches of the recipe's
shape) and, per model, one case per change with that change undone while
the step is traced (``mock.patch``):

* ``fused_loss``: the training loss op by op instead of two XLA
  computations (applies to the dense model too);
* ``grouping``: the MoE layer's groups by a sort and plain gathers (whose
  gradients are segment sums) instead of permutation gathers;
* ``sort_free_rows``: the sorted dispatch's rows by a stable sort of all
  T choices instead of the occupied-slot count;
* ``bf16_static``: bfloat16 activations on the sorted rows instead of the
  static capacity buffers (bfloat16 models only).

``all_undone`` undoes every change at once, so each MoE model's
``speed_vs_dense`` before (all undone, against the dense model with all
undone) and after is a before/after in one process, immune to the load
differences between processes. All cases run interleaved (CPU seconds);
one JSON line per case with its speed relative to the same model with
every change (< 1: the change helps).

Usage (from the repository, its venv active):
  taskset -c 1 python3 results/benchmarks/sparse_step_probe.py --reps=5 \\
      dense moe_E64k8_every dense+--activation_dtype=bfloat16 \\
      moe_E64k8_every+--activation_dtype=bfloat16
"""

from __future__ import annotations

import argparse
import contextlib
import json
from unittest import mock

import tensorflow as tf

from m4moe.benchmarks import timing
from m4moe.benchmarks import train_step
from m4moe.model import losses
from m4moe.moe import dispatch
from m4moe.moe import grouping
from m4moe.pipeline import recipes


def _op_losses(logits, targets, *, label_smoothing=0.0, fused=False):
  del fused
  return _PER_TOKEN_LOSSES(logits, targets, label_smoothing=label_smoothing,
                           fused=False)


def _sorted_group(tokens, mask, *, group_size):
  """The grouping before: an argsort for the inverse, plain gathers."""
  model_dim = tokens.shape[-1]
  num_tokens = tf.shape(mask)[0]
  num_groups = (num_tokens + group_size - 1) // group_size
  position = grouping.compaction_permutation(mask[tf.newaxis])
  source = grouping.compaction_source(mask[tf.newaxis], position,
                                      one_device=False)[0]
  slot = tf.range(num_groups * group_size)
  source = tf.gather(source, tf.minimum(slot, num_tokens - 1))
  valid = tf.cast(slot < num_tokens, tf.float32)
  grouped = tf.gather(tokens, source)
  grouped_mask = tf.gather(mask, source) * valid
  return (tf.reshape(grouped, [-1, group_size, model_dim]),
          tf.reshape(grouped_mask, [-1, group_size]), position, source)


def _plain_ungroup(combined, position, source):
  del source
  return tf.gather(tf.reshape(combined, [-1, combined.shape[-1]]),
                   position[0])


def _sorted_rows(slots, *, num_slots, num_experts):
  """Each choice's row by a stable sort of all T choices by expert."""
  expert = tf.where(slots < num_slots,
                    slots // (num_slots // num_experts), num_experts)
  order = tf.argsort(expert, stable=True)
  counts = tf.math.bincount(expert, minlength=num_experts + 1,
                            maxlength=num_experts + 1, dtype=tf.int32)
  return tf.math.invert_permutation(tf.cast(order, tf.int32)), counts


def _float32_resolution(**kwargs):
  kwargs["activation_dtype"] = "float32"
  return _RESOLVE(**kwargs)


_PER_TOKEN_LOSSES = losses.per_token_losses
_RESOLVE = dispatch.resolve_dispatch
UNDO = {
    "fused_loss": [(losses, "per_token_losses", _op_losses)],
    "grouping": [(grouping, "group_one_device", _sorted_group),
                 (grouping, "ungroup_one_device", _plain_ungroup)],
    "sort_free_rows": [(dispatch, "_slot_order_rows", _sorted_rows)],
    "bf16_static": [(dispatch, "resolve_dispatch", _float32_resolution)],
}


def _applies(model: str, change: str) -> bool:
  if change == "fused_loss":
    return True
  if model.startswith("dense"):
    return False
  return change != "bf16_static" or "bfloat16" in model


def _traced(recipe, model, patches):
  _, built = train_step.recipe_cases(recipe, [model])
  with contextlib.ExitStack() as stack:
    for module, attribute, old in patches:
      stack.enter_context(mock.patch.object(module, attribute, old))
    built[model]()  # traced with the patches
  return built[model]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--recipe", default="study3_screen")
  parser.add_argument("models", nargs="+")
  args = parser.parse_args()
  recipe = recipes.load_recipe(args.recipe)
  cases = {}
  for model in args.models:
    cases[model] = _traced(recipe, model, [])
    changes = [c for c in UNDO if _applies(model, c)]
    for change in changes:
      cases[f"{model}:{change}"] = _traced(recipe, model, UNDO[change])
    cases[f"{model}:all_undone"] = _traced(
        recipe, model, [p for c in changes for p in UNDO[c]])
  times = timing.interleaved(cases, reps=args.reps, warmup=1, clock="cpu")
  for case in cases:
    model = case.split(":")[0]
    print(json.dumps({"case": case, "median_sec": round(times.median(case), 4),
                      "speed_vs_all_changes": round(
                          times.ratio(model, case), 4),
                      "seconds": [round(s, 4) for s in times.seconds[case]],
                      **timing.machine()}))
  for model in args.models:
    dense = "dense" + ("+--activation_dtype=bfloat16" if "bfloat16" in model
                       else "")
    if model.startswith("dense") or dense not in cases:
      continue
    print(json.dumps({
        "model": model, "reference": dense,
        "speed_vs_dense_before": round(times.ratio(
            f"{dense}:all_undone", f"{model}:all_undone"), 4),
        "speed_vs_dense_after": round(times.ratio(dense, model), 4)}))

if __name__ == "__main__":
  main()
