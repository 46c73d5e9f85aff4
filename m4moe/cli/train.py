"""m4moe-train: train (or resume) a model with Adafactor.

Usage:
  m4moe-train --config=tiny/moe --corpus_dir=corpus --vocab_dir=vocab \\
      --languages=de,fr,ja --model_dir=runs/tiny_moe --train_steps=2000
  m4moe-train --flagfile=configs/tiny/dense.flags --d_model=256 ...
  m4moe-train --config=tiny/moe --synthetic_data --model_dir=/tmp/x \\
      --train_steps=100 --check_config

The model is the zoo entry / flagfile (``--config`` or ``--flagfile``);
model flags given on the command line override ``--config``'s values. A zoo
entry may also set the optimiser recipe it was tuned with (``configs/tiny/*``
use the small-model recipe of ``eval/results/peer/``; ``configs/gshard/*``
the paper's Adafactor); optimiser flags given on the command line override
it, and flags no one sets keep the paper's defaults. The
vocabulary sizes come from the SentencePiece models in ``--vocab_dir``.
Running again with the same ``--model_dir`` resumes from the last complete
checkpoint (exactly, see m4moe.train). SIGTERM saves and exits with code 0.

Writes to ``--model_dir``: config.json (effective config; decode/eval rebuild
the model with m4moe.training.checkpointing.model_config_from_run),
checkpoints, metrics.jsonl, TensorBoard events (train/, eval/).

Distribution: one device by default; several local GPUs (or
``--num_cpu_devices=N`` logical CPUs) use MirroredStrategy and split each
global batch across them; ``--tpu=NAME`` connects to a TPU and uses
TPUStrategy (untested here).

Device mesh (GShard sharding, see m4moe.sharding): ``--mesh=data:2,expert:4``
lays the model out on a named mesh of all local devices instead of
MirroredStrategy: expert weights and their Adafactor slots split on E over
``expert``, batches (and MoE groups) split over ``data``, the rest
replicated; DTensor runs it (CPUs, e.g. ``--num_cpu_devices=8``, or GPUs).
With ``--tpu`` the mesh becomes XLA sharding annotations for TPUStrategy's
SPMD partitioner (one replica over all cores; untested here). The mesh must
use every device; E must be divisible by the expert axis and the batch rows
by the data axis. Checkpoints restore on any other mesh or on one device.

  m4moe-train --config=tiny/moe --synthetic_data --model_dir=/tmp/m \
      --num_cpu_devices=8 --mesh=data:2,expert:4 --train_steps=100
"""

from __future__ import annotations

import json
import sys
from typing import Any

from absl import app
from absl import flags
from absl import logging

from m4moe import config as config_lib
from m4moe import optimizer as optimizer_lib

config_lib.define_model_flags()

_CONFIG = flags.DEFINE_string(
    "config", None, "Zoo entry (e.g. tiny/moe) or model flagfile; model "
    "flags on the command line override it. Alternatively use --flagfile.")
# Data.
_CORPUS_DIR = flags.DEFINE_string("corpus_dir", "", "Built corpus directory.")
_VOCAB_DIR = flags.DEFINE_string("vocab_dir", "", "SentencePiece models dir.")
_TFDS_NAME = flags.DEFINE_string(
    "tfds_name", "", "Comma-separated TFDS translation datasets (offline).")
_TFDS_DATA_DIR = flags.DEFINE_string("tfds_data_dir", "", "TFDS data dir.")
_SYNTHETIC = flags.DEFINE_bool("synthetic_data", False,
                               "Train on the synthetic toy task (smoke runs).")
_LANGUAGES = flags.DEFINE_list("languages", [], "Languages (empty: all).")
_TEMPERATURE = flags.DEFINE_float("temperature", 5.0,
                                  "Language sampling temperature T.")
_SEQUENCE_LENGTH = flags.DEFINE_integer(
    "sequence_length", 64, "Tokens per packed row (each side).")
_BATCH_TOKENS = flags.DEFINE_integer(
    "batch_tokens", 4096, "Tokens per global batch (each side).")
