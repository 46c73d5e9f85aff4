"""The position-wise Mixture-of-Experts feed-forward layer (GShard §2).

Dimensions cheat sheet:

  B: batch, L: sequence length, N = B*L tokens
  G: groups, S: group size, E: experts, C: expert capacity
  M: model width, H: expert hidden width
  X: expert-homogeneous blocks, R: rows per block (block dispatch)

``MoeLayer`` turns ``<dtype>[B, L, M]`` into N tokens, moves the real tokens
to the front (keeping their order) so that adding padding never changes
which real tokens share a group, pads to G*S with masked tokens, routes each
group (router in float32), dispatches to the experts
``FFN_e(x) = wo_e . ReLU(wi_e . x)`` (activation dtype) and scatters the
combined outputs back to ``[B, L, M]``; padding positions get exactly 0.

Group size: S = ``moe.group_size``, or N when the (static) token count is
smaller, so small batches are one group of their real size (with an
unknown static N, S = ``moe.group_size``). Capacity:
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
tokens: not on the other rows, nor on how much padding the batch adds.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import tensorflow as tf

from m4moe import dispatch as dispatch_lib
from m4moe import initializers
from m4moe import routing
from m4moe import sharding as sharding_lib
from m4moe.config import ConfigError, ModelConfig


@dataclasses.dataclass(frozen=True)
class MoeOutput:
  """Result of one :class:`MoeLayer` call.

  Attributes:
    outputs: <activation dtype>[B, L, M] (exactly 0 at padding positions).
    aux_loss: <float32>[] unweighted load-balancing loss.
    z_loss: <float32>[] unweighted router z-loss.
    weighted_loss: <float32>[] ``aux_loss_weight * aux_loss +
      z_loss_weight * z_loss``, to add to the model loss.
    stats: the layer's :class:`m4moe.routing.RouterStats`.
  """

  outputs: tf.Tensor
  aux_loss: tf.Tensor
  z_loss: tf.Tensor
  weighted_loss: tf.Tensor
  stats: routing.RouterStats

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
# [640, 128] x [128, 256] per expert: 60 ms vs 83 ms on 2 cores).
_PER_EXPERT_MATMUL_MAX_EXPERTS = 32


class FeedForwardExperts(tf.Module):
  """E independent ReLU FFNs ``FFN_e(x) = wo_e . ReLU(wi_e . x)``.

  Weights: ``wi <float32>[E, M, H]``, ``wo <float32>[E, H, M]``.
  Truncated-normal init with sigma = sqrt(init_scale / fan_in) (fan_in M for
  wi, H for wo). Weights are float32 and cast to the input dtype to compute.
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
    # The dispatch works per group: its buffers come split on G over "data".
    # GShard's AllToAll re-splits them on E over "expert" (G stays split on
    # "data", so a 2-D mesh does not repeat an expert's work per data row).
    groups = "data" if shard.divides(dispatched.shape[1], "data") else None
    dispatched = _split_groups(shard, dispatched, dim=1,
                               name="dispatched_groups")
    dispatched = shard.shard(dispatched, ("expert", groups),
                             name="dispatched")
    keep = None
    if training and self.dropout_rate > 0:
      if seed is None:
        raise ValueError("expert dropout needs seed=<int32>[2] when training")
      keep = self._dropout_scale(tf.shape(dispatched), dtype=dtype, seed=seed)
    num_experts = self.wi.shape[0]
    # Per-expert matmuls would put every expert on every device when sharded.
    if (output_layout == "EGCM" and not shard.enabled and
        num_experts <= _PER_EXPERT_MATMUL_MAX_EXPERTS):
      return self._per_expert(dispatched, keep)
    wi = shard.split(tf.cast(self.wi, dtype), dim=0, axis="expert", name="wi")
    wo = shard.split(tf.cast(self.wo, dtype), dim=0, axis="expert", name="wo")
    h = tf.nn.relu(tf.einsum("EGCM,EMH->EGCH", dispatched, wi))
    if keep is not None:
      h *= keep
    out = tf.einsum(f"EGCH,EHM->{output_layout}", h, wo)
    spec = [None] * 4
    spec[output_layout.index("E")] = "expert"
    spec[output_layout.index("G")] = groups
    out = shard.shard(out, tuple(spec), name="expert_outputs")
    # The reverse AllToAll: back to groups for the per-group combine.
    return _split_groups(shard, out, dim=output_layout.index("G"),
                         name="expert_outputs_groups")

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
    outputs = []
    for e in range(num_experts):
      h = tf.nn.relu(tf.matmul(pieces[e], wi[e]))
      if keeps[e] is not None:
        h *= keeps[e]
      outputs.append(tf.matmul(h, wo[e]))
    outputs.append(tf.zeros_like(pieces[num_experts]))
    return tf.concat(outputs, axis=0)

  def blocks(self, blocks: tf.Tensor, block_expert: tf.Tensor) -> tf.Tensor:
    """Applies expert ``block_expert[x]`` to block x (no dropout).

    Args:
      blocks: <dtype>[X, R, M] rows; block_expert: <int32>[X].

    Returns:
      <dtype>[X, R, M] expert outputs.
    """
    dtype = blocks.dtype
    wi = tf.cast(tf.gather(self.wi, block_expert), dtype)  # [X, M, H]
    wo = tf.cast(tf.gather(self.wo, block_expert), dtype)  # [X, H, M]
    h = tf.nn.relu(tf.einsum("XRM,XMH->XRH", blocks, wi))
    return tf.einsum("XRH,XHM->XRM", h, wo)

  def _dropout_scale(self, buffer_shape: tf.Tensor, *, dtype: tf.DType,
                     seed: tf.Tensor) -> tf.Tensor:
    """<dtype>[E, G, C, H]: 0 for dropped hidden units, 1/(1-rate) else."""
    shape = tf.concat([buffer_shape[:-1], [self.wi.shape[-1]]], axis=0)
    draws = self.sharding.pin_random(
        tf.random.stateless_uniform(shape, seed=seed), name="dropout_draws")
    keep = draws >= self.dropout_rate
    return tf.cast(keep, dtype) / (1.0 - self.dropout_rate)

  def _per_expert(self, dispatched: tf.Tensor,
                  keep: tf.Tensor | None) -> tf.Tensor:
    """Same as the batched einsums, as one 2-D matmul per expert (EGCM out)."""
    dtype = dispatched.dtype
    model_dim, hidden_dim = self.wi.shape[1], self.wi.shape[2]
    rows = tf.reshape(dispatched, [self.wi.shape[0], -1, model_dim])
    wi = tf.unstack(tf.cast(self.wi, dtype))
    wo = tf.unstack(tf.cast(self.wo, dtype))
    keeps = tf.unstack(keep) if keep is not None else None
    outputs = []
    for e, x in enumerate(tf.unstack(rows)):
      h = tf.nn.relu(tf.matmul(x, wi[e]))
      if keeps is not None:
        h *= tf.reshape(keeps[e], [-1, hidden_dim])
      outputs.append(tf.matmul(h, wo[e]))
    return tf.reshape(tf.stack(outputs), tf.shape(dispatched))


