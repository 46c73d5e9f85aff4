"""Entry point run by the OpenNMT-tf virtualenv's Python (not ours).

  PEER_PYTHON driver.py train --config=C.json --model_file=M.py \
      --budget_seconds=480 --summary=train.json --steps_log=steps.jsonl
  PEER_PYTHON driver.py infer --config=C.json --model_file=M.py \
      --features=test.pt.pieces --predictions=test.en.pieces \
      --summary=decode.json [--average=5]

``train`` runs OpenNMT-tf's own Runner and Trainer with one change: the
training-step generator is wrapped, to end once ``--budget_seconds`` of
wall-clock have passed since it started (like ``m4moe-train
--max_train_seconds``; the config's ``max_step`` ends it otherwise), and
to time each step and count its non-padding target tokens (the Trainer's
own target word counter) into ``--steps_log``, one JSON interval every
``--report_every`` steps (``throughput.Interval``: step, steps,
target_tokens, step_seconds, learning_rate). The Trainer takes its normal
exit -- final checkpoint -- and the driver then evaluates the dev set once.
The summary JSON has the steps, the loop's seconds, the last learning rate
and the dev loss (cross-entropy per target token, no label smoothing).

``infer`` restores the latest checkpoint (or, with ``--average=N``, the
average of the last N, made first with ``Runner.average_checkpoints``),
then decodes; the summary's seconds are those of decoding only (graph
tracing included, as in our translator; building the model and restoring
or averaging checkpoints excluded, as our translator's time excludes
loading the model).

Only the standard library is imported at module level; ``opennmt`` and
TensorFlow are imported inside the commands. Writes nothing but the model
directory of the config, ``--predictions`` and ``--summary``.
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import re
import sys
import time

_TOKENS_PER_SEC = re.compile(r"tokens/s = (\d+)")

# Run as a script, this file's directory leads sys.path; drop it so that no
# m4moe module beside it can shadow a package of the OpenNMT-tf environment.
_HERE = pathlib.Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != _HERE]


def _write_json(path: str, value: dict) -> None:
  out = pathlib.Path(path)
  tmp = out.with_suffix(out.suffix + ".tmp")
  tmp.write_text(json.dumps(value, indent=1) + "\n", encoding="utf-8")
  tmp.replace(out)


def _runner(args: argparse.Namespace):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from opennmt import config as config_util  # pylint: disable=g-import-not-at-top
  from opennmt import runner as runner_lib  # pylint: disable=g-import-not-at-top
  tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
  tf.get_logger().setLevel(logging.INFO)
  config = config_util.load_config([args.config])
  pathlib.Path(config["model_dir"]).mkdir(parents=True, exist_ok=True)
  model = config_util.load_model(config["model_dir"],
                                 model_file=args.model_file, as_builder=True)
  return runner_lib.Runner(model, config, auto_config=False, seed=args.seed)


class StepLog:
  """Per-step target tokens and seconds, written as one line per interval.

  Standard library only, so that it is tested without OpenNMT-tf.
  """

  def __init__(self, path: str, *, every: int):
    self.path, self.every = pathlib.Path(path), every
    self.path.write_text("", encoding="utf-8")
    self._reset()

  def _reset(self) -> None:
    self.steps, self.tokens, self.seconds = 0, 0, 0.0

  def add(self, *, step: int, target_tokens: int, seconds: float,
          learning_rate: float | None, last: bool = False) -> None:
    """Adds one step; writes the interval every ``every`` steps or at the
    ``last`` one."""
    self.steps += 1
    self.tokens += target_tokens
    self.seconds += seconds
    if step % self.every == 0 or last:
      self.flush(step=step, learning_rate=learning_rate)

  def flush(self, *, step: int, learning_rate: float | None) -> None:
    if not self.steps:
      return
    with open(self.path, "a", encoding="utf-8") as f:
      f.write(json.dumps({"step": step, "steps": self.steps,
                          "target_tokens": self.tokens,
                          "step_seconds": round(self.seconds, 6),
                          "learning_rate": learning_rate}) + "\n")
    self._reset()


def _target_count(trainer) -> int:
  """The Trainer's target word counter (reset at each of its log lines)."""
  stats = getattr(trainer, "_training_stats", None)
  counter = getattr(stats, "_words_counters", {}).get("target")
  return 0 if counter is None else int(counter.numpy())


def _learning_rate(trainer, step: int) -> float:
  rate = trainer._optimizer.learning_rate  # pylint: disable=protected-access
  return float(rate(step) if callable(rate) else rate)


class _ThroughputLog(logging.Handler):
  """Collects the tokens/s of OpenNMT-tf's "Step = N ; ..." lines."""

  def __init__(self):
    super().__init__()
    self.rates: list[int] = []

  def emit(self, record: logging.LogRecord) -> None:
    match = _TOKENS_PER_SEC.search(record.getMessage())
    if match and record.getMessage().startswith("Step ="):
      self.rates.append(int(match.group(1)))