_PACK = flags.DEFINE_bool("pack", True, "Pack several pairs per row.")
_DEV_SPLIT = flags.DEFINE_string("dev_split", "dev", "Split for dev CE.")
_DEV_BATCH_SIZE = flags.DEFINE_integer("dev_batch_size", 64,
                                       "Pairs per dev batch.")
# Run.
_MODEL_DIR = flags.DEFINE_string("model_dir", None, "Run directory.")
_TRAIN_STEPS = flags.DEFINE_integer("train_steps", 10000, "Total steps.")
_SEED = flags.DEFINE_integer("seed", 0, "Init, data and per-step seed.")
_LABEL_SMOOTHING = flags.DEFINE_float("label_smoothing", 0.1,
                                      "Label smoothing epsilon.")
_GRAD_ACCUM = flags.DEFINE_integer("grad_accum_steps", 1,
                                   "Micro-batches per update.")
_REMAT = flags.DEFINE_bool("remat", False,
                           "Recompute layer activations in the backward pass.")
_CHECKPOINT_EVERY = flags.DEFINE_integer("checkpoint_every", 1000,
                                         "Save every N steps.")
_KEEP = flags.DEFINE_integer("keep_checkpoints", 5, "Checkpoints kept.")
_EVAL_EVERY = flags.DEFINE_integer("eval_every", 1000,
                                   "Dev CE every N steps (0: at the end).")
_LOG_EVERY = flags.DEFINE_integer("log_every", 100, "Log every N steps.")
_MAX_TRAIN_SECONDS = flags.DEFINE_float(
    "max_train_seconds", 0.0,
    "Stop (save, evaluate) once the training loop has run this many seconds "
    "of wall-clock, summed over resumes (0: no budget).")
_PATIENCE = flags.DEFINE_integer(
    "early_stopping_patience", 0,
    "Stop after this many dev evaluations (--eval_every) in a row without a "
    "new best dev cross-entropy (0: off).")
_MIN_DELTA = flags.DEFINE_float(
    "early_stopping_min_delta", 0.0,
    "A dev evaluation is a new best only if it improves on the best dev "
    "cross-entropy by more than this many nats per token.")
_MAX_NONFINITE = flags.DEFINE_integer(
    "max_consecutive_nonfinite", 10, "Stop after this many skipped steps.")
_INIT_FROM_DENSE = flags.DEFINE_string(
    "init_from_dense", "", "Dense run's model dir: a fresh MoE run starts "
    "from its weights, each expert a copy of the dense FFN it replaces "
    "(needs --expert_hidden_dim = its --d_ff), routers fresh (m4moe.upcycle). "
    "Ignored when resuming.")
_INIT_FROM_DENSE_OPTIMIZER = flags.DEFINE_bool(
    "init_from_dense_optimizer", False, "With --init_from_dense, also copy "
    "its Adafactor state (slots, iterations: the schedule continues); needs "
    "the dense run's --factored and --beta1.")
_CHECKPOINT_INPUT = flags.DEFINE_bool(
    "checkpoint_input", True, "Save the input iterator in checkpoints.")
_CHECK_CONFIG = flags.DEFINE_bool(
    "check_config", False, "Validate config, data and devices, then exit.")
_DETERMINISTIC = flags.DEFINE_bool(
    "deterministic", False, "tf.config.experimental.enable_op_determinism.")
_TPU = flags.DEFINE_string("tpu", None, "TPU name ('local' on a TPU VM).")
_NUM_CPU_DEVICES = flags.DEFINE_integer(
    "num_cpu_devices", 1, "Split the CPU into N logical devices (Mirrored, "
    "or the devices of --mesh).")
_MESH = flags.DEFINE_string(
    "mesh", "", "Device mesh, e.g. data:2,expert:4 (axes data, expert, "
    "model): GShard sharding over all devices (DTensor; XLA annotations "
    "with --tpu). Empty: no mesh.")
# Optimiser: one flag per AdafactorConfig field (paper defaults); a zoo
# entry given with --config may carry its own recipe (configs/tiny/*: the
# small-model recipe), and explicit flags win over it.
optimizer_lib.define_flags()


