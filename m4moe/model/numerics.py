"""Numeric conventions shared by the whole package: one home for each.

* :data:`NEG_INF` -- the finite "minus infinity" of every additive mask
  (attention biases, masked router logits, beam-search scores).
* :func:`fold_seed` -- derives a stateless sub-seed for one consumer of a
  ``seed: <int32>[2] | None`` argument (None stays None, i.e. no randomness).
"""

from __future__ import annotations

import tensorflow as tf

# Finite: -inf would turn 0 * -inf into NaN, a fully masked row (e.g. a
# padding query) gets a uniform softmax instead of NaN, and small multiples
# stay finite in float32 (beam search uses 0.5 * NEG_INF .. 3 * NEG_INF).
NEG_INF = -1e9


def fold_seed(seed: tf.Tensor | None, key: int) -> tf.Tensor | None:
  """Sub-seed number ``key`` of ``seed`` (None stays None).

  Args:
    seed: <int32>[2] or None.
    key: a small integer naming the consumer of the sub-seed.

  Returns:
    <int32>[2] = stateless_fold_in(seed, key), or None.
  """
  if seed is None:
    return None
  return tf.random.experimental.stateless_fold_in(seed, key)
