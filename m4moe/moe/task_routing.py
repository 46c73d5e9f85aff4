"""Task-level routing: every token of a sentence pair routed by its language.

Kudugunta et al. (2021, "Beyond Distillation: Task-level Mixture-of-Experts
for Efficient Inference") route by task instead of by token, so serving one
task needs only the experts that task uses. Here (``--route_by=language``):

* Task = the language pair. In a corpus whose pairs all have English on one
  side, a pair is identified by its other language (the pipeline's
  per-language stream), the *routing language*: the source language for
  ``xx_en`` (what ``m4moe-train`` trains), the target language for
  ``en_xx``; :func:`routing_language` picks it from a (source, target)
  request.
* Router input: the one-hot of the routing language's index in
  ``MoeConfig.routing_languages`` (``<float32>[G, S, num_languages]``), fed to
  the unchanged routers, whose ``wg <float32>[num_languages, E]`` thus is a
  learned per-language gate: the logits of a token are ``wg[language]``.
  Chosen over the language tag's embedding or the mean of the sentence's
  encoder inputs because (a) the routing decision is then a function of the
  language alone, in every layer, at training and at inference, which is
  what makes per-language extraction exact (:mod:`m4moe.inference.extraction`); (b)
  in ``xx_en`` the source carries only the ``<2en>`` tag, so no token says
  which language it is; (c) the gate is all the router learns (E numbers per
  language and layer), and its gradient is exactly the aux loss's and the
  combine weights'.
* Both stacks route by the routing language. Routing the decoder by the
  target language (Kudugunta's other option) would, in ``xx_en``, send
  every sentence to the same experts (all targets are English): a dense
  decoder with E times the parameters; routing both by the pair keeps one
  extractable expert set per language in each MoE layer.
* Capacity, aux/z losses, second-expert policies and dispatch are the
  token routers' (a language's tokens compete for their experts' capacity
  in training, and the load-balancing loss spreads languages over experts).
  Deterministic at eval: every token of a sentence gets the same experts and
  combine weights. In training, per-token random draws (top2 ``random``
  dispatches a second choice per token; ``sampling`` and ``noisy_topk``
  noise draw per token) still vary; ``all`` and top1 keep sentences whole.

The model reads per-token routing-language indices from the batch
(:data:`INPUTS_KEY` ``<int32>[B, Ls]``, :data:`TARGETS_KEY` ``<int32>[B,
Lt]``; per token, so packed rows may mix languages), and
:meth:`m4moe.model.transformer.Transformer.encode` takes per-row ``languages <int32>[B]``
that the encoder output carries into every decode step.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf

# The batch keys; m4moe.data.packing.LANGUAGE_FEATURES names the same two
# (tests check it; the core library does not import m4moe.data).
INPUTS_KEY = "inputs_languages"
TARGETS_KEY = "targets_languages"
KEYS = (INPUTS_KEY, TARGETS_KEY)
ENGLISH = "en"


class LanguageRoutingError(ValueError):
  """A language routing request is impossible; says why and what to do."""


def routing_language(*, source_lang: str, target_lang: str) -> str:
  """The pair's routing language: its non-English side (source if neither).

  Raises:
    LanguageRoutingError: both sides are English.
  """
  if source_lang == ENGLISH and target_lang == ENGLISH:
    raise LanguageRoutingError("en->en has no routing language: one side of "
                               "a pair must be another language")
  return target_lang if source_lang == ENGLISH else source_lang


def one_hot_languages(languages: tf.Tensor, *, num_languages: int) -> tf.Tensor:
  """<int32>[...] routing-language indices -> <float32>[..., num_languages].

  Padding positions may hold any index (the pipeline writes 0): padding
  takes no capacity and enters no loss.
  """
  return tf.one_hot(tf.cast(languages, tf.int32), num_languages,
                     dtype=tf.float32)


def per_token(languages: tf.Tensor, *, like: tf.Tensor) -> tf.Tensor:
  """Per-row <int32>[B] languages broadcast to <int32>[B, L] like ``like``."""
  languages = tf.cast(tf.convert_to_tensor(languages), tf.int32)
  return tf.broadcast_to(languages[:, None], tf.shape(like))


def language_features(languages: tf.Tensor, *, inputs: tf.Tensor,
                      targets: tf.Tensor) -> dict[str, tf.Tensor]:
  """The two batch features for unpacked rows of per-row ``languages``."""
  return {INPUTS_KEY: per_token(languages, like=inputs),
          TARGETS_KEY: per_token(languages, like=targets)}


def language_ids(names: Sequence[str], *,
                 routing_languages: Sequence[str]) -> np.ndarray:
  """<int32>[n] indices of ``names`` in ``routing_languages``.

  Raises:
    LanguageRoutingError: a name is not a routing language.
  """
  index: Mapping[str, int] = {l: i for i, l in enumerate(routing_languages)}
  unknown = sorted({n for n in names if n not in index})
  if unknown:
    raise LanguageRoutingError(
        f"language(s) {', '.join(unknown)} have no row in the per-language "
        f"gate (routing languages: {', '.join(routing_languages) or 'none'});"
        " the model was not trained on them")
  return np.array([index[n] for n in names], np.int32)
