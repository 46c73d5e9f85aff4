"""Routing groups on one device: gather-only gradients, sort-free inverse."""

import numpy as np
import tensorflow as tf

from m4moe.moe import grouping


def test_permuted_gather_equals_a_gather_with_autodiff():
  # 5 table rows into 7 output rows: row 3 is read by nobody, output rows
  # 1 and 6 read the zero row (index 5).
  rng = np.random.default_rng(0)
  table = tf.constant(rng.standard_normal((5, 3)), tf.float32)
  index = tf.constant([2, 5, 0, 4, 1, 5, 5], tf.int32)
  inverse = tf.constant([2, 4, 0, 7, 3], tf.int32)  # 7: read by none
  d_out = tf.constant(rng.standard_normal((7, 3)), tf.float32)
  def loss(fn):
    with tf.GradientTape() as tape:
      tape.watch(table)
      out = fn()
      value = tf.reduce_sum(out * d_out)
    return out.numpy(), tf.convert_to_tensor(
        tape.gradient(value, table)).numpy()
  got = loss(lambda: grouping.permuted_gather(table, index, inverse))
  want = loss(lambda: tf.gather(
      tf.concat([table, tf.zeros([1, 3])], axis=0), index))
  np.testing.assert_array_equal(got[0], want[0])
  np.testing.assert_array_equal(got[1], want[1])
  np.testing.assert_array_equal(got[1][3], np.zeros(3))


def test_compaction_source_inverts_without_a_sort():
  mask = tf.constant([[1, 0, 1, 1, 0, 0, 1], [0, 0, 1, 1, 1, 0, 1]],
                     tf.float32)
  position = grouping.compaction_permutation(mask)
  fast = grouping.compaction_source(mask, position, one_device=True)
  sorted_ = grouping.compaction_source(mask, position, one_device=False)
  np.testing.assert_array_equal(fast.numpy(), sorted_.numpy())
  # Real tokens first, in order, then the padding tokens, in order.
  np.testing.assert_array_equal(fast.numpy()[0], [0, 2, 3, 6, 1, 4, 5])


def test_group_one_device_fills_the_last_group_with_empty_slots():
  tokens = tf.constant(np.arange(1, 6, dtype=np.float32)[:, None] *
                       np.ones((1, 2), np.float32))
  mask = tf.constant([1, 0, 1, 1, 0], tf.float32)
  grouped, grouped_mask, position, source = grouping.group_one_device(
      tokens, mask, group_size=4)
  assert grouped.shape == (2, 4, 2)
  np.testing.assert_array_equal(grouped.numpy()[..., 0].ravel(),
                                [1, 3, 4, 2, 5, 0, 0, 0])
  np.testing.assert_array_equal(grouped_mask.numpy().ravel(),
                                [1, 1, 1, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(source.numpy(), [0, 2, 3, 1, 4, 5, 5, 5])
  back = grouping.ungroup_one_device(grouped, position, source)
  np.testing.assert_array_equal(back.numpy(), tokens.numpy())
