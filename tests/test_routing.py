"""Routers: a NumPy loop of GShard Algorithm 1 as oracle, invariants, losses."""

import collections
import dataclasses
import itertools

import numpy as np
import pytest
import tensorflow as tf

from m4moe.moe import placement
from m4moe.moe import routing
from m4moe.config import ModelConfig, MoeConfig

SEED = tf.constant([3, 7], tf.int32)


def top2_oracle(gates, mask, draws, capacity):
  """GShard Algorithm 1 as a plain loop over tokens, one group at a time.

  Args:
    gates: float[G, S, E] softmax gates; mask: float[G, S]; draws: float[G, S]
      U(0, 1) numbers for the random policy; capacity: C.

  Returns:
    (combine float[G, S, E, C], aux loss with the documented E**2 scaling,
    averaged over groups weighted by their real-token counts).
  """
  num_groups, group_size, num_experts = gates.shape
  combine = np.zeros((num_groups, group_size, num_experts, capacity))
  aux, weights = [], []
  for g in range(num_groups):
    real = [s for s in range(group_size) if mask[g, s] > 0]
    top2 = {s: np.argsort(-gates[g, s], kind="stable")[:2] for s in real}
    counts = np.zeros(num_experts, int)
    for s in real:  # first choices, in token order
      e1, e2 = top2[s]
      g1 = gates[g, s, e1] / (gates[g, s, e1] + gates[g, s, e2])
      if counts[e1] < capacity:
        combine[g, s, e1, counts[e1]] = g1
      counts[e1] += 1
    if real:
      mean_gate = gates[g, real].mean(axis=0)
      aux.append(num_experts**2 * np.mean(counts / len(real) * mean_gate))
      weights.append(len(real))
    for s in real:  # second choices, after all first choices
      e1, e2 = top2[s]
      g2 = gates[g, s, e2] / (gates[g, s, e1] + gates[g, s, e2])
      if counts[e2] < capacity and 2 * g2 > draws[g, s]:
        combine[g, s, e2, counts[e2]] = g2
      counts[e2] += 1
  return combine, np.average(aux, weights=weights)


def random_inputs(num_groups=3, group_size=12, model_dim=8, seed=0,
                  pad_fraction=0.25):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(num_groups, group_size, model_dim)).astype(np.float32)
  mask = (rng.random((num_groups, group_size)) > pad_fraction).astype(
      np.float32)
  mask[:, 0] = 1.0
  return tf.constant(x), tf.constant(mask)


def set_router_weights(router, seed=1, scale=2.0):
  rng = np.random.default_rng(seed)
  router.wg.assign(scale * rng.normal(size=router.wg.shape).astype(np.float32))


@pytest.mark.parametrize("capacity", [2, 3, 12])
def test_top2_matches_algorithm1_loop(capacity):
  x, mask = random_inputs()
  router = routing.Top2Router(model_dim=8, num_experts=4, init_scale=1.0,
                              second_expert_policy="random")
  set_router_weights(router)
  draws = np.random.default_rng(5).random(mask.shape).astype(np.float32)
  result = router(x, padding_mask=mask, capacity=capacity, training=True,
                  uniform_draws=tf.constant(draws))
  gates = tf.nn.softmax(router.logits(x)).numpy()
  expected, expected_aux = top2_oracle(gates, mask.numpy(), draws, capacity)
  np.testing.assert_allclose(result.combine_array().numpy(), expected,
                             atol=1e-6)
  np.testing.assert_allclose(result.aux_loss.numpy(), expected_aux, rtol=1e-5)
  if capacity < 12:  # the case must exercise drops of both kinds
    assert result.stats.dropped_first.numpy() > 0
    assert result.stats.dropped_second.numpy() > 0


def test_top2_eval_dispatches_both_choices_like_policy_all():
  x, mask = random_inputs()
  router = routing.Top2Router(model_dim=8, num_experts=4, init_scale=1.0)
  set_router_weights(router)
  result = router(x, padding_mask=mask, capacity=12, training=False)
  gates = tf.nn.softmax(router.logits(x)).numpy()
  expected, _ = top2_oracle(gates, mask.numpy(), np.zeros(mask.shape), 12)
  np.testing.assert_allclose(result.combine_array().numpy(), expected,
                             atol=1e-6)


