"""Token-level cross-entropy with optional label smoothing, in float32.

Label smoothing uses the uniform distribution over all V classes: the target
distribution is ``q = (1 - eps) * onehot(y) + eps / V``, so the per-token loss
is ``(1 - eps) * (-log p_y) + eps * mean_v(-log p_v)``. It is not shifted by
the entropy of ``q``, so a perfect model does not reach 0 when ``eps > 0``.

Both losses come from one pass over the logits (:func:`per_token_losses`)
with a hand-written gradient: with ``lse = log sum_v exp(z_v)``,
``-log p_y = lse - z_y`` and ``mean_v(-log p_v) = lse - mean_v(z_v)``, and
the gradient of either is ``softmax(z)`` minus its target distribution. The
automatic gradient of ``gather(log_softmax(z), y)`` instead scatters into a
dense ``[B, L, V]`` tensor with an ``UnsortedSegmentSum`` (18% of the tiny
dense model's CPU training step in a profile) after a second dense pass for
the log-softmax gradient; the hand-written gradient reuses the forward
pass's ``exp`` (``results/benchmarks/README.md``, "loss").

:func:`per_token_soft_cross_entropy` scores against a whole distribution
given by logits (a teacher's, :mod:`m4moe.training.distill`).

Dimensions (letters of the glossary in :mod:`m4moe`):

  B: batch rows; L: target length; V: vocabulary size.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import tensorflow as tf


def token_cross_entropy(
    logits: tf.Tensor, targets: tf.Tensor, *,
    weights: tf.Tensor | None = None,
    label_smoothing: float = 0.0) -> tuple[tf.Tensor, tf.Tensor]:
  """Summed token cross-entropy and the summed weights.

  Args:
    logits: <float32 or bfloat16>[B, L, V] (cast to float32).
    targets: <int32>[B, L], 0 = padding.
    weights: <float32>[B, L] per-token weights; None means ``targets != 0``
      (padding has weight 0).
    label_smoothing: eps in [0, 1).

  Returns:
    (loss_sum <float32>[], weight_sum <float32>[]); the mean token loss is
    ``loss_sum / weight_sum`` (see :func:`mean_token_cross_entropy`).

  Raises:
    ValueError: ``label_smoothing`` outside [0, 1).
  """
  per_token = per_token_cross_entropy(logits, targets,
                                      label_smoothing=label_smoothing)
  if weights is None:
    weights = tf.cast(tf.not_equal(targets, 0), tf.float32)
  weights = tf.cast(weights, tf.float32)
  return tf.reduce_sum(per_token * weights), tf.reduce_sum(weights)


def per_token_cross_entropy(logits: tf.Tensor, targets: tf.Tensor, *,
                            label_smoothing: float = 0.0) -> tf.Tensor:
  """Unweighted (label-smoothed) cross-entropy of every position.

  Args:
    logits: <float32 or bfloat16>[B, L, V].
    targets: <int32>[B, L].
    label_smoothing: eps in [0, 1).

  Returns:
    <float32>[B, L].
  """
  return per_token_losses(logits, targets,
                          label_smoothing=label_smoothing).smoothed


class TokenLosses(NamedTuple):
  """Both cross-entropies of every position (:func:`per_token_losses`).

  Attributes:
    nll: <float32>[...] ``-log p_y``, the plain cross-entropy (the metric).
    smoothed: <float32>[...] the label-smoothed cross-entropy (the training
      objective); equal to ``nll`` when eps is 0.
  """
  nll: tf.Tensor
  smoothed: tf.Tensor


def per_token_losses(logits: tf.Tensor, targets: tf.Tensor, *,
                     label_smoothing: float = 0.0,
                     fused: bool = False) -> TokenLosses:
  """Plain and label-smoothed cross-entropy of every position, one pass.

  Differentiable once in ``logits`` (no second derivatives).

  Args:
    logits: <float32 or bfloat16>[..., V] (cast to float32).
    targets: <int32>[...] ids in [0, V).
    label_smoothing: eps in [0, 1).
    fused: compute the forward and the gradient each as one XLA
      computation (:func:`_fused_passes`); for one device (a DTensor mesh
      keeps the op-by-op form, whose layouts it propagates). Same values
      up to float rounding.

  Returns:
    TokenLosses of <float32>[...] tensors.

  Raises:
    ValueError: ``label_smoothing`` outside [0, 1).
  """
  if not 0.0 <= label_smoothing < 1.0:
    raise ValueError(f"label_smoothing={label_smoothing} must be in [0, 1)")
  eps = float(label_smoothing)
  lead_shape = tf.shape(targets)
  vocab = tf.shape(logits)[-1]
  flat_logits = tf.reshape(logits, [-1, vocab])  # [N, V]
  flat_targets = tf.reshape(tf.cast(targets, tf.int32), [-1])  # <int32>[N]
  if fused:
    nll, smoothed = _fused_losses(flat_logits, flat_targets, eps=eps)
  else:
    nll, smoothed = _op_losses(tf.cast(flat_logits, tf.float32),
                               flat_targets, eps=eps)
  return TokenLosses(nll=tf.reshape(nll, lead_shape),
                     smoothed=tf.reshape(smoothed, lead_shape))


def _op_losses(flat_logits: tf.Tensor, flat_targets: tf.Tensor, *,
               eps: float) -> tuple[tf.Tensor, tf.Tensor]:
  """(nll, smoothed) <float32>[N] from <float32>[N, V], op by op."""
  vocab = tf.shape(flat_logits)[-1]

  @tf.custom_gradient
  def _losses(z):
    shift = tf.stop_gradient(tf.reduce_max(z, axis=-1, keepdims=True))
    exp = tf.exp(z - shift)  # <float32>[N, V]
    total = tf.reduce_sum(exp, axis=-1)  # <float32>[N]
    lse = tf.math.log(total) + shift[:, 0]
    z_target = tf.gather(z, flat_targets, axis=1, batch_dims=1)  # [N]
    nll = lse - z_target
    smoothed = nll
    if eps:
      smoothed = nll + eps * (z_target - tf.reduce_mean(z, axis=-1))

    def grad(d_nll, d_smoothed):
      # d/dz of nll: p - onehot(y); of smoothed: p - (1-eps) onehot(y) - eps/V.
      d_nll = tf.zeros_like(nll) if d_nll is None else d_nll
      d_smoothed = (tf.zeros_like(nll) if d_smoothed is None
                    else d_smoothed)
      dz = exp * ((d_nll + d_smoothed) / total)[:, None]
      if eps:
        dz -= (d_smoothed * (eps / tf.cast(vocab, tf.float32)))[:, None]
      # A one-hot product, not a scatter: DTensor has no layout rule for
      # TensorScatterSub, and on CPU the scatter was only 6% faster.
      at_target = d_nll + (1.0 - eps) * d_smoothed  # <float32>[N]
      return dz - tf.one_hot(flat_targets, vocab) * at_target[:, None]

    return (nll, smoothed), grad

  return _losses(flat_logits)


@functools.lru_cache(maxsize=None)
def _fused_passes(eps: float):
  """The XLA forward and gradient computations for one eps.

  Op by op, the loss and its gradient read and write the whole ``[N, V]``
  logits about ten times (shift, exp, sums, the gradient's scale, the
  one-hot); each XLA computation reads them once or twice and keeps the
  ``[N, V]`` probabilities out of memory (the gradient recomputes them from
  the logits and the log-normaliser). At the tiny models' V = 8000 that
  made the whole CPU training step 10-12% faster (results/benchmarks/
  sparse-step-cost.md).
  """
  @tf.function(jit_compile=True, autograph=False)
  def forward(z, y):
    z = tf.cast(z, tf.float32)
    shift = tf.reduce_max(z, axis=-1)
    total = tf.reduce_sum(tf.exp(z - shift[:, tf.newaxis]), axis=-1)
    lse = tf.math.log(total) + shift
    z_target = tf.gather(z, y, axis=1, batch_dims=1)
    nll = lse - z_target
    smoothed = nll + eps * (z_target - tf.reduce_mean(z, axis=-1))
    return nll, smoothed, lse

  @tf.function(jit_compile=True, autograph=False)
  def backward(z, y, lse, d_nll, d_smoothed):
    z = tf.cast(z, tf.float32)
    vocab = z.shape[-1] or tf.cast(tf.shape(z)[-1], tf.float32)
    probs = tf.exp(z - lse[:, tf.newaxis])
    dz = (probs * (d_nll + d_smoothed)[:, tf.newaxis] -
          (d_smoothed * (eps / vocab))[:, tf.newaxis])
    at_target = d_nll + (1.0 - eps) * d_smoothed
    hit = tf.equal(tf.range(tf.shape(z)[-1])[tf.newaxis, :], y[:, tf.newaxis])
    return dz - tf.where(hit, at_target[:, tf.newaxis], 0.0)

  return forward, backward


def _fused_losses(flat_logits: tf.Tensor, flat_targets: tf.Tensor, *,
                  eps: float) -> tuple[tf.Tensor, tf.Tensor]:
  """(nll, smoothed) <float32>[N] from <float32 or bfloat16>[N, V] (XLA)."""
  forward, backward = _fused_passes(eps)

  @tf.custom_gradient
  def _losses(z):
    nll, smoothed, lse = forward(z, flat_targets)

    def grad(d_nll, d_smoothed):
      d_nll = tf.zeros_like(nll) if d_nll is None else d_nll
      d_smoothed = (tf.zeros_like(nll) if d_smoothed is None
                    else d_smoothed)
      dz = backward(z, flat_targets, lse, d_nll, d_smoothed)
      return tf.cast(dz, z.dtype)

    return (nll, smoothed), grad

  return _losses(flat_logits)


def per_token_soft_cross_entropy(logits: tf.Tensor,
                                 target_logits: tf.Tensor) -> tf.Tensor:
  """Cross-entropy of every position against a soft target distribution.

  ``-sum_v softmax(target_logits)_v * log_softmax(logits)_v``.

  Args:
    logits: <float32 or bfloat16>[B, L, V] the scored model's logits.
    target_logits: <float32 or bfloat16>[B, L, V] logits of the target
      distribution (e.g. a teacher's); no gradient flows into them.

  Returns:
    <float32>[B, L].
  """
  log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
  target = tf.nn.softmax(tf.cast(tf.stop_gradient(target_logits), tf.float32),
                         axis=-1)
  return -tf.reduce_sum(target * log_probs, axis=-1)


def mean_token_cross_entropy(
    logits: tf.Tensor, targets: tf.Tensor, *,
    weights: tf.Tensor | None = None,
    label_smoothing: float = 0.0) -> tf.Tensor:
  """Weighted mean token cross-entropy, <float32>[] (0 for an empty batch)."""
  loss_sum, weight_sum = token_cross_entropy(
      logits, targets, weights=weights, label_smoothing=label_smoothing)
  return tf.math.divide_no_nan(loss_sum, weight_sum)
