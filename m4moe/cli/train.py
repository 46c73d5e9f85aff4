"""m4moe-train: train (or resume) a model with Adafactor.

Usage:
  m4moe-train --config=tiny/moe --corpus_dir=corpus --vocab_dir=vocab \\
      --languages=de,fr,ja --model_dir=runs/tiny_moe --train_steps=2000
  m4moe-train --flagfile=configs/tiny/dense.flags --d_model=256 ...
  m4moe-train --config=tiny/moe --synthetic_data --model_dir=runs/check \\
      --train_steps=100 --check_config
  m4moe-train --config=tiny/moe --tfds_name=m4moe_corpus --tfds_data_dir=tfds \\
      --vocab_dir=vocab --model_dir=runs/tiny_moe --train_steps=2000

Data: a built corpus (``--corpus_dir``), TFDS (``--tfds_name``: the corpus
as ``m4moe-build-corpus --tfds_data_dir`` wrote it, the same stream as
``--corpus_dir``, or catalog translation datasets) or the synthetic toy task;
m4moe.training.inputs. ``--model_dir`` is a local directory (a ``gs://`` one
is refused; ``--tfds_data_dir`` may be one). ``--process_index`` and
``--process_count`` shard the input of the hosts of a multi-host job; this
trainer is one process, so it takes ``--process_count`` above 1 only with
``--check_config``.

The model is the zoo entry / flagfile (``--config`` or ``--flagfile``); model
flags given on the command line override ``--config``'s values. A zoo entry may
also set the optimiser recipe it was tuned with (``configs/tiny/*`` use the
small-model recipe of ``results/peer/``; ``configs/gshard/*`` the paper's
Adafactor); optimiser flags given on the command line override it, and flags no
one sets keep the paper's defaults. The vocabulary sizes come from the
SentencePiece models in ``--vocab_dir``. Running again with the same
``--model_dir`` resumes from the last complete checkpoint (exactly, see
m4moe.training.loop); ``--continue_from=RUN`` starts a new ``--model_dir`` as a copy of
a finished run and resumes that copy with a larger ``--train_steps``, leaving
the original as it was. SIGTERM, SIGINT (Ctrl-C) or SIGHUP saves and exits with
code 0; a second Ctrl-C stops at once without saving. A damaged newest
checkpoint is moved into ``--model_dir``/damaged/ and the run resumes from the
newest intact one; if none is left, or the metrics show progress whose
checkpoints are gone, it stops with exit code 1 rather than start over. Only
one m4moe-train may use a ``--model_dir`` at a time (a second one exits with
code 1 naming the first one's pid); a ``--model_dir`` that is a file or cannot
be created exits with code 2.

Writes to ``--model_dir`` (the contract is m4moe.training.rundir): config.json
(effective config, plus the vocabulary fingerprint and the trained language
pairs that decode/eval/export check), checkpoints, metrics.jsonl,
TensorBoard events (train/, eval/).

Distribution: one device by default; several local GPUs (or
``--num_cpu_devices=N`` logical CPUs) use MirroredStrategy and split each
global batch across them; ``--tpu=NAME`` connects to a TPU and uses
TPUStrategy (untested here). ``--tpu=local --check_config`` does not
connect: it checks the config, the data and vocabulary, and ``--mesh``
against ``--tpu_cores`` (default 8, a v3-8) and the model, offline, so a TPU
VM run can be checked before the VM exists (README "TPU VM recipe").

Device mesh (GShard sharding, see m4moe.parallel.sharding): ``--mesh=data:2,expert:4``
lays the model out on a named mesh of all local devices instead of
MirroredStrategy: expert weights and their Adafactor slots split on E over
``expert``, batches (and MoE groups) split over ``data``, attention heads,
d_ff and the expert hidden width over ``model`` (tensor parallelism), the
rest replicated; DTensor runs it (CPUs, e.g. ``--num_cpu_devices=8``, or GPUs).
With ``--tpu`` the mesh becomes XLA sharding annotations for TPUStrategy's
SPMD partitioner (one replica over all cores; untested here). The mesh must
use every device; E must be divisible by the expert axis, the batch rows
by the data axis, and --num_heads, --d_ff and --expert_hidden_dim by the
model axis. Checkpoints restore on any other mesh or on one device.

  m4moe-train --config=tiny/moe --synthetic_data --model_dir=runs/mesh \
      --num_cpu_devices=8 --mesh=data:2,expert:4 --train_steps=100
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

from absl import app
from absl import flags
from absl import logging

from m4moe import cli
from m4moe import config as config_lib
from m4moe import flagutil
from m4moe.training import optimizer as optimizer_lib
from m4moe.training import loop as train_lib
from m4moe.training import inputs

config_lib.define_model_flags()

_CONFIG = flags.DEFINE_string(
    "config", None, "Zoo entry (e.g. tiny/moe) or model flagfile; model "
    "flags on the command line override it. Alternatively use --flagfile.")
# Run, optimiser and data settings: one flag per field of TrainConfig (its
# AdafactorConfig included) and DataConfig, defaulting to the dataclass
# defaults (m4moe.flagutil). A zoo entry given with --config may carry its own
# optimiser recipe (configs/tiny/*: the small-model recipe), and explicit
# flags win over it.
flagutil.define_flags(train_lib.TrainConfig)
flagutil.define_flags(inputs.DataConfig)
# Dense -> MoE upcycling (m4moe.moe.upcycle): command-line only, not run settings.
_INIT_FROM_DENSE = flags.DEFINE_string(
    "init_from_dense", "", "Dense run's model dir: a fresh MoE run starts "
    "from its weights, each expert a copy of the dense FFN it replaces "
    "(needs --expert_hidden_dim = its --d_ff), routers fresh (m4moe.moe.upcycle). "
    "Ignored when resuming.")
_INIT_FROM_DENSE_OPTIMIZER = flags.DEFINE_bool(
    "init_from_dense_optimizer", False, "With --init_from_dense, also copy "
    "its Adafactor state (slots, iterations: the schedule continues); needs "
    "the dense run's --factored and --beta1.")
_CONTINUE_FROM = flags.DEFINE_string(
    "continue_from", "", "A finished run's model dir: a new --model_dir "
    "starts as a copy of it (checkpoints, optimiser, step, early-stopping "
    "state, best/, logs) and training resumes from its latest checkpoint up "
    "to --train_steps, leaving it unchanged (m4moe.training.continuation). "
    "Ignored once --model_dir holds a checkpoint.")
_CHECK_CONFIG = flags.DEFINE_bool(
    "check_config", False, "Validate config, data (every corpus line: "
    "malformed ones are listed as file:line) and devices, then exit (2 on "
    "any problem).")
_DETERMINISTIC = flags.DEFINE_bool(
    "deterministic", False, "tf.config.experimental.enable_op_determinism.")
_TPU = flags.DEFINE_string("tpu", None, "TPU name ('local' on a TPU VM).")
_TPU_CORES = flags.DEFINE_integer(
    "tpu_cores", 8, "With --tpu --check_config: the TPU cores TensorFlow "
    "will report (8 on a v2-8 or v3-8 VM), which --mesh must use exactly, "
    "or the replicas that split the batch without --mesh. A real run reads "
    "them from the TPU.", lower_bound=1)
_NUM_CPU_DEVICES = flags.DEFINE_integer(
    "num_cpu_devices", 1, "Split the CPU into N logical devices (Mirrored, "
    "or the devices of --mesh).")
_MESH = flags.DEFINE_string(
    "mesh", "", "Device mesh, e.g. data:2,expert:4 (axes data, expert, "
    "model): GShard sharding over all devices (DTensor; XLA annotations "
    "with --tpu). Empty: no mesh.")


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
  return config_lib.load_optimizer_config(
      _CONFIG.value, optimizer_lib.present_flags(flags.FLAGS))


def _configs():
  """(DataConfig, TrainConfig) from the flags; raises on invalid values."""
  from m4moe.training import checkpointing  # pylint: disable=g-import-not-at-top
  if not flags.FLAGS.model_dir:
    raise flags.ValidationError("--model_dir is required")
  if "://" in flags.FLAGS.model_dir:
    # A URL would silently become a local folder named after its scheme.
    raise flags.ValidationError(
        f"--model_dir={flags.FLAGS.model_dir}: the run directory must be a "
        "local path (its lock and checkpoint bookkeeping use local files); "
        "train into a local folder and copy it to the bucket afterwards "
        "(docs/tpu.md). --tfds_data_dir may be a gs:// path")
  checkpointing.check_model_dir(flags.FLAGS.model_dir)
  data = flagutil.from_flags(inputs.DataConfig, flags.FLAGS)
  train = flagutil.from_flags(train_lib.TrainConfig, flags.FLAGS,
                              batch_tokens=data.batch_tokens,
                              optimizer=_optimizer_config())
  return data, train


def _check_mesh(mesh, data, model_config) -> list[str]:
  """Problems of ``--mesh`` with the model and the batch (not the devices)."""
  from m4moe.parallel import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  if mesh is None:
    return []
  moe = model_config.moe
  tokens = data.batch_rows * data.sequence_length
  groups = None
  if moe.enabled:
    group_size = max(1, min(moe.group_size, tokens))
    groups = -(-tokens // group_size)
  try:
    mesh_lib.validate_mesh(mesh, **mesh_lib.model_widths(model_config),
                           num_groups=groups, batch_size=data.batch_rows)
  except mesh_lib.MeshError as e:
    return [str(e)]
  return []


def _make_sharding(mesh):
  """(strategy, sharding) for ``--mesh`` (and ``--tpu``)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from m4moe.parallel import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
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


