"""Adafactor's update: one XLA computation per variable vs op by op.

``m4moe.training.optimizer.Adafactor`` compiles each one-device variable's
update with XLA where that is faster (``_compiling_pays``). This probe
times ``apply_gradients`` inside a ``tf.function`` with
``compile_updates=True`` and ``False`` for four optimiser configs, on
variables of the study v3 MoE candidates' sizes (four ``[128, 128, 256]``
expert weights, a ``[8000, 128]`` embedding, a dense FFN pair and 20
vectors), interleaved in one process, CPU seconds; it prints one JSON line
per config with the two medians and their ratio. It also prints the largest
difference between the two paths' variables after the timed updates
(float rounding only).

Usage (from the repository, its venv active; ``--ungated`` compiles every
config, also those the optimiser keeps op by op):
  taskset -c 1 python3 results/benchmarks/adafactor_update_probe.py --reps=5
  taskset -c 1 python3 results/benchmarks/adafactor_update_probe.py --reps=5 \\
      --ungated
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import tensorflow as tf

from m4moe.benchmarks import timing
from m4moe.training import optimizer as optimizer_lib

SHAPES = ([(128, 128, 256)] * 4 + [(8000, 128), (128, 512), (512, 128)] +
          [(128,)] * 20)
CONFIGS = {
    "paper": optimizer_lib.AdafactorConfig(),
    "small_model_recipe": optimizer_lib.AdafactorConfig(
        learning_rate=0.031623, warmup_steps=1000, beta1=0.9,
        multiply_by_parameter_scale=False, factored=False,
        clipping_threshold=0.0),
    "factored_only": optimizer_lib.AdafactorConfig(
        clipping_threshold=0.0, multiply_by_parameter_scale=False),
    "unfactored_clip_scale": optimizer_lib.AdafactorConfig(factored=False),
}


def _case(config: optimizer_lib.AdafactorConfig, *, compiled: bool,
          grads: list[tf.Tensor]):
  variables = [tf.Variable(tf.random.stateless_normal(s, seed=[i, 0]))
               for i, s in enumerate(SHAPES)]
  optimizer = optimizer_lib.Adafactor(config, compile_updates=compiled)
  optimizer.build(variables)
  apply = tf.function(lambda g: optimizer.apply_gradients(g, variables))
  return (lambda: apply(grads).numpy()), variables


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--ungated", action="store_true",
                      help="compile every config's update, also those "
                      "_compiling_pays keeps op by op")
  args = parser.parse_args()
  if args.ungated:
    optimizer_lib._compiling_pays = lambda config: True  # pylint: disable=protected-access
  grads = [tf.random.stateless_normal(s, seed=[i, 1]) * 1e-3
           for i, s in enumerate(SHAPES)]
  cases, variables = {}, {}
  for name, config in CONFIGS.items():
    for compiled in (True, False):
      key = f"{name}:{'xla' if compiled else 'ops'}"
      cases[key], variables[key] = _case(config, compiled=compiled,
                                         grads=grads)
  times = timing.interleaved(cases, reps=args.reps, warmup=2, clock="cpu")
  for name in CONFIGS:
    xla, ops = f"{name}:xla", f"{name}:ops"
    diff = max(float(np.max(np.abs(a.numpy() - b.numpy())))
               for a, b in zip(variables[xla], variables[ops]))
    print(json.dumps({
        "config": name, "xla_median_sec": round(times.median(xla), 4),
        "ops_median_sec": round(times.median(ops), 4),
        "xla_speedup": round(times.median(ops) / times.median(xla), 3),
        "max_abs_diff": diff, "ungated": args.ungated, **timing.machine()}))


if __name__ == "__main__":
  main()
