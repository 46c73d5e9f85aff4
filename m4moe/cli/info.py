"""m4moe-info: parameter, expert and FLOP counts of a zoo config.

Usage:
  m4moe-info --flagfile=configs/gshard/moe_2048e_36l.flags [--json]
  m4moe-info --config=gshard/moe_2048e_36l [--json]
  m4moe-info --config=tiny/moe --batch_tokens=4096 --mesh=data:2,expert:8
  m4moe-info --table1 [--tokens_per_device=2048] [--seq_len=N] [--json]

Counts come from :mod:`m4moe.cost` and never build a variable, so the 1T
model is instant. With ``--batch_tokens`` a per-device memory/FLOPs estimate
for a (data, expert) mesh is added. For GShard Table 1 configurations the
paper's rounded weight count and the relative difference are shown too.

``--table1`` prints the paper's section 5 memory claim for the zoo's GShard
Table 1 rows instead: each MoE(E, L) on E devices (mesh expert:E, one expert
of every MoE layer and one dispatch group per device), per-device replicated
weights, expert weights, gradients, Adafactor slots, activations, total bytes
and training FLOPs per step, then per depth the 2048E / 128E ratios.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from typing import Any, Sequence

from absl import app
from absl import flags

from m4moe import config as config_lib
from m4moe import cost
from m4moe import mesh as mesh_lib

config_lib.define_model_flags()
_CONFIG = flags.DEFINE_string(
    "config", None,
    "Zoo entry (e.g. tiny/moe, gshard/moe_2048e_36l) or flagfile path; "
    "alternative to --flagfile. Model flags given on the command line "
    "override the entry's values (e.g. --config=tiny/moe --num_experts=32).")
_JSON = flags.DEFINE_bool("json", False, "Print JSON instead of a table.")
_SEQ_LEN = flags.DEFINE_integer(
    "seq_len", 0, "Source and target length for the attention FLOPs and the "
    "activation estimate; 0 uses --max_length.")
_BATCH_TOKENS = flags.DEFINE_integer(
    "batch_tokens", 0, "Source tokens per global batch for the per-device "
    "estimate; 0 skips the estimate.")
_MESH = flags.DEFINE_string(
    "mesh", "data:1", "Device mesh for the per-device estimate, e.g. "
    "data:2,expert:4 (the expert axis size must divide --num_experts).")
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

# GShard Table 1 (E, L) -> (total experts, weights as the paper rounds them).
PAPER_TABLE1: dict[tuple[int, int], tuple[int, float]] = {
    (2048, 36): (36_864, 600e9), (2048, 12): (12_288, 200e9),
    (512, 36): (9_216, 150e9), (512, 12): (3_072, 50e9),
    (128, 36): (2_304, 37e9), (128, 12): (768, 12.5e9),
    (2048, 60): (61_440, 1e12),
}


# Zoo rows of Table 1, grouped by depth, smallest E first.
TABLE1_CONFIGS = ("gshard/moe_128e_12l", "gshard/moe_512e_12l",
                  "gshard/moe_2048e_12l", "gshard/moe_128e_36l",
                  "gshard/moe_512e_36l", "gshard/moe_2048e_36l",
                  "gshard/moe_2048e_60l")
_GIB = 2**30
# "roughly constant": per-device memory within this factor either way.
_ROUGHLY_CONSTANT = 1.25


def table1(*, tokens_per_device: int = 0, seq_len: int = 0,
           names: Sequence[str] = TABLE1_CONFIGS) -> dict[str, Any]:
  """The ``--table1`` report as a JSON-ready dict.

  Args:
    tokens_per_device: S per device; 0 keeps each config's group size.
    seq_len: source = target length; 0 uses each config's --max_length.
    names: zoo entries, one row each.

  Returns:
    ``rows`` (one per name, bytes and FLOPs per device) and ``ratios``
    (per depth L with both a 128E and a 2048E row: 2048E / 128E).
  """
  configs = [config_lib.load_model_config(name) for name in names]
  rows = [cost.expert_scaling_row(name, config,
                                  tokens_per_device=tokens_per_device or None,
                                  sequence_length=seq_len or None)
          for name, config in zip(names, configs)]
  by_key = {(row.num_experts, row.num_layers): row for row in rows}
  ratios = {}
  for layers in sorted({row.num_layers for row in rows}):
    if (128, layers) in by_key and (2048, layers) in by_key:
      ratios[f"{layers}L"] = cost.scaling_ratios(by_key[128, layers],
                                                 by_key[2048, layers])
  return {
      "mesh": "expert:E (one device per expert, one dispatch group each)",
      "tokens_per_device": tokens_per_device or "config group_size",
      "rows": [{
          "config": row.name,
          "model": f"MoE({row.num_experts}E, {row.num_layers}L)",
          "devices": row.device.num_devices,
          "tokens_per_device": row.device.tokens_per_device,
          "seq_len": seq_len or config.max_length,
          "num_params": row.num_params,
          "params_per_expert": row.params_per_expert,
          "experts_per_device": row.experts_per_device,
          "replicated_bytes": row.replicated_bytes,
          "expert_bytes": row.expert_bytes,
          "gradient_bytes": row.device.gradient_bytes,
          "optimizer_bytes": row.device.optimizer_bytes,
          "activation_bytes": row.device.activation_bytes,
          "state_bytes": row.state_bytes,
          "total_bytes": row.device.total_bytes,
          "train_flops": row.device.train_flops,
      } for row, config in zip(rows, configs)],
      "ratios": ratios,
  }


def _verdict(layers: str, ratio: dict[str, float], large_row: dict[str, Any],
             small_row: dict[str, Any]) -> str:
  """One sentence saying whether the numbers show a constant memory."""
  total = ratio["total_bytes"]
  share = large_row["activation_bytes"] / large_row["total_bytes"]
  if 1 / _ROUGHLY_CONSTANT <= total <= _ROUGHLY_CONSTANT:
    return (f"  {layers}: roughly constant (x{total:.3f} for a "
            f"x{ratio['num_params']:.1f} model); activations are "
            f"{share:.0%} of the 2048E total")
  return (f"  {layers}: NOT constant (x{total:.3f}): tokens per device differ "
          f"({small_row['tokens_per_device']} on 128E vs "
          f"{large_row['tokens_per_device']} on 2048E) and activations, "
          f"{share:.0%} of the 2048E total, scale with them; "
          "--tokens_per_device=2048 holds them fixed as section 5 assumes")


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
    lines.append(_verdict(layers, ratio, rows[f"MoE(2048E, {layers})"],
                          rows[f"MoE(128E, {layers})"]))
  return "\n".join(lines)


def _paper_row(config: config_lib.ModelConfig,
               model_cost: cost.ModelCost) -> dict[str, Any] | None:
  """The Table 1 comparison if ``config`` has the paper's dimensions."""
  key = (config.moe.num_experts, config.num_layers)
  if (key not in PAPER_TABLE1 or config.d_model != 1024 or
      config.moe.expert_hidden_dim != 8192):
    return None
  experts, weights = PAPER_TABLE1[key]
  return {
      "model": f"MoE({key[0]}E, {key[1]}L)",
      "paper_total_experts": experts,
      "paper_weights": weights,
      "weights_vs_paper": model_cost.num_params / weights - 1.0,
  }


