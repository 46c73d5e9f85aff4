"""The (MoE) Transformer encoder-decoder for multilingual translation.

Pre-layer-norm blocks: each encoder layer is self-attention then a
feed-forward layer; each decoder layer is causal self-attention,
cross-attention to the encoder, then a feed-forward layer. Feed-forward layer
``i`` of a stack is an :class:`~m4moe.moe.layer.MoeLayer` when
``config.moe.is_moe_layer(i)`` (GShard: every other layer), a dense
``wo · ReLU(wi · x)`` otherwise. Both stacks end with a layer norm. Dropout
(``config.dropout_rate``) is applied to the embedded inputs, to every residual
branch and after the final layer norm; ``config.attention_dropout_rate`` to
attention probabilities.

Dimensions (letters of the glossary in :mod:`m4moe`):

  B: batch rows; Ls: source length; Lt: target length; M: d_model;
  A: attention heads; D: d_kv per head; V: target vocabulary size;
  Ld: decoding cache length (max decode length).

Batches (:class:`m4moe.model.interfaces.ModelBatch`): ``inputs`` <int32>[B, Ls]
and ``targets`` <int32>[B, Lt] with 0 = padding; for packed rows also
``inputs_segment_ids``, ``inputs_positions``, ``targets_segment_ids``,
``targets_positions`` (segment id 0 = padding); with
``--route_by=language`` also ``inputs_languages`` <int32>[B, Ls] and
``targets_languages`` <int32>[B, Lt], every token's routing-language index
(:mod:`m4moe.moe.task_routing`; :meth:`Transformer.encode` takes them per row). Tokens attend only within
their own segment; the decoder input is the target shifted right within each
segment, with start token 0 (T5 style).

Incremental decoding: :meth:`Transformer.encode` once, then
:meth:`Transformer.decode_step` per position with a :class:`DecoderCache`
from :meth:`Transformer.init_cache`. Both :class:`EncoderOutput` and
:class:`DecoderCache` are NamedTuples of batch-major tensors, so ``tf.nest``
can tile/gather them along axis 0 (beam search) and ``tf.while_loop`` can
carry them.

Decode routing (batch invariance). With a capacity at eval time (the GShard
rows use ``--eval_capacity_factor=1.0``), a group of tokens competes for
expert slots, so a translation would depend on whatever else shares its
group. Decoding therefore routes with groups that hold one sentence's
tokens only (``per_sentence_routing``; always in ``encode`` and
``decode_step``):

* Encoder: each source row (one sentence) is its own group, with the
  capacity of its real-token count, ``moe.capacity(group_size=n)``; source
  padding takes no slot. The capacity factor still bounds every expert's
  share of a sentence, as GShard's groups do, and the result is the same
  whatever the batch, its padding, or repeats of the sentence.
* Decoder: each target token is its own group. A decoder token at step t is
  the last token of one beam; a group of several beams (of a sentence or of
  the batch) makes a beam's output depend on its siblings, which beam
  pruning reshuffles between steps, so a prefix recomputed from scratch
  would no longer see the siblings it was first routed with and cached and
  uncached decoding would disagree. A one-token group has capacity
  ``moe.capacity(group_size=1) == 1`` per expert, so each live token reaches
  its top-k experts. Dead beams (``live=False`` in ``decode_step``) are
  padding: no expert slot, zero MoE output.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, NamedTuple

import tensorflow as tf

from m4moe.model import layers
from m4moe.model import numerics
from m4moe.parallel import sharding as sharding_lib
from m4moe.moe import task_routing
from m4moe.config import ModelConfig
from m4moe.moe.layer import MoeLayer
from m4moe.training import remat as remat_lib

_DTYPES = {"float32": tf.float32, "bfloat16": tf.bfloat16}
_PACKING_KEYS = ("segment_ids", "positions")


class EncoderOutput(NamedTuple):
  """Everything the decoder needs from the source, batch-major.

  Attributes:
    encoded: <activation dtype>[B, Ls, M] final encoder states.
    segment_ids: <int32>[B, Ls] source segment ids (0 = padding).
    cross_keys: per decoder layer, <activation dtype>[B, Ls, A, D] projected
      cross-attention keys (computed once, reused at every decode step).
    cross_values: per decoder layer, like ``cross_keys``.
    languages: <int32>[B] routing language of each row (language routing,
      :mod:`m4moe.moe.task_routing`; zeros otherwise), so every decode step
      routes the row's target tokens by it.
  """
  encoded: tf.Tensor
  segment_ids: tf.Tensor
  cross_keys: tuple[tf.Tensor, ...]
  cross_values: tuple[tf.Tensor, ...]
  languages: tf.Tensor


class DecoderCache(NamedTuple):
  """Self-attention keys/values of the decoded prefix, per decoder layer.

  Attributes:
    keys: per decoder layer, <activation dtype>[B, Ld, A, D]; slot ``t`` holds
      position ``t`` once :meth:`Transformer.decode_step` has run at step t.
    values: like ``keys``.
  """
  keys: tuple[tf.Tensor, ...]
  values: tuple[tf.Tensor, ...]


@dataclasses.dataclass(frozen=True)
class ModelOutput:
  """Result of a teacher-forced forward pass.

  Attributes:
    logits: <float32>[B, Lt, V] next-token logits.
    moe_loss: <float32>[] sum over MoE layers of their weighted aux + z loss;
      add it to the cross-entropy.
    aux_loss: <float32>[] sum of the unweighted load-balancing losses.
    z_loss: <float32>[] sum of the unweighted router z-losses.
    moe_stats: MoE layer name (e.g. ``"decoder/layer_1/moe"``) -> RouterStats.
  """
  logits: tf.Tensor
  moe_loss: tf.Tensor
  aux_loss: tf.Tensor
  z_loss: tf.Tensor
  moe_stats: Mapping[str, Any]

  # tf.nest protocol: a ModelOutput can be returned from a tf.function.
  def __tf_flatten__(self) -> tuple[Any, tuple[Any, ...]]:
    return (), (self.logits, self.moe_loss, self.aux_loss, self.z_loss,
                dict(self.moe_stats))

  @classmethod
  def __tf_unflatten__(cls, metadata: Any, components: Any) -> ModelOutput:
    del metadata
    return cls(*components)


def shift_right(targets: tf.Tensor, *,
                segment_ids: tf.Tensor | None = None) -> tf.Tensor:
  """Decoder inputs: targets shifted right by one within each segment.

  The first position of every segment gets the start token 0.

  Args:
    targets: <int32>[B, Lt].
    segment_ids: <int32>[B, Lt] or None (one segment per row).

  Returns:
    <int32>[B, Lt].
  """
  shifted = tf.pad(targets[:, :-1], [[0, 0], [1, 0]])
  if segment_ids is None:
    return shifted
  previous = tf.pad(segment_ids[:, :-1], [[0, 0], [1, 0]], constant_values=-1)
  return tf.where(tf.equal(segment_ids, previous), shifted,
                  tf.zeros_like(shifted))


def _sequence_features(batch: Mapping[str, tf.Tensor], prefix: str,
                       max_length: int) -> tuple[tf.Tensor, ...]:
  """(ids, segment_ids, positions) for ``prefix`` in {inputs, targets}."""
  if prefix not in batch:
    raise ValueError(f"batch has no {prefix!r} key (keys: {sorted(batch)}); "
                     "the model needs int32 'inputs' and 'targets'")
  ids = tf.convert_to_tensor(batch[prefix])
  given = [f"{prefix}_{key}" in batch for key in _PACKING_KEYS]
  if any(given) and not all(given):
    raise ValueError(
        f"packed batches need both {prefix}_segment_ids and "
        f"{prefix}_positions; got only one of them")
  if all(given):
    segment_ids = batch[f"{prefix}_segment_ids"]
    positions = batch[f"{prefix}_positions"]
  else:
    segment_ids, positions = None, None
  return ids, *_default_packing(ids, segment_ids, positions, max_length,
                                name=prefix)


def _default_packing(ids: tf.Tensor, segment_ids: tf.Tensor | None,
                     positions: tf.Tensor | None, max_length: int, *,
                     name: str) -> tuple[tf.Tensor, tf.Tensor]:
  """Validates ids; fills in one-segment-per-row segment ids and positions."""
  if ids.dtype not in (tf.int32, tf.int64) or ids.shape.rank != 2:
    raise ValueError(f"{name} must be int32 [batch, length], got "
                     f"{ids.dtype.name} {ids.shape}")
  length = ids.shape[1]
  if length is not None and length > max_length:
    raise ValueError(
        f"{name} has length {length} > --max_length={max_length}; raise "
        "--max_length or truncate the data")
  if segment_ids is None:
    segment_ids = tf.cast(tf.not_equal(ids, 0), tf.int32)
  if positions is None:
    # Built from ids (not broadcast to tf.shape(ids)) so that on a mesh the
    # positions, and the encodings made from them, keep the rows' split.
    positions = tf.zeros_like(ids) + tf.range(tf.shape(ids)[1],
                                              dtype=ids.dtype)
  return tf.cast(segment_ids, tf.int32), tf.cast(positions, tf.int32)


def _make_ffn(config: ModelConfig, index: int, *, causal: bool,
              sharding: sharding_lib.Sharding) -> tf.Module:
  if config.moe.is_moe_layer(index):
    return MoeLayer(config=config, causal=causal, name="moe",
                    sharding=sharding)
  return layers.DenseFfn(d_model=config.d_model, d_ff=config.d_ff,
                         init_scale=config.init_scale, name="ffn",
                         sharding=sharding,
                         output_scale=config.ffn_output_scale)


def _attention(config: ModelConfig, name: str,
               sharding: sharding_lib.Sharding) -> layers.MultiHeadAttention:
  return layers.MultiHeadAttention(
      d_model=config.d_model, num_heads=config.num_heads, d_kv=config.d_kv,
      dropout_rate=config.attention_dropout_rate,
      init_scale=config.init_scale, name=name, sharding=sharding)


# MoE routing groups (see "Decode routing" in the module docstring):
# "batch" = MoeLayer's groups of moe.group_size over the whole batch (training
# and eval losses); "rows" = one group per row; "tokens" = one per token.
_ROUTING_GROUPS = ("batch", "rows", "tokens")


def _ffn_block(ffn: tf.Module, x: tf.Tensor, *, padding_mask: tf.Tensor,
               training: bool, seed: tf.Tensor | None,
               groups: str = "batch",
               languages: tf.Tensor | None = None) -> tuple[tf.Tensor, Any]:
  """Runs a dense FFN or an MoE layer; returns (outputs, MoeOutput or None).

  Args:
    ffn: a dense FFN or a MoeLayer.
    x: <dtype>[B, L, M].
    padding_mask: <float32>[B, L] 1 for real tokens.
    training: training mode.
    seed: <int32>[2] or None.
    groups: MoE routing groups, one of ``_ROUTING_GROUPS``.
    languages: <int32>[B, L] routing-language indices (language routing
      only; :mod:`m4moe.moe.task_routing`), else None.
  """
  if groups not in _ROUTING_GROUPS:
    raise ValueError(f"groups={groups!r} is invalid: use one of "
                     f"{', '.join(_ROUTING_GROUPS)}")
  if not isinstance(ffn, MoeLayer):
    return ffn(x), None
  if groups == "tokens":  # [B, L, M] -> [B*L, 1, M]: one row per token
    shape = tf.shape(x)
    moe_output = ffn(tf.reshape(x, [-1, 1, x.shape[-1]]),
                     padding_mask=tf.reshape(padding_mask, [-1, 1]),
                     training=training, seed=seed, group_per_row=True,
                     languages=(None if languages is None else
                                tf.reshape(languages, [-1, 1])))
    outputs = tf.reshape(moe_output.outputs, shape)
    return outputs, dataclasses.replace(moe_output, outputs=outputs)
  moe_output = ffn(x, padding_mask=padding_mask, training=training, seed=seed,
                   group_per_row=groups == "rows", languages=languages)
  return moe_output.outputs, moe_output


class _Layer(tf.Module):
  """Shared pieces of encoder and decoder layers."""

  def __init__(self, *, config: ModelConfig, index: int, causal: bool,
               name: str, sharding: sharding_lib.Sharding, remat: bool):
    super().__init__(name=name)
    # Recompute this layer's activations in the backward pass
    # (:mod:`m4moe.training.remat`).
    self.remat = remat
    self.dropout_rate = config.dropout_rate
    self.sharding = sharding
    with self.name_scope:
      self.self_attention_norm = layers.LayerNorm(d_model=config.d_model,
                                                  name="self_attention_norm")
      self.self_attention = _attention(config, "self_attention", sharding)
      self.ffn_norm = layers.LayerNorm(d_model=config.d_model, name="ffn_norm")
      self.ffn = _make_ffn(config, index, causal=causal, sharding=sharding)

  @property
  def is_moe(self) -> bool:
    return isinstance(self.ffn, MoeLayer)

  def _residual(self, x: tf.Tensor, branch: tf.Tensor, *, training: bool,
                seed: tf.Tensor | None) -> tf.Tensor:
    return x + layers.dropout(branch, rate=self.dropout_rate,
                              training=training, seed=seed,
                              sharding=self.sharding)

  def _self_attention_residual(self, x: tf.Tensor, *, bias: tf.Tensor,
                               training: bool,
                               seed: tf.Tensor | None) -> tf.Tensor:
    """Pre-LN self-attention block with dropout on the residual branch."""
    h = self.self_attention_norm(x)
    h = self.self_attention(h, h, bias=bias, training=training,
                            seed=numerics.fold_seed(seed, 0))
    return self._residual(x, h, training=training,
                          seed=numerics.fold_seed(seed, 1))

  def _ffn_residual(self, x: tf.Tensor, *, padding_mask: tf.Tensor,
                    training: bool, seed: tf.Tensor | None,
                    groups: str = "batch",
                    languages: tf.Tensor | None = None
                    ) -> tuple[tf.Tensor, Any]:
    y, moe_output = _ffn_block(self.ffn, self.ffn_norm(x),
                               padding_mask=padding_mask, training=training,
                               seed=numerics.fold_seed(seed, 4), groups=groups,
                               languages=languages)
    x = self._residual(x, y, training=training, seed=numerics.fold_seed(seed, 5))
    return x, moe_output


class EncoderLayer(_Layer):
  """Self-attention + (dense or MoE) feed-forward, pre-layer-norm."""

  def __init__(self, *, config: ModelConfig, index: int,
               name: str = "encoder_layer",
               sharding: sharding_lib.Sharding = sharding_lib.NO_SHARDING,
               remat: bool = False):
    super().__init__(config=config, index=index, causal=False, name=name,
                     sharding=sharding, remat=remat)

  @remat_lib.rematerializable
  def __call__(self, x: tf.Tensor, *, bias: tf.Tensor,
               padding_mask: tf.Tensor, training: bool,
               seed: tf.Tensor | None = None,
               groups: str = "batch",
               languages: tf.Tensor | None = None) -> tuple[tf.Tensor, Any]:
    """Encodes ``x`` <dtype>[B, Ls, M].

    Args:
      x: <dtype>[B, Ls, M].
      bias: <float32>[B, 1, Ls, Ls] self-attention bias.
      padding_mask: <float32>[B, Ls], 1 for real tokens.
      training: enables dropout and training-time routing.
      seed: <int32>[2] or None.
      groups: MoE routing groups: ``batch``, ``rows`` or ``tokens``.
      languages: <int32>[B, Ls] routing languages (language routing only).

    Returns:
      (<dtype>[B, Ls, M], MoeOutput or None).
    """
    x = self._self_attention_residual(x, bias=bias, training=training,
                                      seed=seed)
    return self._ffn_residual(x, padding_mask=padding_mask, training=training,
                              seed=seed, groups=groups, languages=languages)


class DecoderLayer(_Layer):
  """Causal self-attention + cross-attention + (dense or MoE) FFN."""

  def __init__(self, *, config: ModelConfig, index: int,
               name: str = "decoder_layer",
               sharding: sharding_lib.Sharding = sharding_lib.NO_SHARDING,
               remat: bool = False):
    super().__init__(config=config, index=index, causal=True, name=name,
                     sharding=sharding, remat=remat)
    with self.name_scope:
      self.cross_attention_norm = layers.LayerNorm(
          d_model=config.d_model, name="cross_attention_norm")
      self.cross_attention = _attention(config, "cross_attention",
                                        self.sharding)

  @remat_lib.rematerializable
  def __call__(self, x: tf.Tensor, *, self_bias: tf.Tensor,
               cross_keys: tf.Tensor, cross_values: tf.Tensor,
               cross_bias: tf.Tensor, padding_mask: tf.Tensor, training: bool,
               seed: tf.Tensor | None = None,
               groups: str = "batch",
               languages: tf.Tensor | None = None) -> tuple[tf.Tensor, Any]:
    """Teacher-forced pass over the whole target.

    Args:
      x: <dtype>[B, Lt, M].
      self_bias: <float32>[B, 1, Lt, Lt] causal + segment bias.
      cross_keys, cross_values: <dtype>[B, Ls, A, D].
      cross_bias: <float32>[B, 1, Lt, Ls].
      padding_mask: <float32>[B, Lt], 1 for real target tokens.
      training: enables dropout and training-time routing.
      seed: <int32>[2] or None.
      groups: MoE routing groups: ``batch``, ``rows`` or ``tokens``.
      languages: <int32>[B, Lt] routing languages (language routing only).

    Returns:
      (<dtype>[B, Lt, M], MoeOutput or None).
    """
    x = self._self_attention_residual(x, bias=self_bias, training=training,
                                      seed=seed)
    h = self.cross_attention.attend(
        self.cross_attention_norm(x), cross_keys, cross_values,
        bias=cross_bias, training=training, seed=numerics.fold_seed(seed, 2))
    x = self._residual(x, h, training=training, seed=numerics.fold_seed(seed, 3))
    return self._ffn_residual(x, padding_mask=padding_mask, training=training,
                              seed=seed, groups=groups, languages=languages)

  def step(self, x: tf.Tensor, *, keys: tf.Tensor, values: tf.Tensor,
           step: tf.Tensor, cross_keys: tf.Tensor, cross_values: tf.Tensor,
           cross_bias: tf.Tensor, live: tf.Tensor,
           languages: tf.Tensor | None = None
           ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """One incremental (inference) step for the token at position ``step``.

    Each token is its own MoE routing group; dead rows are MoE padding.

    Args:
      x: <dtype>[B, 1, M].
      keys, values: <dtype>[B, Ld, A, D] this layer's self-attention cache.
      step: <int32>[].
      cross_keys, cross_values: <dtype>[B, Ls, A, D].
      cross_bias: <float32>[B, 1, 1, Ls].
      live: <float32>[B, 1] 1 for rows that hold a real hypothesis.
      languages: <int32>[B, 1] routing languages (language routing only).

    Returns:
      (<dtype>[B, 1, M], updated keys, updated values).
    """
    h, keys, values = self.self_attention.cached_self_attention(
        self.self_attention_norm(x), keys=keys, values=values, step=step)
    x = x + h
    x = x + self.cross_attention.attend(
        self.cross_attention_norm(x), cross_keys, cross_values,
        bias=cross_bias, training=False, seed=None)
    x, _ = self._ffn_residual(x, padding_mask=live, training=False,
                              seed=None, groups="tokens", languages=languages)
    return x, keys, values


def _sum_moe(moe_outputs: Mapping[str, Any]) -> tuple[tf.Tensor, ...]:
  """(moe_loss, aux_loss, z_loss) summed over MoE layers, float32 scalars."""
  zero = tf.constant(0.0, tf.float32)
  totals = [zero, zero, zero]
  for out in moe_outputs.values():
    totals[0] += tf.cast(out.weighted_loss, tf.float32)
    totals[1] += tf.cast(out.aux_loss, tf.float32)
    totals[2] += tf.cast(out.z_loss, tf.float32)
  return tuple(totals)


class Transformer(tf.Module):
  """Encoder-decoder Transformer with GShard-style MoE feed-forward layers.

  Args:
    config: the validated model config.
    share_target_embedding: reuse the target embedding table as the softmax
      weights (tied); otherwise a separate [M, V] projection is learned.
    name: module name.
    sharding: GShard annotations for the layers (default: none).
    remat: recompute each encoder/decoder layer's activations in the
      backward pass (:mod:`m4moe.training.remat`).
  """

  def __init__(self, *, config: ModelConfig, name: str = "transformer",
               share_target_embedding: bool = False,
               sharding: sharding_lib.Sharding = sharding_lib.NO_SHARDING,
               remat: bool = False):
    super().__init__(name=name)
    self.config = config
    self.dtype = _DTYPES[config.activation_dtype]
    self.share_target_embedding = share_target_embedding
    self.sharding = sharding
    c = config
    with self.name_scope:
      self.source_embedding = layers.Embedding(
          vocab_size=c.src_vocab_size, d_model=c.d_model,
          init_scale=c.init_scale, name="source_embedding")
      self.target_embedding = layers.Embedding(
          vocab_size=c.tgt_vocab_size, d_model=c.d_model,
          init_scale=c.init_scale, name="target_embedding")
      self.encoder_layers = [
          EncoderLayer(config=c, index=i, name=f"encoder_layer_{i}",
                       sharding=sharding, remat=remat)
          for i in range(c.num_encoder_layers)]
      self.decoder_layers = [
          DecoderLayer(config=c, index=i, name=f"decoder_layer_{i}",
                       sharding=sharding, remat=remat)
          for i in range(c.num_decoder_layers)]
      self.encoder_norm = layers.LayerNorm(d_model=c.d_model,
                                           name="encoder_norm")
      self.decoder_norm = layers.LayerNorm(d_model=c.d_model,
                                           name="decoder_norm")
      self.output_projection = None
      if not share_target_embedding:
        self.output_projection = layers.OutputProjection(
            d_model=c.d_model, vocab_size=c.tgt_vocab_size,
            init_scale=c.init_scale, name="output_projection")

  def __call__(self, batch: Mapping[str, tf.Tensor], *, training: bool,
               seed: tf.Tensor | None = None,
               per_sentence_routing: bool = False) -> ModelOutput:
    """Teacher-forced forward pass.

    Args:
      batch: "inputs" <int32>[B, Ls], "targets" <int32>[B, Lt] (0 = pad) and
        optionally the four packing features (see the module docstring).
      training: enables dropout and training-time MoE routing/capacity.
      seed: <int32>[2]; required when training with any randomness.
      per_sentence_routing: route the MoE layers as decoding does (one group
        per source row, one per target token; see the module docstring), so
        the logits equal :meth:`decode_step`'s. Needs unpacked rows (one
        sentence each). False: GShard groups of ``moe.group_size`` over the
        batch (training and eval losses).

    Returns:
      ModelOutput with <float32>[B, Lt, V] logits and the MoE losses/stats.

    Raises:
      ValueError: for a packed batch with ``per_sentence_routing``.
    """
    self._check_seed(training=training, seed=seed)
    packed_keys = sorted(k for k in batch if k.endswith(_PACKING_KEYS))
    if per_sentence_routing and packed_keys:
      raise ValueError(
          f"per_sentence_routing needs one sentence per row, but the batch "
          f"is packed ({', '.join(packed_keys)}); pass unpacked rows")
    inputs, in_segments, in_positions = _sequence_features(
        batch, "inputs", self.config.max_length)
    targets, tgt_segments, tgt_positions = _sequence_features(
        batch, "targets", self.config.max_length)
    in_languages, tgt_languages = self._batch_languages(batch)
    encoder_output, moe_outputs = self._encode(
        inputs, segment_ids=in_segments, positions=in_positions,
        training=training, seed=numerics.fold_seed(seed, 0),
        groups="rows" if per_sentence_routing else "batch",
        languages=in_languages)
    packed = "targets_segment_ids" in batch
    decoder_inputs = shift_right(targets,
                                 segment_ids=tgt_segments if packed else None)
    logits, decoder_moe = self._decode(
        encoder_output, decoder_inputs, segment_ids=tgt_segments,
        positions=tgt_positions, training=training,
        seed=numerics.fold_seed(seed, 1),
        groups="tokens" if per_sentence_routing else "batch",
        languages=tgt_languages)
    moe_outputs.update(decoder_moe)
    moe_loss, aux_loss, z_loss = _sum_moe(moe_outputs)
    return ModelOutput(
        logits=logits, moe_loss=moe_loss, aux_loss=aux_loss, z_loss=z_loss,
        moe_stats={name: out.stats for name, out in moe_outputs.items()})

  @property
  def routes_by_language(self) -> bool:
    """True if some MoE layer routes by language (needs language ids)."""
    return self.config.moe.route_by == "language" and any(
        layer.is_moe for layer in [*self.encoder_layers,
                                   *self.decoder_layers])

  def _batch_languages(self, batch: Mapping[str, tf.Tensor]
                       ) -> tuple[tf.Tensor | None, tf.Tensor | None]:
    """(<int32>[B, Ls], <int32>[B, Lt]) routing languages, or (None, None).

    Raises:
      ValueError: a language routing model's batch lacks them.
    """
    if not self.routes_by_language:
      return None, None
    missing = [k for k in task_routing.KEYS if k not in batch]
    if missing:
      raise ValueError(
          f"--route_by=language: the batch has no {', '.join(missing)} "
          f"(keys: {sorted(batch)}); give every token its routing-language "
          "index (m4moe.moe.task_routing.language_features for unpacked rows)")
    return tuple(tf.cast(batch[k], tf.int32) for k in task_routing.KEYS)

  def encode(self, inputs: tf.Tensor, *, segment_ids: tf.Tensor | None = None,
             positions: tf.Tensor | None = None, training: bool = False,
             seed: tf.Tensor | None = None,
             languages: tf.Tensor | None = None) -> EncoderOutput:
    """Encodes a source batch for decoding.

    Every row is its own MoE routing group with the capacity of its
    real-token count (decode routing, see the module docstring), so a row's
    encoding does not depend on the rest of the batch or on its padding.

    Args:
      inputs: <int32>[B, Ls] source ids, 0 = padding (an Ls unknown
        statically is padded to ``max_length`` inside the MoE layers).
      segment_ids: <int32>[B, Ls] or None (then ``inputs != 0``).
      positions: <int32>[B, Ls] or None (then 0..Ls-1).
      training: enables dropout (normally False here).
      seed: <int32>[2] or None.
      languages: <int32>[B] routing language of each row; required with
        ``--route_by=language`` (:mod:`m4moe.moe.task_routing`), else ignored.

    Returns:
      EncoderOutput including every decoder layer's cross-attention
      keys/values and the rows' routing languages.

    Raises:
      ValueError: a language routing model without ``languages``.
    """
    self._check_seed(training=training, seed=seed)
    inputs = tf.convert_to_tensor(inputs)
    segment_ids, positions = _default_packing(
        inputs, segment_ids, positions, self.config.max_length, name="inputs")
    token_languages = None
    if self.routes_by_language:
      if languages is None:
        raise ValueError(
            "--route_by=language: encode() needs languages=<int32>[B], the "
            "routing-language index of each row (MoeConfig.language_index)")
      token_languages = task_routing.per_token(languages, like=inputs)
    encoder_output, _ = self._encode(inputs, segment_ids=segment_ids,
                                     positions=positions, training=training,
                                     seed=seed, groups="rows",
                                     languages=token_languages)
    return encoder_output

  def _check_seed(self, *, training: bool, seed: Any) -> None:
    """Raises ValueError if a training step would be random without a seed."""
    if not training or seed is not None:
      return
    c = self.config
    reasons = [f"--{name}={getattr(c, name)}"
               for name in ("dropout_rate", "attention_dropout_rate")
               if getattr(c, name) > 0]
    layers_ = [*self.encoder_layers, *self.decoder_layers]
    if any(layer.is_moe and layer.ffn.uses_randomness(training=True)
           for layer in layers_):
      reasons.append(f"MoE --router={c.moe.router} (random routing, jitter, "
                     "noise or expert dropout)")
    if reasons:
      raise ValueError(
          f"training=True with {', '.join(reasons)} is random and needs "
          "seed=<int32>[2] (the trainer passes fold_in(base_seed, step))")

  def _embed(self, embedding: layers.Embedding, ids: tf.Tensor,
             positions: tf.Tensor, *, training: bool,
             seed: tf.Tensor | None) -> tf.Tensor:
    """Token + sinusoidal position embedding, with input dropout."""
    x = embedding(ids, dtype=self.dtype) + layers.sinusoidal_positions(
        positions, d_model=self.config.d_model, dtype=self.dtype)
    return layers.dropout(x, rate=self.config.dropout_rate, training=training,
                          seed=seed, sharding=self.sharding)

  def _encode(self, inputs: tf.Tensor, *, segment_ids: tf.Tensor,
              positions: tf.Tensor, training: bool, seed: tf.Tensor | None,
              groups: str, languages: tf.Tensor | None = None
              ) -> tuple[EncoderOutput, dict[str, Any]]:
    """Runs the encoder stack; returns its output and the MoeOutputs.

    ``groups``: MoE routing groups (``batch`` or ``rows``); ``languages``:
    <int32>[B, Ls] routing languages (language routing) or None. The
    output's per-row languages are those of each row's first token.
    """
    x = self._embed(self.source_embedding, inputs, positions,
                    training=training, seed=numerics.fold_seed(seed, 0))
    bias = layers.attention_bias(segment_ids, segment_ids, causal=False)
    padding_mask = tf.cast(segment_ids > 0, tf.float32)
    moe_outputs = {}
    for i, layer in enumerate(self.encoder_layers):
      x, moe_output = layer(x, bias=bias, padding_mask=padding_mask,
                            training=training,
                            seed=numerics.fold_seed(seed, i + 1), groups=groups,
                            languages=languages)
      if moe_output is not None:
        moe_outputs[f"encoder/layer_{i}/moe"] = moe_output
    final_seed = numerics.fold_seed(seed, len(self.encoder_layers) + 1)
    x = layers.dropout(self.encoder_norm(x), rate=self.config.dropout_rate,
                       training=training, seed=final_seed,
                       sharding=self.sharding)
    cross = [layer.cross_attention.project_kv(x)
             for layer in self.decoder_layers]
    if languages is None:
      row_languages = tf.zeros(tf.shape(inputs)[:1], tf.int32)
    else:
      row_languages = languages[:, 0]
    output = EncoderOutput(
        encoded=x, segment_ids=segment_ids,
        cross_keys=tuple(k for k, _ in cross),
        cross_values=tuple(v for _, v in cross), languages=row_languages)
    return output, moe_outputs

  def _logits(self, x: tf.Tensor) -> tf.Tensor:
    """<dtype>[B, T, M] final decoder states -> <float32>[B, T, V]."""
    if self.output_projection is None:
      return self.target_embedding.attend(x)
    return self.output_projection(x)

  def _decode(self, encoder_output: EncoderOutput, decoder_inputs: tf.Tensor,
              *, segment_ids: tf.Tensor, positions: tf.Tensor, training: bool,
              seed: tf.Tensor | None, groups: str,
              languages: tf.Tensor | None = None
              ) -> tuple[tf.Tensor, dict[str, Any]]:
    """Teacher-forced decoder stack; returns (logits, MoeOutputs).

    ``groups``: MoE routing groups (``batch`` or ``tokens``); ``languages``:
    <int32>[B, Lt] routing languages (language routing) or None.
    """
    x = self._embed(self.target_embedding, decoder_inputs, positions,
                    training=training, seed=numerics.fold_seed(seed, 0))
    self_bias = layers.attention_bias(segment_ids, segment_ids, causal=True)
    cross_bias = layers.attention_bias(segment_ids, encoder_output.segment_ids,
                                       causal=False)
    padding_mask = tf.cast(segment_ids > 0, tf.float32)
    moe_outputs = {}
    for i, layer in enumerate(self.decoder_layers):
      x, moe_output = layer(
          x, self_bias=self_bias, cross_keys=encoder_output.cross_keys[i],
          cross_values=encoder_output.cross_values[i], cross_bias=cross_bias,
          padding_mask=padding_mask, training=training,
          seed=numerics.fold_seed(seed, i + 1), groups=groups,
          languages=languages)
      if moe_output is not None:
        moe_outputs[f"decoder/layer_{i}/moe"] = moe_output
    final_seed = numerics.fold_seed(seed, len(self.decoder_layers) + 1)
    x = layers.dropout(self.decoder_norm(x), rate=self.config.dropout_rate,
                       training=training, seed=final_seed,
                       sharding=self.sharding)
    return self._logits(x), moe_outputs

  def init_cache(self, *, batch_size: int | tf.Tensor,
                 max_length: int) -> DecoderCache:
    """An empty self-attention cache for decoding up to ``max_length`` tokens.

    Returns:
      DecoderCache of zeros, each tensor <activation dtype>[B, Ld, A, D].
    """
    if not 1 <= max_length <= self.config.max_length:
      raise ValueError(
          f"init_cache(max_length={max_length}) must be in "
          f"[1, --max_length={self.config.max_length}]")
    shape = [batch_size, max_length, self.config.num_heads, self.config.d_kv]
    count = len(self.decoder_layers)
    return DecoderCache(
        keys=tuple(tf.zeros(shape, self.dtype) for _ in range(count)),
        values=tuple(tf.zeros(shape, self.dtype) for _ in range(count)))

  def decode_step(self, *, encoder_output: EncoderOutput,
                  token_ids: tf.Tensor, cache: DecoderCache,
                  step: tf.Tensor, live: tf.Tensor | None = None
                  ) -> tuple[tf.Tensor, DecoderCache]:
    """Logits for position ``step`` given the previous token, and the cache.

    Equals the teacher-forced pass (``training=False,
    per_sentence_routing=True``) at that position for live rows. Assumes one
    source sentence per row (every non-pad source token is visible). MoE
    layers use the eval capacity with one routing group per token (see the
    module docstring); dead rows take no expert slot.

    Args:
      encoder_output: from :meth:`encode` (possibly tiled for beams).
      token_ids: <int32>[B] the token at position ``step - 1`` (0, the start
        token, at step 0).
      cache: the DecoderCache after steps 0..step-1.
      step: <int32>[] current position, in [0, Ld).
      live: <bool>[B] rows holding a real hypothesis (None: all). A dead
        row's MoE outputs are 0, so its logits are not meaningful.

    Returns:
      (<float32>[B, V] logits, DecoderCache with slot ``step`` filled).
    """
    step = tf.convert_to_tensor(step, tf.int32)
    token_ids = tf.convert_to_tensor(token_ids)[:, None]
    positions = tf.fill(tf.shape(token_ids), step)
    x = self._embed(self.target_embedding, token_ids, positions,
                    training=False, seed=None)
    key_visible = encoder_output.segment_ids > 0
    cross_bias = tf.where(key_visible, 0.0, numerics.NEG_INF)[:, None, None, :]
    if live is None:
      live_mask = tf.ones(tf.shape(token_ids), tf.float32)
    else:
      live_mask = tf.cast(tf.reshape(live, [-1, 1]), tf.float32)
    languages = None
    if self.routes_by_language:
      languages = tf.reshape(encoder_output.languages, [-1, 1])
    keys, values = [], []
    for i, layer in enumerate(self.decoder_layers):
      x, k, v = layer.step(
          x, keys=cache.keys[i], values=cache.values[i], step=step,
          cross_keys=encoder_output.cross_keys[i],
          cross_values=encoder_output.cross_values[i], cross_bias=cross_bias,
          live=live_mask, languages=languages)
      keys.append(k)
      values.append(v)
    logits = self._logits(self.decoder_norm(x))[:, 0]
    return logits, DecoderCache(keys=tuple(keys), values=tuple(values))