def routing_with_techniques(common):
  """(label, router): batch-prioritized and bias-balanced variants."""
  out = [
      ("top2-all-bpr", routing.Top2Router(second_expert_policy="all",
                                          batch_prioritized=True, **common)),
      ("top1-bpr-ntlb", routing.SwitchRouter(batch_prioritized=True,
                                             no_token_left_behind=True,
                                             **common)),
      ("topk3-bpr-bias", routing.TopKRouter(k=3, batch_prioritized=True,
                                            bias_balancing_rate=0.1,
                                            **common)),
      ("top2-random-bias", routing.Top2Router(bias_balancing_rate=0.1,
                                              **common)),
      ("top1-bias", routing.SwitchRouter(bias_balancing_rate=0.1, **common)),
  ]
  for _, router in out:
    if router.balancing_bias is not None:
      router.balancing_bias.assign([0.3, -0.2, 0.0, 0.1])
  return out


def _routers():
  """(label, router) for every router and option worth checking."""
  # Built at collection time, maybe after another module enabled op
  # determinism (which refuses unseeded random ops); the weights are set
  # below anyway.
  tf.random.set_seed(12)
  common = dict(model_dim=8, num_experts=4, init_scale=1.0)
  out = []
  for policy, ntlb in itertools.product(("random", "all", "sampling"),
                                        (False, True)):
    out.append((f"top2-{policy}-ntlb{ntlb:d}", routing.Top2Router(
        second_expert_policy=policy, no_token_left_behind=ntlb, **common)))
  for ntlb in (False, True):
    out.append((f"top1-ntlb{ntlb:d}", routing.SwitchRouter(
        jitter=0.1, no_token_left_behind=ntlb, **common)))
    out.append((f"noisy3-ntlb{ntlb:d}", routing.NoisyTopKRouter(
        k=3, no_token_left_behind=ntlb, **common)))
    out.append((f"topk3-ntlb{ntlb:d}", routing.TopKRouter(
        k=3, no_token_left_behind=ntlb, **common)))
  for name, router in routing_with_techniques(common):
    out.append((name, router))
  out.append(("expert_choice", routing.ExpertChoiceRouter(**common)))
  for _, router in out:
    set_router_weights(router)
  return out


ROUTERS = _routers()


def _choices_per_token(router):
  if isinstance(router, routing.Top2Router):
    return 2
  if isinstance(router, routing.SwitchRouter):
    return 1
  if isinstance(router, (routing.NoisyTopKRouter, routing.TopKRouter)):
    return router.k
  return router.num_experts  # expert choice: any number of experts


def check_invariants(result, mask, capacity, k, *, token_choice):
  dispatch = result.dispatch_mask().numpy()
  combine = result.combine_array().numpy()
  group_size = dispatch.shape[1]
  np.testing.assert_array_equal(dispatch, (combine > 0).astype(np.float32))
  # Each slot holds at most one token; per (group, expert) at most C tokens.
  assert dispatch.sum(axis=1).max() <= 1
  assert (dispatch.sum(axis=(1, 3)) <= capacity).all()
  # A token uses an expert at most once and at most k slots in all.
  assert dispatch.sum(axis=3).max() <= 1
  assert dispatch.sum(axis=(2, 3)).max() <= k
  # Padding takes no slot.
  assert (dispatch.sum(axis=(2, 3))[mask.numpy() == 0] == 0).all()
  slot_token = result.slots()[0].numpy()
  assert ((slot_token >= 0) & (slot_token <= group_size)).all()
  if not token_choice:
    return
  experts = result.expert_index.numpy()
  positions = result.buffer_position.numpy()
  weights = result.combine_weights.numpy()
  kept = positions >= 0
  np.testing.assert_array_equal(kept, weights > 0)
  # The per-token view and the slot view agree, so positions are unique.
  assert kept.sum() == (slot_token < group_size).sum()
  for g, s, j in zip(*np.nonzero(kept)):
    e, c = experts[g, s, j], positions[g, s, j]
    assert c < capacity and slot_token[g, e, c] == s
    assert combine[g, s, e, c] == pytest.approx(weights[g, s, j])
  # First choices are never displaced by later choices: at every expert,
  # all first-choice slots come before all later-choice slots.
  for g, e in itertools.product(range(experts.shape[0]),
                                range(dispatch.shape[2])):
    here = kept[g] & (experts[g] == e)
    first = positions[g, :, :1][here[:, :1]]
    later = positions[g, :, 1:][here[:, 1:]]
    if first.size and later.size:
      assert first.max() < later.min()