def _split_groups(sharding: sharding_lib.Sharding, t: tf.Tensor, *, dim: int,
                  name: str) -> tf.Tensor:
  """Splits the G dimension ``dim`` of ``t`` over ``data`` if it divides.

  Training batches are checked to give a G the ``data`` axis divides
  (:func:`m4moe.mesh.validate_mesh`); an eval batch or a decoding step may
  not, and then its groups stay whole on every device (same values).
  """
  if not sharding.divides(t.shape[dim], "data"):
    return t
  return sharding.split(t, dim=dim, axis="data", name=name)


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


def _compaction_permutation(mask: tf.Tensor) -> tf.Tensor:
  """<int32>[N] new position of each token: real tokens first, in order."""
  real = tf.cast(mask > 0, tf.int32)
  real_position = tf.cumsum(real, exclusive=True)
  pad_position = tf.reduce_sum(real) + tf.cumsum(1 - real, exclusive=True)
  return tf.where(real > 0, real_position, pad_position)


class MoeLayer(tf.Module):
  """GShard/Switch MoE layer replacing a Transformer feed-forward layer."""

  def __init__(self, *, config: ModelConfig, causal: bool, name: str = "moe",
               sharding: sharding_lib.Sharding = sharding_lib.NO_SHARDING):
    """Builds the router and the experts.

    Args:
      config: the model config; ``config.moe`` must have experts.
      causal: True in the decoder (rejects ``--router=expert_choice``).
      name: module name.
      sharding: GShard annotations (groups split on ``data``, experts on
        ``expert``); the default annotates nothing.

    Raises:
      ConfigError: for a config this layer cannot run.
    """
    super().__init__(name=name)
    _check_config(config, causal=causal)
    self.config = config
    self.causal = causal
    self.sharding = sharding
    moe = config.moe
    with self.name_scope:
      self.router = routing.make_router(config, name="router",
                                        sharding=sharding)
      self.experts = FeedForwardExperts(
          num_experts=moe.num_experts, model_dim=config.d_model,
          hidden_dim=moe.expert_hidden_dim, init_scale=config.init_scale,
          dropout_rate=moe.expert_dropout_rate, sharding=sharding,
          name="experts")

  @property
  def dispatch(self) -> str:
    """The dispatch implementation used: ``moe.dispatch``, but ``"einsum"``
    under the DTensor backend.

    DTensor (TF 2.21) cannot partition the index path: its ``[G, E, C] ->
    [E, G, C]`` transpose of the slot tables fails ("TransposeOp SPMD needs
    communication") from a replicated or G-split table into the E-split
    buffers, and with the tables pinned to G-split the gather/scatter
    gradients fail shape checks (ReluGrad, Mul). The one-hot einsums of
    GShard Algorithm 2 partition cleanly (same outputs and gradients, more
    memory). The XLA backend keeps ``moe.dispatch``, but ``"sorted"``
    (dynamic per-expert row counts, which XLA cannot compile) becomes its
    static-shape equivalent ``"index"``, as it does for the expert-choice
    router (no per-token view to sort).
    """
    moe = self.config.moe
    if self.sharding.backend == "dtensor":
      return "einsum"
    if moe.dispatch == "sorted" and (self.sharding.backend == "xla" or
                                     moe.router == "expert_choice"):
      return "index"
    return moe.dispatch

  def uses_randomness(self, *, training: bool) -> bool:
    return (self.router.uses_randomness(training=training) or
            (training and self.config.moe.expert_dropout_rate > 0))

  def group_size(self, num_tokens: int | None) -> int:
    """S for a call with ``num_tokens`` tokens (None: unknown statically)."""
    if num_tokens is None:
      return self.config.moe.group_size
    return max(1, min(self.config.moe.group_size, num_tokens))

  def __call__(self, x: tf.Tensor, *, padding_mask: tf.Tensor, training: bool,
               seed: tf.Tensor | None = None,
               group_per_row: bool = False) -> MoeOutput:
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

    Returns:
      :class:`MoeOutput`.
    """
    if self.uses_randomness(training=training) and seed is None:
      raise ValueError(
          f"MoeLayer {self.name!r} is random when training=True (router "
          f"{self.config.moe.router!r} / expert dropout); pass "
          "seed=<int32>[2], e.g. fold_in(base_seed, step)")
    router_seed = expert_seed = None
    if seed is not None:
      router_seed = tf.random.experimental.stateless_fold_in(seed, 0)
      expert_seed = tf.random.experimental.stateless_fold_in(seed, 1)
    model_dim = x.shape[-1]
    tokens = tf.reshape(x, [-1, model_dim])
    mask = tf.reshape(tf.cast(padding_mask, tf.float32), [-1])
    group_capacity = None
    if group_per_row:
      grouped, grouped_mask, position, group_capacity = self._group_rows(
          x, padding_mask, training=training)
    else:
      grouped, grouped_mask, position = self._group(tokens, mask)
    grouped = _split_groups(self.sharding, grouped, dim=0, name="groups")
    grouped_mask = _split_groups(self.sharding, grouped_mask, dim=0,
                                 name="group_mask")
    capacity = self.config.moe.capacity(group_size=grouped.shape[1],
                                        training=training)
    result = self.router(grouped, padding_mask=grouped_mask,
                         capacity=capacity, training=training,
                         seed=router_seed, group_capacity=group_capacity)
    if self.dispatch == "sorted":
      combined = dispatch_lib.sorted_dispatch_combine(
          grouped, result, functools.partial(
              self.experts.rows, training=training, seed=expert_seed))
    elif self._use_blocks(grouped, result, training=training):
      combined = dispatch_lib.block_dispatch_combine(grouped, result,
                                                     self.experts.blocks)
    else:
      expert_fn = functools.partial(self.experts, training=training,
                                    seed=expert_seed)
      combined = dispatch_lib.dispatch_combine(
          grouped, result, expert_fn, implementation=self.dispatch)
    combined = _split_groups(self.sharding, combined, dim=0, name="combined")
    outputs = tf.gather(tf.reshape(combined, [-1, model_dim]), position)
    moe = self.config.moe
    return MoeOutput(
        outputs=tf.reshape(outputs, tf.shape(x)),
        aux_loss=result.aux_loss, z_loss=result.z_loss,
        weighted_loss=(moe.aux_loss_weight * result.aux_loss +
                       moe.z_loss_weight * result.z_loss),
        stats=result.stats)

  def _use_blocks(self, grouped: tf.Tensor, result: routing.RoutingResult, *,
                  training: bool) -> bool:
    """Block dispatch for ``--dispatch=index`` when it computes fewer rows.

    That is a large capacity for few tokens (the no-drop eval capacity C = S
    at decoding: E*C buffer rows per group vs at most S*K + E*(b-1) block
    rows). Needs the per-token routing view, a static G and no expert
    dropout.
    """
    moe = self.config.moe
    if (self.dispatch != "index" or result.expert_index is None or
        self.sharding.enabled or  # blocks gather weights across experts
        grouped.shape[0] is None or
        (training and moe.expert_dropout_rate > 0)):
      return False
    num_groups, group_size = grouped.shape[0], grouped.shape[1]
    return dispatch_lib.block_rows_are_fewer(
        num_choices=num_groups * group_size * result.expert_index.shape[-1],
        num_experts=moe.num_experts,
        buffer_rows=moe.num_experts * num_groups * result.capacity)

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

  def _group(self, tokens: tf.Tensor, mask: tf.Tensor):
    """Compacts real tokens to the front and splits them into groups.

    Args:
      tokens: <dtype>[N, M]; mask: <float32>[N].

    Returns:
      (grouped <dtype>[G, S, M], grouped mask <float32>[G, S],
       position <int32>[N] of each token in the flattened G*S order).
    """
    num_tokens_static = tokens.shape[0]
    group_size = self.group_size(num_tokens_static)
    num_tokens = tf.shape(tokens)[0]
    num_groups = (num_tokens + group_size - 1) // group_size
    position = _compaction_permutation(mask)
    source = tf.math.invert_permutation(position)  # token at each position
    slot = tf.range(num_groups * group_size)
    source = tf.gather(source, tf.minimum(slot, num_tokens - 1))
    valid = tf.cast(slot < num_tokens, tf.float32)
    grouped = tf.reshape(tf.gather(tokens, source),
                         [-1, group_size, tokens.shape[-1]])
    grouped_mask = tf.reshape(tf.gather(mask, source) * valid,
                              [-1, group_size])
    return grouped, grouped_mask, position
