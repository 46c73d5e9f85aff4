"""One optimiser step: loss, gradients (accumulated), non-finite guard, update.

The objective of a step over ``k`` micro-batches (gradient accumulation) and
``R`` replicas, with ``T`` the number of non-padding target tokens of the
whole step, is::

  sum over micro-batches i and replicas r of
      CE_ls_sum(i, r) / T  +  moe_loss(i, r) / (k * R)

i.e. the token-mean (label-smoothed) cross-entropy of the full step plus the
mean of the MoE losses, whatever ``k`` and ``R`` are. So accumulating two
half batches gives the update of one full batch (tested). The logged
cross-entropy is always the plain one (no smoothing, no MoE loss).

Each micro-batch is one call of a ``tf.function`` that returns the summed
gradients; the update (with the non-finite guard) is a second one. Seeds:
the trainer passes ``fold_in(base_seed, step)``; micro-batch ``i`` uses
``fold_in(that, i)`` and replica ``r`` ``fold_in(..., r)``, so every random
decision is a function of (seed, step) and a resumed run repeats it exactly.

Auxiliary-loss-free load balancing (``--bias_balancing_rate``): every router
with a ``balancing_bias`` reports ``RouterStats.selection_counts``; the step
sums them over its micro-batches and replicas (on a mesh the router's sum
over groups already spans every device), and after the optimiser update, in
the same compiled function and only if the update was applied, moves each
bias by :func:`m4moe.moe.routing.bias_balancing_update`. The biases are model
variables (non-trainable), so checkpoints carry them and a resumed run
repeats the updates exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from m4moe.analysis import capture as routing_capture
from m4moe.model import interfaces
from m4moe.model import losses
from m4moe.parallel import sharding as sharding_lib
from m4moe.training import optimizer as optimizer_lib

MODEL_KEYS = interfaces.MODEL_KEYS


def model_features(batch: Mapping[str, tf.Tensor]) -> interfaces.ModelBatch:
  """The keys of ``batch`` the model consumes (drops e.g. ``lang``)."""
  return {k: v for k, v in batch.items() if k in MODEL_KEYS}


def flat_router_stats(
    moe_stats: Mapping[str, Any]) -> dict[str, dict[str, tf.Tensor]]:
  """``{layer: RouterStats}`` -> ``{layer: {stat: float32 tensor}}``."""
  out = {}
  for layer, stats in moe_stats.items():
    values = stats.as_dict() if hasattr(stats, "as_dict") else dict(stats)
    out[layer] = {k: tf.cast(v, tf.float32) for k, v in values.items()}
  return out


def bias_balanced_routers(model: Any) -> dict[str, Any]:
  """``{MoE layer name (as in moe_stats): router}`` of the routers with a
  balancing bias; empty for models without MoE layers (e.g. the toy)."""
  if not hasattr(model, "encoder_layers"):
    return {}
  return {name: layer.router
          for name, layer in routing_capture.moe_layers(model).items()
          if getattr(layer.router, "balancing_bias", None) is not None}


@dataclasses.dataclass(frozen=True)
class StepResult:
  """Host-side (numpy) outcome of one optimiser step.

  Attributes:
    applied: False if the update was skipped (non-finite loss or gradient).
    nonfinite: names of the non-finite tensors ("loss" or variable names).
    ce_sum: plain cross-entropy summed over the step's target tokens.
    objective: the optimised loss (smoothed CE mean + MoE loss).
    target_tokens, source_tokens: non-padding tokens of the step.
    moe_loss, aux_loss, z_loss: means over micro-batches and replicas.
    grad_norm: global norm of the (accumulated) gradient.
    learning_rate: the rate of this update.
    router: {layer: {stat: np.ndarray}} of the last micro-batch (replica mean).
  """
  applied: bool
  nonfinite: tuple[str, ...]
  ce_sum: float
  objective: float
  target_tokens: float
  source_tokens: float
  moe_loss: float
  aux_loss: float
  z_loss: float
  grad_norm: float
  learning_rate: float
  router: Mapping[str, Mapping[str, np.ndarray]]


def finite_and_global_norm(grads: Sequence[tf.Tensor]
                           ) -> tuple[tf.Tensor, tf.Tensor]:
  """Per-gradient finiteness and ``tf.linalg.global_norm``, in one pass.

  The global norm sums each gradient's ``l2_loss`` (as
  ``tf.linalg.global_norm`` does, so the value is the same); a finite
  ``l2_loss`` means every element is finite (an infinite or NaN element
  makes the sum of squares infinite or NaN), so the elementwise check, a
  second pass over every parameter's gradient, runs only when some sum is
  not finite (a non-finite gradient, or squares that overflow). Same results
  as checking every element. Not for DTensor meshes (the branch).

  Args:
    grads: <float32>[...] one dense gradient per variable.

  Returns:
    (<bool>[V] whether each gradient is finite, <float32>[] global norm).
  """
  half_squared = tf.stack([tf.nn.l2_loss(g) for g in grads])
  grad_norm = tf.sqrt(tf.reduce_sum(half_squared) * 2.0)
  finite = tf.cond(
      tf.reduce_all(tf.math.is_finite(half_squared)),
      lambda: tf.ones([len(grads)], tf.bool),
      lambda: tf.stack([tf.reduce_all(tf.math.is_finite(g)) for g in grads]))
  return finite, grad_norm


def _local_part(batch: Mapping[str, tf.Tensor], *, replicas: int,
                replica_id: Any) -> dict[str, tf.Tensor]:
  """Replica ``replica_id``'s slice of the global batch along axis 0."""
  if replicas == 1:
    return dict(batch)
  def part(t):
    shape = tf.shape(t)
    split = tf.reshape(t, tf.concat([[replicas, shape[0] // replicas],
                                     shape[1:]], 0))
    return tf.gather(split, replica_id)
  return {k: part(v) for k, v in batch.items()}


class StepRunner:
  """Builds and runs the compiled train and eval steps of one model.

  Args:
    model: a :class:`~m4moe.model.interfaces.TrainableModel` (``model(batch,
      training=..., seed=...)`` returns a ModelOutput).
    optimizer: a built :class:`m4moe.training.optimizer.Adafactor`.
    variables: the trained variables (given to ``optimizer.build``).
    strategy: the tf.distribute strategy the variables were created under.
    label_smoothing: epsilon of the training loss.
    sharding: the mesh the model and optimiser were built on (inside
      ``sharding.variable_scope()``); batches are then put on it with their
      rows split over ``data``, and gradients are relaid out like their
      variables before the update. Use it with the default strategy.
    token_loss: replaces the label-smoothed cross-entropy of the objective:
      ``token_loss(logits=, batch=, weights=, label_smoothing=)`` returns
      the <float32>[] loss summed over the micro-batch's target tokens
      (``weights`` <float32>[B, Lt], 0 = padding), e.g. distillation's
      (:class:`m4moe.training.distill.DistillationLoss`). None: the usual loss.
  """

  def __init__(self, *, model: interfaces.TrainableModel, optimizer: optimizer_lib.Adafactor,
               variables: Sequence[tf.Variable],
               strategy: tf.distribute.Strategy, label_smoothing: float,
               sharding: sharding_lib.Sharding = sharding_lib.NO_SHARDING,
               token_loss: Callable[..., tf.Tensor] | None = None):
    self.model = model
    self.token_loss = token_loss
    self.optimizer = optimizer
    self.variables = list(variables)
    self.strategy = strategy
    self.label_smoothing = label_smoothing
    self.sharding = sharding
    self.variable_names = [v.name.split(":")[0] for v in self.variables]
    self.balanced_routers = bias_balanced_routers(model)
    self._grads_fn = tf.function(self._grads, reduce_retracing=True)
    self._apply_fn = tf.function(self._apply)
    self._eval_fn = tf.function(self._eval, reduce_retracing=True)

  # -- training ---------------------------------------------------------------

  def _replica_grads(self, batch, seed, total_tokens, num_micro):
    ctx = tf.distribute.get_replica_context()
    replicas = ctx.num_replicas_in_sync
    replica_id = ctx.replica_id_in_sync_group
    local = _local_part(batch, replicas=replicas, replica_id=replica_id)
    seed = tf.random.experimental.stateless_fold_in(seed, replica_id)
    weights = tf.cast(tf.not_equal(local["targets"], 0), tf.float32)
    with tf.GradientTape() as tape:
      out = self.model(local, training=True, seed=seed)
      # One pass over the [B, L, V] logits gives both the metric and the
      # label-smoothed objective.
      per_token = losses.per_token_losses(
          out.logits, local["targets"], label_smoothing=self.label_smoothing,
          fused=not self.sharding.enabled)
      ce_sum = tf.reduce_sum(per_token.nll * weights)
      if self.token_loss is not None:
        ls_sum = self.token_loss(logits=out.logits, batch=local,
                                 weights=weights,
                                 label_smoothing=self.label_smoothing)
      else:
        ls_sum = tf.reduce_sum(per_token.smoothed * weights)
      moe_share = num_micro * float(replicas)
      objective = ls_sum / total_tokens + out.moe_loss / moe_share
    grads = tape.gradient(objective, self.variables)
    grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
             for g, v in zip(grads, self.variables)]
    metrics = {
        "ce_sum": ce_sum, "objective": objective,
        "target_tokens": tf.reduce_sum(weights),
        "source_tokens": tf.reduce_sum(
            tf.cast(tf.not_equal(local["inputs"], 0), tf.float32)),
        "moe_loss": out.moe_loss / moe_share,
        "aux_loss": out.aux_loss / moe_share,
        "z_loss": out.z_loss / moe_share,
    }
    router = tf.nest.map_structure(lambda t: t / float(replicas),
                                   flat_router_stats(out.moe_stats))
    counts = {name: tf.cast(out.moe_stats[name].selection_counts, tf.float32)
              for name in self.balanced_routers}
    return grads, metrics, router, counts

  def _grads(self, batch, seed, total_tokens, num_micro):
    """Gradients, metrics and router stats, and the bias-balancing counts
    ``{layer: <float32>[E]}``, each summed over the replicas."""
    grads, metrics, router, counts = self.strategy.run(
        self._replica_grads, args=(batch, seed, total_tokens, num_micro))
    def total(value):
      return self.strategy.reduce(tf.distribute.ReduceOp.SUM, value,
                                  axis=None)
    return tf.nest.map_structure(total, (grads, metrics, router, counts))

  def _update_biases(self, counts: Mapping[str, tf.Tensor]) -> None:
    """Bias balancing after the optimiser update: counts <float32>[E] of
    the whole step per layer, laid out like each bias before the update."""
    for name, router in self.balanced_routers.items():
      layer_counts, = self.sharding.like_variables([counts[name]],
                                                   [router.balancing_bias])
      router.update_balancing_bias(layer_counts)

  def _apply(self, grads, objective, counts):
    # DTensor may leave gradients as per-device partial sums; reduce first.
    grads = self.sharding.like_variables(grads, self.variables)
    if self.sharding.enabled:
      finite = tf.stack([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
      grad_norm = tf.linalg.global_norm(grads)
    else:
      finite, grad_norm = finite_and_global_norm(grads)
    loss_finite = tf.math.is_finite(objective)
    ok = tf.logical_and(tf.reduce_all(finite), loss_finite)
    learning_rate = self.optimizer.learning_rate()
    if ok:
      self.optimizer.apply_gradients(grads, self.variables)
      self._update_biases(counts)
    return ok, finite, loss_finite, grad_norm, learning_rate

  def train_step(self, microbatches: Sequence[Mapping[str, tf.Tensor]], *,
                 seed: tf.Tensor) -> StepResult:
    """Runs one optimiser step over ``microbatches`` (their sum is the batch).

    Args:
      microbatches: k >= 1 model batches (global, undistributed).
      seed: <int32>[2] the step's seed, fold_in(base_seed, step).

    Returns:
      The StepResult (the update is skipped if anything is non-finite).
    """
    microbatches = [self.put(model_features(b)) for b in microbatches]
    seed = self.sharding.put(seed)
    total_tokens = tf.add_n([
        tf.reduce_sum(tf.cast(tf.not_equal(b["targets"], 0), tf.float32))
        for b in microbatches])
    total_tokens = tf.maximum(total_tokens, 1.0)
    num_micro = tf.constant(float(len(microbatches)))
    grads = metrics = router = counts = None
    for i, batch in enumerate(microbatches):
      micro_seed = tf.random.experimental.stateless_fold_in(seed, i)
      g, m, router, c = self._grads_fn(batch, micro_seed, total_tokens,
                                       num_micro)
      if grads is None:
        grads, metrics, counts = g, m, c
      else:
        grads = [a + b for a, b in zip(grads, g)]
        metrics = {k: metrics[k] + m[k] for k in metrics}
        counts = {k: counts[k] + c[k] for k in counts}
    ok, finite, loss_finite, grad_norm, lr = self._apply_fn(
        grads, metrics["objective"], counts)
    host = self.host
    nonfinite = [name for name, ok in zip(self.variable_names, host(finite))
                 if not ok]
    if not bool(host(loss_finite)):
      nonfinite.insert(0, "loss")
    values = {k: float(host(v)) for k, v in metrics.items()}
    return StepResult(
        applied=bool(host(ok)), nonfinite=tuple(nonfinite),
        ce_sum=values["ce_sum"], objective=values["objective"],
        target_tokens=values["target_tokens"],
        source_tokens=values["source_tokens"], moe_loss=values["moe_loss"],
        aux_loss=values["aux_loss"], z_loss=values["z_loss"],
        grad_norm=float(host(grad_norm)), learning_rate=float(host(lr)),
        router=tf.nest.map_structure(host, router))

  def put(self, batch: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """A host batch on the mesh, rows split over the batch axis (else as is).

    The batch axis is :attr:`m4moe.parallel.sharding.Sharding.batch_axis` (``data``,
    or ``expert`` on a mesh without a ``data`` axis). A batch whose row count
    that axis does not divide (e.g. the last dev batch) is put replicated.
    """
    if not self.sharding.enabled:
      return dict(batch)
    rows = {tf.convert_to_tensor(v).shape[0] for v in batch.values()}
    axis = self.sharding.batch_axis
    spec = (axis,) if all(self.sharding.divides(r, axis)
                          for r in rows) else ()
    return {k: self.sharding.put(v, spec) for k, v in batch.items()}

  def host(self, t: tf.Tensor) -> np.ndarray:
    """The whole value of a step output (possibly a DTensor) as numpy."""
    return np.asarray(self.sharding.gather(t))

  # -- evaluation -------------------------------------------------------------

  def _eval(self, batch):
    out = self.model(batch, training=False)
    return losses.token_cross_entropy(out.logits, batch["targets"])

  def evaluate(self, dataset: tf.data.Dataset) -> tuple[float, float]:
    """(plain CE summed over target tokens, token count) of a dev dataset."""
    ce_sum, tokens = 0.0, 0.0
    for batch in dataset:
      s, n = self._eval_fn(self.put(model_features(batch)))
      ce_sum += float(self.host(s))
      tokens += float(self.host(n))
    return ce_sum, tokens

  def evaluate_with_source_reliance(self, dataset: tf.data.Dataset
                                    ) -> tuple[float, float, float]:
    """Dev CE as :meth:`evaluate`, plus the source-reliance gap.

    Source reliance: each target is scored a second time with the source of
    the next pair of its batch (``inputs`` rolled by one row), and the gap is
    the mean CE with wrong sources minus the mean CE with the right ones,
    over the batches of at least two (unpacked) pairs. A model that
    translates loses a lot (several nats per token); one that ignores its
    source and models the target language loses ~0.

    Returns:
      (CE sum, target tokens, gap in nats per target token; NaN if no batch
      had two pairs).
    """
    ce_sum = tokens = right = wrong = counted = 0.0
    for batch in dataset:
      features = model_features(batch)
      s, n = self._eval_fn(self.put(features))
      s, n = float(self.host(s)), float(self.host(n))
      ce_sum += s
      tokens += n
      if int(features["inputs"].shape[0]) < 2 or any(
          k.endswith(("segment_ids", "positions")) for k in features):
        continue
      shifted = dict(features, inputs=tf.roll(features["inputs"], 1, axis=0))
      w, _ = self._eval_fn(self.put(shifted))
      right, wrong, counted = right + s, wrong + float(self.host(w)), counted + n
    gap = (wrong - right) / counted if counted else float("nan")
    return ce_sum, tokens, gap