@pytest.mark.parametrize("label,router", ROUTERS, ids=[r[0] for r in ROUTERS])
@pytest.mark.parametrize("capacity", [2, 5])
def test_router_invariants(label, router, capacity):
  x, mask = random_inputs(seed=2)
  k = _choices_per_token(router)
  result = router(x, padding_mask=mask, capacity=capacity, training=True,
                  seed=SEED)
  check_invariants(result, mask, capacity, k,
                   token_choice=label != "expert_choice")
  if label == "expert_choice":  # dropped = real tokens no expert picked
    unpicked = result.dispatch_mask().numpy().sum(axis=(2, 3)) == 0
    real = mask.numpy() > 0
    np.testing.assert_allclose(result.stats.dropped_first.numpy(),
                               unpicked[real].mean(), rtol=1e-6)
  stats = result.stats.as_dict()
  assert set(stats) >= {"load", "load_cv", "dropped_first", "dropped_second",
                        "entropy", "max_logit", "aux_loss", "z_loss"}
  np.testing.assert_allclose(stats["load"].numpy().sum(), 1.0, rtol=1e-6)


def test_first_choices_get_priority_over_second_choices():
  # Every token's second choice is expert 0, token 0's first choice too;
  # with C=1 the second choices must not take expert 0's slot... and token 0
  # keeps it although tokens 1-3 come later only with second choices.
  logits = np.array([[[5.0, 0, 0, -9], [0, 5, -9, -9], [-9, 0, 5, -9],
                      [0, -9, -9, 5]]], np.float32)
  router = routing.Top2Router(model_dim=4, num_experts=4, init_scale=1.0,
                              second_expert_policy="all")
  router.wg.assign(tf.eye(4))
  result = router(tf.constant(logits), padding_mask=tf.ones([1, 4]),
                  capacity=1, training=True)
  np.testing.assert_array_equal(result.slots()[0].numpy()[0, :, 0],
                                [0, 1, 2, 3])
  assert result.stats.dropped_first.numpy() == 0
  np.testing.assert_allclose(result.stats.dropped_second.numpy(), 1.0)


def test_no_token_left_behind_reroutes_to_next_best_with_room():
  # All four tokens prefer expert 0 (C=1); preferences afterwards differ.
  logits = np.array([[[9.0, 1, 2, 3], [8.0, 3, 2, 1], [7.0, 2, 3, 1],
                      [6.0, 1, 3, 2]]], np.float32)
  common = dict(model_dim=4, num_experts=4, init_scale=1.0)
  plain = routing.SwitchRouter(**common)
  ntlb = routing.SwitchRouter(no_token_left_behind=True, **common)
  for router in (plain, ntlb):
    router.wg.assign(tf.eye(4))
  args = dict(padding_mask=tf.ones([1, 4]), capacity=1, training=False)
  dropped = plain(tf.constant(logits), **args)
  assert dropped.stats.dropped_first.numpy() == pytest.approx(0.75)
  result = ntlb(tf.constant(logits), **args)
  # Token 0 keeps expert 0; round 1: tokens 1, 2, 3 ask for 1, 2, 2 ->
  # 1 and 2 placed; round 2: token 3 asks for its third-best (3).
  np.testing.assert_array_equal(result.expert_index.numpy()[0, :, 0],
                                [0, 1, 2, 3])
  assert result.stats.dropped_first.numpy() == 0
  # Load statistics count the original first choice.
  np.testing.assert_allclose(result.stats.load.numpy(), [1, 0, 0, 0])


def test_no_token_left_behind_places_every_token_when_room_exists():
  x, mask = random_inputs(seed=4, pad_fraction=0.0)
  router = routing.SwitchRouter(model_dim=8, num_experts=4, init_scale=1.0,
                                no_token_left_behind=True)
  set_router_weights(router, scale=5.0)
  result = router(x, padding_mask=mask, capacity=3, training=False)
  assert result.stats.dropped_first.numpy() == 0
  assert (result.combine_weights.numpy() > 0).all()


def _balanced_inputs(num_experts=4, group_size=8):
  """Token s prefers experts s, s+1, ... (mod E): balanced routing."""
  base = np.arange(num_experts, 0, -1, dtype=np.float32)  # E, E-1, ..., 1
  x = np.stack([np.roll(base, s) for s in range(group_size)])
  return tf.constant(x[np.newaxis]), tf.ones([1, group_size])


