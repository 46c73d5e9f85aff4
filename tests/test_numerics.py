"""One NEG_INF and one fold_seed, shared by every module that masks or seeds."""

import numpy as np
import tensorflow as tf

from m4moe.inference import beam_search as decoding
from m4moe.model import layers
from m4moe.model import numerics
from m4moe.moe import routing


def test_every_module_uses_the_one_neg_inf():
  values = (layers.NEG_INF, decoding.NEG_INF,
            routing._NEG_INF)  # pylint: disable=protected-access
  for value in values:
    assert value is numerics.NEG_INF
  # Finite, and beam search's multiples of it stay finite in float32.
  assert np.isfinite(np.float32(3 * numerics.NEG_INF))
  probs = tf.nn.softmax(tf.fill([4], tf.constant(numerics.NEG_INF)))
  np.testing.assert_allclose(probs, [0.25] * 4)  # fully masked: uniform


def test_fold_seed_is_stateless_fold_in_and_keeps_none():
  seed = tf.constant([3, 4], tf.int32)
  assert layers.fold_seed is numerics.fold_seed
  assert numerics.fold_seed(None, 0) is None
  np.testing.assert_array_equal(
      numerics.fold_seed(seed, 7),
      tf.random.experimental.stateless_fold_in(seed, 7))
  assert not np.array_equal(numerics.fold_seed(seed, 0),
                            numerics.fold_seed(seed, 1))