def train(args: argparse.Namespace) -> None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from opennmt import training  # pylint: disable=g-import-not-at-top
  runner = _runner(args)
  clock: dict[str, float] = {}
  steps_of = training.Trainer._steps  # pylint: disable=protected-access

  log = StepLog(args.steps_log, every=args.report_every)

  def budgeted_steps(self, dataset, accum_steps=1):
    clock["start"] = time.monotonic()
    steps, counted = steps_of(self, dataset, accum_steps=accum_steps), 0
    while True:
      began = time.perf_counter()
      try:
        loss = next(steps)
      except StopIteration:
        return
      seconds = time.perf_counter() - began
      # pylint: disable-next=protected-access
      step = int(self._optimizer.iterations.numpy())
      clock["end"] = time.monotonic()
      over = clock["end"] - clock["start"] >= args.budget_seconds
      log.add(step=step, target_tokens=_target_count(self) - counted,
              seconds=seconds, learning_rate=_learning_rate(self, step),
              last=over or step >= args.max_step)
      yield loss
      counted = _target_count(self)  # after the Trainer's own resets
      clock.setdefault("first_step", clock["end"] - clock["start"])
      if over:
        clock["stopped_by"] = 1.0
        return

  training.Trainer._steps = budgeted_steps  # pylint: disable=protected-access
  rates = _ThroughputLog()
  tf.get_logger().addHandler(rates)
  _, summary = runner.train(with_eval=False, return_summary=True)
  seconds = clock.get("end", 0.0) - clock.get("start", 0.0)
  metrics = runner.evaluate()
  steps = int(summary["last_step"])
  kept = rates.rates[1:] or rates.rates
  _write_json(args.summary, {
      "steps": steps, "train_seconds": round(seconds, 1),
      "steps_per_sec": round(steps / max(seconds, 1e-9), 4),
      "tokens_per_sec": round(sum(kept) / max(len(kept), 1), 1),
      "dev_ce": round(float(metrics["loss"]), 4),
      "last_learning_rate": summary.get("last_learning_rate"),
      "stopped_by": "time_budget" if "stopped_by" in clock else "max_step",
      "first_step_seconds": round(clock.get("first_step", 0.0), 1),
      "logged_tokens_per_sec": rates.rates,
  })


def infer(args: argparse.Namespace) -> None:
  # pylint: disable=g-import-not-at-top
  from opennmt import inference
  from opennmt.utils import checkpoint as checkpoint_util
  # pylint: enable=g-import-not-at-top
  runner = _runner(args)
  if args.average:
    runner.average_checkpoints(
        str(pathlib.Path(runner.model_dir) / "averaged"),
        max_count=args.average)
  # Runner.infer's steps, with the clock around the decoding only.
  # pylint: disable=protected-access
  config = runner._finalize_config()
  model = runner._init_model(config)
  checkpoint = checkpoint_util.Checkpoint.from_config(config, model)
  checkpoint.restore(weights_only=True)
  infer_config = config["infer"]
  dataset = model.examples_inputter.make_inference_dataset(
      args.features, infer_config["batch_size"],
      batch_type=infer_config["batch_type"],
      length_bucket_width=infer_config["length_bucket_width"])
  start = time.monotonic()
  inference.predict_dataset(model, dataset, print_params=infer_config,
                            predictions_file=args.predictions)
  seconds = time.monotonic() - start
  with open(args.predictions, encoding="utf-8") as f:
    lines = sum(1 for _ in f)
  _write_json(args.summary, {"sentences": lines,
                             "seconds": round(seconds, 2)})


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  sub = parser.add_subparsers(dest="command", required=True)
  for name in ("train", "infer"):
    command = sub.add_parser(name)
    command.add_argument("--config", required=True)
    command.add_argument("--model_file", required=True)
    command.add_argument("--summary", required=True)
    command.add_argument("--seed", type=int, default=0)
    command.add_argument("--intra_op_threads", type=int, default=1)
  sub.choices["train"].add_argument("--budget_seconds", type=float,
                                    required=True)
  sub.choices["train"].add_argument("--steps_log", required=True)
  sub.choices["train"].add_argument("--report_every", type=int, default=50)
  sub.choices["train"].add_argument("--max_step", type=int,
                                    default=10_000_000)
  sub.choices["infer"].add_argument("--average", type=int, default=0)
  sub.choices["infer"].add_argument("--features", required=True)
  sub.choices["infer"].add_argument("--predictions", required=True)
  args = parser.parse_args(argv)
  if args.command == "train":
    if args.budget_seconds <= 0:
      parser.error(f"--budget_seconds={args.budget_seconds}: use a positive "
                   "number of seconds")
    train(args)
  else:
    infer(args)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