def _check(data, replicas: int, model_config) -> list[str]:
  """Problems with data files and ``replicas`` (config values are checked at
  construction already)."""
  problems = inputs.check_data(data)
  if data.batch_rows % replicas:
    problems.append(
        f"--batch_tokens={data.batch_tokens} gives {data.batch_rows} rows of "
        f"--sequence_length={data.sequence_length}, not divisible by the "
        f"{replicas} replicas; change --batch_tokens")
  if data.process_count > 1 and not _CHECK_CONFIG.value:
    problems.append(
        f"--process_count={data.process_count}: this trainer is one process "
        "that consumes whole global batches; the flag shards the input of "
        "each host of a multi-host job (m4moe.training.inputs, "
        "shard_for_input_context), which m4moe-train does not run yet. "
        "Use it with --check_config, or drop it")
  if data.sequence_length > model_config.max_length:
    problems.append(f"--sequence_length={data.sequence_length} exceeds the "
                    f"model's --max_length={model_config.max_length}")
  return problems


def _check_tpu(mesh) -> tuple[list[str], Any, int]:
  """(problems, sharding, replicas) of ``--tpu --check_config``, offline.

  Checks what does not need the TPU: ``--mesh`` against ``--tpu_cores``
  (the XLA backend's annotations need one replica over every core) and
  flags that mean nothing on a TPU. Never connects to the TPU.
  """
  from m4moe.parallel import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from m4moe.parallel import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  problems = []
  cores = _TPU_CORES.value
  if _NUM_CPU_DEVICES.value > 1:
    problems.append(f"--num_cpu_devices={_NUM_CPU_DEVICES.value} splits the "
                    "host CPU, which a --tpu run does not use; drop it")
  if mesh is None:
    return problems, sharding_lib.NO_SHARDING, cores
  if mesh.size != cores:
    problems.append(
        f"--mesh={mesh} uses {mesh.size} devices but the TPU has {cores} "
        f"cores (--tpu_cores={cores}); make the axis sizes multiply to "
        f"{cores} (e.g. --mesh=data:{max(1, cores // 8)},expert:"
        f"{min(cores, 8)}), or pass the slice's core count as --tpu_cores")
  try:
    return problems, sharding_lib.make_sharding(mesh, backend="xla"), 1
  except mesh_lib.MeshError as e:
    return problems + [str(e)], sharding_lib.NO_SHARDING, 1


