"""m4moe-bench: performance benchmarks, one JSON line per measurement.

Usage:
  m4moe-bench moe_layer [--experts=8,32,128] [--top_ks=1,2,8]
      [--dispatches=sorted,index,einsum] [--jit=on,off] [--model_dim=512]
      [--hidden_dim=2048] [--num_tokens=4096] [--group_size=1024]
      [--capacity_factor=1.25] [--matmul_size=2048] [--clock=wall|cpu]
      [--input_batches=1] [--parts] [--profile_dir=DIR [--profile_top=10]]
  m4moe-bench train_step [--batch_size=64] [--sequence_length=32]
  m4moe-bench loss [--batch_size=64] [--sequence_length=64]
      [--vocab_size=8000] [--model_dim=128] [--clock=wall|cpu]
  m4moe-bench loss_step [--batch_size=64] [--sequence_length=64]
      [--vocab_size=8000] [--step_configs=tiny/dense] [--clock=wall|cpu]
  m4moe-bench dropout_step [--batch_size=64] [--sequence_length=64]
      [--vocab_size=8000] [--step_configs=tiny/dense,tiny/moe]
      [--clock=wall|cpu]
  m4moe-bench recipe_step [--step_recipe=study3_screen]
      [--recipe_models=dense,moe_E64k8_every,moe_E32_every_lr4x] [--clock=wall|cpu]
      [--profile_dir=DIR [--profile_top=10]]
  m4moe-bench decode [--batch_size=32] [--beam_size=4]
      [--max_decode_length=64] [--source_length=16] [--vocab_size=8000]
      [--decode_configs=tiny/moe,tiny/dense]
  m4moe-bench input_pipeline [--corpus_dir=DIR --vocab_dir=DIR]
      [--batch_tokens=4096] [--batches_per_rep=20]
  m4moe-bench sharding [--sharding_devices=1,2,4,8]
      [--sharding_layouts=expert,data] [--experts_per_device=4]
      [--tokens_per_device=64] [--sequence_length=8] [--model_dim=32]
      [--num_heads=2] [--d_kv=16] [--hidden_dim=64] [--vocab_size=64]
  m4moe-bench peak_rss [--rss_interval=0.5] -- COMMAND [ARGS...]
  common: [--reps=R] [--warmup=W]

Every sub-benchmark times the cases it compares interleaved in one process
(a shared machine's speed drifts) and prints medians over R reps after W
warm-up calls, plus the ratios the comparison is about (``speed_vs_dense``
of the MoE layer, ``cached_speedup`` of decoding, ...; each module of
``m4moe/benchmarks`` documents its own).

``moe_layer --parts`` splits the layer's time: the router alone
(``router_*``) and the layer with its experts replaced by the identity
(``moe_<dispatch>_noexperts_*``: routing, dispatch and combine), each with
its ``share_of_layer`` of the whole layer, timed interleaved with it
(``m4moe/benchmarks/moe_layer.py``).

``loss`` and ``loss_step`` time the one-pass cross-entropy of
``m4moe.model.losses`` against the log-softmax formulation the trainer used
before, on the output layer alone and in the real trainer step
(``m4moe/benchmarks/loss.py``).

``dropout_step`` times the real trainer step with ``m4moe.model.layers.dropout``
(16-bit masks, two per uint32 Philox word) against the float32-uniform
masks it used before (``m4moe/benchmarks/dropout.py``).

``recipe_step`` times the real trainer step of a training recipe's models
as ``m4moe-run`` trains them (their zoo configs and extra flags, the zoo's
optimiser, packed batches of the recipe's shape and vocabularies); the
first model is the reference of every other's ``speed_vs_<first>``
(``m4moe/benchmarks/train_step.py``). A model may carry further flags,
``NAME+--flag=value``, for an A/B of one option. With ``--profile_dir`` each
model's step is then traced for R calls into ``DIR/<model>/`` and a
``recipe_step_profile`` line per model lists its slowest op types and, for
every model after the first, the op types that take the most time per
step beyond the reference's (``extra_vs_<first>``).

``peak_rss`` times nothing either: it runs COMMAND (everything after
``--``), echoes its output to stderr with the elapsed seconds and the
resident memory in front of each line, and prints one JSON line with the
command's exact peak RSS (``max_rss_kb``, from the kernel) and the time
and last output line of the largest sampled RSS, so a training run's
peak can be placed in its phase (``m4moe/benchmarks/peak_rss.py``). It
exits with 1 if the command failed (the JSON line is printed first).

``sharding`` times nothing: it measures the per-device memory of the real
sharded training step on D = 1, 2, 4, 8 virtual CPU devices with
E = 4*D experts and a fixed number of tokens per device, one process per D,
next to m4moe.cost.model's estimate (``m4moe/benchmarks/sharding.py``). Its
model size defaults to a tiny MoE (M = 32, 64 tokens per device);
``--model_dim``, ``--num_heads``, ``--d_kv``, ``--hidden_dim`` (dense FFN
and expert hidden), ``--vocab_size``, ``--tokens_per_device`` and
``--sequence_length`` change it.

With ``--profile_dir``, moe_layer then traces each case of each point (not
the matmul reference) for R calls with tf.profiler into
``DIR/<point>_<case>/`` (``tensorboard --logdir=DIR``) and prints one
``moe_layer_profile`` line per case: its trace, its slowest TF ops
(``ops``) and op types (``op_types``), ``--profile_top`` of each, then the
rest summed (see ``m4moe/benchmarks/profile.py``).
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from typing import TYPE_CHECKING, Any, Sequence

from absl import app
from absl import flags

from m4moe import cli

if TYPE_CHECKING:
  from m4moe.benchmarks import moe_layer

_REPS = flags.DEFINE_integer("reps", 3, "Timed repetitions per case.",
                             lower_bound=1)
_WARMUP = flags.DEFINE_integer("warmup", 1, "Untimed calls per case first.",
                               lower_bound=0)
_EXPERTS = flags.DEFINE_list("experts", ["32"], "moe_layer: E values.")
_TOP_KS = flags.DEFINE_list(
    "top_ks", ["2"], "moe_layer: k values (1: top1, 2: top2, more: the "
    "token-choice topk router of fine-grained MoEs).")
_DISPATCHES = flags.DEFINE_list(
    "dispatches", ["sorted", "index", "einsum"],
    "moe_layer: dispatch implementations (sorted is timed with --jit=off "
    "only: its per-expert row counts are dynamic, which XLA cannot compile).")
_JIT = flags.DEFINE_list("jit", ["on", "off"], "moe_layer: XLA on/off.")
_CLOCK = flags.DEFINE_enum(
    "clock", "wall", ["wall", "cpu"], "moe_layer, loss, loss_step, "
    "dropout_step: time wall-clock seconds, "
    "or the CPU seconds of this process (all threads), which other "
    "processes' load inflates less; each JSON line records it.")
_MODEL_DIM = flags.DEFINE_integer(
    "model_dim", 512, "moe_layer: M (loss: default 128; sharding: default 32).")
_HIDDEN_DIM = flags.DEFINE_integer(
    "hidden_dim", 2048, "moe_layer: H (sharding: dense FFN F and expert H, "
    "default 64).")
_NUM_TOKENS = flags.DEFINE_integer("num_tokens", 4096, "moe_layer: N.")
_GROUP_SIZE = flags.DEFINE_integer("group_size", 1024, "moe_layer: S.")
_CAPACITY_FACTOR = flags.DEFINE_float("capacity_factor", 1.25,
                                      "moe_layer: training capacity factor.")
_INPUT_BATCHES = flags.DEFINE_integer(
    "input_batches", 1, "moe_layer: the MoE cases cycle through this many "
    "random batches: 1 routes every call alike (the sorted path's "
    "per-expert row counts repeat), more gives each call a new routing, as "
    "in training.")
_MATMUL_SIZE = flags.DEFINE_integer(
    "matmul_size", 2048, "moe_layer: square matmul for the GFLOP/s reference "
    "(0: none).")
_PARTS = flags.DEFINE_bool(
    "parts", False, "moe_layer: also time the router alone and the layer "
    "with identity experts (routing + dispatch + combine), each as a share "
    "of the whole layer.")
_PROFILE_DIR = flags.DEFINE_string(
    "profile_dir", None, "moe_layer: after timing each point, trace each of "
    "its cases for --reps calls with tf.profiler into "
    "<profile_dir>/<point>_<case>/ and print their slowest ops and op types "
    "(recipe_step: each model into <profile_dir>/<model>/; default: no "
    "profiles).")
_PROFILE_TOP = flags.DEFINE_integer(
    "profile_top", 10, "--profile_dir: ops (and op types) listed per case, "
    "slowest first (the others are summed into one row).", lower_bound=0)
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", None, "train_step: rows (default 64); decode: sentences "
    "(default 32).")
_SEQUENCE_LENGTH = flags.DEFINE_integer(
    "sequence_length", 32, "train_step: tokens per row (each side; loss, "
    "loss_step, dropout_step: default 64; sharding: default 8).")
_BEAM_SIZE = flags.DEFINE_integer("beam_size", 4, "decode: beam.")
_MAX_DECODE_LENGTH = flags.DEFINE_integer("max_decode_length", 64,
                                          "decode: max target tokens.")
_SOURCE_LENGTH = flags.DEFINE_integer("source_length", 16,
                                      "decode: source tokens.")
_VOCAB_SIZE = flags.DEFINE_integer(
    "vocab_size", 8000, "decode, loss, loss_step, dropout_step: vocabulary "
    "of the random model (sharding: default 64).")
_DECODE_CONFIGS = flags.DEFINE_list(
    "decode_configs", ["tiny/moe", "tiny/dense"], "decode: zoo configs.")
_STEP_CONFIGS = flags.DEFINE_list(
    "step_configs", ["tiny/moe", "tiny/dense"],
    "train_step: the two zoo configs compared (first vs second); loss_step: "
    "the configs measured (default tiny/dense); dropout_step: the configs "
    "measured (default tiny/dense,tiny/moe).")
_STEP_RECIPE = flags.DEFINE_string(
    "step_recipe", "study3_screen", "recipe_step: packaged recipe name or .toml "
    "path whose models are timed.")
_RECIPE_MODELS = flags.DEFINE_list(
    "recipe_models", ["dense", "moe_E64k8_every", "moe_E32_every_lr4x"],
    "recipe_step: models of --step_recipe, the reference first; NAME+--flag=v "
    "adds flags to a model.")
_CORPUS_DIR = flags.DEFINE_string(
    "corpus_dir", None, "input_pipeline: built corpus (default: a synthetic "
    "fixture corpus in a temporary directory).")
_VOCAB_DIR = flags.DEFINE_string("vocab_dir", None,
                                 "input_pipeline: m4moe-vocab output.")
_BATCH_TOKENS = flags.DEFINE_integer("batch_tokens", 4096,
                                     "input_pipeline: tokens per batch side.")
_BATCHES_PER_REP = flags.DEFINE_integer(
    "batches_per_rep", 20, "input_pipeline: batches per timed repetition.")
_RSS_INTERVAL = flags.DEFINE_float(
    "rss_interval", 0.5, "peak_rss: seconds between two readings of the "
    "command's resident memory.", lower_bound=0.01)
_FIXTURE_PAIRS = flags.DEFINE_integer(
    "fixture_pairs", 2000, "input_pipeline: pairs of the largest fixture "
    "language.")

_SHARDING_DEVICES = flags.DEFINE_list(
    "sharding_devices", ["1", "2", "4", "8"],
    "sharding: mesh sizes D (virtual CPU devices; one process each).")
_SHARDING_LAYOUTS = flags.DEFINE_list(
    "sharding_layouts", ["expert"],
    "sharding: meshes: expert (expert:D, the experts split) and/or data "
    "(data:D, the batch split, experts replicated).")
_EXPERTS_PER_DEVICE = flags.DEFINE_integer(
    "experts_per_device", 4, "sharding: E / D.", lower_bound=1)
_TOKENS_PER_DEVICE = flags.DEFINE_integer(
    "tokens_per_device", 64, "sharding: source tokens per device (rows of "
    "--sequence_length tokens; one dispatch group per device).",
    lower_bound=1)
_NUM_HEADS = flags.DEFINE_integer("num_heads", 2,
                                  "sharding: attention heads A.")
_D_KV = flags.DEFINE_integer("d_kv", 16, "sharding: key/value width per "
                             "head.")

# The sub-benchmarks that take --clock=cpu.
CLOCKED = ("moe_layer", "loss", "loss_step", "dropout_step", "recipe_step")
BENCHMARKS = ("moe_layer", "train_step", "loss", "loss_step", "dropout_step",
              "recipe_step", "decode", "input_pipeline", "sharding",
              "peak_rss")
# The sub-benchmarks that take --profile_dir.
PROFILED = ("moe_layer", "recipe_step")


def _jits() -> tuple[bool, ...]:
  bad = [v for v in _JIT.value if v not in ("on", "off")]
  if bad:
    raise app.UsageError(f"--jit={','.join(_JIT.value)}: use on and/or off")
  return tuple(v == "on" for v in _JIT.value)


def _point_name(point: moe_layer.LayerPoint) -> str:
  """A directory name for a moe_layer.LayerPoint, e.g. E32_K2_M512_..."""
  return (f"E{point.num_experts}_K{point.top_k}_M{point.model_dim}_"
          f"H{point.hidden_dim}_N{point.num_tokens}_S{point.group_size}_"
          f"cf{point.capacity_factor:g}")


def _profile_point(point: moe_layer.LayerPoint, *,
                   profile_dir: pathlib.Path) -> None:
  """Traces each case of ``point``; one moe_layer_profile line per case."""
  from m4moe.benchmarks import moe_layer  # pylint: disable=g-import-not-at-top
  from m4moe.benchmarks import profile  # pylint: disable=g-import-not-at-top
  from m4moe.benchmarks import timing  # pylint: disable=g-import-not-at-top
  calls = moe_layer.cases(point, dispatches=tuple(_DISPATCHES.value),
                          jits=_jits(), matmul_size=0, parts=_PARTS.value)
  for case, fn in calls.items():
    trace = profile.profile_call(
        fn, logdir=profile_dir / f"{_point_name(point)}_{case}",
        reps=_REPS.value)
    timing.emit({"benchmark": "moe_layer_profile",
                 **dataclasses.asdict(point), "case": case,
                 "reps": _REPS.value, "trace": str(trace),
                 "ops": profile.op_table(trace, top=_PROFILE_TOP.value),
                 "op_types": profile.op_table(trace, top=_PROFILE_TOP.value,
                                              by="op_type")})


def _positive_ints(holder: flags.FlagHolder[list[str]], *,
                   example: str) -> list[int]:
  """The integers of a list flag, or a usage error naming the flag."""
  given = ",".join(holder.value)
  try:
    values = [int(v) for v in holder.value]
  except ValueError:
    values = []
  if not values or min(values) < 1:
    raise app.UsageError(f"--{holder.name}={given}: give positive integers "
                         f"separated by commas, e.g. {example}")
  return values


def _moe_layer() -> None:
  from m4moe import config as config_lib  # pylint: disable=g-import-not-at-top
  from m4moe.benchmarks import moe_layer  # pylint: disable=g-import-not-at-top
  from m4moe.benchmarks import timing  # pylint: disable=g-import-not-at-top
  unknown = [d for d in _DISPATCHES.value
             if d not in config_lib.DISPATCH_IMPLEMENTATIONS]
  if unknown:
    raise app.UsageError(
        f"--dispatches: unknown {', '.join(unknown)}; use any of "
        f"{','.join(config_lib.DISPATCH_IMPLEMENTATIONS)}")
  for e in _positive_ints(_EXPERTS, example="8,32,128"):
    for k in _positive_ints(_TOP_KS, example="1,2,8"):
      try:
        point = moe_layer.LayerPoint(
            num_experts=e, top_k=k, model_dim=_MODEL_DIM.value,
            hidden_dim=_HIDDEN_DIM.value, num_tokens=_NUM_TOKENS.value,
            group_size=_GROUP_SIZE.value,
            capacity_factor=_CAPACITY_FACTOR.value,
            input_batches=_INPUT_BATCHES.value)
      except ValueError as error:
        raise app.UsageError(str(error)) from None
      for record in moe_layer.run_point(
          point, dispatches=tuple(_DISPATCHES.value), jits=_jits(),
          reps=_REPS.value, warmup=_WARMUP.value,
          matmul_size=_MATMUL_SIZE.value, clock=_CLOCK.value,
          parts=_PARTS.value):
        timing.emit(record)
      if _PROFILE_DIR.value:
        _profile_point(point, profile_dir=pathlib.Path(_PROFILE_DIR.value))


def _train_step() -> None:
  from m4moe.benchmarks import timing  # pylint: disable=g-import-not-at-top
  from m4moe.benchmarks import train_step  # pylint: disable=g-import-not-at-top
  point = train_step.StepPoint(batch_size=_BATCH_SIZE.value or 64,
                               length=_SEQUENCE_LENGTH.value)
  if len(_STEP_CONFIGS.value) != 2:
    raise app.UsageError("--step_configs takes exactly two configs")
  for record in train_step.run(point, configs=tuple(_STEP_CONFIGS.value),
                               reps=_REPS.value, warmup=_WARMUP.value):
    timing.emit(record)


def _given(flag: flags.FlagHolder, default: int) -> int:
  """``flag``'s value if given on the command line, else ``default``."""
  return flag.value if flag.present else default


