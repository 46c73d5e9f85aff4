"""m4moe-distill: distil a trained MoE teacher into a dense student (Switch §4.2).

Usage:
  m4moe-distill --teacher_dir=runs/moe --student_config=tiny/dense \\
      --corpus_dir=corpus --vocab_dir=vocab --languages=pt,kk,si,ia \\
      --model_dir=runs/distilled --train_steps=500

The student is an ordinary m4moe-train run (same model, data, optimiser and
run flags; ``--student_config`` is m4moe-train's ``--config``) with two
differences (m4moe.training.distill):

* it starts from the teacher's non-expert weights (embeddings, attention,
  layer norms, output projection, the dense FFNs); its FFN at a layer where
  the teacher has experts starts fresh, as in Switch §4.2;
* its training target mixes the teacher's probabilities (weight
  ``--distill_teacher_weight``, Switch: 0.25) with the label-smoothed ground
  truth (the rest). Logged and dev cross-entropies stay the plain ones
  against the ground truth.

The teacher is read from its latest checkpoint and never written. Running
again with the same ``--model_dir`` resumes exactly, with the teacher
checkpoint recorded at the start (``config.json``'s "distill" section);
SIGTERM, SIGINT or SIGHUP save and exit 0, as m4moe-train does. The
student must be dense and match the teacher's shapes (a differing flag is
named with the value to set), its ``--vocab_dir`` must hold the teacher's
SentencePiece models (fingerprint check) and its ``--languages`` must be
among the teacher's. Exit codes: 2 for bad flags or an unusable teacher
(nothing is written), 1 for a locked or unrecoverable ``--model_dir``.
One device only (no ``--mesh``, ``--tpu``, ``--num_cpu_devices``).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from absl import app
from absl import flags
from absl import logging

from m4moe import cli
# m4moe-train's flags (model, run, optimiser, data) and its flag readers.
from m4moe.cli import train as train_cli

_TEACHER_DIR = flags.DEFINE_string(
    "teacher_dir", "", "The teacher's model dir: a trained MoE m4moe-train "
    "run (its latest checkpoint is read; nothing is written there).")
_TEACHER_WEIGHT = flags.DEFINE_float(
    "distill_teacher_weight", 0.25, "Share of the teacher's distribution in "
    "the training target; the rest is the (label-smoothed) ground truth. "
    "Switch Transformer: 0.25.")
flags.DEFINE_alias("student_config", "config")

# m4moe-train flags that m4moe-distill does not support: (flag, default).
_UNSUPPORTED = (("init_from_dense", ""), ("init_from_dense_optimizer", False),
                ("mesh", ""), ("tpu", None), ("num_cpu_devices", 1))


def _unsupported_flags() -> list[str]:
  return [f"--{name} is not supported by m4moe-distill (one device, the "
          "student starts from the teacher): drop it"
          for name, default in _UNSUPPORTED
          if flags.FLAGS[name].value != default]


def _fail(problems: list[str], code: int = 2) -> int:
  for p in dict.fromkeys(problems):  # data checks may report a file twice
    print(f"m4moe-distill: {p}", file=sys.stderr)
  return code


def _inputs_and_student(data) -> tuple[list[str], Any, Any]:
  """(data problems, built inputs or None, student model config).

  The vocabulary sizes come from the built inputs, so those are built first;
  with data problems nothing is built.
  """
  from m4moe.training import inputs  # pylint: disable=g-import-not-at-top
  problems = inputs.check_data(data)
  built = None if problems else inputs.build_inputs(data)
  overrides = {}
  if built is not None and built.src_vocab_size:
    overrides = {"src_vocab_size": built.src_vocab_size,
                 "tgt_vocab_size": built.tgt_vocab_size}
  student = train_cli._model_config(overrides)  # pylint: disable=protected-access
  return problems, built, student


def _preflight(config, data, train, built, model_config, *, replicas: int):
  """(problems, run-directory records, prepared distillation).

  All checks run, so one ``--check_config`` lists every problem.
  """
  from m4moe.training import distill  # pylint: disable=g-import-not-at-top
  # pylint: disable=protected-access
  problems = train_cli._check(data, replicas, model_config)
  try:
    record = train_cli._run_record(data, built)
  except (ValueError, OSError) as e:
    problems.append(str(e))
    record = {}
  # pylint: enable=protected-access
  prepared = distill.prepare(
      config=config, student=model_config, model_dir=train.model_dir,
      vocab_dir="" if data.synthetic else data.vocab_dir,
      languages=built.languages if built is not None and not data.synthetic
      else ())
  return problems + list(prepared.problems), record, prepared


def _announce(built, prepared) -> None:
  """Says what training will skip and whether it resumes, since both change
  what the run does without failing it."""
  skipped = built.skipped_lines
  if skipped:
    print(f"m4moe-distill: skipping {sum(skipped.values())} malformed corpus "
          "line(s): " + ", ".join(f"{p} ({n})" for p, n in skipped.items())
          + "; run with --check_config to list them", file=sys.stderr)
  if prepared.resumed:
    print("m4moe-distill: resuming; the student's init from the teacher is "
          f"ignored, the teacher is {prepared.teacher_checkpoint}",
          file=sys.stderr)


def _distil(config, data, train, built, model_config, *, strategy, record,
            prepared) -> int:
  """Loads the teacher and trains the student; the exit code (1: a locked
  or unrecoverable ``--model_dir``, 2: an unusable teacher)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from m4moe.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  from m4moe.training import checkpointing  # pylint: disable=g-import-not-at-top
  from m4moe.training import distill  # pylint: disable=g-import-not-at-top
  from m4moe.training import loop as train_lib  # pylint: disable=g-import-not-at-top
  from m4moe import run_lock  # pylint: disable=g-import-not-at-top
  try:
    # Building the teacher draws (then overwritten) initial values; under
    # --deterministic random ops need a global seed (train() sets its own).
    tf.random.set_seed(train.seed)
    teacher = distill.load_teacher(config=prepared.teacher_config,
                                   checkpoint=prepared.teacher_checkpoint)
    result = train_lib.train(
        model_fn=lambda: model_lib.Transformer(config=model_config),
        train_dataset=built.train, dev_datasets=built.dev, config=train,
        model_config=model_config, strategy=strategy,
        run_sections={"data": data.to_dict(),
                      "languages": list(built.languages), "mesh": None,
                      distill.SECTION: dict(prepared.section), **record},
        warm_start=prepared.warm_start,
        token_loss=distill.DistillationLoss(
            teacher=teacher, teacher_weight=config.teacher_weight))
  except (checkpointing.ModelDirError, checkpointing.CheckpointError,
          run_lock.RunLockedError) as e:
    logging.error("%s", e)
    return _fail([str(e)], code=1)
  except distill.DistillError as e:
    return _fail([str(e)])
  train_cli.print_result(result)
  return 0


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from m4moe.training import distill  # pylint: disable=g-import-not-at-top
  problems = _unsupported_flags()
  if problems:
    return _fail(problems)
  if train_cli._DETERMINISTIC.value:  # pylint: disable=protected-access
    tf.config.experimental.enable_op_determinism()
  try:
    config = distill.DistillConfig(teacher_dir=_TEACHER_DIR.value,
                                   teacher_weight=_TEACHER_WEIGHT.value)
    data, train = train_cli._configs()  # pylint: disable=protected-access
    problems, built, model_config = _inputs_and_student(data)
  except (ValueError, flags.ValidationError) as e:
    return _fail([str(e)])
  strategy = tf.distribute.get_strategy()
  more, record, prepared = _preflight(
      config, data, train, built, model_config,
      replicas=strategy.num_replicas_in_sync)
  problems += more
  print(json.dumps({"model": model_config.to_dict(), "train": train.to_dict(),
                    "data": data.to_dict(),
                    distill.SECTION: dict(prepared.section)},
                   indent=2, sort_keys=True))
  if problems:
    return _fail(problems)
  if train_cli._CHECK_CONFIG.value:  # pylint: disable=protected-access
    line_problems = built.line_problems()
    if line_problems:
      return _fail(line_problems + [
          "malformed corpus lines (listed above): fix them, or train anyway "
          "(training skips and counts them)"])
    print(f"m4moe-distill: config OK (teacher {prepared.teacher_checkpoint})")
    return 0
  _announce(built, prepared)
  return _distil(config, data, train, built, model_config, strategy=strategy,
                 record=record, prepared=prepared)


def run():
  cli.run_tool(main, module=__name__)


if __name__ == "__main__":
  run()
