"""Training observability: TensorBoard summaries and console lines.

TensorBoard: summaries are written with the core ``tf.summary.write`` op and
the TensorBoard plugin metadata (``scalars`` / ``histograms``), so writing
needs no ``tensorboard`` package (reading them does). Tags:

  train/cross_entropy, train/loss, train/moe_loss, train/aux_loss,
  train/z_loss, train/learning_rate, train/grad_norm, train/step_time_sec,
  train/tokens_per_sec, train/nonfinite_skipped
  router/<layer>/<stat> for every scalar RouterStats field (load_cv,
    dropped_first, dropped_second, entropy, max_logit, ...) and the
    executed expert compute of ``m4moe.moe.layer.MoeLayerStats``
    (expert_assignments_per_token, expert_flops_per_token,
    expert_flops_dense_fraction)
  router/<layer>/load_per_expert   a histogram with one bucket per expert
    (x = expert index, height = fraction of tokens routed to it)
  dev/cross_entropy/<lang>, dev/cross_entropy (token-weighted over languages)
  dev/source_reliance/<lang> (CE with wrong sources minus CE, nats/token)

The JSONL log of the same numbers (``metrics.jsonl``) is
:mod:`m4moe.training.metrics_log`.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import numpy as np
import tensorflow as tf
from absl import logging
from tensorflow.core.framework import summary_pb2

def _metadata(plugin: str) -> summary_pb2.SummaryMetadata:
  return summary_pb2.SummaryMetadata(
      plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin))


def write_scalar(tag: str, value: float, *, step: int) -> None:
  """A TensorBoard scalar on the default summary writer."""
  tf.summary.write(tag, tf.constant(float(value), tf.float32), step=step,
                   metadata=_metadata("scalars"))


def write_per_expert_histogram(tag: str, load: np.ndarray, *,
                               step: int) -> None:
  """A histogram with bucket ``e`` = [e, e+1) of height ``load[e]``.

  Args:
    tag: summary tag.
    load: <float32>[E] fraction of tokens routed to each expert.
    step: global step.
  """
  load = np.asarray(load, np.float64).reshape(-1)
  edges = np.arange(load.size + 1, dtype=np.float64)
  buckets = np.stack([edges[:-1], edges[1:], load], axis=1)
  tf.summary.write(tag, tf.constant(buckets), step=step,
                   metadata=_metadata("histograms"))


def write_router_summaries(router: Mapping[str, Mapping[str, np.ndarray]], *,
                           step: int) -> None:
  """Scalars for every scalar stat, a per-expert histogram for ``load``."""
  for layer, stats in router.items():
    for name, value in stats.items():
      value = np.asarray(value)
      if value.ndim == 0:
        write_scalar(f"router/{layer}/{name}", value, step=step)
      elif name == "load":
        write_per_expert_histogram(f"router/{layer}/load_per_expert", value,
                                   step=step)


def router_scalars(router: Mapping[str, Mapping[str, np.ndarray]]
                   ) -> dict[str, dict[str, float]]:
  """The scalar router stats as plain floats (for the JSONL log)."""
  return {layer: {k: float(v) for k, v in stats.items() if np.ndim(v) == 0}
          for layer, stats in router.items()}


# The per-layer stats of the executed expert compute (MoeLayerStats).
EXPERT_COMPUTE_STATS = ("expert_assignments_per_token",
                        "expert_flops_per_token",
                        "expert_flops_dense_fraction")


def expert_compute_means(router: Mapping[str, Mapping[str, Any]]
                         ) -> dict[str, dict[str, float]]:
  """Per stack, the mean over its MoE layers of the executed expert compute.

  Args:
    router: ``{layer: {stat: value}}`` with layer names such as
      ``encoder/layer_1/moe`` (the stack is the first path component).

  Returns:
    ``{stack: {stat: mean}}`` for the :data:`EXPERT_COMPUTE_STATS`, stacks
    in sorted order; empty without MoE layers that report them.
  """
  values: dict[str, dict[str, list[float]]] = {}
  for layer, stats in router.items():
    stack = layer.split("/")[0]
    for name in EXPERT_COMPUTE_STATS:
      if name in stats:
        values.setdefault(stack, {}).setdefault(name, []).append(
            float(stats[name]))
  return {stack: {name: float(np.mean(v)) for name, v in stats.items()}
          for stack, stats in sorted(values.items())}


class Interval:
  """Accumulates per-step host values between two log lines."""

  def __init__(self):
    self.reset()

  def reset(self) -> None:
    self.steps = 0
    self.ce_sum = 0.0
    self.objective_sum = 0.0
    self.target_tokens = 0.0
    self.source_tokens = 0.0
    self.seconds = 0.0
    self.cpu_seconds = 0.0

  def add(self, *, ce_sum: float, objective: float, target_tokens: float,
          source_tokens: float, seconds: float,
          cpu_seconds: float) -> None:
    self.steps += 1
    self.ce_sum += ce_sum
    self.objective_sum += objective
    self.target_tokens += target_tokens
    self.source_tokens += source_tokens
    self.seconds += seconds
    self.cpu_seconds += cpu_seconds

  def summary(self) -> dict[str, float]:
    steps = max(self.steps, 1)
    seconds = max(self.seconds, 1e-9)
    return {
        "train_ce": self.ce_sum / max(self.target_tokens, 1.0),
        "train_loss": self.objective_sum / steps,
        "step_time_sec": self.seconds / steps,
        "step_cpu_sec": self.cpu_seconds / steps,
        "tokens_per_sec": (self.source_tokens + self.target_tokens) / seconds,
        "target_tokens_per_sec": self.target_tokens / seconds,
    }


def format_eta(seconds: float) -> str:
  seconds = max(0, int(seconds))
  hours, rest = divmod(seconds, 3600)
  return f"{hours}h{rest // 60:02d}m{rest % 60:02d}s"


def log_console(record: Mapping[str, Any], *, train_steps: int) -> None:
  """One absl line per logging interval: step, losses, tokens/s and ETA."""
  eta = (train_steps - record["step"]) * record["step_time_sec"]
  logging.info(
      "step %d/%d  ce %.4f  loss %.4f  moe %.4f  lr %.3g  |g| %.3g  "
      "%.0f tok/s  %.3fs/step  skipped %d  ETA %s",
      record["step"], train_steps, record["train_ce"], record["train_loss"],
      record["moe_loss"], record["learning_rate"], record["grad_norm"],
      record["tokens_per_sec"], record["step_time_sec"],
      record["nonfinite_skipped"], format_eta(eta))


def now() -> float:
  return time.time()
