"""Would XLA (jit_compile) speed up the trainer step on CPU, dense vs MoE?

The trainer compiles its gradient and update functions with ``tf.function``
but not with XLA (``m4moe.training.step.StepRunner``). This probe builds the
models of ``m4moe-bench recipe_step`` (study v3's screening shapes) and
re-wraps one of the runner's two functions with ``jit_compile=True`` for the
cases marked ``jit``, then times every case interleaved in one process
(CPU seconds), printing one JSON line per case with its speed relative to
the first case. The ``sorted`` dispatch has dynamic shapes and does not
compile; compile the MoE with ``+--dispatch=index``.

Usage (from the repository, its venv active):
  taskset -c 1 python3 results/benchmarks/step_jit_probe.py --compile=grads \\
      dense:nojit dense:jit moe_E32_every+--dispatch=index:jit \\
      moe_E32_every:nojit
  taskset -c 1 python3 results/benchmarks/step_jit_probe.py --compile=apply \\
      dense:nojit dense:jit moe_E64k8_every:nojit moe_E64k8_every:jit
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import tensorflow as tf

from m4moe.benchmarks import timing
from m4moe.benchmarks import train_step
from m4moe.pipeline import recipes
from m4moe.training import step as step_lib


def _compiling_runner(function: str, jit: dict[str, bool]) -> None:
  """Makes every StepRunner built while ``jit["on"]`` compile ``function``
  (``grads``: the forward and backward pass; ``apply``: the update)."""
  original = step_lib.StepRunner.__init__

  def init(self, **kwargs):
    original(self, **kwargs)
    if jit["on"]:
      setattr(self, f"_{function}_fn", tf.function(
          getattr(self, f"_{function}"), jit_compile=True))
  step_lib.StepRunner.__init__ = init


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--compile", choices=("grads", "apply"),
                      default="grads")
  parser.add_argument("--recipe", default="study3_screen")
  parser.add_argument("--reps", type=int, default=3)
  parser.add_argument("cases", nargs="+", help="MODEL_SPEC:jit|nojit")
  args = parser.parse_args()
  jit = {"on": False}
  _compiling_runner(args.compile, jit)
  recipe = recipes.load_recipe(args.recipe)
  cases = {}
  for case in args.cases:
    spec, _, mode = case.rpartition(":")
    jit["on"] = mode == "jit"
    _, built = train_step.recipe_cases(recipe, [spec])
    start = time.time()
    built[spec]()
    print(f"{case}: first call {time.time() - start:.1f} s", file=sys.stderr)
    cases[case] = built[spec]
  times = timing.interleaved(cases, reps=args.reps, warmup=1, clock="cpu")
  first = args.cases[0]
  for case in args.cases:
    print(json.dumps({"case": case, "compile": args.compile,
                      "median_sec": round(times.median(case), 4),
                      "speed_vs_first": round(times.ratio(first, case), 3),
                      "seconds": [round(s, 3) for s in times.seconds[case]],
                      **timing.machine()}))


if __name__ == "__main__":
  main()
