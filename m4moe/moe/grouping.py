"""Routing groups: a batch's tokens compacted and cut into ``[G, S]`` groups.

Dimensions (letters of the glossary in :mod:`m4moe`):

  D: row shards that group their own tokens; N: tokens (of a shard);
  G: groups; S: group size; M: model width; P: rows of a gathered table.

The MoE layer moves each shard's real tokens to the front (keeping their
order), so adding padding never changes which real tokens share a group,
then cuts the shard into groups of S tokens, the last one padded with
masked slots. Both directions (tokens -> group slots, group slots ->
tokens) are row permutations plus empty slots, so on one device they are
row gathers whose gradient is the gather by the inverse map
(:func:`permuted_gather`): no ``UnsortedSegmentSum``, which is what the
plain autodiff of a gather gives and what TensorFlow runs serially on CPU.
The inverse of the compaction is inverted directly, not found by a sort.
On a mesh the gathers are batched over D so no shard reads another's
tokens, and autodiff's gradient (a per-shard segment sum) is kept: an
inverse permutation indexes the flattened shards.
"""

from __future__ import annotations

import tensorflow as tf


def compaction_permutation(mask: tf.Tensor) -> tf.Tensor:
  """New position of each token within its row: real tokens first, in order.

  Args:
    mask: <float32>[D, N] 1 for real tokens, one row per shard.

  Returns:
    <int32>[D, N] position of each token in its row after the compaction.
  """
  real = tf.cast(mask > 0, tf.int32)
  real_position = tf.cumsum(real, axis=-1, exclusive=True)
  pad_position = (tf.reduce_sum(real, axis=-1, keepdims=True) +
                  tf.cumsum(1 - real, axis=-1, exclusive=True))
  return tf.where(real > 0, real_position, pad_position)


def compaction_source(mask: tf.Tensor, position: tf.Tensor, *,
                      one_device: bool) -> tf.Tensor:
  """The inverse of :func:`compaction_permutation`, row by row.

  On one device ``position``'s rows are inverted as one permutation of the
  flattened ``[D*N]`` tokens (``InvertPermutation``, linear time). On a
  mesh, where that would index across shards, a stable sort of the key
  "is padding" lists each row's real tokens, in order, then its padding
  tokens, in order: the same integers.

  Args:
    mask: <float32>[D, N].
    position: <int32>[D, N] :func:`compaction_permutation` of ``mask``.
    one_device: not on a mesh.

  Returns:
    <int32>[D, N] token (index within its row) at each new position.
  """
  if not one_device:
    padding = tf.cast(mask <= 0, tf.int32)
    return tf.argsort(padding, axis=-1, stable=True)
  width = tf.shape(position)[1]
  offsets = tf.range(tf.shape(position)[0])[:, tf.newaxis] * width
  inverse = tf.math.invert_permutation(tf.reshape(position + offsets, [-1]))
  return tf.reshape(inverse, tf.shape(position)) - offsets


def _with_zero_row(rows: tf.Tensor) -> tf.Tensor:
  """<dtype>[P + 1, ...]: ``rows`` <dtype>[P, ...] and a zero row at P."""
  return tf.concat([rows, tf.zeros_like(rows[:1])], axis=0)


@tf.custom_gradient
def permuted_gather(table: tf.Tensor, index: tf.Tensor,
                    inverse: tf.Tensor) -> tf.Tensor:
  """``[table; 0][index]`` where no table row is read twice.

  Because each row of ``table`` lands in at most one output row, the
  gradient is a gather too: table row p receives the output gradient of
  row ``inverse[p]`` (or zero). Same values and gradients as
  ``tf.gather`` on the zero-padded table.

  Args:
    table: <dtype>[P, M] rows.
    index: <int32>[N] table row each of the N output rows reads; P reads
      zeros.
    inverse: <int32>[P] output row that reads each table row; N: none.

  Returns:
    <dtype>[N, M].
  """
  def grad(d_out):
    return tf.gather(_with_zero_row(d_out), inverse), None, None
  return tf.gather(_with_zero_row(table), index), grad


def group_one_device(tokens: tf.Tensor, mask: tf.Tensor, *,
                     group_size: int) -> tuple[tf.Tensor, ...]:
  """Compacts the N tokens of one device and cuts them into groups.

  Args:
    tokens: <dtype>[N, M] the batch's tokens, row-major.
    mask: <float32>[N] 1 for real tokens.
    group_size: S.

  Returns:
    (grouped <dtype>[G, S, M] (zeros in the slots past N),
     grouped mask <float32>[G, S],
     position <int32>[1, N] each token's slot in the flattened G*S,
     source <int32>[G*S] the token in each slot, N past the last token).
  """
  model_dim = tokens.shape[-1]
  num_tokens = tf.shape(mask)[0]
  num_groups = (num_tokens + group_size - 1) // group_size
  position = compaction_permutation(mask[tf.newaxis])
  source = compaction_source(mask[tf.newaxis], position, one_device=True)[0]
  source = tf.concat(
      [source, tf.fill([num_groups * group_size - num_tokens], num_tokens)],
      axis=0)
  grouped = permuted_gather(tokens, source, position[0])
  grouped_mask = tf.gather(_with_zero_row(mask), source)
  return (tf.reshape(grouped, [-1, group_size, model_dim]),
          tf.reshape(grouped_mask, [-1, group_size]), position, source)


def ungroup_one_device(combined: tf.Tensor, position: tf.Tensor,
                       source: tf.Tensor) -> tf.Tensor:
  """The tokens' rows of ``combined``, in token order (one device).

  Args:
    combined: <dtype>[G, S, M] per-slot outputs.
    position: <int32>[1, N] from :func:`group_one_device`.
    source: <int32>[G*S] from :func:`group_one_device`.

  Returns:
    <dtype>[N, M].
  """
  rows = tf.reshape(combined, [-1, combined.shape[-1]])
  return permuted_gather(rows, position[0], source)