@pytest.mark.parametrize("label,router", ROUTERS, ids=[r[0] for r in ROUTERS])
def test_uniform_routing_gives_documented_aux_loss(label, router):
  del label
  expected = 0.0 if isinstance(router, (routing.NoisyTopKRouter,
                                        routing.ExpertChoiceRouter)) else 1.0
  small = type(router)(**{**_ctor_args(router), "model_dim": 4})
  small.wg.assign(tf.eye(4))
  x, mask = _balanced_inputs()
  result = small(x, padding_mask=mask, capacity=8, training=False)
  np.testing.assert_allclose(result.aux_loss.numpy(), expected, atol=1e-6)
  np.testing.assert_allclose(result.stats.load.numpy(), [0.25] * 4)
  if expected == 1.0:  # uniform gates give 1 whatever the assignment
    small.wg.assign(tf.zeros_like(small.wg))
    result = small(x, padding_mask=mask, capacity=8, training=False)
    np.testing.assert_allclose(result.aux_loss.numpy(), 1.0, rtol=1e-6)


def _ctor_args(router):
  args = dict(model_dim=router.wg.shape[0], num_experts=router.num_experts,
              init_scale=1.0)
  if isinstance(router, routing.Top2Router):
    args["second_expert_policy"] = router.second_expert_policy
  if isinstance(router, (routing.NoisyTopKRouter, routing.TopKRouter)):
    args["k"] = router.k
  return args


def test_skewed_routing_increases_aux_loss():
  router = routing.SwitchRouter(model_dim=4, num_experts=4, init_scale=1.0)
  router.wg.assign(tf.eye(4))
  x = tf.constant(np.tile([[[3.0, 0, 0, 0]]], [1, 8, 1]), tf.float32)
  result = router(x, padding_mask=tf.ones([1, 8]), capacity=8,
                  training=False)
  gate = np.exp(3) / (np.exp(3) + 3)
  np.testing.assert_allclose(result.aux_loss.numpy(), 4 * gate, rtol=1e-5)
  assert result.stats.load_cv.numpy() > 1


def test_padding_never_enters_losses_or_stats():
  x, mask = random_inputs(num_groups=1, group_size=6, pad_fraction=0.0)
  garbage = tf.constant(100 * np.random.default_rng(0).normal(
      size=(1, 4, 8)).astype(np.float32))
  padded_x = tf.concat([x, garbage], axis=1)
  padded_mask = tf.concat([mask, tf.zeros([1, 4])], axis=1)
  for _, router in ROUTERS:
    a = router(x, padding_mask=mask, capacity=3, training=False)
    b = router(padded_x, padding_mask=padded_mask, capacity=3, training=False)
    for name, value in a.stats.as_dict().items():
      np.testing.assert_allclose(b.stats.as_dict()[name].numpy(),
                                 value.numpy(), rtol=1e-5, err_msg=name)
    np.testing.assert_allclose(b.combine_array().numpy()[:, :6],
                               a.combine_array().numpy(), atol=1e-6)


def test_z_loss_is_mean_squared_logsumexp_over_real_tokens():
  x, mask = random_inputs()
  router = routing.SwitchRouter(model_dim=8, num_experts=4, init_scale=1.0)
  result = router(x, padding_mask=mask, capacity=4, training=False)
  logits = router.logits(x).numpy()
  lse = np.log(np.exp(logits).sum(-1))
  expected = (lse**2 * mask.numpy()).sum() / mask.numpy().sum()
  np.testing.assert_allclose(result.z_loss.numpy(), expected, rtol=1e-5)


@pytest.mark.parametrize("label,router", ROUTERS, ids=[r[0] for r in ROUTERS])
def test_randomness_is_stateless_and_needs_a_seed(label, router):
  x, mask = random_inputs()
  if router.uses_randomness(training=True):
    with pytest.raises(ValueError, match="seed"):
      router(x, padding_mask=mask, capacity=4, training=True)
  a = router(x, padding_mask=mask, capacity=4, training=True, seed=SEED)
  b = router(x, padding_mask=mask, capacity=4, training=True, seed=SEED)
  np.testing.assert_array_equal(a.combine_array().numpy(),
                                b.combine_array().numpy())
  del label


def test_make_router_follows_config():
  for name, cls in (("top2", routing.Top2Router),
                    ("top1", routing.SwitchRouter),
                    ("topk", routing.TopKRouter),
                    ("noisy_topk", routing.NoisyTopKRouter),
                    ("expert_choice", routing.ExpertChoiceRouter)):
    config = ModelConfig(d_model=8, moe=MoeConfig(num_experts=4, router=name))
    router = routing.make_router(config)
    assert type(router) is cls
    assert router.wg.shape == (8, 4) and router.wg.dtype == tf.float32


