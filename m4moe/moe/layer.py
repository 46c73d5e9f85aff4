"""The position-wise Mixture-of-Experts feed-forward layer (GShard §2).

Dimensions (letters of the glossary in :mod:`m4moe`):

  B: batch rows; L: sequence length; N = B*L: tokens; G: groups;
  S: group size; E: experts; C: expert capacity; M: model width;
  H: expert hidden width; K: expert choices per token; T = G*S*K: choices;
  X: expert-homogeneous blocks; R: rows per block (block dispatch).

``MoeLayer`` turns ``<dtype>[B, L, M]`` into N tokens, moves the real tokens
to the front (keeping their order) so that adding padding never changes
which real tokens share a group, pads to G*S with masked tokens, routes each
group (router in float32), dispatches to the experts
``FFN_e(x) = wo_e . ReLU(wi_e . x)`` (activation dtype) and scatters the
combined outputs back to ``[B, L, M]``; padding positions get exactly 0. The
dispatch path is :func:`m4moe.moe.dispatch.resolve_dispatch`'s choice, run from
:data:`m4moe.moe.dispatch.DISPATCH_PATHS`; :class:`FeedForwardExperts` serves
the paths' three layouts (buffers, expert-sorted rows, blocks).

Local groups: on a mesh whose batch axis (size D;
:attr:`m4moe.parallel.sharding.Sharding.batch_axis`: ``data``, or ``expert`` on a
mesh without ``data``) divides B, all of this happens within each shard's
B/D rows (:meth:`MoeLayer._group`, :meth:`MoeLayer.group_shards`): padding
is compacted and groups are formed per shard, never across shards (G = D *
G_local), as GShard's groups are per device; otherwise (no mesh, D = 1)
over the whole batch. On ``expert:D`` the groups and the experts are split
over the same devices and the dispatch is an AllToAll
(:meth:`FeedForwardExperts._to_experts`).

Group size: S = ``moe.group_size``, or N (N/D per shard) when the (static)
token count is smaller, so small batches are one group of their real size
(with an unknown static N, S = ``moe.group_size``). Capacity:
``moe.capacity(group_size=S, training=training)`` (eval factor 0 = no drops,
C = S).

Padding is exact: adding padding tokens anywhere changes neither the real
tokens' outputs nor any gradient, as long as S stays the same. Random draws
(random routing policy, jitter, noise, expert dropout) are laid out by
group, so with those on, extra groups of padding change the draws the real
tokens see (the distribution is unchanged).

In a causal (decoder) layer, capacity makes a token's routing depend on the
earlier tokens of its group and, through the second-choice pass, on later
tokens' first choices -- as in GShard. With the no-drop eval capacity every
token gets its top-k experts whatever shares its group, so incremental
decoding reproduces the full-sequence eval outputs.

Per-row groups (``group_per_row=True``, used for decoding): each row of the
``[B, L, M]`` input is its own group (S = L, whatever ``moe.group_size``),
and row b gets the capacity of its own real-token count n_b,
``moe.capacity(group_size=n_b)``, in buffers ``moe.capacity(group_size=L)``
wide. Padding takes no slot, so a row's outputs depend only on its own real
tokens: not on the other rows, nor on how much padding the batch adds. The
dispatch path is resolved and run as for batch groups, from the per-row
call's static sizes (G = B rows, S = L, C); the paths honour the per-row
caps because they read the router's kept slots.

Language routing (``--route_by=language``, :mod:`m4moe.moe.task_routing`): the
router input is the one-hot routing language of each token (``languages``),
grouped exactly like the tokens, instead of the token's activation; the
router, capacity, aux loss and dispatch are unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

from m4moe.moe import dispatch as dispatch_lib
from m4moe.moe import grouping
from m4moe.model import initializers
from m4moe.model import layers
from m4moe.moe import routing
from m4moe.parallel import sharding as sharding_lib
from m4moe.moe import task_routing
from m4moe.config import ConfigError, ModelConfig
from m4moe.model.numerics import fold_seed


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoeLayerStats(routing.RouterStats):
  """The router's statistics plus what the layer's experts executed.

  Counted from the dispatch actually made (:func:`m4moe.moe.dispatch.
  dispatched_assignments`), so the second-expert policy's skips and the
  capacity drops are subtracted; FLOPs are forward multiply-adds times 2,
  as in :mod:`m4moe.cost.model`. Per real (non-padding) token of the call.

  Attributes (besides :class:`m4moe.moe.routing.RouterStats`'):
    expert_assignments_per_token: <float32>[] dispatched (token, routed
      expert) pairs per real token (top2 with the ``all`` policy and no
      drops: 2).
    expert_flops_per_token: <float32>[] FLOPs of the routed experts run
      (assignments x 4 M H) plus the shared experts (4 M H_s each), per real
      token.
    expert_flops_dense_fraction: <float32>[] ``expert_flops_per_token``
      over the 4 M F FLOPs of the dense FFN (``--d_ff``) the layer replaces.
  """

  expert_assignments_per_token: tf.Tensor
  expert_flops_per_token: tf.Tensor
  expert_flops_dense_fraction: tf.Tensor

  @classmethod
  def __tf_unflatten__(cls, metadata: Any, components: Any) -> MoeLayerStats:
    del metadata
    names = [f.name for f in dataclasses.fields(cls)]
    return cls(**dict(zip(names, components)))


@dataclasses.dataclass(frozen=True)
class MoeOutput:
  """Result of one :class:`MoeLayer` call.

  Attributes:
    outputs: <activation dtype>[B, L, M] (exactly 0 at padding positions).
    aux_loss: <float32>[] unweighted load-balancing loss.
    z_loss: <float32>[] unweighted router z-loss.
    weighted_loss: <float32>[] ``aux_loss_weight * aux_loss +
      z_loss_weight * z_loss``, to add to the model loss.
    stats: the layer's :class:`MoeLayerStats` (router statistics and the
      expert FLOPs executed).
  """

  outputs: tf.Tensor
  aux_loss: tf.Tensor
  z_loss: tf.Tensor
  weighted_loss: tf.Tensor
  stats: MoeLayerStats

  def __tf_flatten__(self) -> tuple[Any, tuple[Any, ...]]:
    return (), (self.outputs, self.aux_loss, self.z_loss, self.weighted_loss,
                self.stats)

  @classmethod
  def __tf_unflatten__(cls, metadata: Any, components: Any) -> MoeOutput:
    del metadata
    return cls(*components)


# With at most this many experts, the "EGCM" (index dispatch) path runs one
# 2-D matmul per expert instead of a batched einsum: XLA:CPU runs the former
# multi-threaded and the latter much slower (forward+backward for E=8,
# [640, 128] x [128, 256] per expert: 60 ms vs 83 ms on 2 cores; the whole
# index layer at E=128, top-2, in CPU seconds vs a dense FFN: 0.62-0.64x
# instead of 0.35-0.42x under XLA, 0.57x instead of 0.35x without). The
# price is compile time: ~4x longer at E=128 (88-131 s instead of 22-27 s
# under XLA on a loaded machine; results/benchmarks/README.md, "layer
# table"). In bfloat16 the batched einsum is faster: at the fine-grained
# layer's shapes one batched product runs at 0.55-0.89x the dense FFN's
# rate against 0.34-0.48x for 64 separate ones (results/benchmarks/
# sparse-step-cost.md), so the loop is float32's.
_PER_EXPERT_MATMUL_MAX_EXPERTS = 128


# Expected rows per expert from which ``a @ w^T`` with a tall ``w`` (more
# rows than columns: ``wo``, <[H, M]>, in the gradient into the hidden layer)
# is cheaper as oneDNN's ``transpose_b`` matmul than as ``(w @ a^T)^T``.
# Measured at M=512, H=2048 (results/benchmarks/expert_matmul_probe.py, one
# process, 2 threads; results/benchmarks/README.md, "quiet re-run"):
# ``dy @ wo^T`` at 1024 rows per expert 37.6 vs 47.4 ms per 8 experts
# (transpose_b is as fast as a plain matmul), at 256 rows 47.6 vs 49.6 ms
# per 32, at 64 rows 86.5 vs 56.7 ms per 128; for the wide ``d_pre @ wi^T``
# the transposed form wins at every count (48.1 vs 54.1, 50.3 vs 59.3, 62.8
# vs 129.6 ms).
TRANSPOSE_B_MIN_ROWS = 512


# Weights of at most this many elements (512 KB in float32) always take the
# ``transpose_b`` form: their re-layout is cheaper than transposing the
# rows and the result at any row count. Measured with 64 experts per call,
# one thread: [512, 128] x [64, 128]^T 5.2 vs 7.1 ms, [256, 128] x [256,
# 128]^T 10.1 vs 12.0 ms, [64, 256] x [128, 256]^T 3.6 vs 3.8 ms, [16, 128]
# x [256, 128]^T 1.9 vs 2.1 ms (the tiny configs' experts, and the study v3
# candidates'; results/benchmarks/README.md, "MoE step overhead").
TRANSPOSE_B_MAX_WEIGHT = 1 << 17


def _times_transposed(a: tf.Tensor, w: tf.Tensor, *,
                      rows: int | None = None) -> tf.Tensor:
  """``a @ w^T``: <dtype>[R, P] from [R, Q] and [P, Q], in the cheaper form.

  oneDNN's ``MatMul(transpose_b=True)`` re-lays out the whole weight ``w``
  on every call; for a few rows (an expert's share of a batch) that copy
  costs more than the product (E=128, 64 rows of [64, 2048] x [512, 2048]^T:
  269 vs 139 ms of CPU per 128 experts), so by default this computes
  ``(w @ a^T)^T``, which transposes only the small ``a`` and the small
  result. With many ``rows`` (the expected R, static) and a tall ``w`` (P >=
  Q) the result transpose costs more than the re-layout, and the
  ``transpose_b`` matmul is used (:data:`TRANSPOSE_B_MIN_ROWS`); so it is
  for a small ``w`` (:data:`TRANSPOSE_B_MAX_WEIGHT`), whose re-layout is
  cheap.
  """
  if w.shape[0] is not None and (
      w.shape[0] * w.shape[1] <= TRANSPOSE_B_MAX_WEIGHT or
      (rows is not None and rows >= TRANSPOSE_B_MIN_ROWS and
       w.shape[0] >= w.shape[1])):
    return tf.matmul(a, w, transpose_b=True)
  return tf.transpose(tf.matmul(w, a, transpose_b=True))


def _expert_ffn(x: tf.Tensor, wi: tf.Tensor, wo: tf.Tensor,
                keep: tf.Tensor | None = None, *,
                rows: int | None = None) -> tf.Tensor:
  """One expert's ``(ReLU(x . wi) * keep) . wo``, with a hand-written gradient.

  The gradient equals autodiff's; the input gradients use
  :func:`_times_transposed`, which picks the matmul form from ``rows``.

  Args:
    x: <dtype>[R, M] the expert's rows; wi: <dtype>[M, H]; wo: <dtype>[H, M].
    keep: <dtype>[R, H] expert-dropout scale (0 or 1/(1-rate)), or None.
    rows: the expected R (static; None: unknown, the few-rows form).

  Returns:
    <dtype>[R, M].
  """
  @tf.custom_gradient
  def ffn(x, wi, wo):
    h = tf.nn.relu(tf.matmul(x, wi))
    if keep is not None:
      h *= keep
    def grad(dy):
      d_h = _times_transposed(dy, wo, rows=rows)
      if keep is not None:
        d_h *= keep
      # ReLU'(pre) = [h > 0]: h = ReLU(pre) * keep, and keep = 0 zeroes d_h.
      d_pre = tf.raw_ops.ReluGrad(gradients=d_h, features=h)
      return (_times_transposed(d_pre, wi, rows=rows),
              tf.matmul(x, d_pre, transpose_a=True),
              tf.matmul(h, dy, transpose_a=True))
    return tf.matmul(h, wo), grad
  return ffn(x, wi, wo)


class FeedForwardExperts(tf.Module):
  """E independent ReLU FFNs ``FFN_e(x) = wo_e . ReLU(wi_e . x)``.

  Weights: ``wi <float32>[E, M, H]``, ``wo <float32>[E, H, M]``, split on E
  over ``expert`` and on H over ``model`` under a mesh (Megatron-style within
  an expert: the hidden ``<[E, G, C, H]>`` is H-split, ``wo``'s contraction
  over H is one all-reduce over ``model``). Truncated-normal init with
  sigma = sqrt(init_scale / fan_in) (fan_in M for wi, H for wo). Weights are
  float32 and cast to the input dtype to compute.
  """

  def __init__(self, *, num_experts: int, model_dim: int, hidden_dim: int,
               init_scale: float, dropout_rate: float = 0.0,
               sharding: sharding_lib.Sharding = sharding_lib.NO_SHARDING,
               name: str = "experts"):
    super().__init__(name=name)
    self.dropout_rate = dropout_rate
    self.sharding = sharding
    with self.name_scope:
      self.wi = initializers.init_variable(
          (num_experts, model_dim, hidden_dim), fan_in=model_dim,
          scale=init_scale, name="wi")
      self.wo = initializers.init_variable(
          (num_experts, hidden_dim, model_dim), fan_in=hidden_dim,
          scale=init_scale, name="wo")

  def __call__(self, dispatched: tf.Tensor, *, output_layout: str = "EGCM",
               training: bool = False,
               seed: tf.Tensor | None = None) -> tf.Tensor:
    """Applies expert e to buffer e.

    Args:
      dispatched: <dtype>[E, G, C, M] expert input buffers.
      output_layout: "EGCM" or "GECM" (Algorithm 2's layout).
      training: applies expert dropout on the hidden layer.
      seed: <int32>[2], required if training with a nonzero dropout rate.

    Returns:
      <dtype>[E, G, C, M] or <dtype>[G, E, C, M] expert outputs.
    """
    dtype = dispatched.dtype
    shard = self.sharding
    groups = _expert_split_groups(shard, dispatched.shape[1])
    dispatched = self._to_experts(dispatched)
    keep = None
    if training and self.dropout_rate > 0:
      if seed is None:
        raise ValueError("expert dropout needs seed=<int32>[2] when training")
      keep = self._dropout_scale(tf.shape(dispatched), dtype=dtype, seed=seed)
    num_experts = self.wi.shape[0]
    # Per-expert matmuls would put every expert on every device when sharded.
    if (output_layout == "EGCM" and not shard.enabled and
        dtype == tf.float32 and
        num_experts <= _PER_EXPERT_MATMUL_MAX_EXPERTS):
      return self._per_expert(dispatched, keep)
    wi = shard.shard(tf.cast(self.wi, dtype), ("expert", None, "model"),
                     name="wi")
    wo = shard.shard(tf.cast(self.wo, dtype), ("expert", "model"), name="wo")
    h = tf.nn.relu(tf.einsum("EGCM,EMH->EGCH", dispatched, wi))
    if shard.enabled and shard.mesh.axis_size("model") > 1:
      h = shard.shard(h, ("expert", groups, None, "model"),
                      name="expert_hidden")
    if keep is not None:
      h *= keep
    out = tf.einsum(f"EGCH,EHM->{output_layout}", h, wo)
    spec = [None] * 4
    spec[output_layout.index("E")] = "expert"
    spec[output_layout.index("G")] = groups
    out = shard.shard(out, tuple(spec), name="expert_outputs")
    # The reverse AllToAll (expert:D; an all-gather over expert on a data x
    # expert mesh): back to groups for the per-group combine.
    return _split_groups(shard, out, dim=output_layout.index("G"),
                         name="expert_outputs_groups")

  def _to_experts(self, dispatched: tf.Tensor) -> tf.Tensor:
    """The dispatch's AllToAll: buffers from group-split to expert-split.

    The dispatch works per group, so its buffers come split on G over the
    batch axis (``dispatched_groups``); they are re-split on E over
    ``expert`` (``dispatched``). On a mesh whose batch axis is ``expert``
    (``expert:D``: GShard's layout) G becomes whole: each device sends
    device e the buffers of e's experts for its own groups, an AllToAll
    (DTensor lowers it to ``DTensorAllToAll``, then
    ``CollectiveAllToAllV2``). On a ``data`` x ``expert`` mesh G stays
    split on ``data`` and every device of a ``data`` row holds the same
    groups, so the E split is a local slice (no communication) and the way
    back (:meth:`__call__`) an all-gather over ``expert``. Annotations
    only: the values are unchanged.

    Args:
      dispatched: <dtype>[E, G, C, M] expert input buffers.

    Returns:
      <dtype>[E, G, C, M] the same buffers, annotated E-split.
    """
    shard = self.sharding
    groups = _expert_split_groups(shard, dispatched.shape[1])
    dispatched = _split_groups(shard, dispatched, dim=1,
                               name="dispatched_groups")
    return shard.shard(dispatched, ("expert", groups), name="dispatched")

  def rows(self, rows: tf.Tensor, counts: tf.Tensor, *,
           row_slots: tf.Tensor | None = None,
           buffer_shape: tf.Tensor | None = None, training: bool = False,
           seed: tf.Tensor | None = None) -> tf.Tensor:
    """Applies expert e to its ``counts[e]`` expert-sorted rows.

    One 2-D matmul pair per expert on exactly its rows (no capacity padding);
    the row counts are dynamic, so this runs outside XLA only. Expert
    dropout is drawn over the ``[E, G, C, H]`` buffers, as by ``__call__``,
    and each row takes its slot's draws: the same masks as the buffer paths.

    Args:
      rows: <dtype>[T, M] rows sorted by expert, the rows past
        ``sum(counts)`` not dispatched.
      counts: <int32>[E] rows of each expert.
      row_slots: <int32>[T] slot of each row in the flattened buffers;
        required with expert dropout.
      buffer_shape: <int32>[3] (E, G, C); required with expert dropout.
      training: applies expert dropout on the hidden layer.
      seed: <int32>[2], required if training with a nonzero dropout rate.

    Returns:
      <dtype>[T, M] expert outputs, zeros past ``sum(counts)``.
    """
    if self.sharding.enabled:
      raise ValueError("the sorted dispatch runs every expert on every "
                       "device; under a mesh use --dispatch=einsum")
    dtype = rows.dtype
    num_experts, hidden_dim = self.wi.shape[0], self.wi.shape[2]
    sizes = tf.concat([counts, [tf.shape(rows)[0] - tf.reduce_sum(counts)]],
                      axis=0)
    pieces = tf.split(rows, sizes, num=num_experts + 1)
    keeps = [None] * num_experts
    if training and self.dropout_rate > 0:
      if seed is None:
        raise ValueError("expert dropout needs seed=<int32>[2] when training")
      if row_slots is None or buffer_shape is None:
        raise ValueError("expert dropout needs row_slots and buffer_shape")
      keep = self._dropout_scale(
          tf.concat([buffer_shape, tf.shape(rows)[-1:]], axis=0),
          dtype=dtype, seed=seed)
      keep = tf.gather(tf.reshape(keep, [-1, hidden_dim]), row_slots)
      keeps = tf.split(keep, sizes, num=num_experts + 1)
    wi = tf.unstack(tf.cast(self.wi, dtype))
    wo = tf.unstack(tf.cast(self.wo, dtype))
    # The mean rows per expert (T/E when T is static) picks the gradient's
    # matmul forms.
    total = rows.shape[0]
    mean_rows = None if total is None else total // num_experts
    outputs = [_expert_ffn(pieces[e], wi[e], wo[e], keeps[e], rows=mean_rows)
               for e in range(num_experts)]
    outputs.append(tf.zeros_like(pieces[num_experts]))
    return tf.concat(outputs, axis=0)

  def blocks(self, blocks: tf.Tensor, block_expert: tf.Tensor, *,
             training: bool = False,
             seed: tf.Tensor | None = None) -> tf.Tensor:
    """Applies expert ``block_expert[x]`` to block x (no expert dropout).

    Args:
      blocks: <dtype>[X, R, M] rows; block_expert: <int32>[X].
      training: training mode; with a nonzero dropout rate it is an error.
      seed: unused (blocks draw no randomness).

    Returns:
      <dtype>[X, R, M] expert outputs.

    Raises:
      ValueError: ``training`` with a nonzero dropout rate, which the block
        layout cannot apply (:func:`m4moe.moe.dispatch.resolve_dispatch` never
        picks it then).
    """
    del seed  # no randomness
    if training and self.dropout_rate > 0:
      raise ValueError(
          f"the block dispatch has no expert dropout (rate "
          f"{self.dropout_rate}); use --dispatch=index, sorted or einsum "
          "when training with --expert_dropout_rate")
    dtype = blocks.dtype
    wi = tf.cast(tf.gather(self.wi, block_expert), dtype)  # [X, M, H]
    wo = tf.cast(tf.gather(self.wo, block_expert), dtype)  # [X, H, M]
    h = tf.nn.relu(tf.einsum("XRM,XMH->XRH", blocks, wi))
    return tf.einsum("XRH,XHM->XRM", h, wo)

  def _dropout_scale(self, buffer_shape: tf.Tensor, *, dtype: tf.DType,
                     seed: tf.Tensor) -> tf.Tensor:
    """<dtype>[E, G, C, H]: 0 for dropped hidden units, 1/(1-rate) else.

    The mask is :func:`m4moe.model.layers.dropout_scale`'s (16-bit numbers, pinned
    under a mesh).
    """
    shape = tf.concat([buffer_shape[:-1], [self.wi.shape[-1]]], axis=0)
    return layers.dropout_scale(shape, rate=self.dropout_rate, seed=seed,
                                dtype=dtype, sharding=self.sharding)

  def _per_expert(self, dispatched: tf.Tensor,
                  keep: tf.Tensor | None) -> tf.Tensor:
    """Same as the batched einsums, as one 2-D matmul per expert (EGCM out)."""
    dtype = dispatched.dtype
    model_dim, hidden_dim = self.wi.shape[1], self.wi.shape[2]
    rows = tf.reshape(dispatched, [self.wi.shape[0], -1, model_dim])
    wi = tf.unstack(tf.cast(self.wi, dtype))
    wo = tf.unstack(tf.cast(self.wo, dtype))
    keeps = tf.unstack(keep) if keep is not None else None
    outputs = [
        _expert_ffn(x, wi[e], wo[e], None if keeps is None else
                    tf.reshape(keeps[e], [-1, hidden_dim]), rows=x.shape[0])
        for e, x in enumerate(tf.unstack(rows))]
    return tf.reshape(tf.stack(outputs), tf.shape(dispatched))


def _split_groups(sharding: sharding_lib.Sharding, t: tf.Tensor, *, dim: int,
                  name: str) -> tf.Tensor:
  """Splits the G dimension ``dim`` of ``t`` over the batch axis if it divides.

  The batch axis is :attr:`m4moe.parallel.sharding.Sharding.batch_axis`: ``data``, or
  ``expert`` on a mesh without a ``data`` axis (GShard's layout).

  With rows the batch axis divides, G = D * G_local is a multiple of it
  (:meth:`MoeLayer.group_shards`); an eval batch or a decoding step may
  not be, and then its groups stay whole on every device (same values).
  """
  axis = sharding.batch_axis
  if not sharding.divides(t.shape[dim], axis):
    return t
  return sharding.split(t, dim=dim, axis=axis, name=name)


def _expert_split_groups(sharding: sharding_lib.Sharding,
                         num_groups: int | None) -> str | None:
  """The axis that splits G in the expert-split buffers <[E, G, C, M]>.

  The batch axis when it is not ``expert`` (E takes that one) and divides
  G, so a ``data`` x ``expert`` mesh does not repeat an expert's work per
  ``data`` row; otherwise None (G whole on each expert's devices).
  """
  axis = sharding.batch_axis
  if axis == "expert" or not sharding.divides(num_groups, axis):
    return None
  return axis


def _check_config(config: ModelConfig, *, causal: bool) -> None:
  moe = config.moe
  if not moe.enabled:
    raise ConfigError("--num_experts=0 is invalid for an MoE layer: use a "
                      "dense FFN or set --num_experts to a positive count")
  if causal and moe.router == "expert_choice":
    raise ConfigError(
        "--router=expert_choice is invalid in a causal (decoder) MoE layer: "
        "an expert's choice depends on later tokens; use another --router "
        "(top2, top1 or noisy_topk) for the decoder")
  if moe.no_token_left_behind and moe.router == "expert_choice":
    raise ConfigError("--no_token_left_behind is invalid with "
                      "--router=expert_choice (experts pick tokens); use "
                      "--nono_token_left_behind or a token-choice --router")


_ROUTER_CLASSES = {
    "top2": routing.Top2Router, "top1": routing.SwitchRouter,
    "topk": routing.TopKRouter, "noisy_topk": routing.NoisyTopKRouter,
    "expert_choice": routing.ExpertChoiceRouter}


def _check_layer_features(config: ModelConfig, *,
                          sharding: sharding_lib.Sharding) -> None:
  """Rejects layer features this layer cannot run on ``sharding``."""
  moe = config.moe
  if moe.dropless and sharding.backend != "none":
    raise ConfigError(
        "--train_capacity_factor=0 (dropless) runs on the one-device sorted "
        "dispatch; on a mesh the layer uses the grouped index buffers, whose "
        "no-drop capacity C = S costs E/k times the useful rows; use a "
        "positive --train_capacity_factor on a mesh")


def _check_parts(config: ModelConfig, *, router: routing.Router,
                 experts: FeedForwardExperts) -> None:
  """Rejects a router or experts that disagree with ``config``."""
  moe = config.moe
  kind = _ROUTER_CLASSES[moe.router]
  if not isinstance(router, kind):
    raise ConfigError(
        f"MoeLayer got a {type(router).__name__} but --router={moe.router} "
        f"needs a {kind.__name__}; pass a matching router or leave it None")
  sizes = {
      "router weights wg [M, E]": (tuple(router.wg.shape),
                                   (moe.router_input_dim or config.d_model,
                                    moe.num_experts)),
      "expert weights wi [E, M, H]": (tuple(experts.wi.shape),
                                 (moe.num_experts, config.d_model,
                                  moe.expert_hidden_dim)),
  }
  for what, (got, want) in sizes.items():
    if got != want:
      raise ConfigError(
          f"MoeLayer {what} have shape {list(got)}, the config says "
          f"{list(want)} (--d_model={config.d_model}, --num_experts="
          f"{moe.num_experts}, --expert_hidden_dim={moe.expert_hidden_dim}); "
          "build them from the same config or leave them None")


def _buffer_layout(grouped: tf.Tensor,
                   result: routing.RoutingResult) -> dispatch_lib.BufferLayout:
  """The static sizes of a call: grouped <dtype>[G, S, M] and its routing."""
  return dispatch_lib.BufferLayout(
      num_groups=grouped.shape[0], group_size=grouped.shape[1],
      num_selected=(None if result.expert_index is None else
                    result.expert_index.shape[-1]),
      num_experts=result.num_experts, capacity=result.capacity)


class MoeLayer(tf.Module):
  """GShard/Switch MoE layer replacing a Transformer feed-forward layer.

  Holds a router and the experts (Model Garden's ``MoeLayer(experts,
  router)``): pass them in, or leave them None to build both from
  ``config``. The dispatch path of each call is decided by
  :func:`m4moe.moe.dispatch.resolve_dispatch` and run from
  :data:`m4moe.moe.dispatch.DISPATCH_PATHS`.
  """

  def __init__(self, *, config: ModelConfig, causal: bool, name: str = "moe",
               sharding: sharding_lib.Sharding = sharding_lib.NO_SHARDING,
               router: routing.Router | None = None,
               experts: FeedForwardExperts | None = None,
               allow_block_dispatch: bool = True):
    """Takes or builds the router and the experts.

    Args:
      config: the model config; ``config.moe`` must have experts.
      causal: True in the decoder (rejects ``--router=expert_choice``).
      name: module name.
      sharding: GShard annotations (groups split on the batch axis, experts on
        ``expert``); the default annotates nothing.
      router: the router; None builds ``routing.make_router(config)``.
      experts: the experts; None builds them from ``config.moe``.
      allow_block_dispatch: False keeps ``--dispatch=index`` on its buffers
        where the block layout would be cheaper (for benchmarks).

    Raises:
      ConfigError: for a config this layer cannot run, a router of another
        kind than ``--router``, or a router/experts whose sizes disagree
        with the config.
    """
    super().__init__(name=name)
    _check_config(config, causal=causal)
    self.config = config
    self.causal = causal
    self.sharding = sharding
    self.allow_block_dispatch = allow_block_dispatch
    moe = config.moe
    with self.name_scope:
      if router is None:
        router = routing.make_router(config, name="router", sharding=sharding)
      if experts is None:
        experts = FeedForwardExperts(
            num_experts=moe.num_experts, model_dim=config.d_model,
            hidden_dim=moe.expert_hidden_dim, init_scale=config.moe_init_scale,
            dropout_rate=moe.expert_dropout_rate, sharding=sharding,
            name="experts")
    _check_parts(config, router=router, experts=experts)
    _check_layer_features(config, sharding=sharding)
    self.router = router
    self.experts = experts
    self.shared_experts = None
    if moe.num_shared_experts:
      # Scope ``shared_experts/ffn``: the dense FFN's layout rules apply.
      with self.name_scope, tf.name_scope("shared_experts"):
        self.shared_experts = layers.DenseFfn(
            d_model=config.d_model,
            d_ff=moe.num_shared_experts * moe.shared_hidden_dim,
            init_scale=config.moe_init_scale, name="ffn", sharding=sharding)

  @property
  def dispatch(self) -> str:
    """The dispatch path before any call's sizes are known.

    :func:`m4moe.moe.dispatch.resolve_dispatch` without a layout: ``moe.dispatch``;
    on a mesh ``grouped_index`` for ``index``/``sorted`` with a
    token-choice router, else ``einsum`` under DTensor; ``index`` for
    ``sorted`` with the expert-choice router. A call may still run
    ``block`` for ``index``.
    """
    return self.resolve_dispatch(training=False, layout=None)

  def resolve_dispatch(self, *, training: bool,
                       layout: dispatch_lib.BufferLayout | None) -> str:
    """:func:`m4moe.moe.dispatch.resolve_dispatch` for this layer's config."""
    moe = self.config.moe
    return dispatch_lib.resolve_dispatch(
        requested=moe.dispatch, backend=self.sharding.backend,
        router=moe.router, training=training,
        expert_dropout_rate=self.experts.dropout_rate,
        layout=layout if self.allow_block_dispatch else None,
        activation_dtype=self.config.activation_dtype)

  def uses_randomness(self, *, training: bool) -> bool:
    return (self.router.uses_randomness(training=training) or
            (training and (self.experts.dropout_rate > 0 or
                           self.config.moe.expert_output_mask_rate > 0)))

  def group_size(self, num_tokens: int | None) -> int:
    """S for a call with ``num_tokens`` tokens (None: unknown statically)."""
    if num_tokens is None:
      return self.config.moe.group_size
    return max(1, min(self.config.moe.group_size, num_tokens))

  def __call__(self, x: tf.Tensor, *, padding_mask: tf.Tensor, training: bool,
               seed: tf.Tensor | None = None,
               group_per_row: bool = False,
               languages: tf.Tensor | None = None) -> MoeOutput:
    """Applies the MoE feed-forward layer.

    Args:
      x: <activation dtype>[B, L, M] inputs.
      padding_mask: <float32>[B, L] 1 for real tokens, 0 for padding.
      training: training mode (train capacity, jitter/noise/random policy,
        expert dropout).
      seed: <int32>[2] stateless seed; required when training with any
        randomness.
      group_per_row: route each row as its own group with the capacity of
        its real-token count (see the module docstring).
      languages: <int32>[B, L] routing-language index of every token
        (:mod:`m4moe.moe.task_routing`); required with ``--route_by=language``,
        where the router sees their one-hot instead of ``x``.

    Returns:
      :class:`MoeOutput`.

    Raises:
      ValueError: ``--route_by=language`` without ``languages``.
    """
    self._check_seed(seed, training=training)
    grouped, grouped_mask, position, source, group_capacity = (
        self._grouped_inputs(x, padding_mask, training=training,
                             group_per_row=group_per_row))
    router_inputs = grouped
    if self.config.moe.route_by == "language":
      router_inputs = self._language_router_inputs(
          languages, padding_mask, training=training,
          group_per_row=group_per_row)
    capacity = self.config.moe.capacity(group_size=grouped.shape[1],
                                        training=training)
    result = self.router(router_inputs, padding_mask=grouped_mask,
                         capacity=capacity, training=training,
                         seed=fold_seed(seed, 0),
                         group_capacity=group_capacity)
    path = self.resolve_dispatch(
        training=training, layout=_buffer_layout(grouped, result))
    combined = dispatch_lib.DISPATCH_PATHS[path](
        grouped, result, self.experts, training=training,
        seed=fold_seed(seed, 1))
    combined = self._shared_and_masked(combined, grouped, grouped_mask,
                                       training=training,
                                       seed=fold_seed(seed, 2))
    combined = _split_groups(self.sharding, combined, dim=0, name="combined")
    moe = self.config.moe
    return MoeOutput(
        outputs=self._ungroup(combined, position, source, like=x),
        aux_loss=result.aux_loss, z_loss=result.z_loss,
        weighted_loss=(moe.aux_loss_weight * result.aux_loss +
                       moe.z_loss_weight * result.z_loss),
        stats=self._layer_stats(result, grouped_mask))

  def _check_seed(self, seed: tf.Tensor | None, *, training: bool) -> None:
    """Refuses a random call without a seed.

    Without one the router noise, expert dropout and output masks would be
    drawn statefully, so a step could not be replayed exactly on resume.
    """
    if self.uses_randomness(training=training) and seed is None:
      raise ValueError(
          f"MoeLayer {self.name!r} is random when training=True (router "
          f"{self.config.moe.router!r} / expert dropout / output masking); "
          "pass "
          "seed=<int32>[2], e.g. fold_in(base_seed, step)")

  def _grouped_inputs(
      self, x: tf.Tensor, padding_mask: tf.Tensor, *, training: bool,
      group_per_row: bool,
  ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor | None,
             tf.Tensor | None]:
    """Splits the batch into routing groups, laid out over the mesh.

    One place decides between per-row groups (each row its own capacity,
    for decoding) and fixed-size groups per shard, so the router and the
    dispatch below see the same [G, S, M] either way.

    Args:
      x: <activation dtype>[B, L, M] inputs.
      padding_mask: <float32>[B, L] 1 for real tokens, 0 for padding.
      training: training mode (per-row capacity uses the train factor).
      group_per_row: route each row as its own group.

    Returns:
      ``(grouped, grouped_mask, position, source, group_capacity)``:
      <activation dtype>[G, S, M] groups, <float32>[G, S] their mask,
      <int32>[D, B*L/D] each token's row in its shard's flattened groups
      (D = 1 with per-row groups), <int32>[G*S] the token in each slot
      (B*L: none) for groups formed on one device, else None, and
      <int32>[G] per-group capacity with per-row groups, else None.
    """
    group_capacity, source = None, None
    if group_per_row:
      grouped, grouped_mask, position, group_capacity = self._group_rows(
          x, padding_mask, training=training)
      position = tf.reshape(position, [1, -1])
    else:
      tokens = tf.reshape(x, [-1, x.shape[-1]])
      mask = tf.reshape(tf.cast(padding_mask, tf.float32), [-1])
      grouped, grouped_mask, position, source = self._group(
          tokens, mask, shards=self.group_shards(x.shape[0]))
    grouped = _split_groups(self.sharding, grouped, dim=0, name="groups")
    grouped_mask = _split_groups(self.sharding, grouped_mask, dim=0,
                                 name="group_mask")
    return grouped, grouped_mask, position, source, group_capacity

  @staticmethod
  def _ungroup(combined: tf.Tensor, position: tf.Tensor,
               source: tf.Tensor | None, *, like: tf.Tensor) -> tf.Tensor:
    """Puts the combined outputs back in the inputs' [B, L, M] order.

    Each token reads its row of its own shard's groups (batched over D), so
    the gather never crosses shards.

    Args:
      combined: <activation dtype>[G, S, M] the layer's per-group outputs.
      position: <int32>[D, B*L/D] from :meth:`_grouped_inputs`.
      source: <int32>[G*S] from :meth:`_grouped_inputs`: with it (groups
        formed on one device) the gather's gradient is the gather by it
        (:func:`m4moe.moe.grouping.permuted_gather`).
      like: <activation dtype>[B, L, M] the layer's inputs (for the shape).

    Returns:
      <activation dtype>[B, L, M].
    """
    if source is not None:
      return tf.reshape(
          grouping.ungroup_one_device(combined, position, source),
          tf.shape(like))
    model_dim = like.shape[-1]
    outputs = tf.gather(
        tf.reshape(combined, [position.shape[0], -1, model_dim]),
        position, batch_dims=1)
    return tf.reshape(outputs, tf.shape(like))

  def _shared_and_masked(self, combined: tf.Tensor, grouped: tf.Tensor,
                         grouped_mask: tf.Tensor, *, training: bool,
                         seed: tf.Tensor | None) -> tf.Tensor:
    """Scales the routed output, adds the shared experts and applies
    expert output masking.

    Args:
      combined: <dtype>[G, S, M] the routed experts' combined outputs.
      grouped: <dtype>[G, S, M] the grouped tokens.
      grouped_mask: <float32>[G, S] 1 for real tokens.
      training: output masking applies only when training.
      seed: <int32>[2], the masking draw's (required if it applies).

    Returns:
      <dtype>[G, S, M] the MoE layer's output per grouped token (0 at
      padding). The masking draw is one unit per grouped token, laid out by
      group as the routers' draws are.
    """
    moe = self.config.moe
    if moe.expert_output_scale != 1.0:
      combined *= tf.cast(moe.expert_output_scale, combined.dtype)
    if self.shared_experts is not None:
      real = tf.cast(grouped_mask > 0, combined.dtype)[..., tf.newaxis]
      combined += self.shared_experts(grouped) * real
    if training and moe.expert_output_mask_rate > 0:
      keep = layers.dropout_scale(
          tf.shape(grouped_mask), rate=moe.expert_output_mask_rate,
          seed=seed, dtype=combined.dtype, sharding=self.sharding)
      combined *= keep[..., tf.newaxis]
    return combined

  def _layer_stats(self, result: routing.RoutingResult,
                   grouped_mask: tf.Tensor) -> MoeLayerStats:
    """The router's stats plus the expert FLOPs this call executed.

    Args:
      result: the call's routing.
      grouped_mask: <float32>[G, S] 1 for real tokens.
    """
    config, moe = self.config, self.config.moe
    real = tf.reduce_sum(tf.cast(grouped_mask > 0, tf.float32))
    per_token = tf.math.divide_no_nan(
        dispatch_lib.dispatched_assignments(result), real)
    routed = 4.0 * config.d_model * moe.expert_hidden_dim
    shared = 4.0 * config.d_model * moe.num_shared_experts * (
        moe.shared_hidden_dim)
    flops = per_token * routed + shared
    computed = tf.nest.map_structure(tf.stop_gradient, dict(
        expert_assignments_per_token=per_token, expert_flops_per_token=flops,
        expert_flops_dense_fraction=flops / (4.0 * config.d_model *
                                             config.d_ff)))
    return MoeLayerStats(**result.stats.as_dict(), **computed)

  def _language_router_inputs(self, languages: tf.Tensor | None,
                              padding_mask: tf.Tensor, *, training: bool,
                              group_per_row: bool) -> tf.Tensor:
    """<float32>[G, S, num_languages] one-hot languages, grouped as the tokens.

    The grouping is a function of the padding mask only, so grouping the
    one-hot ids the same way puts every token's language beside it.
    """
    if languages is None:
      raise ValueError(
          f"MoeLayer {self.name!r} routes by language (--route_by=language) "
          "and needs languages=<int32>[B, L] (the batch's "
          f"{task_routing.INPUTS_KEY} / {task_routing.TARGETS_KEY})")
    one_hot = task_routing.one_hot_languages(
        languages, num_languages=self.config.moe.router_input_dim)
    if group_per_row:
      grouped, _, _, _ = self._group_rows(one_hot, padding_mask,
                                          training=training)
    else:
      grouped, _, _, _ = self._group(
          tf.reshape(one_hot, [-1, one_hot.shape[-1]]),
          tf.reshape(tf.cast(padding_mask, tf.float32), [-1]))
    return _split_groups(self.sharding, grouped, dim=0, name="router_groups")

  def _group_rows(self, x: tf.Tensor, padding_mask: tf.Tensor, *,
                  training: bool):
    """One group per row, capped at the capacity of its real-token count.

    A row length L unknown statically (a ``tf.function`` with a
    ``[None, None]`` signature) is padded to ``config.max_length``, the
    static bound the routers need; padding changes no output.

    Args:
      x: <dtype>[B, L, M]; padding_mask: <float32>[B, L].
      training: selects the capacity factor.

    Returns:
      (grouped <dtype>[B, S, M], grouped mask <float32>[B, S],
       position <int32>[B*L] of each token in the flattened B*S order,
       group capacity <int32>[B]), S = L if static, else max_length.
    """
    mask = tf.cast(padding_mask, tf.float32)
    length = x.shape[1]
    if length is None:
      length = self.config.max_length
      dynamic = tf.shape(x)[1]
      with tf.control_dependencies([tf.debugging.assert_less_equal(
          dynamic, length, message=(
              f"MoeLayer {self.name!r}: rows are longer than --max_length="
              f"{length}; truncate them"))]):
        extra = length - dynamic
      x = tf.pad(x, [[0, 0], [0, extra], [0, 0]])
      mask = tf.pad(mask, [[0, 0], [0, extra]])
      x = tf.ensure_shape(x, [None, length, x.shape[-1]])
      mask = tf.ensure_shape(mask, [None, length])
      position = tf.reshape(
          tf.range(tf.shape(x)[0])[:, None] * length + tf.range(dynamic), [-1])
    else:
      position = tf.range(tf.size(mask))
    real = tf.reduce_sum(tf.cast(mask > 0, tf.int32), axis=1)
    # C(n) for every real-token count n in [0, S] (0 for an empty row),
    # all through MoeConfig.capacity.
    moe = self.config.moe
    table = [0] + [moe.capacity(group_size=n, training=training)
                   for n in range(1, length + 1)]
    group_capacity = tf.gather(tf.constant(table, tf.int32), real)
    return x, mask, position, group_capacity

  def group_shards(self, num_rows: int | None) -> int:
    """D: how many row shards group their own tokens, for B = ``num_rows``.

    The size of the mesh's batch axis (:attr:`m4moe.parallel.sharding.Sharding.
    batch_axis`: ``data``, or ``expert`` on a mesh without a ``data`` axis)
    when it divides the static row count B (each shard then holds B/D whole
    rows); 1 without a mesh, without such an axis, or for a B it does not
    divide or that is unknown statically (an odd eval batch: grouped as one
    shard).
    """
    if not self.sharding.enabled:
      return 1
    data = self.sharding.mesh.axis_size(self.sharding.batch_axis)
    if data > 1 and num_rows is not None and num_rows % data == 0:
      return data
    return 1

  def _group(self, tokens: tf.Tensor, mask: tf.Tensor, *, shards: int = 1):
    """Forms each shard's groups from its own tokens (local group dispatch).

    The N tokens (rows of the batch one after the other) are D consecutive
    shards of N/D tokens, the rows each batch-axis shard holds. Within each
    shard the real tokens move to the front (keeping their order) and the
    shard is cut into G_local groups of S tokens, the last one padded with
    masked tokens; no token leaves its shard, so on a mesh every op here is
    local to a shard (batched over D) and no device gathers the
    other shards' tokens. With D = 1 this is one compaction of the batch.

    Args:
      tokens: <dtype>[N, M] the batch's tokens, row-major.
      mask: <float32>[N] 1 for real tokens.
      shards: D, dividing the row count B (see :meth:`group_shards`).

    Returns:
      (grouped <dtype>[G, S, M], G = D*G_local, group g from shard
       g // G_local;
       grouped mask <float32>[G, S];
       position <int32>[D, N/D] of each token in its shard's flattened
       G_local*S order;
       source <int32>[G*S] the token in each slot (N: none) without a
       mesh, where :func:`m4moe.moe.grouping.group_one_device` forms the
       groups with gather-only gradients; None on a mesh).
    """
    model_dim = tokens.shape[-1]
    num_tokens_static = tokens.shape[0]
    group_size = self.group_size(
        None if num_tokens_static is None else num_tokens_static // shards)
    if not self.sharding.enabled:
      return grouping.group_one_device(tokens, mask, group_size=group_size)
    # Shard d on data device d (annotations; D = 1 is left whole).
    tokens = _split_groups(self.sharding,
                           tf.reshape(tokens, [shards, -1, model_dim]),
                           dim=0, name="shard_tokens")  # [D, N/D, M]
    mask = _split_groups(self.sharding, tf.reshape(mask, [shards, -1]),
                         dim=0, name="shard_mask")  # [D, N/D]
    num_tokens = tf.shape(mask)[1]
    num_groups = (num_tokens + group_size - 1) // group_size
    position = grouping.compaction_permutation(mask)
    # The token at each position.
    source = grouping.compaction_source(mask, position, one_device=False)
    slot = tf.range(num_groups * group_size)
    source = tf.gather(source, tf.minimum(slot, num_tokens - 1), axis=1)
    valid = tf.cast(slot < num_tokens, tf.float32)
    grouped = tf.reshape(tf.gather(tokens, source, batch_dims=1),
                         [-1, group_size, model_dim])
    grouped_mask = tf.reshape(tf.gather(mask, source, batch_dims=1) * valid,
                              [-1, group_size])
    return grouped, grouped_mask, position, None