def _loss() -> None:
  from m4moe.benchmarks import loss  # pylint: disable=g-import-not-at-top
  from m4moe.benchmarks import timing  # pylint: disable=g-import-not-at-top
  point = loss.LossPoint(batch_size=_BATCH_SIZE.value or 64,
                         length=_given(_SEQUENCE_LENGTH, 64),
                         model_dim=_given(_MODEL_DIM, 128),
                         vocab_size=_VOCAB_SIZE.value)
  for record in loss.run_layer(point, reps=_REPS.value, warmup=_WARMUP.value,
                               clock=_CLOCK.value):
    timing.emit(record)


def _loss_step() -> None:
  from m4moe.benchmarks import loss  # pylint: disable=g-import-not-at-top
  from m4moe.benchmarks import timing  # pylint: disable=g-import-not-at-top
  from m4moe.benchmarks import train_step  # pylint: disable=g-import-not-at-top
  point = train_step.StepPoint(batch_size=_BATCH_SIZE.value or 64,
                               length=_given(_SEQUENCE_LENGTH, 64),
                               vocab_size=_VOCAB_SIZE.value)
  configs = _STEP_CONFIGS.value if _STEP_CONFIGS.present else ["tiny/dense"]
  for config in configs:
    for record in loss.run_step(point, config=config, reps=_REPS.value,
                                warmup=_WARMUP.value, clock=_CLOCK.value):
      timing.emit(record)