def test_stats_are_nest_compatible():
  x, mask = random_inputs()
  router = routing.SwitchRouter(model_dim=8, num_experts=4, init_scale=1.0)
  stats = router(x, padding_mask=mask, capacity=4, training=False).stats
  flat = tf.nest.flatten(stats)
  assert len(flat) == len(dataclasses.fields(routing.RouterStats)) == 9
  rebuilt = tf.nest.pack_sequence_as(stats, flat)
  assert isinstance(rebuilt, routing.RouterStats)


def _queue_positions(choices, requested, attempted, capacity):
  """Capacity positions by a plain loop: choice rank j over all tokens of a
  group before rank j + 1, a counter per expert (GShard's rule, any K)."""
  num_groups, group_size, num_k = choices.shape
  positions = np.full(choices.shape, -1)
  for g in range(num_groups):
    counts = collections.Counter()
    for j in range(num_k):
      for s in range(group_size):
        if requested[g, s, j]:
          e = choices[g, s, j]
          if attempted[g, s, j] and counts[e] < capacity[g]:
            positions[g, s, j] = counts[e]
          counts[e] += 1
  return positions


@pytest.mark.parametrize("num_k,num_experts", [(1, 4), (2, 4), (8, 16)])
def test_sorted_placement_equals_the_loop_and_the_counters(num_k, num_experts):
  # The one-device placement (one sort per group) against a plain loop and
  # against the per-choice one-hot counters it replaces (used on meshes):
  # same kept choices, same positions; with padding, policy skips that
  # still take a position, and per-group capacity caps.
  rng = np.random.default_rng(num_k)
  num_groups, group_size = 3, 20
  choices = np.stack([[rng.permutation(num_experts)[:num_k]
                       for _ in range(group_size)] for _ in range(num_groups)])
  requested = np.broadcast_to(rng.random((num_groups, group_size, 1)) > 0.2,
                              choices.shape)
  attempted = requested & (rng.random(choices.shape) > 0.3)
  caps = np.array([1, 3, 40])
  expected = _queue_positions(choices, requested, attempted, caps)
  args = [tf.constant(choices, tf.int32), tf.constant(requested),
          tf.constant(attempted)]
  for one_device in (True, False):
    placed, positions, kept = placement.place(
        *args, num_experts=num_experts, capacity=tf.constant(caps[:, None], tf.int32),
        candidates=None, one_device=one_device)
    np.testing.assert_array_equal(placed.numpy(), choices)
    np.testing.assert_array_equal(kept.numpy(), expected >= 0)
    np.testing.assert_array_equal(
        np.where(kept.numpy(), positions.numpy(), -1), expected)


def test_choice_values_and_counts_equal_the_one_hot_forms():
  # Gathers (one device) and one-hot sums (meshes): the same values and
  # gradients, both equal to NumPy's indexing and bincount.
  rng = np.random.default_rng(0)
  values = tf.constant(rng.random((2, 5, 6)), tf.float32)
  choices_np = np.stack([[rng.permutation(6)[:3] for _ in range(5)]
                         for _ in range(2)])
  choices = tf.constant(choices_np, tf.int32)
  mask = tf.constant([[1, 1, 1, 0, 0], [1, 0, 1, 1, 1]], tf.float32)
  probe = tf.constant(rng.normal(size=(2, 5, 3)), tf.float32)
  results = []
  for one_device in (True, False):
    with tf.GradientTape() as tape:
      tape.watch(values)
      picked = routing._choice_values(  # pylint: disable=protected-access
          values, choices, one_device=one_device)
      loss = tf.reduce_sum(picked * probe)
    counts = routing._selection_counts(  # pylint: disable=protected-access
        choices, mask, num_experts=6, one_device=one_device)
    results.append((picked.numpy(), tape.gradient(loss, values).numpy(),
                    counts.numpy()))
  picked_np = np.take_along_axis(values.numpy(), choices_np, axis=-1)
  grad_np = np.zeros(values.shape)
  np.put_along_axis(grad_np, choices_np, probe.numpy(), axis=-1)
  real = np.broadcast_to(mask.numpy()[..., None], choices_np.shape) > 0
  counts_np = np.bincount(choices_np[real], minlength=6)
  for picked, grad, counts in results:
    np.testing.assert_array_equal(picked, picked_np)
    np.testing.assert_allclose(grad, grad_np, rtol=1e-6)
    np.testing.assert_array_equal(counts, counts_np)