def _run_record(data, built) -> dict[str, Any]:
  """The m4moe.training.rundir records of this run (vocabulary fingerprint, language
  pairs, skipped lines); {} for synthetic data or when ``built`` is None.

  Raises:
    ValueError: --model_dir already holds a run trained with other
      SentencePiece models (resuming would continue it on wrong ids).
  """
  from m4moe.training import rundir  # pylint: disable=g-import-not-at-top
  if built is None or data.synthetic:
    return {}
  record = rundir.run_sections(vocab_dir=data.vocab_dir,
                               languages=built.languages,
                               skipped_lines=built.skipped_lines)
  config_path = pathlib.Path(flags.FLAGS.model_dir) / rundir.CONFIG_FILENAME
  if config_path.is_file():
    old = rundir.read_run_config(flags.FLAGS.model_dir).get("vocab")
    if old is not None:
      vocab_dir = pathlib.Path(data.vocab_dir)
      rundir.check_vocab(rundir.VocabFingerprint.from_dict(old),
                         source=vocab_dir / rundir.SOURCE_MODEL,
                         target=vocab_dir / rundir.TARGET_MODEL,
                         model_dir=flags.FLAGS.model_dir)
  return record


def _continue_run(model_dir: str, model_config: config_lib.ModelConfig, *,
                  dry: bool) -> list[str]:
  """--continue_from: copies the finished run into a fresh ``model_dir``
  before anything reads it (``dry``: only validates); its problems."""
  from m4moe.training import continuation  # pylint: disable=g-import-not-at-top
  source = _CONTINUE_FROM.value
  if not source:
    return []
  if _INIT_FROM_DENSE.value:
    return ["--continue_from and --init_from_dense exclude each other: a "
            "continued run already has its weights"]
  try:
    step = (continuation.check if dry else continuation.copy_run)(
        source=source, model_dir=model_dir, model_config=model_config)
  except (continuation.ContinuationError, OSError) as e:
    return [str(e)]
  if step is not None:
    verb = "would continue" if dry else "continues"
    print(f"m4moe-train: --model_dir={model_dir} {verb} {source} from its "
          f"step {step}", file=sys.stderr)
  return []


