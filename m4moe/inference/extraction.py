"""Per-language extraction of a language-routed MoE model (Kudugunta 2021).

With ``--route_by=language`` (:mod:`m4moe.moe.task_routing`) the router of an
MoE layer sees only the one-hot routing language, so at inference every
token of language ``l`` goes to the same top-k experts ``e_1..e_k`` with the
same combine weights ``w_1..w_k``, computed from ``wg[l]`` alone.
:func:`extract_language` replaces each MoE layer of a model by a
:class:`LanguageExperts` holding just those k experts and weights: a
dense-like model whose feed-forward cost is k experts per MoE layer and
whose routers and other experts are gone.

Why the translations are equal, token for token:

* The choices and weights are the router's own: :func:`language_route` calls
  the layer's router (eval mode, the same class and weights) on the
  language's one-hot, so policy, renormalisation (top2 ``g/(g1+g2)``, top1
  the raw gate, noisy_topk the softmax over the k) and tie-breaking are
  those of the full model.
* No token of the full model is dropped at inference: ``--route_by=language``
  requires ``--eval_capacity_factor=0`` (:class:`m4moe.config.MoeConfig`),
  i.e. capacity C = S per group, and a token requests an expert at most
  once, so no expert gets more than S requests; decoding's per-sentence and
  per-token groups get the capacity of their real-token count, likewise
  no-drop. So every real token gets all k choices, exactly what
  :class:`LanguageExperts` computes.
* Eval routing draws no random numbers (top2's second expert is always
  dispatched, no jitter or noise), so there is nothing else to match.

What differs: padding positions (the MoE layer outputs 0 there, the dense
block does not; padding never reaches a real token) and float rounding of
the per-expert matmuls (a different row count); tests compare translations
exactly and logits to 1e-5.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

from m4moe.moe import task_routing
from m4moe.config import ConfigError
from m4moe.moe.layer import MoeLayer


class ExtractionError(ConfigError):
  """The model cannot be extracted for a language; says why and what to do."""


@dataclasses.dataclass(frozen=True)
class LayerRoute:
  """One MoE layer's experts for one language.

  Attributes:
    layer: the layer's name in :attr:`m4moe.model.transformer.ModelOutput.moe_stats`
      (``encoder/layer_1/moe``).
    experts: the chosen experts, first choice first.
    weights: their combine weights.
  """

  layer: str
  experts: tuple[int, ...]
  weights: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class Extraction:
  """What :func:`extract_language` did.

  Attributes:
    language: the routing language.
    routes: one :class:`LayerRoute` per MoE layer.
    parameters_before: trainable parameters of the full model.
    parameters_after: parameters of the extracted model.
  """

  language: str
  routes: tuple[LayerRoute, ...]
  parameters_before: int
  parameters_after: int

  def as_dict(self) -> dict[str, Any]:
    return {"language": self.language,
            "parameters_before": self.parameters_before,
            "parameters_after": self.parameters_after,
            "routes": [dataclasses.asdict(r) for r in self.routes]}


class LanguageExperts(tf.Module):
  """The experts one language uses in one MoE layer, as one dense block.

  ``y = sum_k weights[k] * wo_k . ReLU(wi_k . x)`` for every position, plus
  the layer's shared experts' output if it has any (they serve every
  token, so every language keeps them whole).

  Weights: ``wi <float32>[K, M, H]``, ``wo <float32>[K, H, M]`` (copies of
  the chosen experts), ``weights <float32>[K]`` (non-trainable); ``shared``
  the layer's shared-expert FFN (None without shared experts).
  """

  def __init__(self, *, wi: tf.Tensor, wo: tf.Tensor, weights: tf.Tensor,
               shared: tf.Module | None = None,
               name: str = "language_experts"):
    super().__init__(name=name)
    with self.name_scope:
      self.wi = tf.Variable(wi, name="wi")
      self.wo = tf.Variable(wo, name="wo")
      self.weights = tf.Variable(weights, trainable=False, name="weights")
    self.shared = shared

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    """<dtype>[B, L, M] -> <dtype>[B, L, M]."""
    dtype = x.dtype
    h = tf.nn.relu(tf.einsum("BLM,KMH->BLKH", x, tf.cast(self.wi, dtype)))
    out = tf.einsum("BLKH,KHM->BLKM", h, tf.cast(self.wo, dtype))
    routed = tf.einsum("BLKM,K->BLM", out, tf.cast(self.weights, dtype))
    if self.shared is None:
      return routed
    return routed + self.shared(x)


def language_route(layer: MoeLayer, *, index: int) -> tuple[list[int],
                                                            list[float]]:
  """(experts, combine weights) the layer's router gives language ``index``.

  Runs the router itself on the language's one-hot (eval mode), one token.
  """
  num_languages = layer.config.moe.router_input_dim
  x = task_routing.one_hot_languages(tf.constant([[index]]),
                                     num_languages=num_languages)
  result = layer.router(x, padding_mask=tf.ones([1, 1]), capacity=1,
                        training=False)
  experts = result.expert_index[0, 0].numpy().tolist()
  weights = result.combine_weights[0, 0].numpy().tolist()
  kept = result.buffer_position[0, 0].numpy() >= 0
  return ([e for e, k in zip(experts, kept) if k],
          [w for w, k in zip(weights, kept) if k])


def _moe_layers(model: Any) -> list[tuple[str, Any]]:
  """(name, encoder/decoder layer) of every MoE layer, as moe_stats names."""
  out = []
  for stack in ("encoder", "decoder"):
    for i, layer in enumerate(getattr(model, f"{stack}_layers")):
      if isinstance(layer.ffn, MoeLayer):
        out.append((f"{stack}/layer_{i}/moe", layer))
  return out


def count_parameters(model: tf.Module) -> int:
  """Elements of all of ``model``'s variables (trainable or not)."""
  return sum(int(v.shape.num_elements()) for v in model.variables)