def collect(config: config_lib.ModelConfig, *, source: str, seq_len: int = 0,
            batch_tokens: int = 0, mesh: mesh_lib.MeshShape | None = None,
            share_target_embedding: bool = False) -> dict[str, Any]:
  """Everything m4moe-info reports, as a JSON-ready dict.

  Raises:
    ValueError: the mesh has a ``model`` axis (not estimated) or does not
      fit the config (see :func:`m4moe.cost.estimate_device`).
  """
  model_cost = cost.model_cost(config, source_length=seq_len or None,
                               target_length=seq_len or None,
                               share_target_embedding=share_target_embedding)
  flops = model_cost.flops
  info: dict[str, Any] = {
      "config": source,
      "num_params": model_cost.num_params,
      "num_moe_layers": model_cost.num_moe_layers,
      "num_experts_total": model_cost.num_experts_total,
      "params_per_expert": model_cost.params_per_expert,
      "expert_params": model_cost.expert_params,
      "active_params_per_token": model_cost.active_params_per_token,
      "flops_per_token": model_cost.flops_per_token,
      "train_flops_per_token": flops.train,
      "flops": {**dataclasses.asdict(flops), "forward": flops.forward},
      "params": {**dataclasses.asdict(model_cost.params),
                 "non_expert": model_cost.params.non_expert},
      "paper": _paper_row(config, model_cost),
  }
  if batch_tokens:
    mesh = mesh or mesh_lib.MeshShape.single_device()
    if mesh.axis_size("model") != 1:
      raise ValueError(f"--mesh={mesh}: the estimate covers data and expert "
                       "axes only; drop the model axis")
    device = cost.estimate_device(
        config, data_axis=mesh.axis_size("data"),
        expert_axis=mesh.axis_size("expert"), batch_tokens=batch_tokens,
        sequence_length=seq_len or None,
        share_target_embedding=share_target_embedding)
    info["mesh"] = str(mesh)
    info["device"] = {**dataclasses.asdict(device),
                      "num_devices": device.num_devices,
                      "params_per_device": device.params_per_device,
                      "total_bytes": device.total_bytes}
  return info


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
    info = collect(config, source=source, seq_len=_SEQ_LEN.value,
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
    info = table1(tokens_per_device=_TOKENS_PER_DEVICE.value,
                  seq_len=_SEQ_LEN.value)
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
  app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
  run()
