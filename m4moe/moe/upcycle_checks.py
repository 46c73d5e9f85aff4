"""Whether an MoE model config can be upcycled from a dense one, without
TensorFlow.

:func:`config_problems` is what ``m4moe-train --init_from_dense`` checks
before training (:func:`m4moe.moe.upcycle.prepare`) and what ``m4moe-run``
checks when it loads a recipe whose model has ``init_from``
(:mod:`m4moe.pipeline.recipes`), so a wrong expert width fails at load time
rather than hours into a job. It lives apart from :mod:`m4moe.moe.upcycle`
because ``m4moe-run`` starts without loading TensorFlow.
"""

from __future__ import annotations

from m4moe import config as config_lib

# Model flags that shape variables and must equal the dense run's.
_SHAPE_FLAGS = ("src_vocab_size", "tgt_vocab_size", "d_model", "num_heads",
                "d_kv", "d_ff", "num_encoder_layers", "num_decoder_layers")


def config_problems(*, config: config_lib.ModelConfig,
                    dense: config_lib.ModelConfig) -> list[str]:
  """Why ``config`` (MoE) cannot be upcycled from ``dense`` (empty: fine).

  Checked before training starts, so a wrong flag fails before the run
  directory is written; :func:`m4moe.moe.upcycle.plan` checks every
  variable again.
  """
  problems = []
  if not config.moe.enabled:
    problems.append("--init_from_dense needs an MoE model: set "
                    "--num_experts (and --expert_hidden_dim)")
  if dense.moe.enabled:
    problems.append(f"the --init_from_dense run is an MoE run (--num_experts="
                    f"{dense.moe.num_experts}); pass a dense run")
  for name in _SHAPE_FLAGS:
    mine, theirs = getattr(config, name), getattr(dense, name)
    if mine != theirs:
      problems.append(f"--{name}={mine} differs from the dense run's "
                      f"{theirs}: set --{name}={theirs}")
  if config.moe.enabled and config.moe.expert_hidden_dim != dense.d_ff:
    problems.append(
        f"--expert_hidden_dim={config.moe.expert_hidden_dim} differs from "
        f"the dense run's --d_ff={dense.d_ff}: each expert starts as a copy "
        f"of the dense FFN, set --expert_hidden_dim={dense.d_ff}")
  if dense.ffn_output_scale != 1.0:
    problems.append(
        f"the --init_from_dense run scales its FFN outputs "
        f"(--ffn_output_scale={dense.ffn_output_scale}), which copied "
        "experts would not: upcycle from a run with --ffn_output_scale=1")
  return problems
