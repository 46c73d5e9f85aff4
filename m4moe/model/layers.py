"""Transformer building blocks as ``tf.Module``s with plain ``tf.Variable``s.

Dimensions (glossary letters, :mod:`m4moe`; also the einsum letters):

  B: batch rows; L: sequence length; Q: query length; U: key (memory)
  length; Ld: decoding length (the self-attention cache); M: model width
  (d_model); A: attention heads; D: key/value width per head (d_kv);
  F: dense feed-forward hidden width (d_ff); V: vocabulary size.

Precision: every weight is a float32 ``tf.Variable`` and is cast to the
activation dtype (``float32`` or ``bfloat16``) where it is used. Layer norm
statistics, attention softmax and output logits are computed in float32.

Randomness is stateless: every call that may drop units takes
``seed: <int32>[2] | None`` and derives sub-seeds with
:func:`m4moe.model.numerics.fold_seed`.

Tensor parallelism (Megatron-style, on a mesh with a ``model`` axis; see
:mod:`m4moe.parallel.sharding`): attention splits its heads A over ``model`` (``wq``,
``wk``, ``wv`` column-split, ``wo`` row-split) and the dense FFN its hidden
F (``wi`` column-split, ``wo`` row-split), so each block runs head- or
column-local up to its output projection, whose contraction over the split
dimension is the block's one reduction (an all-reduce over ``model``; the
output is annotated whole on ``model``). The backward pass reduces once
more, on the block's input gradient. Activations keep their batch rows B
on ``data`` (when ``data`` divides B). On meshes without a ``model`` axis
these annotations are skipped: layouts follow from the data-split batch.
"""

from __future__ import annotations

import math
import tensorflow as tf

from m4moe.parallel import sharding as sharding_lib
from m4moe.model.initializers import init_variable
# NEG_INF is the additive attention bias of disallowed (query, key) pairs;
# fold_seed stays importable from here for older callers.
from m4moe.model.numerics import NEG_INF, fold_seed  # pylint: disable=unused-import  # noqa: F401


# Dropout masks are drawn at 16 bits per unit: one 32-bit Philox word gives
# two units. A unit is kept when its 16-bit number is >= the threshold
# round(rate * 2**16), i.e. with probability 1 - rate to within 2**-17.
DROPOUT_BITS = 16


def dropout_threshold(rate: float) -> int:
  """The 16-bit number below which a unit is dropped: round(rate * 2**16).

  Args:
    rate: probability of zeroing a unit, in [0, 1).

  Returns:
    An int in [0, 2**16]; a unit is kept with probability
    ``1 - threshold / 2**16``, which is ``1 - rate`` to within 2**-17
    (2**16, every unit dropped, for rates within 2**-17 of 1).

  Raises:
    ValueError: ``rate`` outside [0, 1).
  """
  if not 0 <= rate < 1:
    raise ValueError(f"dropout rate={rate} must be in [0, 1): it is the "
                     "probability of zeroing a unit (e.g. 0.1)")
  return round(rate * (1 << DROPOUT_BITS))


