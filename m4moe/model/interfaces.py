"""The typed team contract between models, the input pipeline, the step
runner and decoding (written as Protocols, as t5x types its trainer's
callables).

* :class:`ModelBatch` -- the model's batch: ``inputs`` <int32>[B, Ls] and
  ``targets`` <int32>[B, Lt] (0 = padding) and, for packed rows, the four
  packing features (segment id 0 = padding, positions restart at 0 per
  segment) and, for ``--route_by=language``, every token's routing-language
  index (:mod:`m4moe.moe.task_routing`). :data:`MODEL_KEYS` are its keys; the
  training pipeline (:data:`m4moe.data.packing.FEATURES`, plus
  :data:`~m4moe.data.packing.LANGUAGE_FEATURES` for language routing)
  produces exactly them, and other
  keys of a dataset element (``lang``, texts) are dropped by
  :func:`m4moe.training.step.model_features`.
* :class:`ModelOutputLike` -- what a forward pass returns
  (:class:`m4moe.model.transformer.ModelOutput`).
* :class:`TrainableModel` -- ``model(batch, training=, seed=)``: what the
  step runner needs (the real Transformer and the test stand-in
  :class:`~m4moe.training.toy_model.ToyTranslator`).
* :class:`TranslationModel` -- a trainable model that also decodes
  incrementally (``encode``, ``init_cache``, ``decode_step`` with a
  ``live`` mask of the beams holding a hypothesis) and whose forward pass
  can route its MoE layers as decoding does (``per_sentence_routing``):
  what beam search and its uncached oracle need
  (:class:`m4moe.model.transformer.Transformer`).

All Protocols are ``runtime_checkable`` (isinstance checks that the methods
exist; ``tests/test_interfaces.py`` also checks their parameter names).
"""

# No ``from __future__ import annotations``: TypedDict reads NotRequired from
# evaluated annotations only.
from typing import Any, Mapping, NotRequired, Protocol, TypedDict
from typing import runtime_checkable

import tensorflow as tf


class ModelBatch(TypedDict):
  """One model batch; every value <int32>[B, L] (L = Ls or Lt)."""

  inputs: tf.Tensor
  targets: tf.Tensor
  inputs_segment_ids: NotRequired[tf.Tensor]
  inputs_positions: NotRequired[tf.Tensor]
  targets_segment_ids: NotRequired[tf.Tensor]
  targets_positions: NotRequired[tf.Tensor]
  inputs_languages: NotRequired[tf.Tensor]
  targets_languages: NotRequired[tf.Tensor]


# The keys a model consumes, required ones first.
MODEL_KEYS: tuple[str, ...] = tuple(ModelBatch.__annotations__)
REQUIRED_MODEL_KEYS: tuple[str, ...] = tuple(
    k for k in MODEL_KEYS if k in ModelBatch.__required_keys__)

# A tf.nest of batch-major tensors (axis 0 = rows, so beam search can tile
# and gather it): the encoder output and the decoder cache.
Nest = Any


@runtime_checkable
class ModelOutputLike(Protocol):
  """The forward pass's outputs."""

  @property
  def logits(self) -> tf.Tensor:
    """<float32>[B, Lt, V]."""

  @property
  def moe_loss(self) -> tf.Tensor:
    """<float32>[] weighted MoE losses, added to the training objective."""

  @property
  def aux_loss(self) -> tf.Tensor:
    """<float32>[] unweighted load-balancing losses (for logging)."""

  @property
  def z_loss(self) -> tf.Tensor:
    """<float32>[] unweighted router z-losses (for logging)."""

  @property
  def moe_stats(self) -> Mapping[str, Any]:
    """{MoE layer name: RouterStats or a dict of float tensors}."""


@runtime_checkable
class TrainableModel(Protocol):
  """A model the step runner can train and evaluate."""

  def __call__(self, batch: ModelBatch, *, training: bool,
               seed: tf.Tensor | None = None) -> ModelOutputLike:
    """Teacher-forced forward pass.

    Args:
      batch: the model batch (extra keys are not passed).
      training: dropout and training-time routing/capacity.
      seed: <int32>[2]; required when training with any randomness.
    """


@runtime_checkable
class TranslationModel(TrainableModel, Protocol):
  """A trainable model that also decodes one token at a time."""

  def __call__(self, batch: ModelBatch, *, training: bool,
               seed: tf.Tensor | None = None,
               per_sentence_routing: bool = False) -> ModelOutputLike:
    """Teacher-forced forward pass (see :meth:`TrainableModel.__call__`).

    Args:
      batch: the model batch (extra keys are not passed).
      training: dropout and training-time routing/capacity.
      seed: <int32>[2]; required when training with any randomness.
      per_sentence_routing: route as :meth:`encode` and :meth:`decode_step`
        do (one sentence per row), so the logits equal the decoder's; False
        routes as in training and eval losses.
    """

  def encode(self, inputs: tf.Tensor, *, segment_ids: tf.Tensor | None = None,
             positions: tf.Tensor | None = None, training: bool = False,
             seed: tf.Tensor | None = None,
             languages: tf.Tensor | None = None) -> Nest:
    """Encodes <int32>[B, Ls] source ids (0 = padding) once per sentence;
    ``languages`` <int32>[B] are the rows' routing languages (language
    routing only)."""

  def init_cache(self, *, batch_size: int | tf.Tensor,
                 max_length: int) -> Nest:
    """An empty decoder cache for ``batch_size`` rows and ``max_length``
    positions."""

  def decode_step(self, *, encoder_output: Nest, token_ids: tf.Tensor,
                  cache: Nest, step: tf.Tensor,
                  live: tf.Tensor | None = None) -> tuple[tf.Tensor, Nest]:
    """<float32>[B, V] logits at position ``step`` given the previous token
    <int32>[B], and the cache with slot ``step`` filled. ``live`` <bool>[B]
    marks the rows holding a real hypothesis (None: all); a dead row's
    logits need not be meaningful, and it must not change the live rows'."""