def _model_config(overrides: dict[str, Any]) -> config_lib.ModelConfig:
  """--config as the base, explicit model flags and vocab sizes on top."""
  if _CONFIG.value is None:
    return config_lib.model_config_from_flags(flags.FLAGS, **overrides)
  return config_lib.load_model_config(
      _CONFIG.value, config_lib.present_model_flags(flags.FLAGS), **overrides)


def _optimizer_config() -> optimizer_lib.AdafactorConfig:
  """--config's optimiser recipe as the base, explicit flags on top."""
  if _CONFIG.value is None:
    return optimizer_lib.config_from_flags(flags.FLAGS)
  return optimizer_lib.load_config(_CONFIG.value,
                                   optimizer_lib.present_flags(flags.FLAGS))


def _configs():
  """(DataConfig, TrainConfig) from the flags; raises on invalid values."""
  from m4moe import train as train_lib  # pylint: disable=g-import-not-at-top
  from m4moe.training import inputs  # pylint: disable=g-import-not-at-top
  if not _MODEL_DIR.value:
    raise flags.ValidationError("--model_dir is required")
  data = inputs.DataConfig(
      corpus_dir=_CORPUS_DIR.value, vocab_dir=_VOCAB_DIR.value,
      tfds_name=_TFDS_NAME.value, tfds_data_dir=_TFDS_DATA_DIR.value,
      synthetic=_SYNTHETIC.value, languages=tuple(_LANGUAGES.value),
      temperature=_TEMPERATURE.value, sequence_length=_SEQUENCE_LENGTH.value,
      batch_tokens=_BATCH_TOKENS.value, pack=_PACK.value,
      dev_split=_DEV_SPLIT.value, dev_batch_size=_DEV_BATCH_SIZE.value,
      seed=_SEED.value)
  train = train_lib.TrainConfig(
      model_dir=_MODEL_DIR.value, train_steps=_TRAIN_STEPS.value,
      seed=_SEED.value, label_smoothing=_LABEL_SMOOTHING.value,
      grad_accum_steps=_GRAD_ACCUM.value, remat=_REMAT.value,
      checkpoint_every=_CHECKPOINT_EVERY.value,
      keep_checkpoints=_KEEP.value, eval_every=_EVAL_EVERY.value,
      log_every=_LOG_EVERY.value,
      max_train_seconds=_MAX_TRAIN_SECONDS.value,
      early_stopping_patience=_PATIENCE.value,
      early_stopping_min_delta=_MIN_DELTA.value,
      max_consecutive_nonfinite=_MAX_NONFINITE.value,
      checkpoint_input=_CHECKPOINT_INPUT.value,
      batch_tokens=_BATCH_TOKENS.value, optimizer=_optimizer_config())
  return data, train