def _report(problems: list[str]) -> None:
  """Prints each problem on its own line, so a user sees all of them at once
  rather than fixing one per run."""
  for problem in problems:
    print(f"m4moe-train: {problem}", file=sys.stderr)


def _routing_languages(preliminary: config_lib.MoeConfig,
                       built: Any) -> dict[str, Any]:
  """The ``routing_languages`` override of ``--route_by=language``.

  The gate has one row per training language in sorted order, which only
  the built inputs know; a user-given list that differs would silently
  route by the wrong rows, so it is refused.

  Raises:
    config_lib.ConfigError: ``--routing_languages`` differs from the
      training languages.
  """
  given = preliminary.routing_languages
  if given and tuple(given) != tuple(built.languages):
    raise config_lib.ConfigError(
        f"--routing_languages={','.join(given)} is invalid: the gate rows "
        "are the training languages in sorted order "
        f"({','.join(built.languages)}); leave it empty")
  return {"routing_languages": tuple(built.languages)}


def _inputs_and_model(data) -> tuple[list[str], Any, config_lib.ModelConfig]:
  """(data problems, built inputs or None, model config).

  The inputs are built before the model config because the vocabulary
  sizes and the routing languages come from them; with data problems
  nothing is built and the config keeps its flag values.

  Raises:
    ValueError: an invalid model flag (config_lib.ConfigError).
  """
  problems = inputs.check_data(data)
  # --route_by=language: batches carry language ids, and the gate has one
  # row per training language (m4moe.moe.task_routing).
  preliminary = _model_config({}).moe
  by_language = preliminary.route_by == "language"
  built = None if problems else inputs.build_inputs(
      data, language_features=by_language)
  overrides = {}
  if built is not None and built.src_vocab_size:
    overrides = {"src_vocab_size": built.src_vocab_size,
                 "tgt_vocab_size": built.tgt_vocab_size}
  if built is not None and by_language:
    overrides.update(_routing_languages(preliminary, built))
  return problems, built, _model_config(overrides)