def _dropout_step() -> None:
  from m4moe.benchmarks import dropout  # pylint: disable=g-import-not-at-top
  from m4moe.benchmarks import timing  # pylint: disable=g-import-not-at-top
  from m4moe.benchmarks import train_step  # pylint: disable=g-import-not-at-top
  point = train_step.StepPoint(batch_size=_BATCH_SIZE.value or 64,
                               length=_given(_SEQUENCE_LENGTH, 64),
                               vocab_size=_VOCAB_SIZE.value)
  configs = (_STEP_CONFIGS.value if _STEP_CONFIGS.present
             else ["tiny/dense", "tiny/moe"])
  for config in configs:
    for record in dropout.run_step(point, config=config, reps=_REPS.value,
                                   warmup=_WARMUP.value, clock=_CLOCK.value):
      timing.emit(record)


def _recipe_step() -> None:
  from m4moe.benchmarks import timing  # pylint: disable=g-import-not-at-top
  from m4moe.benchmarks import train_step  # pylint: disable=g-import-not-at-top
  from m4moe.pipeline import recipes  # pylint: disable=g-import-not-at-top
  try:
    recipe = recipes.load_recipe(_STEP_RECIPE.value)
    train_step.recipe_models(recipe, _RECIPE_MODELS.value)
  except (recipes.RecipeError, ValueError) as e:
    # The loader speaks of m4moe-run's --recipe; here the flag is another.
    raise app.UsageError(
        str(e).replace("--recipe=", "--step_recipe=", 1)) from None
  for record in train_step.run_recipe(
      recipe, specs=_RECIPE_MODELS.value, reps=_REPS.value,
      warmup=_WARMUP.value, clock=_CLOCK.value):
    timing.emit(record)
  if _PROFILE_DIR.value:
    _profile_recipe(recipe, profile_dir=pathlib.Path(_PROFILE_DIR.value))


