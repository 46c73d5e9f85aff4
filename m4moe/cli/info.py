"""m4moe-info: parameter, expert and FLOP counts of a zoo config.

Usage:
  m4moe-info --flagfile=configs/gshard/moe_2048e_36l.flags [--json]
  m4moe-info --config=gshard/moe_2048e_36l [--json]
  m4moe-info --config=tiny/moe --batch_tokens=4096 --mesh=data:2,expert:8
  m4moe-info --config=tiny/moe --batch_tokens=4096 \
      --mesh=data:2,expert:2,model:2
  m4moe-info --table1 [--tokens_per_device=2048] [--sequence_length=N] [--json]

Counts come from :mod:`m4moe.cost.model` through :mod:`m4moe.cost.tables` (this
tool only parses flags and prints) and never build a variable, so the 1T
model is instant. With ``--batch_tokens`` a per-device memory/FLOPs estimate
for a (data, expert, model) mesh is added: the batch is split over data x
expert, experts over expert, and attention heads, d_ff and the expert hidden
width over model (Megatron-style tensor parallelism). ``device`` counts the
activations a compiled (XLA/TPU) program keeps; ``device_unfused`` those
TensorFlow keeps running the step kernel by kernel (eager, DTensor without
XLA; ``m4moe/cost/unfused.py``, the figure ``m4moe-bench sharding``
measures), or says why its table does not describe the config. For GShard Table 1 configurations the
paper's rounded weight count and the relative difference are shown too.

``--table1`` prints the paper's section 5 memory claim for the zoo's GShard
Table 1 rows instead: each MoE(E, L) on E devices (mesh expert:E, one expert
of every MoE layer and one dispatch group per device), per-device replicated
weights, expert weights, gradients, Adafactor slots, activations, total bytes
and training FLOPs per step, then per depth the 2048E / 128E ratios.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Any, Sequence

from absl import app
from absl import flags

from m4moe import cli
from m4moe import config as config_lib
from m4moe.cost import tables as cost_tables
from m4moe.parallel import mesh as mesh_lib

config_lib.define_model_flags()
_CONFIG = flags.DEFINE_string(
    "config", None,
    "Zoo entry (e.g. tiny/moe, gshard/moe_2048e_36l) or flagfile path; "
    "alternative to --flagfile. Model flags given on the command line "
    "override the entry's values (e.g. --config=tiny/moe --num_experts=32).")
_JSON = flags.DEFINE_bool("json", False, "Print JSON instead of a table.")
_SEQUENCE_LENGTH = flags.DEFINE_integer(
    "sequence_length", 0, "Source and target length for the attention FLOPs "
    "and the activation estimate; 0 uses --max_length.")
_BATCH_TOKENS = flags.DEFINE_integer(
    "batch_tokens", 0, "Source tokens per global batch for the per-device "
    "estimate; 0 skips the estimate.")
_MESH = flags.DEFINE_string(
    "mesh", "data:1", "Device mesh for the per-device estimate, e.g. "
    "data:2,expert:4,model:2 (the expert axis size must divide "
    "--num_experts; the model axis size must divide --num_heads, --d_ff and "
    "--expert_hidden_dim).")
_TABLE1 = flags.DEFINE_bool(
    "table1", False, "Print per-device memory and FLOPs for every GShard "
    "Table 1 zoo row on as many devices as it has experts (mesh expert:E), "
    "with the 2048E / 128E ratios per depth (paper section 5). Ignores "
    "--config/--flagfile model flags; --mesh and --batch_tokens do not apply.")
_TOKENS_PER_DEVICE = flags.DEFINE_integer(
    "tokens_per_device", 0, "With --table1: source tokens per device and "
    "step (one dispatch group); 0 uses each config's --group_size, i.e. the "
    "paper's Table 3 batch / cores (8192 for 128E, 2048 for 512E and 2048E).")
_SHARE_TARGET_EMBEDDING = flags.DEFINE_bool(
    "share_target_embedding", False, "Count the Transformer with the target "
    "embedding tied to the softmax weights (default: untied projection).")

_GIB = 2**30


def format_table1(info: dict[str, Any]) -> str:
  """The ``--table1`` dict as a text table plus ratio lines."""
  columns = (("model", "model", "s"), ("devices", "devices", "d"),
             ("tok/dev", "tokens_per_device", "d"),
             ("replicated", "replicated_bytes", "g"),
             ("experts", "expert_bytes", "g"),
             ("grads", "gradient_bytes", "g"),
             ("adafactor", "optimizer_bytes", "g"),
             ("activations", "activation_bytes", "g"),
             ("total", "total_bytes", "g"),
             ("TFLOP/step", "train_flops", "t"))

  def cell(row: dict[str, Any], key: str, kind: str) -> str:
    value = row[key]
    if kind == "g":
      return f"{value / _GIB:.3f}"
    if kind == "t":
      return f"{value / 1e12:.2f}"
    return str(value)

  table = [[title for title, _, _ in columns]]
  table += [[cell(row, key, kind) for _, key, kind in columns]
            for row in info["rows"]]
  widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
  lines = [
      "GShard section 5: per-device memory (GiB, float32 weights, gradients "
      "and Adafactor slots; activations without rematerialisation) and "
      "training FLOPs per step, MoE(E, L) on E devices (mesh expert:E); "
      "sequence length " + "/".join(
          str(length) for length in sorted({row["seq_len"]
                                            for row in info["rows"]})) +
      " (source = target)",
  ]
  for i, line in enumerate(table):
    lines.append("  ".join(value.ljust(widths[j]) if j == 0 else
                           value.rjust(widths[j]) for j, value in
                           enumerate(line)))
    if i == 0:
      lines.append("  ".join("-" * width for width in widths))
  per_depth = {row["model"].split(", ")[1][:-1]:
               (row["experts_per_device"], row["params_per_expert"])
               for row in info["rows"]}
  lines.append("experts = experts/device (E/E = 1 per MoE layer) x "
               "params/expert (2 M H) x 4 bytes: " + ", ".join(
                   f"{layers} {count} x {params:,} x 4"
                   for layers, (count, params) in per_depth.items()))
  rows = {row["model"]: row for row in info["rows"]}
  for layers, ratio in info["ratios"].items():
    lines.append(
        f"{layers} 2048E / 128E: model weights x{ratio['num_params']:.2f}, "
        f"tokens/device x{ratio['tokens_per_device']:.2f}, "
        f"weights+grads+slots x{ratio['state_bytes']:.3f}, "
        f"activations x{ratio['activation_bytes']:.3f}, "
        f"total x{ratio['total_bytes']:.3f}, "
        f"FLOPs x{ratio['train_flops']:.3f}")
    lines.append(cost_tables.verdict(
        layers=layers, ratio=ratio, large_row=rows[f"MoE(2048E, {layers})"],
        small_row=rows[f"MoE(128E, {layers})"]))
  return "\n".join(lines)


def _number(value: float) -> str:
  """``1,234,567  (1.235M)``; small numbers without the suffix."""
  for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
    if abs(value) >= scale:
      return f"{value:,.0f}  ({value / scale:.3f}{unit})"
  return f"{value:,.0f}"


def _rows(info: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
  rows = []
  for key, value in info.items():
    if isinstance(value, dict):
      rows += _rows(value, prefix=f"{prefix}{key}.")
    elif value is None:
      continue
    elif key == "weights_vs_paper":
      rows.append((prefix + key, f"{value:+.2%}"))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
      rows.append((prefix + key, _number(value)))
    else:
      rows.append((prefix + key, str(value)))
  return rows


def format_table(info: dict[str, Any]) -> str:
  rows = _rows(info)
  width = max(len(name) for name, _ in rows)
  return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _flagfiles(argv: Sequence[str]) -> list[str]:
  """The ``--flagfile=`` values on a command line (absl keeps no record)."""
  return [a.split("=", 1)[1] for a in argv[1:]
          if a.startswith(("--flagfile=", "-flagfile="))]


def _load_config(argv: Sequence[str]) -> tuple[config_lib.ModelConfig, str]:
  """The config from --config, else from the parsed flags (and flagfiles).

  Raises:
    ConfigError: naming the file that holds the bad value.
  """
  if _CONFIG.value:
    source = str(config_lib.resolve_config_path(_CONFIG.value))
    load = functools.partial(config_lib.load_model_config, source,
                             config_lib.present_model_flags(flags.FLAGS))
  else:
    source = ", ".join(_flagfiles(argv)) or "command-line flags"
    load = functools.partial(config_lib.model_config_from_flags, flags.FLAGS)
  try:
    return load(), source
  except config_lib.ConfigError as e:
    if source in str(e):
      raise
    raise config_lib.ConfigError(f"{source}: {e}") from e


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if _TABLE1.value:
    _main_table1()
    return
  try:
    config, source = _load_config(sys.argv)
    info = cost_tables.collect(
        config, source=source, sequence_length=_SEQUENCE_LENGTH.value,
        batch_tokens=_BATCH_TOKENS.value,
        mesh=mesh_lib.MeshShape.parse(_MESH.value),
        share_target_embedding=_SHARE_TARGET_EMBEDDING.value)
  except (config_lib.ConfigError, ValueError) as e:
    print(f"m4moe-info: error: {e}", file=sys.stderr)
    sys.exit(1)
  print(json.dumps(info, indent=2) if _JSON.value else format_table(info))


def _main_table1() -> None:
  try:
    if _BATCH_TOKENS.value or _MESH.value != _MESH.default:
      raise ValueError("--table1 fixes the mesh (expert:E) and the batch "
                       "(E x tokens per device); drop --mesh/--batch_tokens "
                       "and use --tokens_per_device")
    info = cost_tables.table1(tokens_per_device=_TOKENS_PER_DEVICE.value,
                              sequence_length=_SEQUENCE_LENGTH.value)
  except (config_lib.ConfigError, ValueError) as e:
    print(f"m4moe-info: error: {e}", file=sys.stderr)
    sys.exit(1)
  print(json.dumps(info, indent=2) if _JSON.value else format_table1(info))


def _parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing that names the flagfile(s) when parsing fails."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    files = _flagfiles(argv)
    where = f" in flagfile {', '.join(files)}" if files else ""
    print(f"m4moe-info: error{where}: {e}", file=sys.stderr)
    sys.exit(1)


def run() -> None:
  cli.run_tool(main, module=__name__, flags_parser=_parse_flags)


if __name__ == "__main__":
  run()
