"""m4moe-info: parameter, expert and FLOP counts of a zoo config.

Usage:
  m4moe-info --flagfile=configs/gshard/moe_2048e_36l.flags [--json]
  m4moe-info --config=gshard/moe_2048e_36l [--json]
  m4moe-info --config=tiny/moe --batch_tokens=4096 --mesh=data:2,expert:8

Counts come from :mod:`m4moe.cost` and never build a variable, so the 1T
model is instant. With ``--batch_tokens`` a per-device memory/FLOPs estimate
for a (data, expert) mesh is added. For GShard Table 1 configurations the
paper's rounded weight count and the relative difference are shown too.
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
    "alternative to --flagfile. Model flags given on the command line after "
    "it are ignored: use --flagfile to combine a file with overrides.")
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
    load = functools.partial(config_lib.load_model_config, source)
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
