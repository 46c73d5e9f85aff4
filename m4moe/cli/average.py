r"""m4moe-average: average the weights of a run's last checkpoints.

Example (train keeping the last 5 checkpoints 100 steps apart, average them,
evaluate the average):

  m4moe-train --config=tiny/dense --model_dir=runs/pt --train_steps=3000 \
      --checkpoint_every=100 --keep_checkpoints=5 ...
  m4moe-average --model_dir=runs/pt --last=5
  m4moe-eval --model_dir=runs/pt --checkpoint=averaged ...

Writes the element-wise mean of the model weights of the chosen
``ckpt-<step>`` checkpoints to ``<model_dir>/averaged/`` (model weights
only, named by the newest step, with ``averaged.json`` listing the steps),
replacing an earlier average; the run's checkpoints are only read
(m4moe.training.averaging). Prints the averaged checkpoint and its steps.

Averaging pays once the weights change little between checkpoints: on the
tiny models' 1000- and 2400-step runs the mean of the last 2 scored the
same as the last checkpoint and the mean of the last 5 about 2 BLEU less
(results/peer/README.md, the recipe ablation).
"""

from __future__ import annotations

import sys

from absl import app
from absl import flags

from m4moe import cli
from m4moe.training import rundir
from m4moe.training import averaging

_MODEL_DIR = flags.DEFINE_string(
    "model_dir", None, "Run directory written by m4moe-train.")
_LAST = flags.DEFINE_integer(
    "last", 5, "Average the newest N checkpoints (N >= 2; the run must keep "
    "them: m4moe-train --keep_checkpoints).")
_STEPS = flags.DEFINE_list(
    "steps", [], "Average exactly these checkpoint steps instead of --last "
    "(e.g. 2600,2800,3000).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    steps = [int(s) for s in _STEPS.value]
  except ValueError as e:
    raise app.UsageError(f"--steps={','.join(_STEPS.value)}: give integer "
                         "checkpoint steps, e.g. --steps=2600,2800") from e
  try:
    result = averaging.average_checkpoints(
        model_dir=_MODEL_DIR.value, last=_LAST.value, steps=steps)
  except (averaging.AveragingError, rundir.RunDirError, OSError) as e:
    sys.exit(f"m4moe-average: error: {e}")
  print(f"{result.path}: mean of {len(result.steps)} checkpoints (steps "
        f"{', '.join(map(str, result.steps))})")


def run():
  flags.mark_flag_as_required("model_dir")
  cli.run_tool(main, module=__name__)


if __name__ == "__main__":
  run()