def _profile_recipe(recipe: Any, *, profile_dir: pathlib.Path) -> None:
  """Traces each model's step; one recipe_step_profile line per model."""
  from m4moe.benchmarks import profile  # pylint: disable=g-import-not-at-top
  from m4moe.benchmarks import timing  # pylint: disable=g-import-not-at-top
  from m4moe.benchmarks import train_step  # pylint: disable=g-import-not-at-top
  specs = _RECIPE_MODELS.value
  _, cases = train_step.recipe_cases(recipe, specs)
  traces = {spec: profile.profile_call(
      fn, logdir=profile_dir / spec.replace("/", "_"), reps=_REPS.value)
            for spec, fn in cases.items()}
  top = _PROFILE_TOP.value
  for spec, trace in traces.items():
    record = {"benchmark": "recipe_step_profile", "recipe": recipe.name,
              "model": spec, "reps": _REPS.value, "trace": str(trace),
              "op_types": profile.op_table(trace, top=top, by="op_type")}
    if spec != specs[0]:
      record[f"extra_vs_{specs[0]}"] = profile.extra_table(
          trace, traces[specs[0]], top=top, calls=_REPS.value)
    timing.emit(record)


def _decode() -> None:
  from m4moe.benchmarks import decode  # pylint: disable=g-import-not-at-top
  from m4moe.benchmarks import timing  # pylint: disable=g-import-not-at-top
  point = decode.DecodePoint(
      batch_size=_BATCH_SIZE.value or 32, beam_size=_BEAM_SIZE.value,
      max_decode_length=_MAX_DECODE_LENGTH.value,
      source_length=_SOURCE_LENGTH.value, vocab_size=_VOCAB_SIZE.value)
  for record in decode.run(point, configs=tuple(_DECODE_CONFIGS.value),
                           reps=_REPS.value, warmup=_WARMUP.value):
    timing.emit(record)


