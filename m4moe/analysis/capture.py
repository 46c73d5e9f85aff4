"""Per-layer expert-choice counts of a Transformer's teacher-forced pass.

How the routing decisions are read: :class:`RoutingCapture` puts a thin
recording proxy in place of each MoE layer's ``router`` for the duration of
a ``with`` block. The proxy calls the real router and keeps what it returns
(``RoutingResult.expert_index <int32>[G, S, K]`` and the grouped padding
mask ``<float32>[G, S]``), so the counts are the layer's own decisions in
that very pass -- not a recomputation that could drift from the layer --
and no model or layer code changes (nothing is added to ``MoeOutput``).
The layer groups tokens after moving the real ones to the front, so counts
over the grouped mask are exactly the real tokens' choices (each batch holds
one language, so position within the batch does not matter).

Only token-choice routers (top2, top1, noisy_topk) have per-token choices;
``expert_choice`` (experts pick tokens) raises :class:`CaptureError`.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
import tensorflow as tf


class CaptureError(ValueError):
  """The model's routing cannot be captured; the message says why."""


class _RecordingRouter:
  """Calls ``router`` and records its choices under ``name``."""

  def __init__(self, router: Any, *, name: str, sink: dict[str, Any]):
    self._router = router
    self._name = name
    self._sink = sink

  def __getattr__(self, attr: str) -> Any:
    return getattr(self._router, attr)

  def __call__(self, x, *, padding_mask, **kwargs):
    result = self._router(x, padding_mask=padding_mask, **kwargs)
    if result.expert_index is None:
      raise CaptureError(
          f"{self._name}: --router={type(self._router).__name__} has no "
          "per-token expert choices (experts pick tokens); routing by "
          "language needs a token-choice router (top2, top1, noisy_topk)")
    self._sink[self._name] = (result.expert_index, padding_mask)
    return result


def moe_layers(model: Any) -> dict[str, Any]:
  """``"encoder/layer_1/moe"`` -> MoeLayer (the names of ``moe_stats``)."""
  out = {}
  for stack in ("encoder", "decoder"):
    for i, layer in enumerate(getattr(model, f"{stack}_layers")):
      if layer.is_moe:
        out[f"{stack}/layer_{i}/moe"] = layer.ffn
  return out


def choice_counts(expert_index: tf.Tensor, mask: tf.Tensor, *,
                  num_experts: int) -> tf.Tensor:
  """<float32>[K, E] real tokens whose k-th choice is e.

  Args:
    expert_index: <int32>[G, S, K] choices.
    mask: <float32>[G, S] 1 for real tokens.
    num_experts: E.
  """
  one_hot = tf.one_hot(expert_index, num_experts)  # [G, S, K, E]
  return tf.einsum("GSKE,GS->KE", one_hot, tf.cast(mask, tf.float32))


class RoutingCapture:
  """Context manager recording every MoE layer's choices of a forward pass.

  Usage::

    with RoutingCapture(model) as capture:
      counts = capture.counts(batch)   # name -> (<[K, E]>, <[]> tokens)
  """

  def __init__(self, model: Any):
    self._layers = moe_layers(model)
    if not self._layers:
      raise CaptureError("the model has no MoE layers (--num_experts=0): "
                         "there is no routing to analyse")
    self._model = model
    self._sink: dict[str, Any] = {}
    self._originals: dict[str, Any] = {}
    self._forward = tf.function(self._counts, reduce_retracing=True)

  @property
  def layer_names(self) -> tuple[str, ...]:
    return tuple(self._layers)

  def num_experts(self, name: str) -> int:
    return self._layers[name].config.moe.num_experts

  def __enter__(self) -> RoutingCapture:
    for name, layer in self._layers.items():
      self._originals[name] = layer.router
      layer.router = _RecordingRouter(layer.router, name=name,
                                      sink=self._sink)
    return self

  def __exit__(self, *exc) -> None:
    for name, router in self._originals.items():
      self._layers[name].router = router
    self._originals.clear()

  def _counts(self, batch: Mapping[str, tf.Tensor]) -> dict[str, Any]:
    self._sink.clear()
    self._model(batch, training=False)
    missing = sorted(set(self._layers) - set(self._sink))
    if missing:
      raise CaptureError(f"no routing recorded for {', '.join(missing)}")
    return {name: (choice_counts(index, mask,
                                 num_experts=self.num_experts(name)),
                   tf.reduce_sum(tf.cast(mask, tf.float32)))
            for name, (index, mask) in self._sink.items()}

  def counts(self, batch: Mapping[str, tf.Tensor]
             ) -> dict[str, tuple[np.ndarray, int]]:
    """Layer -> (<int64>[K, E] choice counts, real tokens) of one batch.

    Runs the model teacher-forced in eval mode (no dropout, eval capacity).
    """
    if not self._originals:
      raise CaptureError("RoutingCapture.counts needs the `with` block")
    out = self._forward(batch)
    return {name: (np.rint(c.numpy()).astype(np.int64),
                   int(round(float(t.numpy()))))
            for name, (c, t) in out.items()}


def accumulate(capture: RoutingCapture,
               batches: Iterable[Mapping[str, tf.Tensor]]
               ) -> tuple[dict[str, np.ndarray], dict[str, int]]:
  """Sums :meth:`RoutingCapture.counts` over batches (one language).

  Returns:
    (layer -> <int64>[K, E] counts, layer -> real tokens).
  """
  counts: dict[str, np.ndarray] = {}
  tokens: dict[str, int] = {}
  for batch in batches:
    for name, (c, t) in capture.counts(batch).items():
      counts[name] = counts.get(name, 0) + c
      tokens[name] = tokens.get(name, 0) + t
  return counts, tokens
