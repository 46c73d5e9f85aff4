"""Cost tables of the model zoo: what ``m4moe-info`` reports.

:func:`collect` gathers the counts of :mod:`m4moe.cost.model` for one config
(parameters, experts, FLOPs, the per-device estimate on a (data, expert,
model) mesh, for a compiled program and, where :mod:`m4moe.cost.unfused`
describes the setting, for TensorFlow's kernel-by-kernel execution) and, for a GShard Table 1 configuration, the paper's rounded weight
count and the relative difference (:func:`paper_row`).

:func:`table1` is the paper's section 5 memory claim for the zoo's Table 1
rows: each MoE(E, L) on E devices (mesh expert:E, one expert of every MoE
layer and one dispatch group per device), per-device memory and training
FLOPs, then per depth the 2048E / 128E ratios; :func:`verdict` says whether
they show a roughly constant per-device memory. ``m4moe-info`` only parses
flags and prints these.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from m4moe import config as config_lib
from m4moe.cost import model as cost
from m4moe.cost import unfused as cost_unfused
from m4moe.parallel import mesh as mesh_lib

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
# "roughly constant": per-device memory within this factor either way.
ROUGHLY_CONSTANT = 1.25


def table1(*, tokens_per_device: int = 0, sequence_length: int = 0,
           names: Sequence[str] = TABLE1_CONFIGS) -> dict[str, Any]:
  """``m4moe-info --table1``: GShard section 5 per zoo row, JSON-ready.

  Args:
    tokens_per_device: S per device; 0 keeps each config's group size.
    sequence_length: source = target length; 0 uses each config's
      --max_length.
    names: zoo entries, one row each.

  Returns:
    ``rows`` (one per name, bytes and FLOPs per device) and ``ratios``
    (per depth L with both a 128E and a 2048E row: 2048E / 128E).
  """
  configs = [config_lib.load_model_config(name) for name in names]
  rows = [cost.expert_scaling_row(name, config,
                                  tokens_per_device=tokens_per_device or None,
                                  sequence_length=sequence_length or None)
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
          "seq_len": sequence_length or config.max_length,
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


def verdict(*, layers: str, ratio: dict[str, float],
            large_row: dict[str, Any], small_row: dict[str, Any]) -> str:
  """One sentence saying whether the numbers show a constant memory.

  Args:
    layers: the depth, e.g. ``"12L"``.
    ratio: that depth's entry of :func:`table1`'s ``ratios``.
    large_row, small_row: its 2048E and 128E entries of ``rows``.
  """
  total = ratio["total_bytes"]
  share = large_row["activation_bytes"] / large_row["total_bytes"]
  if 1 / ROUGHLY_CONSTANT <= total <= ROUGHLY_CONSTANT:
    return (f"  {layers}: roughly constant (x{total:.3f} for a "
            f"x{ratio['num_params']:.1f} model); activations are "
            f"{share:.0%} of the 2048E total")
  return (f"  {layers}: NOT constant (x{total:.3f}): tokens per device differ "
          f"({small_row['tokens_per_device']} on 128E vs "
          f"{large_row['tokens_per_device']} on 2048E) and activations, "
          f"{share:.0%} of the 2048E total, scale with them; "
          "--tokens_per_device=2048 holds them fixed as section 5 assumes")


def paper_row(config: config_lib.ModelConfig, *,
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


def collect(config: config_lib.ModelConfig, *, source: str,
            sequence_length: int = 0, batch_tokens: int = 0,
            mesh: mesh_lib.MeshShape | None = None,
            share_target_embedding: bool = False) -> dict[str, Any]:
  """Everything ``m4moe-info`` reports for ``config``, JSON-ready.

  Raises:
    ValueError: the mesh does not fit the config (see
      :func:`m4moe.cost.model.estimate_device`).
  """
  model_cost = cost.model_cost(config, source_length=sequence_length or None,
                               target_length=sequence_length or None,
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
      "paper": paper_row(config, model_cost=model_cost),
  }
  if batch_tokens:
    mesh = mesh or mesh_lib.MeshShape.single_device()
    # Errors name the mesh as given (--mesh=...).
    mesh_lib.validate_mesh(mesh, **mesh_lib.model_widths(config))
    device = cost.estimate_device(
        config, data_axis=mesh.axis_size("data"),
        expert_axis=mesh.axis_size("expert"),
        model_axis=mesh.axis_size("model"), batch_tokens=batch_tokens,
        sequence_length=sequence_length or None,
        share_target_embedding=share_target_embedding)
    info["mesh"] = str(mesh)
    info["device"] = {**dataclasses.asdict(device),
                      "num_devices": device.num_devices,
                      "params_per_device": device.params_per_device,
                      "total_bytes": device.total_bytes}
    info["device_unfused"] = _unfused_device(
        config, mesh=mesh, batch_tokens=batch_tokens,
        sequence_length=sequence_length,
        share_target_embedding=share_target_embedding)
  return info


def _unfused_device(config: config_lib.ModelConfig, *, mesh: mesh_lib.MeshShape,
                    batch_tokens: int, sequence_length: int,
                    share_target_embedding: bool) -> dict[str, Any]:
  """The same estimate for TensorFlow's kernel-by-kernel execution.

  ``activation_bytes`` and ``total_bytes`` of
  :func:`m4moe.cost.model.estimate_device` with ``execution="unfused"`` (the
  rest equals the fused estimate), or ``unavailable`` saying why its table
  (:mod:`m4moe.cost.unfused`) does not describe this setting.
  """
  try:
    cost_unfused.check_supported(config, model_axis=mesh.axis_size("model"))
  except ValueError as e:
    return {"execution": "unfused", "unavailable": str(e)}
  device = cost.estimate_device(
      config, data_axis=mesh.axis_size("data"),
      expert_axis=mesh.axis_size("expert"),
      model_axis=mesh.axis_size("model"), batch_tokens=batch_tokens,
      sequence_length=sequence_length or None,
      share_target_embedding=share_target_embedding, execution="unfused")
  return {"execution": "unfused", "activation_bytes": device.activation_bytes,
          "total_bytes": device.total_bytes}