def _placement(mesh, *, offline_tpu: bool) -> tuple[list[str], Any, Any, int]:
  """(problems, strategy, sharding, replicas) of this run's devices.

  ``offline_tpu`` (``--tpu --check_config``) checks what needs no TPU and
  never connects, so the strategy is None.

  Raises:
    m4moe.parallel.mesh.MeshError: the mesh does not fit the devices.
  """
  if offline_tpu:
    problems, sharding, replicas = _check_tpu(mesh)
    return problems, None, sharding, replicas
  strategy, sharding = _make_sharding(mesh)
  return [], strategy, sharding, strategy.num_replicas_in_sync


def _preflight(data, train, built, model_config, *, mesh, replicas: int,
               dry: bool) -> tuple[list[str], dict[str, Any], Any]:
  """(problems, run-directory records, upcycling warm start) of the run.

  Every check runs even after an earlier one failed, so one
  ``--check_config`` lists all problems. ``dry``: copy nothing into
  ``--model_dir`` (``--continue_from`` only validates).
  """
  from m4moe.moe import upcycle  # pylint: disable=g-import-not-at-top
  problems = _check(data, replicas, model_config)
  problems += _check_mesh(mesh, data, model_config)
  problems += _continue_run(train.model_dir, model_config,
                            dry=dry or bool(problems))
  try:
    record = _run_record(data, built)
  except (ValueError, OSError) as e:
    problems.append(str(e))
    record = {}
  warm_start, upcycle_problems, notice = upcycle.prepare(
      dense_dir=_INIT_FROM_DENSE.value, model_dir=train.model_dir,
      copy_optimizer=_INIT_FROM_DENSE_OPTIMIZER.value,
      config=model_config, optimizer=train.optimizer, mesh=mesh is not None)
  if notice:
    print(f"m4moe-train: {notice}", file=sys.stderr)
  return problems + upcycle_problems, record, warm_start


def _check_config_exit(built, *, devices: int, offline_tpu: bool) -> int:
  """The exit code of ``--check_config`` once the config is valid.

  Malformed corpus lines fail the check (training would skip them, but a
  check exists to find them before a long run).
  """
  line_problems = built.line_problems()
  if line_problems:
    _report(line_problems)
    print(f"m4moe-train: {sum(built.skipped_lines.values())} malformed "
          f"corpus line(s) in {len(built.skipped_lines)} file(s) (listed "
          "above): fix them, or train anyway (training skips and counts "
          "them)", file=sys.stderr)
    return 2
  where = (f"{devices} device(s)" if not offline_tpu else
           f"{_TPU_CORES.value} TPU core(s) assumed (--tpu_cores); the TPU "
           "itself was not contacted")
  print(f"m4moe-train: config OK ({len(built.languages)} languages, "
        f"{where})")
  return 0


def _warn_skipped_lines(built) -> None:
  """Says how many malformed corpus lines training skips, and where, so a
  broken corpus is not trained on silently."""
  if not sum(built.skipped_lines.values()):
    return
  for path, count in built.skipped_lines.items():
    logging.warning("skipping %d malformed line(s) of %s", count, path)
  print(f"m4moe-train: skipping {sum(built.skipped_lines.values())} "
        "malformed corpus line(s): "
        + ", ".join(f"{path} ({count})"
                    for path, count in built.skipped_lines.items())
        + "; run with --check_config to list them", file=sys.stderr)