def extract_language(model: Any, *, language: str) -> Extraction:
  """Replaces every MoE layer of ``model`` by ``language``'s experts, in place.

  Args:
    model: an ``m4moe.model.transformer.Transformer`` with ``--route_by=language``.
    language: a routing language of the model (``MoeConfig.
      routing_languages``).

  Returns:
    The :class:`Extraction` (experts per layer, parameter counts).

  Raises:
    ExtractionError: a token-routed model (extraction is only exact when
      routing depends on the language alone), a model without MoE layers,
      or a language without a gate row.
  """
  moe = model.config.moe
  if moe.route_by != "language":
    raise ExtractionError(
        f"--language={language}: this model routes by token "
        f"(--route_by={moe.route_by}), so a language's tokens use all the "
        "experts and no subset reproduces its translations; extraction needs "
        "a model trained with --route_by=language (export without "
        "--language to keep every expert)")
  layers = _moe_layers(model)
  if not layers:
    raise ExtractionError("the model has no MoE layers (--num_experts=0): "
                          "there is nothing to extract; export without "
                          "--language")
  try:
    index = moe.language_index(language)
  except ConfigError as e:
    raise ExtractionError(f"--language={language}: {e}") from e
  before = count_parameters(model)
  routes = []
  for name, layer in layers:
    experts, weights = language_route(layer.ffn, index=index)
    ffn = layer.ffn.experts
    with layer.name_scope:
      layer.ffn = LanguageExperts(
          wi=tf.gather(ffn.wi, experts), wo=tf.gather(ffn.wo, experts),
          weights=tf.constant(weights, tf.float32),
          shared=layer.ffn.shared_experts)
    routes.append(LayerRoute(layer=name, experts=tuple(experts),
                             weights=tuple(weights)))
  return Extraction(language=language, routes=tuple(routes),
                    parameters_before=before,
                    parameters_after=count_parameters(model))