def _check_mesh(mesh, data, model_config) -> list[str]:
  """Problems of ``--mesh`` with the model and the batch (not the devices)."""
  from m4moe import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  if mesh is None:
    return []
  moe = model_config.moe
  tokens = data.batch_rows * data.sequence_length
  groups = None
  if moe.enabled:
    group_size = max(1, min(moe.group_size, tokens))
    groups = -(-tokens // group_size)
  try:
    mesh_lib.validate_mesh(mesh, num_experts=moe.num_experts,
                           num_groups=groups, batch_size=data.batch_rows)
  except mesh_lib.MeshError as e:
    return [str(e)]
  return []


def _make_sharding(mesh):
  """(strategy, sharding) for ``--mesh`` (and ``--tpu``)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from m4moe import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  from m4moe.training import distribute  # pylint: disable=g-import-not-at-top
  if mesh is None:
    return distribute.make_strategy(tpu=_TPU.value), sharding_lib.NO_SHARDING
  if _TPU.value:
    strategy = distribute.make_strategy(tpu=_TPU.value, mesh_size=mesh.size)
    return strategy, sharding_lib.make_sharding(mesh, backend="xla")
  device_type = "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
  sharding = sharding_lib.make_sharding(mesh, backend="dtensor",
                                        device_type=device_type)
  return tf.distribute.get_strategy(), sharding


def _check(data, strategy, model_config) -> list[str]:
  """Problems with data files and devices (config values are checked at
  construction already)."""
  from m4moe.training import inputs  # pylint: disable=g-import-not-at-top
  problems = inputs.check_data(data)
  replicas = strategy.num_replicas_in_sync
  if data.batch_rows % replicas:
    problems.append(
        f"--batch_tokens={data.batch_tokens} gives {data.batch_rows} rows of "
        f"--sequence_length={data.sequence_length}, not divisible by the "
        f"{replicas} replicas; change --batch_tokens")
  if data.sequence_length > model_config.max_length:
    problems.append(f"--sequence_length={data.sequence_length} exceeds the "
                    f"model's --max_length={model_config.max_length}")
  return problems


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from m4moe import model as model_lib  # pylint: disable=g-import-not-at-top
  from m4moe import train as train_lib  # pylint: disable=g-import-not-at-top
  from m4moe.training import distribute  # pylint: disable=g-import-not-at-top
  from m4moe.training import inputs  # pylint: disable=g-import-not-at-top
  from m4moe import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  try:
    mesh = mesh_lib.MeshShape.parse(_MESH.value) if _MESH.value else None
  except mesh_lib.MeshError as e:
    print(f"m4moe-train: {e}", file=sys.stderr)
    return 2
  distribute.configure_cpu_devices(_NUM_CPU_DEVICES.value)
  if _DETERMINISTIC.value:
    tf.config.experimental.enable_op_determinism()
  try:
    data, train = _configs()
    problems = inputs.check_data(data)
    built = None if problems else inputs.build_inputs(data)
    overrides = {}
    if built is not None and built.src_vocab_size:
      overrides = {"src_vocab_size": built.src_vocab_size,
                   "tgt_vocab_size": built.tgt_vocab_size}
    model_config = _model_config(overrides)
  except (ValueError, flags.ValidationError) as e:
    logging.error("%s", e)
    print(f"m4moe-train: {e}", file=sys.stderr)
    return 2
  try:
    strategy, sharding = _make_sharding(mesh)
  except mesh_lib.MeshError as e:
    print(f"m4moe-train: {e}; with --num_cpu_devices=N the CPU is split "
          "into N devices", file=sys.stderr)
    return 2
  problems += _check(data, strategy, model_config)
  problems += _check_mesh(mesh, data, model_config)
  from m4moe import upcycle  # pylint: disable=g-import-not-at-top
  warm_start, upcycle_problems, notice = upcycle.prepare(
      dense_dir=_INIT_FROM_DENSE.value, model_dir=train.model_dir,
      copy_optimizer=_INIT_FROM_DENSE_OPTIMIZER.value,
      config=model_config, optimizer=train.optimizer, mesh=mesh is not None)
  if notice:
    print(f"m4moe-train: {notice}", file=sys.stderr)
  problems += upcycle_problems
  devices = mesh.size if mesh else strategy.num_replicas_in_sync
  effective = {"model": model_config.to_dict(), "train": train.to_dict(),
               "data": data.to_dict(), "devices": devices,
               "mesh": str(mesh) if mesh else None}
  print(json.dumps(effective, indent=2, sort_keys=True))
  if problems:
    for p in problems:
      print(f"m4moe-train: {p}", file=sys.stderr)
    return 2
  if _CHECK_CONFIG.value:
    print(f"m4moe-train: config OK ({len(built.languages)} languages, "
          f"{devices} device(s))")
    return 0
  try:
    result = train_lib.train(
        model_fn=lambda: model_lib.Transformer(config=model_config,
                                               sharding=sharding),
        train_dataset=built.train, dev_datasets=built.dev, config=train,
        model_config=model_config, strategy=strategy, sharding=sharding,
        run_sections={"data": data.to_dict(),
                      "languages": list(built.languages),
                      "mesh": str(mesh) if mesh else None},
        warm_start=warm_start)
  except upcycle.UpcycleError as e:
    print(f"m4moe-train: {e}", file=sys.stderr)
    return 2
  logging.info("Finished: %s", result)
  print(json.dumps({"step": result.step, "preempted": result.preempted,
                    "stopped_by": result.stopped_by,
                    "checkpoint": result.last_checkpoint,
                    "train_ce": result.train_ce, "dev_ce": result.dev_ce,
                    "nonfinite_skipped": result.nonfinite_skipped}))
  return 0


def run():
  app.run(main)


if __name__ == "__main__":
  run()