def _input_pipeline() -> None:
  from m4moe.benchmarks import input_pipeline  # pylint: disable=g-import-not-at-top
  from m4moe.benchmarks import timing  # pylint: disable=g-import-not-at-top
  if (_CORPUS_DIR.value is None) != (_VOCAB_DIR.value is None):
    raise app.UsageError("give both --corpus_dir and --vocab_dir, or neither")
  point = input_pipeline.PipelinePoint(
      batch_size_tokens=_BATCH_TOKENS.value,
      batches_per_rep=_BATCHES_PER_REP.value,
      fixture_pairs=_FIXTURE_PAIRS.value)
  corpus = pathlib.Path(_CORPUS_DIR.value) if _CORPUS_DIR.value else None
  vocab = pathlib.Path(_VOCAB_DIR.value) if _VOCAB_DIR.value else None
  for record in input_pipeline.run(point, corpus_dir=corpus, vocab_dir=vocab,
                                   reps=_REPS.value):
    timing.emit(record)


def _sharding() -> None:
  from m4moe.benchmarks import sharding  # pylint: disable=g-import-not-at-top
  from m4moe.benchmarks import timing  # pylint: disable=g-import-not-at-top
  devices = _positive_ints(_SHARDING_DEVICES, example="1,2,4,8")
  try:
    points = [sharding.ShardingPoint(
        devices=d, layout=layout, experts_per_device=_EXPERTS_PER_DEVICE.value,
        tokens_per_device=_TOKENS_PER_DEVICE.value,
        sequence_length=_given(_SEQUENCE_LENGTH, 8),
        d_model=_given(_MODEL_DIM, 32), num_heads=_NUM_HEADS.value,
        d_kv=_D_KV.value, d_ff=_given(_HIDDEN_DIM, 64),
        expert_hidden_dim=_given(_HIDDEN_DIM, 64),
        vocab_size=_given(_VOCAB_SIZE, 64))
              for layout in _SHARDING_LAYOUTS.value for d in devices]
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  for point in points:
    try:
      record = sharding.measure_in_subprocess(point)
    except RuntimeError as e:
      print(f"m4moe-bench: {e}", file=sys.stderr)
      sys.exit(1)
    timing.emit(record)