def _train(data, train, built, model_config, *, mesh, strategy, sharding,
           record: dict[str, Any], warm_start) -> int:
  """Trains (or resumes) the run; its exit code.

  Exit code 1 is a run directory that cannot be resumed or is in use
  (retrying will not help without the user acting); 2 a bad upcycling
  source.
  """
  from m4moe.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  from m4moe.moe import upcycle  # pylint: disable=g-import-not-at-top
  from m4moe.training import checkpointing  # pylint: disable=g-import-not-at-top
  from m4moe import run_lock  # pylint: disable=g-import-not-at-top
  try:
    result = train_lib.train(
        model_fn=lambda: model_lib.Transformer(config=model_config,
                                               sharding=sharding),
        train_dataset=built.train, dev_datasets=built.dev, config=train,
        model_config=model_config, strategy=strategy, sharding=sharding,
        run_sections={"data": data.to_dict(),
                      "languages": list(built.languages),
                      "mesh": str(mesh) if mesh else None, **record},
        warm_start=warm_start)
  except (checkpointing.ModelDirError, checkpointing.CheckpointError,
          run_lock.RunLockedError) as e:
    logging.error("%s", e)
    print(f"m4moe-train: {e}", file=sys.stderr)
    return 1
  except upcycle.UpcycleError as e:
    print(f"m4moe-train: {e}", file=sys.stderr)
    return 2
  print_result(result)
  return 0


def _set_up_devices() -> None:
  """Splits the host CPU (``--num_cpu_devices``) and enables determinism
  before TensorFlow creates its devices, which fixes both."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from m4moe.training import distribute  # pylint: disable=g-import-not-at-top
  if not _TPU.value:  # A TPU run does not split the host CPU.
    distribute.configure_cpu_devices(_NUM_CPU_DEVICES.value)
  if _DETERMINISTIC.value:
    tf.config.experimental.enable_op_determinism()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  from m4moe.parallel import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  try:
    mesh = mesh_lib.MeshShape.parse(_MESH.value) if _MESH.value else None
  except mesh_lib.MeshError as e:
    print(f"m4moe-train: {e}", file=sys.stderr)
    return 2
  _set_up_devices()
  try:
    data, train = _configs()
    problems, built, model_config = _inputs_and_model(data)
  except (ValueError, flags.ValidationError) as e:
    logging.error("%s", e)
    print(f"m4moe-train: {e}", file=sys.stderr)
    return 2
  offline_tpu = bool(_TPU.value) and _CHECK_CONFIG.value
  try:
    placement_problems, strategy, sharding, replicas = _placement(
        mesh, offline_tpu=offline_tpu)
  except mesh_lib.MeshError as e:
    print(f"m4moe-train: {e}; with --num_cpu_devices=N the CPU is split "
          "into N devices", file=sys.stderr)
    return 2
  more, record, warm_start = _preflight(
      data, train, built, model_config, mesh=mesh, replicas=replicas,
      dry=_CHECK_CONFIG.value or bool(problems + placement_problems))
  problems += placement_problems + more
  devices = mesh.size if mesh else replicas
  print(json.dumps({"model": model_config.to_dict(), "train": train.to_dict(),
                    "data": data.to_dict(), "devices": devices,
                    "mesh": str(mesh) if mesh else None},
                   indent=2, sort_keys=True))
  if problems:
    _report(problems)
    return 2
  if _CHECK_CONFIG.value:
    return _check_config_exit(built, devices=devices, offline_tpu=offline_tpu)
  _warn_skipped_lines(built)
  return _train(data, train, built, model_config, mesh=mesh,
                strategy=strategy, sharding=sharding, record=record,
                warm_start=warm_start)


def print_result(result) -> None:
  """Logs a finished run and prints its one-line JSON summary."""
  logging.info("Finished: %s", result)
  print(json.dumps({"step": result.step, "preempted": result.preempted,
                    "stopped_by": result.stopped_by,
                    "checkpoint": result.last_checkpoint,
                    "train_ce": result.train_ce, "dev_ce": result.dev_ce,
                    "nonfinite_skipped": result.nonfinite_skipped}))


def run():
  cli.run_tool(main, module=__name__)


if __name__ == "__main__":
  run()
