"""Tests for m4moe.model.losses against hand computations."""

import math

import numpy as np
import pytest
import tensorflow as tf

from m4moe.model import losses


def test_label_smoothing_matches_hand_computation():
  # One real token over a 3-word vocabulary, one padding token.
  logits = tf.constant([[[math.log(2.0), 0.0, 0.0], [5.0, 1.0, 2.0]]])
  targets = tf.constant([[1, 0]])
  # p = [1/2, 1/4, 1/4]; target 1: -log p = log 4.
  # Smoothed with eps = 0.3 over V = 3:
  #   0.7 * log 4 + 0.3 * (log 2 + log 4 + log 4) / 3.
  want = 0.7 * math.log(4) + 0.1 * (math.log(2) + 2 * math.log(4))
  loss_sum, weight_sum = losses.token_cross_entropy(
      logits, targets, label_smoothing=0.3)
  assert loss_sum.dtype == tf.float32
  np.testing.assert_allclose(loss_sum.numpy(), want, rtol=1e-6)
  assert weight_sum.numpy() == 1.0


def test_no_smoothing_equals_sparse_softmax_cross_entropy():
  rng = np.random.default_rng(0)
  logits = tf.constant(rng.normal(size=(2, 5, 11)).astype(np.float32))
  targets = tf.constant([[3, 4, 1, 0, 0], [7, 8, 9, 10, 1]])
  loss_sum, weight_sum = losses.token_cross_entropy(logits, targets)
  per = tf.nn.sparse_softmax_cross_entropy_with_logits(targets, logits)
  mask = (targets.numpy() != 0)
  np.testing.assert_allclose(loss_sum.numpy(), per.numpy()[mask].sum(),
                             rtol=1e-6)
  assert weight_sum.numpy() == 8.0
  np.testing.assert_allclose(
      losses.mean_token_cross_entropy(logits, targets).numpy(),
      per.numpy()[mask].mean(), rtol=1e-6)


def test_explicit_weights_and_bfloat16_logits():
  logits = tf.constant([[[0.0, 1.0], [1.0, 0.0]]], tf.bfloat16)
  targets = tf.constant([[1, 1]])
  weights = tf.constant([[2.0, 0.5]])
  loss_sum, weight_sum = losses.token_cross_entropy(logits, targets,
                                                    weights=weights)
  assert loss_sum.dtype == tf.float32
  low, high = math.log1p(math.exp(-1)), math.log1p(math.exp(1))
  np.testing.assert_allclose(loss_sum.numpy(), 2.0 * low + 0.5 * high,
                             rtol=1e-6)
  assert weight_sum.numpy() == 2.5


def test_empty_batch_mean_is_zero_and_bad_smoothing_raises():
  logits = tf.zeros([1, 2, 4])
  targets = tf.zeros([1, 2], tf.int32)
  assert losses.mean_token_cross_entropy(logits, targets).numpy() == 0.0
  with pytest.raises(ValueError,
                     match=r"label_smoothing=1.0 must be in \[0, 1\)"):
    losses.token_cross_entropy(logits, targets, label_smoothing=1.0)


def test_gradient_of_smoothed_loss_is_softmax_minus_target_distribution():
  logits = tf.Variable([[[0.3, -0.2, 1.0, 0.1]]])
  targets = tf.constant([[2]])
  eps = 0.2
  with tf.GradientTape() as tape:
    loss, _ = losses.token_cross_entropy(logits, targets, label_smoothing=eps)
  grad = tape.gradient(loss, logits).numpy()[0, 0]
  probs = tf.nn.softmax(logits).numpy()[0, 0]
  q = np.full(4, eps / 4)
  q[2] += 1 - eps
  np.testing.assert_allclose(grad, probs - q, rtol=1e-5, atol=1e-7)


def _reference_losses(logits, targets, eps):
  """The textbook formulation: gather from log_softmax (autodiff gradient)."""
  log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
  nll = -tf.gather(log_probs, targets, axis=-1, batch_dims=targets.shape.rank)
  return nll, (1 - eps) * nll - eps * tf.reduce_mean(log_probs, axis=-1)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_one_pass_losses_and_gradient_equal_the_autodiff_reference(eps,
                                                                   fused):
  rng = np.random.default_rng(3)
  logits = tf.Variable(rng.normal(scale=4.0, size=(3, 5, 13)).astype(
      np.float32))
  targets = tf.constant(rng.integers(0, 13, size=(3, 5)), tf.int32)
  # Different upstream gradients on the two outputs exercise both terms.
  up_nll = tf.constant(rng.normal(size=(3, 5)).astype(np.float32))
  up_smooth = tf.constant(rng.normal(size=(3, 5)).astype(np.float32))
  with tf.GradientTape(persistent=True) as tape:
    got = losses.per_token_losses(logits, targets, label_smoothing=eps,
                                  fused=fused)
    want = _reference_losses(logits, targets, eps)
    got_obj = tf.reduce_sum(got.nll * up_nll + got.smoothed * up_smooth)
    want_obj = tf.reduce_sum(want[0] * up_nll + want[1] * up_smooth)
    # Only one output used: the other's upstream gradient is None.
    got_only = tf.reduce_sum(got.smoothed * up_smooth)
    want_only = tf.reduce_sum(want[1] * up_smooth)
  np.testing.assert_allclose(got.nll.numpy(), want[0].numpy(), rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(got.smoothed.numpy(), want[1].numpy(),
                             rtol=1e-5, atol=1e-5)
  if eps == 0:
    np.testing.assert_array_equal(got.nll.numpy(), got.smoothed.numpy())
  for g_obj, w_obj in ((got_obj, want_obj), (got_only, want_only)):
    np.testing.assert_allclose(tape.gradient(g_obj, logits).numpy(),
                               tape.gradient(w_obj, logits).numpy(),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fused", [False, True])
def test_one_pass_losses_repeated_target_rows_and_bfloat16_gradient(fused):
  # Every row targets the same id (the scatter must not merge rows), and
  # bfloat16 logits get a bfloat16 gradient of the right values.
  logits = tf.Variable(tf.constant([[[1.0, 2.0, 0.5], [0.0, 0.0, 3.0]]],
                                   tf.bfloat16))
  targets = tf.constant([[2, 2]])
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(losses.per_token_losses(
        logits, targets, label_smoothing=0.3, fused=fused).smoothed)
  grad = tape.gradient(loss, logits)
  assert grad.dtype == tf.bfloat16
  probs = tf.nn.softmax(tf.cast(logits, tf.float32)).numpy()[0]
  q = np.full(3, 0.1)
  q[2] += 0.7
  np.testing.assert_allclose(tf.cast(grad, tf.float32).numpy()[0], probs - q,
                             atol=1e-2)
