"""Routers: which token goes to which slot of which expert's buffer.

Dimensions (letters of the glossary in :mod:`m4moe`; GShard Algorithm 2's):

  G: number of groups (local group dispatching: groups route independently);
  S: group size, tokens per group; E: number of experts;
  C: expert capacity, buffer slots per expert per group;
  M: model width (d_model); H: expert hidden width;
  K: expert choices per token (top2: 2, top1: 1, topk and noisy_topk: k).

Every router maps ``<float32>[G, S, M]`` router inputs (token activations;
with ``--route_by=language`` one-hot language ids, M = number of routing
languages, :mod:`m4moe.moe.task_routing`) and a
``<float32>[G, S]`` padding mask (1 real, 0 pad) to a :class:`RoutingResult`.
The router weights ``wg <float32>[M, E]`` and all routing arithmetic stay in
float32 whatever the activation dtype ("selective precision", Switch §2.4).

Routers:

* :class:`Top2Router` -- GShard Algorithm 1, vectorised. First choices of the
  whole group take buffer positions in token order before any second choice
  does. As in the paper's loop (Algorithm 1, line 22), a real token's second
  choice advances its expert's counter even when the ``random`` policy decides
  not to dispatch it, so such a choice leaves its slot empty.
* :class:`SwitchRouter` -- top-1 (Switch Transformer), multiplicative jitter.
* :class:`TopKRouter` -- Algorithm 1's capacity rule for any k: all first
  choices of a group take positions before any second choice, all second
  choices before any third, ...; combine weights renormalised over the k
  chosen gates or not (``--renormalize_combine_weights``).
* :class:`NoisyTopKRouter` -- Shazeer et al. (2017) noisy top-k gating.
* :class:`ExpertChoiceRouter` -- each expert picks its top-C tokens of the
  group by gate value (encoder only: a token's routing depends on later
  tokens).

Load-balancing ("aux") losses, all unweighted:

* top2, top1 and topk: ``E * sum_e f_e * P_e`` per group, where ``f_e`` is the
  fraction of the group's real tokens whose first choice is ``e`` (counted
  before capacity is applied) and ``P_e`` is their mean gate for ``e``. This
  equals GShard's ``mean_e(c_e/S * m_e)`` scaled by ``E**2`` and Switch's
  ``N * sum_i f_i P_i``; uniform routing gives exactly **1.0** (with uniform
  gates it is 1.0 whatever the assignment). Only ``P_e`` carries gradient.
* noisy_topk: importance loss ``CV(sum_x G(x))**2`` per group (squared
  coefficient of variation over experts); uniform importance gives **0.0**.
* expert_choice: balanced by construction, the loss is **0.0**.

Per-group losses are averaged over groups weighted by their number of real
tokens, so all-padding groups change nothing. The optional z-loss is the mean
over real tokens of ``logsumexp(logits)**2``.

Padding tokens take no capacity, never enter losses or statistics, and get
no buffer slot (hence zero MoE output).

Router techniques of the token-choice routers (docs/moe_techniques.md):

* Batch-prioritized routing (``batch_prioritized=True``, V-MoE): within a
  group the tokens take buffer positions in descending order of their
  largest router probability (ties: token order) instead of token order,
  still all first choices before any second choice.
* Auxiliary-loss-free balancing (``bias_balancing_rate > 0``, top2, top1 and
  topk): a non-trainable per-expert bias ``b <float32>[E]`` is added to the
  gates to *select* experts (``top-k(gates + b)``); combine weights, the aux
  loss's ``P_e`` and batch priorities use the unbiased gates. After every
  training step the trainer moves it by :func:`bias_balancing_update` from
  ``RouterStats.selection_counts`` summed over the whole step.

Per-group capacity: ``group_capacity <int32>[G]`` (optional) caps group g at
``group_capacity[g] <= C`` slots per expert; the buffers stay C wide and the
slots past the cap stay empty. The MoE layer uses it to give every sentence
the capacity of its own real-token count (see ``MoeLayer``, decode routing).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

from m4moe.model import initializers
from m4moe.moe import placement
from m4moe.parallel import sharding as sharding_lib
from m4moe.config import ConfigError, ModelConfig
from m4moe.model.numerics import NEG_INF as _NEG_INF


@dataclasses.dataclass(frozen=True)
class RouterStats:
  """Routing statistics of one MoE layer for one step (no gradient).

  Attributes:
    load: <float32>[E] fraction of real tokens whose first choice is expert e
      (expert_choice: whose highest gate is e).
    load_cv: <float32>[] coefficient of variation (std/mean) of ``load``.
    dropped_first: <float32>[] fraction of real tokens whose first choice got
      no buffer slot (expert_choice: tokens no expert picked).
    dropped_second: <float32>[] fraction of attempted later choices (2nd..kth,
      after the second-expert policy) that got no slot.
    entropy: <float32>[] mean over real tokens of the router distribution's
      entropy (nats).
    max_logit: <float32>[] largest router logit over real tokens.
    aux_loss: <float32>[] unweighted load-balancing loss.
    z_loss: <float32>[] unweighted router z-loss.
    selection_counts: <float32>[E] choices of real tokens (all K, as
      selected: before capacity, policy skips and re-routing) that select
      expert e, summed over the groups; the load bias balancing equalises
      (expert_choice: tokens in e's filled slots).
  """

  load: tf.Tensor
  load_cv: tf.Tensor
  dropped_first: tf.Tensor
  dropped_second: tf.Tensor
  entropy: tf.Tensor
  max_logit: tf.Tensor
  aux_loss: tf.Tensor
  z_loss: tf.Tensor
  selection_counts: tf.Tensor

  def as_dict(self) -> dict[str, tf.Tensor]:
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

  # tf.nest support, so stats can leave a tf.function or a while loop.
  def __tf_flatten__(self) -> tuple[Any, tuple[tf.Tensor, ...]]:
    return (), tuple(getattr(self, f.name) for f in dataclasses.fields(self))

  @classmethod
  def __tf_unflatten__(cls, metadata: Any, components: Any) -> RouterStats:
    del metadata
    return cls(*components)


@dataclasses.dataclass(frozen=True)
class RoutingResult:
  """Where every token goes; every dispatch implementation reads this.

  Token-choice routers fill the per-token view (``expert_index``,
  ``buffer_position``, ``combine_weights``); expert_choice fills the
  buffer-slot view (``slot_token``, ``slot_weight``). The methods derive
  everything else: :meth:`dispatch_mask` / :meth:`combine_array` (one-hot
  ops only, for the einsum path -- nothing but elementwise ops and einsums,
  so DTensor can partition it) and :meth:`slots` (a scatter, for the index
  path).

  Attributes:
    num_experts: E (static).
    capacity: C (static).
    group_size: S (static).
    aux_loss: <float32>[] unweighted load-balancing loss.
    z_loss: <float32>[] unweighted router z-loss.
    stats: the step's :class:`RouterStats`.
    expert_index: <int32>[G, S, K] expert of each choice (kept or not).
    buffer_position: <int32>[G, S, K] slot of each dispatched choice in its
      expert's buffer, -1 if it was not dispatched (pad, policy, capacity).
    combine_weights: <float32>[G, S, K] weight of each choice, 0 unless
      dispatched.
    slot_token: <int32>[G, E, C] index in [0, S) of the token in each buffer
      slot, or S for an empty slot.
    slot_weight: <float32>[G, E, C] combine weight of each slot (0 if empty).
  """

  num_experts: int
  capacity: int
  group_size: int
  aux_loss: tf.Tensor
  z_loss: tf.Tensor
  stats: RouterStats
  expert_index: tf.Tensor | None = None
  buffer_position: tf.Tensor | None = None
  combine_weights: tf.Tensor | None = None
  slot_token: tf.Tensor | None = None
  slot_weight: tf.Tensor | None = None

  def slots(self) -> tuple[tf.Tensor, tf.Tensor]:
    """(slot_token <int32>[G, E, C], slot_weight <float32>[G, E, C])."""
    if self.slot_token is not None:
      return self.slot_token, self.slot_weight
    return placement.slot_view(self.expert_index, self.buffer_position,
                      self.combine_weights, num_experts=self.num_experts,
                      capacity=self.capacity)

  def _one_hot(self, weighted: bool) -> tf.Tensor:
    if self.expert_index is None:  # slot view: GECS one-hot -> GSEC
      # An empty slot holds S, whose one-hot row of depth S is all zeros.
      one_hot = tf.one_hot(self.slot_token, self.group_size, dtype=tf.float32)
      if weighted:
        one_hot *= tf.expand_dims(self.slot_weight, -1)
      return tf.transpose(one_hot, [0, 3, 1, 2])
    expert = tf.one_hot(self.expert_index, self.num_experts)  # GSKE
    if weighted:
      expert *= tf.expand_dims(self.combine_weights, -1)
    position = tf.one_hot(self.buffer_position, self.capacity)  # -1: zeros
    return tf.einsum("GSKE,GSKC->GSEC", expert, position)

  def dispatch_mask(self) -> tf.Tensor:
    """<float32>[G, S, E, C] Algorithm 2's binary dispatch mask."""
    return self._one_hot(weighted=False)

  def combine_array(self) -> tf.Tensor:
    """<float32>[G, S, E, C] Algorithm 2's combine weights."""
    return self._one_hot(weighted=True)


def _masked_mean(values: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
  """Mean of <float32>[...] over positions where mask <float32>[...] is 1."""
  return tf.math.divide_no_nan(tf.reduce_sum(values * mask),
                               tf.reduce_sum(mask))


def _group_weighted_mean(per_group: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
  """<float32>[G] per-group values averaged with real-token-count weights."""
  tokens = tf.reduce_sum(mask, axis=1)
  return tf.math.divide_no_nan(tf.reduce_sum(per_group * tokens),
                               tf.reduce_sum(tokens))


def balance_loss(gates: tf.Tensor, first_choice: tf.Tensor,
                 mask: tf.Tensor) -> tf.Tensor:
  """GShard/Switch load-balancing loss ``E * sum_e f_e * P_e`` (1 if uniform).

  Args:
    gates: <float32>[G, S, E] router probabilities (carry the gradient).
    first_choice: <int32>[G, S] each token's first-choice expert.
    mask: <float32>[G, S] 1 for real tokens.

  Returns:
    <float32>[] the loss, averaged over groups by real-token count.
  """
  num_experts = gates.shape[-1]
  tokens = tf.reduce_sum(mask, axis=1, keepdims=True)  # [G, 1]
  counts = tf.reduce_sum(
      tf.one_hot(first_choice, num_experts) * tf.expand_dims(mask, -1), axis=1)
  fraction = tf.math.divide_no_nan(counts, tokens)  # c_e / S, [G, E]
  mean_gate = tf.math.divide_no_nan(
      tf.reduce_sum(gates * tf.expand_dims(mask, -1), axis=1), tokens)  # m_e
  per_group = num_experts * tf.reduce_sum(
      tf.stop_gradient(fraction) * mean_gate, axis=-1)
  return _group_weighted_mean(per_group, mask)


def bias_balancing_update(bias: tf.Tensor, counts: tf.Tensor, *,
                          rate: float) -> tf.Tensor:
  """One step of auxiliary-loss-free balancing (Wang et al. 2024, Alg. 1).

  ``b_e + rate * sign(mean_e'(c_e') - c_e)``: an expert selected less often
  than the mean gains ``rate``, one selected more often loses it, one exactly
  at the mean keeps its bias. The sign is taken of ``sum(c) - E * c_e``
  (the same sign, exact for integer counts below 2**24, where a float mean
  could round), so the update is a function of the counts only.

  Args:
    bias: <float32>[E] the current selection bias.
    counts: <float32>[E] selections of each expert over the whole step
      (``RouterStats.selection_counts`` summed over micro-batches and
      replicas: a global count, the same on every device).
    rate: the update rate u (``--bias_balancing_rate``).

  Returns:
    <float32>[E] the new bias.
  """
  counts = tf.cast(counts, tf.float32)
  error = tf.reduce_sum(counts) - float(counts.shape[-1]) * counts
  return bias + tf.constant(rate, tf.float32) * tf.sign(error)


def z_loss(logits: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
  """Router z-loss: mean over real tokens of logsumexp(<[G, S, E]>)**2."""
  return _masked_mean(tf.square(tf.reduce_logsumexp(logits, axis=-1)), mask)


def _base_stats(logits: tf.Tensor, first_choice: tf.Tensor,
                mask: tf.Tensor) -> dict[str, tf.Tensor]:
  """load, load_cv, entropy and max_logit over the real tokens."""
  num_experts = logits.shape[-1]
  load = tf.math.divide_no_nan(
      tf.reduce_sum(tf.one_hot(first_choice, num_experts)
                    * tf.expand_dims(mask, -1), axis=[0, 1]),
      tf.reduce_sum(mask))
  load_cv = tf.math.divide_no_nan(tf.math.reduce_std(load),
                                  tf.reduce_mean(load))
  log_probs = tf.nn.log_softmax(logits)
  entropy = _masked_mean(
      -tf.reduce_sum(tf.exp(log_probs) * log_probs, axis=-1), mask)
  masked_logits = tf.where(tf.expand_dims(mask, -1) > 0, logits, _NEG_INF)
  max_logit = tf.where(tf.reduce_sum(mask) > 0,
                       tf.reduce_max(masked_logits), 0.0)
  return dict(load=load, load_cv=load_cv, entropy=entropy,
              max_logit=max_logit)


class Router(tf.Module):
  """Base router: owns ``wg <float32>[M, E]`` and computes router logits."""

  def __init__(self, *, model_dim: int, num_experts: int, init_scale: float,
               name: str = "router",
               sharding: sharding_lib.Sharding = sharding_lib.NO_SHARDING):
    super().__init__(name=name)
    self.num_experts = num_experts
    # Random draws are pinned (Sharding.pin_random): same routing on any mesh.
    self.sharding = sharding
    with self.name_scope:
      self.wg = initializers.init_variable(
          (model_dim, num_experts), fan_in=model_dim, scale=init_scale,
          name="wg")

  def logits(self, x: tf.Tensor) -> tf.Tensor:
    """<float32>[G, S, E] router logits of x <float32>[G, S, M]."""
    return tf.einsum("GSM,ME->GSE", x, self.wg)

  def uses_randomness(self, *, training: bool) -> bool:
    """Whether ``__call__`` draws random numbers (then it needs a seed)."""
    del training
    return False

  def __call__(self, x: tf.Tensor, *, padding_mask: tf.Tensor, capacity: int,
               training: bool, seed: tf.Tensor | None = None,
               group_capacity: tf.Tensor | None = None) -> RoutingResult:
    """Routes one batch of groups.

    Args:
      x: <float32>[G, S, M] router inputs (cast to float32 if not already).
      padding_mask: <float32>[G, S] 1 for real tokens, 0 for padding.
      capacity: C, buffer slots per expert per group.
      training: enables jitter/noise/random policies.
      seed: <int32>[2] stateless seed, required when
        ``uses_randomness(training=training)``.
      group_capacity: optional <int32>[G] slots per expert of each group, each
        at most C (None: C for every group).

    Returns:
      The :class:`RoutingResult`.
    """
    if self.uses_randomness(training=training) and seed is None:
      raise ValueError(
          f"{type(self).__name__} draws random numbers when training=True; "
          "pass seed=<int32>[2] (e.g. fold_in(base_seed, step))")
    x = tf.cast(x, tf.float32)
    mask = tf.cast(padding_mask, tf.float32)
    return self._route(x, mask=mask, capacity=capacity, training=training,
                       seed=seed, group_capacity=group_capacity)

  def _route(self, x: tf.Tensor, *, mask: tf.Tensor, capacity: int,
             training: bool, seed: tf.Tensor | None,
             group_capacity: tf.Tensor | None) -> RoutingResult:
    raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class _Selection:
  """What a token-choice router chose, before capacity is applied.

  Attributes:
    logits: <float32>[G, S, E] clean router logits (z-loss, statistics).
    scores: <float32>[G, S, E] probabilities the combine weights come from.
    normaliser: <float32>[G, S] combine weight of a choice e is
      ``scores[e] / normaliser``.
    choices: <int32>[G, S, K] chosen experts, first choice first.
    policy_keep: <bool>[G, S, K] False where a policy declines to dispatch a
      choice (it still takes a buffer position, as in Algorithm 1).
    reroute_key: <float32>[G, S, E] preference order for No-Token-Left-Behind.
    aux_loss: <float32>[] unweighted load-balancing loss.
  """

  logits: tf.Tensor
  scores: tf.Tensor
  normaliser: tf.Tensor
  choices: tf.Tensor
  policy_keep: tf.Tensor
  reroute_key: tf.Tensor
  aux_loss: tf.Tensor


class TokenChoiceRouter(Router):
  """Routers where each token picks K experts (top2, top1, topk, noisy_topk).

  Subclasses implement :meth:`_select`; this class applies capacity (all
  first choices of a group before any second choice, in token order, or in
  priority order with ``batch_prioritized``), optional No-Token-Left-Behind
  re-routing, and builds the result.

  With ``bias_balancing_rate > 0`` (subclasses that select through
  :meth:`_selection_key`) the router owns ``balancing_bias <float32>[E]``, a
  non-trainable variable (so checkpoints carry it and no optimiser touches
  it) that the trainer updates with :meth:`update_balancing_bias`.
  """

  def __init__(self, *, model_dim: int, num_experts: int, init_scale: float,
               no_token_left_behind: bool = False,
               batch_prioritized: bool = False,
               bias_balancing_rate: float = 0.0, name: str = "router",
               sharding: sharding_lib.Sharding = sharding_lib.NO_SHARDING):
    super().__init__(model_dim=model_dim, num_experts=num_experts,
                     init_scale=init_scale, name=name, sharding=sharding)
    self.no_token_left_behind = no_token_left_behind
    self.batch_prioritized = batch_prioritized
    self.bias_balancing_rate = bias_balancing_rate
    self.balancing_bias = None
    if bias_balancing_rate > 0:
      with self.name_scope:
        self.balancing_bias = tf.Variable(
            tf.zeros([num_experts], tf.float32), trainable=False,
            name="balancing_bias")

  def _selection_key(self, gates: tf.Tensor) -> tf.Tensor:
    """<float32>[G, S, E] what experts are selected by: gates (+ bias)."""
    if self.balancing_bias is None:
      return gates
    return gates + tf.convert_to_tensor(self.balancing_bias)

  def update_balancing_bias(self, counts: tf.Tensor) -> None:
    """Applies :func:`bias_balancing_update` with the step's global counts.

    Args:
      counts: <float32>[E] selections of each expert summed over the whole
        training step (every micro-batch, replica and device).
    """
    if self.balancing_bias is None:
      raise ValueError(f"{type(self).__name__} has no balancing bias; build "
                       "it with bias_balancing_rate > 0")
    self.balancing_bias.assign(bias_balancing_update(
        self.balancing_bias, counts, rate=self.bias_balancing_rate))

  def _select(self, x: tf.Tensor, *, mask: tf.Tensor, training: bool,
              seed: tf.Tensor | None) -> _Selection:
    raise NotImplementedError

  def _route(self, x, *, mask, capacity, training, seed, group_capacity,
             **select_kwargs) -> RoutingResult:
    sel = self._select(x, mask=mask, training=training, seed=seed,
                       **select_kwargs)
    num_experts = self.num_experts
    real = tf.expand_dims(mask, -1) > 0
    requested = tf.broadcast_to(real, tf.shape(sel.choices))
    attempted = requested & sel.policy_keep
    candidates = None
    if self.no_token_left_behind and num_experts > sel.choices.shape[-1]:
      candidates = placement.reroute_candidates(sel.reroute_key, sel.choices)
    order = None
    if self.batch_prioritized:
      order = placement.priority_order(sel.scores, mask)
    choices, positions, kept = placement.place_in_order(
        order, sel.choices, requested, attempted, num_experts=num_experts,
        capacity=placement.capacity_limit(capacity, group_capacity),
        candidates=candidates, one_device=not self.sharding.enabled)
    score = _choice_values(sel.scores, choices,
                           one_device=not self.sharding.enabled)
    weights = tf.where(kept, score / tf.expand_dims(sel.normaliser, -1), 0.0)
    zl = z_loss(sel.logits, mask)
    stats = self._stats(sel, kept=kept, attempted=attempted, mask=mask,
                        z=zl)
    return RoutingResult(
        num_experts=num_experts, capacity=capacity, group_size=x.shape[1],
        aux_loss=sel.aux_loss, z_loss=zl, stats=stats, expert_index=choices,
        buffer_position=tf.where(kept, positions, -1),
        combine_weights=weights)

  def _stats(self, sel: _Selection, *, kept, attempted, mask, z) -> RouterStats:
    base = _base_stats(sel.logits, tf.unstack(sel.choices, axis=-1)[0], mask)
    dropped = tf.unstack(tf.cast(attempted & ~kept, tf.float32), axis=-1)
    later = tf.unstack(tf.cast(attempted, tf.float32), axis=-1)[1:]
    later_attempts = tf.add_n([tf.reduce_sum(a) for a in later] + [0.0])
    return tf.nest.map_structure(tf.stop_gradient, RouterStats(
        dropped_first=_masked_mean(dropped[0], mask),
        dropped_second=tf.math.divide_no_nan(
            tf.add_n([tf.reduce_sum(d) for d in dropped[1:]] + [0.0]),
            later_attempts),
        aux_loss=sel.aux_loss, z_loss=z,
        selection_counts=_selection_counts(
            sel.choices, mask, num_experts=self.num_experts,
            one_device=not self.sharding.enabled), **base))


def _choice_values(values: tf.Tensor, choices: tf.Tensor, *,
                   one_device: bool) -> tf.Tensor:
  """values <float32>[G, S, E] at each choice <int32>[G, S, K> -> [G, S, K].

  On one device a batched gather (gradient: a scatter of K values per
  token); on a mesh a one-hot product summed over E, which partitions like
  elementwise ops but builds ``<[G, S, K, E]>`` (E*K floats per token, the
  router's largest tensors at E = 64, K = 8). Same values and gradients.
  """
  if one_device:
    return tf.gather(values, choices, batch_dims=2)
  return tf.reduce_sum(tf.one_hot(choices, values.shape[-1])
                       * tf.expand_dims(values, 2), axis=-1)


def _selection_counts(choices: tf.Tensor, mask: tf.Tensor, *,
                      num_experts: int, one_device: bool) -> tf.Tensor:
  """<float32>[E] choices <int32>[G, S, K] of real tokens per expert.

  A segment sum on one device; a one-hot sum on a mesh (see
  :func:`_choice_values`). Whole counts, so both are exact.
  """
  real = tf.broadcast_to(tf.expand_dims(mask, -1), tf.shape(choices))
  if one_device:
    return tf.math.unsorted_segment_sum(real, choices, num_experts)
  return tf.reduce_sum(tf.one_hot(choices, num_experts)
                       * tf.expand_dims(real, -1), axis=[0, 1, 2])


class Top2Router(TokenChoiceRouter):
  """GShard Algorithm 1 (top-2 gating), vectorised over groups and tokens.

  Second-expert policies (``second_expert_policy``), applied when training:
  ``random`` dispatches the second choice iff ``2 * g2 > U(0, 1)`` with g2 the
  renormalised second gate (the paper's); ``all`` always dispatches it;
  ``sampling`` samples e2 from the gates with e1 excluded (Gumbel-max). At
  eval every policy deterministically dispatches the second-best expert.
  With a balancing bias, e1 and e2 are the two best of ``gates + bias``
  (not with ``sampling``); g1, g2 stay the unbiased gates.
  """

  def __init__(self, *, model_dim: int, num_experts: int, init_scale: float,
               second_expert_policy: str = "random",
               no_token_left_behind: bool = False,
               batch_prioritized: bool = False,
               bias_balancing_rate: float = 0.0, name: str = "router",
               sharding: sharding_lib.Sharding = sharding_lib.NO_SHARDING):
    if bias_balancing_rate > 0 and second_expert_policy == "sampling":
      raise ConfigError(
          "--second_expert_policy=sampling samples e2 from the unbiased "
          "gates, so --bias_balancing_rate cannot steer it; use "
          "--second_expert_policy=all or random")
    super().__init__(model_dim=model_dim, num_experts=num_experts,
                     init_scale=init_scale,
                     no_token_left_behind=no_token_left_behind,
                     batch_prioritized=batch_prioritized,
                     bias_balancing_rate=bias_balancing_rate, name=name,
                     sharding=sharding)
    self.second_expert_policy = second_expert_policy

  def uses_randomness(self, *, training: bool) -> bool:
    return training and self.second_expert_policy in ("random", "sampling")

  def __call__(self, x: tf.Tensor, *, padding_mask: tf.Tensor, capacity: int,
               training: bool, seed: tf.Tensor | None = None,
               group_capacity: tf.Tensor | None = None,
               uniform_draws: tf.Tensor | None = None) -> RoutingResult:
    """As :meth:`Router.__call__`.

    Args:
      uniform_draws: optional <float32>[G, S] U(0, 1) draws for the
        ``random`` policy (tests inject them); drawn from ``seed`` if None.
    """
    needs_seed = training and (
        self.second_expert_policy == "sampling" or
        (self.second_expert_policy == "random" and uniform_draws is None))
    if needs_seed and seed is None:
      raise ValueError(
          f"Top2Router with --second_expert_policy="
          f"{self.second_expert_policy} draws random numbers when "
          "training=True; pass seed=<int32>[2] (e.g. fold_in(base_seed, "
          "step))")
    return self._route(tf.cast(x, tf.float32),
                       mask=tf.cast(padding_mask, tf.float32),
                       capacity=capacity, training=training, seed=seed,
                       group_capacity=group_capacity,
                       uniform_draws=uniform_draws)

  def _select(self, x, *, mask, training, seed,
              uniform_draws=None) -> _Selection:
    logits = self.logits(x)
    gates = tf.nn.softmax(logits)
    key = self._selection_key(gates)
    e1 = tf.argmax(key, axis=-1, output_type=tf.int32)
    # Unbiased: the logits, whose order is the gates' (as in Algorithm 1).
    without_e1 = tf.where(tf.one_hot(e1, self.num_experts) > 0, _NEG_INF,
                          logits if self.balancing_bias is None else key)
    policy = self.second_expert_policy if training else "all"
    if policy == "sampling":
      u = self.sharding.pin_random(tf.random.stateless_uniform(
          tf.shape(logits), seed=tf.random.experimental.stateless_fold_in(
              seed, 0), minval=1e-9, maxval=1.0))
      without_e1 -= tf.math.log(-tf.math.log(u))  # Gumbel-max sample
    e2 = tf.argmax(without_e1, axis=-1, output_type=tf.int32)
    choices = tf.stack([e1, e2], axis=-1)
    g1, g2 = tf.unstack(_choice_values(
        gates, choices, one_device=not self.sharding.enabled), axis=-1)
    normaliser = g1 + g2
    keep_second = tf.ones_like(g1, dtype=tf.bool)
    if policy == "random":
      if uniform_draws is None:
        uniform_draws = self.sharding.pin_random(tf.random.stateless_uniform(
            tf.shape(g1), seed=tf.random.experimental.stateless_fold_in(
                seed, 1)))
      keep_second = 2.0 * g2 / normaliser > uniform_draws
    return _Selection(
        logits=logits, scores=gates, normaliser=normaliser,
        choices=choices,
        policy_keep=tf.stack([tf.ones_like(keep_second), keep_second], -1),
        reroute_key=key, aux_loss=balance_loss(gates, e1, mask))


class SwitchRouter(TokenChoiceRouter):
  """Switch Transformer top-1 routing with multiplicative input jitter.

  The combine weight is the (not renormalised) gate of the chosen expert.
  ``jitter`` multiplies router inputs by U(1 - eps, 1 + eps) when training.
  With a balancing bias the chosen expert is the argmax of ``gates + bias``.
  """

  def __init__(self, *, model_dim: int, num_experts: int, init_scale: float,
               jitter: float = 0.0, no_token_left_behind: bool = False,
               batch_prioritized: bool = False,
               bias_balancing_rate: float = 0.0, name: str = "router",
               sharding: sharding_lib.Sharding = sharding_lib.NO_SHARDING):
    super().__init__(model_dim=model_dim, num_experts=num_experts,
                     init_scale=init_scale,
                     no_token_left_behind=no_token_left_behind,
                     batch_prioritized=batch_prioritized,
                     bias_balancing_rate=bias_balancing_rate, name=name,
                     sharding=sharding)
    self.jitter = jitter

  def uses_randomness(self, *, training: bool) -> bool:
    return training and self.jitter > 0

  def _select(self, x, *, mask, training, seed) -> _Selection:
    if self.uses_randomness(training=training):
      x *= self.sharding.pin_random(tf.random.stateless_uniform(
          tf.shape(x), seed=tf.random.experimental.stateless_fold_in(seed, 2),
          minval=1.0 - self.jitter, maxval=1.0 + self.jitter))
    logits = self.logits(x)
    gates = tf.nn.softmax(logits)
    key = self._selection_key(gates)
    e1 = tf.argmax(key, axis=-1, output_type=tf.int32)
    return _Selection(
        logits=logits, scores=gates, normaliser=tf.ones_like(gates[..., 0]),
        choices=tf.expand_dims(e1, -1),
        policy_keep=tf.ones_like(tf.expand_dims(e1, -1), dtype=tf.bool),
        reroute_key=key, aux_loss=balance_loss(gates, e1, mask))


class TopKRouter(TokenChoiceRouter):
  """Token-choice top-k for any k: GShard's capacity rule generalised.

  Each token selects the k largest of ``gates + bias`` (bias 0 without
  balancing; ties: lower expert index first), k = ``--num_selected_experts``.
  Capacity as for every token-choice router: all first choices of a group
  take positions (in token or priority order) before any second choice,
  all second choices before any third, and so on. Combine weight of choice
  e: ``g_e / sum of the k chosen g`` with ``renormalize`` (GShard's rule:
  k = 2 is the ``top2`` router with the ``all`` policy), else the raw gate
  ``g_e`` (k = 1 is the ``top1`` router without jitter). The aux loss is
  GShard/Switch's :func:`balance_loss` on the first choices, scaled like
  top2's. No randomness: training and eval route alike.
  """

  def __init__(self, *, model_dim: int, num_experts: int, init_scale: float,
               k: int, renormalize: bool = True,
               no_token_left_behind: bool = False,
               batch_prioritized: bool = False,
               bias_balancing_rate: float = 0.0, name: str = "router",
               sharding: sharding_lib.Sharding = sharding_lib.NO_SHARDING):
    if not 1 <= k <= num_experts:
      raise ConfigError(f"--num_selected_experts={k} is invalid for "
                        f"--num_experts={num_experts}; use k in [1, E]")
    super().__init__(model_dim=model_dim, num_experts=num_experts,
                     init_scale=init_scale,
                     no_token_left_behind=no_token_left_behind,
                     batch_prioritized=batch_prioritized,
                     bias_balancing_rate=bias_balancing_rate, name=name,
                     sharding=sharding)
    self.k = k
    self.renormalize = renormalize

  def _select(self, x, *, mask, training, seed) -> _Selection:
    del training, seed
    logits = self.logits(x)
    gates = tf.nn.softmax(logits)
    key = self._selection_key(gates)
    _, choices = tf.math.top_k(key, k=self.k)
    choices = tf.cast(choices, tf.int32)  # [G, S, K]
    normaliser = tf.ones_like(gates[..., 0])
    if self.renormalize:
      normaliser = tf.reduce_sum(_choice_values(
          gates, choices, one_device=not self.sharding.enabled), axis=-1)
    first = tf.unstack(choices, axis=-1)[0]
    return _Selection(
        logits=logits, scores=gates, normaliser=normaliser, choices=choices,
        policy_keep=tf.ones_like(choices, dtype=tf.bool), reroute_key=key,
        aux_loss=balance_loss(gates, first, mask))


def importance_loss(gates: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
  """Shazeer et al. (2017): CV(sum_x G(x))**2 per group (0 if uniform).

  Args:
    gates: <float32>[G, S, E] sparse gates G(x) (zero off the top-k).
    mask: <float32>[G, S] 1 for real tokens.

  Returns:
    <float32>[] squared coefficient of variation of the per-expert
    importance, averaged over groups by real-token count.
  """
  importance = tf.reduce_sum(gates * tf.expand_dims(mask, -1), axis=1)  # [G, E]
  mean = tf.reduce_mean(importance, axis=-1)
  variance = tf.reduce_mean(tf.square(importance - tf.expand_dims(mean, 1)), -1)
  return _group_weighted_mean(tf.math.divide_no_nan(variance, mean * mean),
                              mask)


class NoisyTopKRouter(TokenChoiceRouter):
  """Noisy top-k gating (Shazeer et al. 2017).

  ``H = x.wg + eps * softplus(x.w_noise)``, eps ~ N(0, 1), when training
  (``H = x.wg`` at eval); the k largest H are kept and the gates are a softmax
  over them. ``w_noise <float32>[M, E]`` starts at zero, like ``wg`` in the
  paper. The aux loss is the importance loss; ``stats.load`` reports load.
  """

  def __init__(self, *, model_dim: int, num_experts: int, init_scale: float,
               k: int, no_token_left_behind: bool = False,
               batch_prioritized: bool = False, name: str = "router",
               sharding: sharding_lib.Sharding = sharding_lib.NO_SHARDING):
    super().__init__(model_dim=model_dim, num_experts=num_experts,
                     init_scale=init_scale,
                     no_token_left_behind=no_token_left_behind,
                     batch_prioritized=batch_prioritized, name=name,
                     sharding=sharding)
    self.k = k
    with self.name_scope:
      self.w_noise = tf.Variable(tf.zeros((model_dim, num_experts)),
                                 name="w_noise")

  def uses_randomness(self, *, training: bool) -> bool:
    return training

  def _select(self, x, *, mask, training, seed) -> _Selection:
    logits = self.logits(x)
    h = logits
    if training:
      noise_std = tf.nn.softplus(tf.einsum("GSM,ME->GSE", x, self.w_noise))
      h += noise_std * self.sharding.pin_random(tf.random.stateless_normal(
          tf.shape(logits), seed=tf.random.experimental.stateless_fold_in(
              seed, 3)))
    _, choices = tf.math.top_k(h, k=self.k)
    scores = tf.nn.softmax(h)
    chosen = tf.reduce_sum(tf.one_hot(choices, self.num_experts), axis=2)
    normaliser = tf.reduce_sum(scores * chosen, axis=-1)
    sparse_gates = scores * chosen / tf.expand_dims(normaliser, -1)
    return _Selection(
        logits=logits, scores=scores, normaliser=normaliser,
        choices=tf.cast(choices, tf.int32),
        policy_keep=tf.ones_like(choices, dtype=tf.bool), reroute_key=h,
        aux_loss=importance_loss(sparse_gates, mask))


class ExpertChoiceRouter(Router):
  """Expert-choice routing (Zhou et al. 2022): expert e takes its top-C tokens.

  Each expert ranks the group's real tokens by their gate softmax(x.wg)[e] and
  fills its C slots with the best; the combine weight is that gate. A token
  may be taken by several experts or by none. A token's routing depends on
  the whole group, so this is for the encoder only.
  """

  def _route(self, x, *, mask, capacity, training, seed,
             group_capacity) -> RoutingResult:
    del training, seed
    group_size = x.shape[1]
    logits = self.logits(x)
    gates = tf.nn.softmax(logits)
    keyed = tf.where(tf.expand_dims(mask, -1) > 0, gates, -1.0)
    values, tokens = tf.math.top_k(tf.transpose(keyed, [0, 2, 1]), k=capacity)
    if group_capacity is not None:  # slots past a group's cap stay empty
      in_cap = (tf.range(capacity)[tf.newaxis, :] <
                placement.capacity_limit(capacity, group_capacity))  # [G, C]
      values = tf.where(tf.expand_dims(in_cap, 1), values, -1.0)
    valid = values >= 0  # [G, E, C]
    slot_token = tf.where(valid, tokens, group_size)
    slot_weight = tf.where(valid, values, 0.0)
    # A real token is picked iff its gate reaches some expert's last valid
    # slot (its C-th best, or its cap-th best under a per-group cap).
    threshold = tf.maximum(tf.reduce_min(
        tf.where(valid, values, 2.0), axis=-1), 0.0)  # [G, E]
    picked = tf.reduce_any(keyed >= tf.expand_dims(threshold, 1), axis=-1)
    zl = z_loss(logits, mask)
    aux = tf.zeros([], tf.float32)
    base = _base_stats(logits, tf.argmax(logits, -1, output_type=tf.int32),
                       mask)
    stats = tf.nest.map_structure(tf.stop_gradient, RouterStats(
        dropped_first=_masked_mean(1.0 - tf.cast(picked, tf.float32), mask),
        dropped_second=tf.zeros([], tf.float32), aux_loss=aux, z_loss=zl,
        selection_counts=tf.reduce_sum(tf.cast(valid, tf.float32),
                                       axis=[0, 2]), **base))
    return RoutingResult(num_experts=self.num_experts, capacity=capacity,
                         slot_token=slot_token, slot_weight=slot_weight,
                         group_size=group_size, aux_loss=aux, z_loss=zl,
                         stats=stats)


def make_router(config: ModelConfig, *, name: str = "router",
                sharding: sharding_lib.Sharding = sharding_lib.NO_SHARDING
                ) -> Router:
  """The router ``config.moe.router`` names, built from the config.

  With ``--route_by=language`` its input width is the number of routing
  languages (inputs are one-hot language ids, :mod:`m4moe.moe.task_routing`), so
  ``wg <float32>[num_languages, E]`` is a learned per-language gate.

  Raises:
    ConfigError: ``--route_by=language`` without routing languages.
  """
  moe = config.moe
  model_dim = config.d_model
  if moe.route_by == "language":  # wg is the per-language gate [L, E]
    if not moe.routing_languages:
      raise ConfigError(
          "--route_by=language needs the routing languages (the rows of the "
          "per-language gate); m4moe-train sets them to the training "
          "languages, other callers pass routing_languages=(...)")
    model_dim = moe.router_input_dim
  common = dict(model_dim=model_dim, num_experts=moe.num_experts,
                init_scale=config.moe_init_scale, name=name, sharding=sharding)
  options = dict(no_token_left_behind=moe.no_token_left_behind,
                 batch_prioritized=moe.batch_prioritized_routing)
  bias = dict(bias_balancing_rate=moe.bias_balancing_rate)
  if moe.router == "top2":
    return Top2Router(second_expert_policy=moe.second_expert_policy,
                      **options, **bias, **common)
  if moe.router == "top1":
    return SwitchRouter(jitter=moe.router_jitter, **options, **bias,
                        **common)
  if moe.router == "topk":
    return TopKRouter(k=moe.num_selected_experts,
                      renormalize=moe.renormalize_combine_weights,
                      **options, **bias, **common)
  if moe.router == "noisy_topk":
    return NoisyTopKRouter(k=moe.num_selected_experts, **options, **common)
  return ExpertChoiceRouter(**common)