def dropout_scale(shape: tf.Tensor | list[int], *, rate: float,
                  seed: tf.Tensor, dtype: tf.DType,
                  sharding: sharding_lib.Sharding = sharding_lib.NO_SHARDING
                  ) -> tf.Tensor:
  """The stateless inverted-dropout multiplier: 0 or 1/(1-rate) per unit.

  The one place that decides how dropout masks are drawn (:func:`dropout`,
  attention dropout and the experts' hidden-unit dropout use it). With N the
  number of units (row-major over ``shape``), the draw is one
  ``tf.random.stateless_uniform([ceil(N/2)], seed, dtype=tf.uint32,
  minval=None, maxval=None)``: word ``w[i]`` gives unit ``2i`` its low 16
  bits (``w[i] & 0xffff``) and unit ``2i+1`` its high 16 bits
  (``w[i] >> 16``); a unit is kept iff its number is
  ``>= dropout_threshold(rate)`` (0.1 -> 6554/65536). Half the Philox work
  of one float32 uniform per unit.

  Args:
    shape: <int32>[R] or a list, the shape of the units.
    rate: probability of zeroing a unit, in [0, 1).
    seed: <int32>[2].
    dtype: the multiplier's dtype (the activations').
    sharding: under a mesh the draw is pinned
      (:meth:`~m4moe.parallel.sharding.Sharding.pin_random`) so the mask equals the
      one-device mask.

  Returns:
    <dtype>[*shape]: 0 for dropped units, ``1 / (1 - rate)`` (rounded to
    ``dtype``) for kept ones.

  Raises:
    ValueError: ``rate`` outside [0, 1).
  """
  threshold = dropout_threshold(rate)
  shape = tf.convert_to_tensor(shape, tf.int32)
  if threshold == 1 << DROPOUT_BITS:  # no 16-bit number is kept
    return tf.zeros(shape, dtype)
  size = tf.reduce_prod(shape)
  words = sharding.pin_random(
      tf.random.stateless_uniform(tf.reshape((size + 1) // 2, [1]), seed=seed,
                                  minval=None, maxval=None, dtype=tf.uint32),
      name="dropout_draws")
  # <uint16>[ceil(N / 2), 2]: low then high half of each word (bitcast is
  # little-endian on every platform TF runs on). Replicated like the draw:
  # DTensor has no rule for a Bitcast whose output layout differs from its
  # input's (it would take the sharded layout of the consumer).
  halves = sharding.replicate(tf.bitcast(words, tf.uint16),
                              name="dropout_numbers")
  numbers = tf.reshape(halves, [-1])[:size]
  keep = tf.reshape(numbers, shape) >= tf.constant(threshold, tf.uint16)
  return tf.cast(keep, dtype) * tf.constant(1 / (1 - rate), dtype)


def dropout(x: tf.Tensor, *, rate: float, training: bool,
            seed: tf.Tensor | None,
            sharding: sharding_lib.Sharding = sharding_lib.NO_SHARDING
            ) -> tf.Tensor:
  """Stateless inverted dropout: ``x * dropout_scale(...)``.

  Args:
    x: <any float>[...].
    rate: probability of zeroing a unit, in [0, 1).
    training: dropout is only applied when True.
    seed: <int32>[2]; required when ``training`` and ``rate > 0``.
    sharding: under a mesh the draw is pinned
      (:meth:`~m4moe.parallel.sharding.Sharding.pin_random`) so the mask equals the
      one-device mask.

  Returns:
    Same dtype and shape as ``x``: the mask of :func:`dropout_scale` (16-bit
    numbers from a uint32 Philox draw) times ``x``. Nothing is drawn when
    ``training`` is False or ``rate`` is 0.

  Raises:
    ValueError: ``training=True`` with ``rate > 0`` and no seed; ``rate``
      outside [0, 1).
  """
  if not training or rate == 0:
    return x
  if seed is None:
    raise ValueError(
        f"dropout(rate={rate}) with training=True needs a seed: pass "
        "seed=<int32>[2] (e.g. fold_in(base_seed, step)) or training=False")
  return x * dropout_scale(tf.shape(x), rate=rate, seed=seed, dtype=x.dtype,
                           sharding=sharding)


def tensor_parallel(t: tf.Tensor, *, sharding: sharding_lib.Sharding,
                    model_dim: int | None, name: str) -> tf.Tensor:
  """Annotates an activation for tensor parallelism over ``model``.

  Args:
    t: <any>[B, ...] an activation whose dimension 0 is the batch rows.
    sharding: the layout; without a ``model`` axis of size > 1 ``t`` is
      returned unchanged.
    model_dim: the dimension split over ``model`` (heads A or hidden F);
      None for an output that must be whole on every ``model`` device (the
      reduction of a row-split projection).
    name: name of the annotation.

  Returns:
    ``t``, with B split over the batch axis (``Sharding.batch_axis``) when
    that axis divides it.

  Raises:
    MeshError: ``model`` does not divide dimension ``model_dim``
      (:func:`m4moe.parallel.mesh.validate_mesh` checks the flags earlier).
  """
  if not sharding.enabled or sharding.mesh.axis_size("model") == 1:
    return t
  spec: list[str | None] = [None] * t.shape.rank
  if sharding.divides(t.shape[0], sharding.batch_axis):
    spec[0] = sharding.batch_axis
  if model_dim is not None:
    spec[model_dim] = "model"
  return sharding.shard(t, tuple(spec), name=name)


def _model_split_weight(w: tf.Tensor, *, sharding: sharding_lib.Sharding,
                        spec: tuple[str | None, ...], name: str) -> tf.Tensor:
  """Annotates a (cast) weight with its ``model`` split (XLA reads it)."""
  if not sharding.enabled or sharding.mesh.axis_size("model") == 1:
    return w
  return sharding.shard(w, spec, name=name)


def sinusoidal_positions(positions: tf.Tensor, *, d_model: int,
                         dtype: tf.DType = tf.float32) -> tf.Tensor:
  """Sinusoidal position encodings of explicit position ids.

  Channel ``i < M/2`` is ``sin(p / 10000^(2i/M))`` and channel ``M/2 + i`` the
  matching cosine (an odd ``M`` gets a trailing zero channel). Explicit ids
  let packed segments restart at position 0.

  Args:
    positions: <int32>[B, L] position of each token within its segment.
    d_model: M.
    dtype: output dtype (computed in float32, then cast).

  Returns:
    <dtype>[B, L, M].
  """
  half = d_model // 2
  exponents = tf.range(half, dtype=tf.float32) * (2.0 / d_model)
  inv_timescales = tf.pow(10000.0, -exponents)  # [M/2]
  angles = tf.cast(positions, tf.float32)[..., None] * inv_timescales
  encoding = tf.concat([tf.sin(angles), tf.cos(angles)], axis=-1)
  if d_model % 2:
    encoding = tf.pad(encoding, [[0, 0], [0, 0], [0, 1]])
  return tf.cast(encoding, dtype)


def attention_bias(query_segment_ids: tf.Tensor, key_segment_ids: tf.Tensor,
                   *, causal: bool) -> tf.Tensor:
  """Additive attention bias from segment ids (0 = padding).

  A query may attend to a key iff both are in the same segment and the key is
  not padding; with ``causal`` also only to keys at or before its own index
  (queries and keys then index the same sequence).

  Args:
    query_segment_ids: <int32>[B, Q].
    key_segment_ids: <int32>[B, U].
    causal: add the causal mask (requires Q == U).

  Returns:
    <float32>[B, 1, Q, U]: 0 where allowed, ``NEG_INF`` elsewhere.
  """
  allowed = tf.logical_and(
      tf.equal(query_segment_ids[:, :, None], key_segment_ids[:, None, :]),
      tf.greater(key_segment_ids, 0)[:, None, :])
  if causal:
    length = tf.shape(query_segment_ids)[1]
    index = tf.range(length)
    allowed = tf.logical_and(allowed, tf.expand_dims(
        index[:, None] >= index[None, :], 0))
  return tf.expand_dims(tf.where(allowed, 0.0, NEG_INF), 1)


class Embedding(tf.Module):
  """Token embedding table, optionally reused as the output softmax weights.

  The table is initialised with std sqrt(init_scale / M) (its fan-in when it
  serves as the softmax projection) and lookups are multiplied by sqrt(M), so
  embedded tokens have std ~sqrt(init_scale).
  """

  def __init__(self, *, vocab_size: int, d_model: int, init_scale: float,
               name: str = "embedding"):
    super().__init__(name=name)
    self.vocab_size = vocab_size
    self.d_model = d_model
    with self.name_scope:
      self.embeddings = init_variable([vocab_size, d_model], fan_in=d_model,
                                      scale=init_scale, name="embeddings")

  def __call__(self, ids: tf.Tensor, *, dtype: tf.DType) -> tf.Tensor:
    """Looks up ``ids`` <int32>[...] and returns <dtype>[..., M]."""
    vectors = tf.gather(self.embeddings, ids) * math.sqrt(self.d_model)
    return tf.cast(vectors, dtype)

  def attend(self, x: tf.Tensor) -> tf.Tensor:
    """Tied softmax logits: <any float>[B, L, M] or [B, M] -> <float32>[..., V]."""
    x = tf.cast(x, tf.float32)
    # Explicit letters: DTensor's einsum has no "..." broadcasting, and the
    # gradient of "...M,VM->...V" is ~100x slower on CPU than this form.
    if x.shape.rank == 3:
      return tf.einsum("BLM,VM->BLV", x, self.embeddings)
    return tf.einsum("BM,VM->BV", x, self.embeddings)


class OutputProjection(tf.Module):
  """Untied softmax projection to float32 logits."""

  def __init__(self, *, d_model: int, vocab_size: int, init_scale: float,
               name: str = "logits"):
    super().__init__(name=name)
    with self.name_scope:
      self.kernel = init_variable([d_model, vocab_size], fan_in=d_model,
                                  scale=init_scale, name="kernel")

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    """<any float>[B, L, M] or [B, M] -> <float32>[B, L, V] or [B, V]."""
    x = tf.cast(x, tf.float32)
    # Explicit letters: DTensor's einsum has no "..." broadcasting, and the
    # gradient of "...M,MV->...V" is ~100x slower on CPU than this form.
    if x.shape.rank == 3:
      return tf.einsum("BLM,MV->BLV", x, self.kernel)
    return tf.einsum("BM,MV->BV", x, self.kernel)


class LayerNorm(tf.Module):
  """Layer normalisation over the last axis with a learned scale and bias.

  Statistics are computed in float32; the output has the input's dtype.
  """

  def __init__(self, *, d_model: int, epsilon: float = 1e-6,
               name: str = "layer_norm"):
    super().__init__(name=name)
    self.epsilon = epsilon
    with self.name_scope:
      self.scale = tf.Variable(tf.ones([d_model]), name="scale")
      self.bias = tf.Variable(tf.zeros([d_model]), name="bias")

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    """<dtype>[..., M] -> <dtype>[..., M]."""
    x32 = tf.cast(x, tf.float32)
    mean, variance = tf.nn.moments(x32, axes=[-1], keepdims=True)
    normed = (x32 - mean) * tf.math.rsqrt(variance + self.epsilon)
    return tf.cast(normed * self.scale + self.bias, x.dtype)


class MultiHeadAttention(tf.Module):
  """Multi-head dot-product attention with a per-head key/value width D.

  Weights: ``wq``, ``wk``, ``wv`` <float32>[M, A, D] and ``wo``
  <float32>[A, D, M]. On a mesh with a ``model`` axis the heads A are split
  over it (:func:`tensor_parallel`): one all-reduce per block, at ``wo``.
  Queries are scaled by D^-0.5. Keys/values can be projected once
  (:meth:`project_kv`) and reused, which is how cross-attention memories and
  the decoder's incremental self-attention cache work.
  """

  def __init__(self, *, d_model: int, num_heads: int, d_kv: int,
               dropout_rate: float, init_scale: float,
               name: str = "attention",
               sharding: sharding_lib.Sharding = sharding_lib.NO_SHARDING):
    super().__init__(name=name)
    self.d_kv = d_kv
    self.num_heads = num_heads
    self.dropout_rate = dropout_rate
    self.sharding = sharding
    with self.name_scope:
      shape = [d_model, num_heads, d_kv]
      self.wq, self.wk, self.wv = (
          init_variable(shape, fan_in=d_model, scale=init_scale, name=w)
          for w in ("wq", "wk", "wv"))
      self.wo = init_variable([num_heads, d_kv, d_model],
                              fan_in=num_heads * d_kv, scale=init_scale,
                              name="wo")

  def _weight(self, w: tf.Variable, dtype: tf.DType, *,
              spec: tuple[str | None, ...], name: str) -> tf.Tensor:
    return _model_split_weight(tf.cast(w, dtype), sharding=self.sharding,
                               spec=spec, name=name)

  def _project_in(self, x: tf.Tensor, w: tf.Variable, *,
                  name: str) -> tf.Tensor:
    """<dtype>[B, L, M] -> <dtype>[B, L, A, D], column-split on A."""
    w = self._weight(w, x.dtype, spec=(None, "model", None), name=name)
    out = tf.einsum("BLM,MAD->BLAD", x, w)
    return tensor_parallel(out, sharding=self.sharding, model_dim=2,
                           name=f"{name}_heads")

  def project_query(self, x: tf.Tensor) -> tf.Tensor:
    """<dtype>[B, Q, M] -> scaled queries <dtype>[B, Q, A, D]."""
    q = self._project_in(x, self.wq, name="wq")
    return q * tf.cast(self.d_kv ** -0.5, x.dtype)

  def project_kv(self, memory: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """<dtype>[B, U, M] -> (keys, values), each <dtype>[B, U, A, D]."""
    return (self._project_in(memory, self.wk, name="wk"),
            self._project_in(memory, self.wv, name="wv"))

  def attend(self, x: tf.Tensor, keys: tf.Tensor, values: tf.Tensor, *,
             bias: tf.Tensor, training: bool,
             seed: tf.Tensor | None) -> tf.Tensor:
    """Attention of queries from ``x`` over projected keys/values.

    Args:
      x: <dtype>[B, Q, M] query inputs.
      keys, values: <dtype>[B, U, A, D] (from :meth:`project_kv`).
      bias: <float32>[B, 1 or A, Q, U] additive mask (0 or ``NEG_INF``).
      training: apply attention dropout.
      seed: <int32>[2] for attention dropout.

    Returns:
      <dtype>[B, Q, M].
    """
    q = self.project_query(x)
    scores = tf.einsum("BQAD,BUAD->BAQU", q, keys)
    probs = tf.nn.softmax(tf.cast(scores, tf.float32) + bias, axis=-1)
    probs = dropout(probs, rate=self.dropout_rate, training=training, seed=seed,
                    sharding=self.sharding)
    context = tf.einsum("BAQU,BUAD->BQAD", tf.cast(probs, x.dtype), values)
    context = tensor_parallel(context, sharding=self.sharding, model_dim=2,
                              name="context")
    wo = self._weight(self.wo, x.dtype, spec=("model", None, None), name="wo")
    out = tf.einsum("BQAD,ADM->BQM", context, wo)
    # The row-split projection's partial sums: the block's one all-reduce.
    return tensor_parallel(out, sharding=self.sharding, model_dim=None,
                           name="attention_output")

  def __call__(self, x: tf.Tensor, memory: tf.Tensor, *, bias: tf.Tensor,
               training: bool, seed: tf.Tensor | None = None) -> tf.Tensor:
    """Attention of ``x`` <dtype>[B, Q, M] over ``memory`` <dtype>[B, U, M].

    ``bias`` is <float32>[B, 1 or A, Q, U]; returns <dtype>[B, Q, M].
    """
    keys, values = self.project_kv(memory)
    return self.attend(x, keys, values, bias=bias, training=training,
                       seed=seed)

  def cached_self_attention(
      self, x: tf.Tensor, *, keys: tf.Tensor, values: tf.Tensor,
      step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """One incremental causal self-attention step over a preallocated cache.

    The key/value of the new token are written into slot ``step`` (a one-hot
    blend, so shapes stay static) and the token attends to slots ``<= step``.

    Args:
      x: <dtype>[B, 1, M] the token at position ``step``.
      keys, values: <dtype>[B, Ld, A, D] cache; slots ``>= step`` unused.
      step: <int32>[] current position, 0 <= step < Ld.

    Returns:
      (output <dtype>[B, 1, M], updated keys, updated values).
    """
    new_k, new_v = self.project_kv(x)
    max_length = tf.shape(keys)[1]
    slot = tf.one_hot(step, max_length, dtype=keys.dtype)[None, :, None, None]
    keys = keys * (1 - slot) + new_k * slot
    values = values * (1 - slot) + new_v * slot
    visible = tf.range(max_length) <= step
    bias = tf.where(visible, 0.0, NEG_INF)[None, None, None, :]
    out = self.attend(x, keys, values, bias=bias, training=False, seed=None)
    return out, keys, values


class DenseFfn(tf.Module):
  """Position-wise feed-forward layer ``wo · ReLU(wi · x)``.

  Weights: ``wi`` <float32>[M, F], ``wo`` <float32>[F, M]. On a mesh with a
  ``model`` axis F is split over it (``wi`` column-split, ``wo`` row-split;
  :func:`tensor_parallel`): one all-reduce per block, at ``wo``.
  ``output_scale`` multiplies the output (``ModelConfig.ffn_output_scale``).
  """

  def __init__(self, *, d_model: int, d_ff: int, init_scale: float,
               name: str = "ffn",
               sharding: sharding_lib.Sharding = sharding_lib.NO_SHARDING,
               output_scale: float = 1.0):
    super().__init__(name=name)
    self.sharding = sharding
    self.output_scale = output_scale
    with self.name_scope:
      self.wi = init_variable([d_model, d_ff], fan_in=d_model,
                              scale=init_scale, name="wi")
      self.wo = init_variable([d_ff, d_model], fan_in=d_ff, scale=init_scale,
                              name="wo")

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    """<dtype>[B, L, M] -> <dtype>[B, L, M]."""
    shard = self.sharding
    wi = _model_split_weight(tf.cast(self.wi, x.dtype), sharding=shard,
                             spec=(None, "model"), name="wi")
    wo = _model_split_weight(tf.cast(self.wo, x.dtype), sharding=shard,
                             spec=("model", None), name="wo")
    h = tf.nn.relu(tf.einsum("BLM,MF->BLF", x, wi))
    h = tensor_parallel(h, sharding=shard, model_dim=2, name="ffn_hidden")
    out = tf.einsum("BLF,FM->BLM", h, wo)
    if self.output_scale != 1.0:
      out = out * tf.cast(self.output_scale, out.dtype)
    # The row-split projection's partial sums: the block's one all-reduce.
    return tensor_parallel(out, sharding=shard, model_dim=None,
                           name="ffn_output")