def _peak_rss(command: Sequence[str]) -> None:
  from m4moe.benchmarks import peak_rss  # pylint: disable=g-import-not-at-top
  from m4moe.benchmarks import timing  # pylint: disable=g-import-not-at-top
  if not command:
    raise app.UsageError("peak_rss needs the command to measure after --, "
                         "e.g. m4moe-bench peak_rss -- m4moe-train ...")
  try:
    record = peak_rss.measure(command, interval=_RSS_INTERVAL.value,
                              echo=sys.stderr)
  except OSError as e:
    raise app.UsageError(f"peak_rss: cannot run {command[0]!r}: "
                         f"{e.strerror or e}") from None
  timing.emit(record)
  if record["returncode"] != 0:
    print(f"m4moe-bench: the measured command exited with "
          f"{record['returncode']}", file=sys.stderr)
    sys.exit(1)


def main(argv: Sequence[str]) -> None:
  if len(argv) < 2 or argv[1] not in BENCHMARKS or (
      len(argv) != 2 and argv[1] != "peak_rss"):
    raise app.UsageError(
        f"usage: m4moe-bench <{'|'.join(BENCHMARKS)}> [flags]; got "
        f"{' '.join(argv[1:]) or 'nothing'}")
  if _PROFILE_DIR.value and argv[1] not in PROFILED:
    raise app.UsageError(f"--profile_dir profiles {', '.join(PROFILED)} "
                         f"only, not {argv[1]}: drop the flag")
  if _PARTS.value and argv[1] != "moe_layer":
    raise app.UsageError(f"--parts splits the moe_layer benchmark only, not "
                         f"{argv[1]}: drop the flag")
  if _CLOCK.value != "wall" and argv[1] not in CLOCKED:
    raise app.UsageError(f"--clock={_CLOCK.value} times {', '.join(CLOCKED)} "
                         f"only; {argv[1]} times wall-clock seconds: drop "
                         "the flag")
  if argv[1] == "peak_rss":
    _peak_rss(argv[2:])
    return
  {"moe_layer": _moe_layer, "train_step": _train_step, "loss": _loss,
   "loss_step": _loss_step, "dropout_step": _dropout_step,
   "recipe_step": _recipe_step, "decode": _decode,
   "input_pipeline": _input_pipeline, "sharding": _sharding}[argv[1]]()


def run() -> None:
  cli.run_tool(main, module=__name__)


if __name__ == "__main__":
  run()
