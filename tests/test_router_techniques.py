"""Router techniques against a NumPy reference: top-k for any k,
batch-prioritized routing and auxiliary-loss-free (bias) balancing.

The reference (:func:`reference_routing`) is a float64 loop over tokens:
choices by sorting, capacity by counting, written independently of the
router's vectorised ranks; its gradients are central differences of the
same loop in float64.
"""

import numpy as np
import pytest
import tensorflow as tf

from m4moe.config import ConfigError, ModelConfig, MoeConfig
from m4moe.model import transformer as model_lib
from m4moe.moe import routing
from m4moe.moe.layer import MoeLayer
from m4moe.training import loop as train_lib
from m4moe.training import optimizer as optimizer_lib
from m4moe.training import step as step_lib
from m4moe.training import synthetic

SEED = tf.constant([3, 7], tf.int32)
# Dimensions: G groups, S group size, M router input width, E experts.
G, S, M, E = 2, 8, 6, 4


def softmax(z):
  z = z - z.max(axis=-1, keepdims=True)
  return np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)


def reference_routing(x, wg, mask, *, k, capacity, renormalize=True,
                      bias=None, prioritized=False):
  """Token-choice top-k routing as a plain loop (float64).

  Args:
    x: float[G, S, M]; wg: float[M, E]; mask: float[G, S].
    k: choices per token; capacity: C.
    renormalize: combine weight g_e / (sum of the k chosen g), else g_e.
    bias: float[E] added to the gates for selection only, or None.
    prioritized: real tokens queue by descending largest gate (ties: token
      order) instead of token order.

  Returns:
    (combine float[G, S, E, C], aux loss E * sum_e f_e P_e averaged over
    groups by real tokens, selection counts float[E]).
  """
  gates = softmax(np.einsum("GSM,ME->GSE", x, wg))
  num_groups, group_size, num_experts = gates.shape
  bias = np.zeros(num_experts) if bias is None else np.asarray(bias)
  combine = np.zeros((num_groups, group_size, num_experts, capacity))
  counts = np.zeros(num_experts)
  aux, weights = [], []
  for g in range(num_groups):
    real = [s for s in range(group_size) if mask[g, s] > 0]
    chosen = {s: list(np.argsort(-(gates[g, s] + bias), kind="stable")[:k])
              for s in real}
    queue = (sorted(real, key=lambda s: -gates[g, s].max()) if prioritized
             else real)  # Python's sort is stable: ties keep token order
    taken = np.zeros(num_experts, int)
    for j in range(k):  # every j-th choice of the group before any (j+1)-th
      for s in queue:
        e = chosen[s][j]
        counts[e] += 1
        norm = sum(gates[g, s, c] for c in chosen[s]) if renormalize else 1.0
        if taken[e] < capacity:
          combine[g, s, e, taken[e]] = gates[g, s, e] / norm
        taken[e] += 1
    if real:
      first = np.bincount([chosen[s][0] for s in real],
                          minlength=num_experts) / len(real)
      aux.append(num_experts * np.sum(first * gates[g, real].mean(axis=0)))
      weights.append(len(real))
  return combine, np.average(aux, weights=weights), counts


def reference_grad(x, wg, mask, probe, aux_weight, **kwargs):
  """d/d wg of sum(combine * probe) + aux_weight * aux, central differences."""
  def loss(w):
    combine, aux, _ = reference_routing(x, w, mask, **kwargs)
    return np.sum(combine * probe) + aux_weight * aux
  grad, eps = np.zeros_like(wg), 1e-6
  for index in np.ndindex(*wg.shape):
    step = np.zeros_like(wg)
    step[index] = eps
    grad[index] = (loss(wg + step) - loss(wg - step)) / (2 * eps)
  return grad


def inputs(seed=0, pad=True):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(G, S, M)).astype(np.float32)
  wg = (1.5 * rng.normal(size=(M, E))).astype(np.float32)
  mask = np.ones((G, S), np.float32)
  if pad:
    mask[0, [2, 5]] = 0
    mask[1, 7] = 0
  return x, wg, mask


def route(router, x, wg, mask, *, capacity, probe, aux_weight=0.5,
          training=False, **kwargs):
  """(result, d/d wg of sum(combine * probe) + aux_weight * aux)."""
  router.wg.assign(wg)
  with tf.GradientTape() as tape:
    result = router(tf.constant(x), padding_mask=tf.constant(mask),
                    capacity=capacity, training=training, **kwargs)
    loss = (tf.reduce_sum(result.combine_array() * probe) +
            aux_weight * result.aux_loss)
  return result, tape.gradient(loss, router.wg).numpy()


def _probe(capacity, seed=9):
  return np.random.default_rng(seed).normal(
      size=(G, S, E, capacity)).astype(np.float32)


@pytest.mark.parametrize("k,capacity", [(2, 2), (3, 3), (3, 8), (4, 2)])
@pytest.mark.parametrize("renormalize", [True, False])
def test_topk_matches_the_reference_queue(k, capacity, renormalize):
  x, wg, mask = inputs()
  probe = _probe(capacity)
  router = routing.TopKRouter(model_dim=M, num_experts=E, init_scale=1.0, k=k,
                              renormalize=renormalize)
  result, grad = route(router, x, wg, mask, capacity=capacity, probe=probe,
                       training=True)
  args = dict(k=k, capacity=capacity, renormalize=renormalize)
  combine, aux, counts = reference_routing(
      x.astype(np.float64), wg.astype(np.float64), mask, **args)
  np.testing.assert_allclose(result.combine_array().numpy(), combine,
                             atol=1e-6)
  np.testing.assert_allclose(result.aux_loss.numpy(), aux, rtol=1e-5)
  np.testing.assert_array_equal(result.stats.selection_counts.numpy(), counts)
  expected = reference_grad(x.astype(np.float64), wg.astype(np.float64), mask,
                            probe, 0.5, **args)
  np.testing.assert_allclose(grad, expected, rtol=1e-3, atol=1e-5)
  if capacity < S:  # the case must drop later choices
    assert result.stats.dropped_second.numpy() > 0


def test_topk_queues_every_rank_before_the_next_by_hand():
  # One group, E=4, k=3, C=1. Preferences (best first): token 0: 0,1,2;
  # token 1: 1,0,3; token 2: 3,2,1. First choices take 0, 1, 3; the second
  # pass finds 1, 0 and 2 -- only expert 2 is free (token 2); the third
  # pass finds 2 (taken), 3 (taken), 1 (taken).
  logits = np.array([[[3.0, 2, 1, 0], [2, 3, 0, 1], [0, 1, 2, 3]]],
                    np.float32)
  router = routing.TopKRouter(model_dim=4, num_experts=4, init_scale=1.0, k=3)
  router.wg.assign(tf.eye(4))
  result = router(tf.constant(logits), padding_mask=tf.ones([1, 3]),
                  capacity=1, training=False)
  np.testing.assert_array_equal(result.slots()[0].numpy()[0, :, 0],
                                [0, 1, 2, 2])
  np.testing.assert_array_equal(result.buffer_position.numpy()[0],
                                [[0, -1, -1], [0, -1, -1], [0, 0, -1]])
  g = softmax(logits[0])
  np.testing.assert_allclose(result.combine_weights.numpy()[0, 2],
                             [g[2, 3] / (g[2, 3] + g[2, 2] + g[2, 1]),
                              g[2, 2] / (g[2, 3] + g[2, 2] + g[2, 1]), 0],
                             rtol=1e-6)


@pytest.mark.parametrize("capacity", [2, 3, 8])
def test_topk_with_k2_is_top2_with_policy_all(capacity):
  x, wg, mask = inputs(seed=1)
  probe = _probe(capacity)
  common = dict(model_dim=M, num_experts=E, init_scale=1.0)
  topk, grad_k = route(routing.TopKRouter(k=2, **common), x, wg, mask,
                       capacity=capacity, probe=probe, training=True)
  top2, grad_2 = route(routing.Top2Router(second_expert_policy="all",
                                          **common), x, wg, mask,
                       capacity=capacity, probe=probe, training=True)
  for name in ("expert_index", "buffer_position"):
    np.testing.assert_array_equal(getattr(topk, name).numpy(),
                                  getattr(top2, name).numpy(), err_msg=name)
  np.testing.assert_allclose(topk.combine_weights.numpy(),
                             top2.combine_weights.numpy(), rtol=1e-6)
  for name, value in top2.stats.as_dict().items():
    np.testing.assert_allclose(topk.stats.as_dict()[name].numpy(),
                               value.numpy(), rtol=1e-6, err_msg=name)
  np.testing.assert_allclose(grad_k, grad_2, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("capacity", [2, 8])
def test_topk_with_k1_unnormalised_is_top1(capacity):
  x, wg, mask = inputs(seed=2)
  probe = _probe(capacity)
  common = dict(model_dim=M, num_experts=E, init_scale=1.0)
  topk, grad_k = route(routing.TopKRouter(k=1, renormalize=False, **common),
                       x, wg, mask, capacity=capacity, probe=probe)
  top1, grad_1 = route(routing.SwitchRouter(**common), x, wg, mask,
                       capacity=capacity, probe=probe)
  np.testing.assert_array_equal(topk.buffer_position.numpy(),
                                top1.buffer_position.numpy())
  np.testing.assert_allclose(topk.combine_array().numpy(),
                             top1.combine_array().numpy(), rtol=1e-6)
  np.testing.assert_allclose(topk.aux_loss.numpy(), top1.aux_loss.numpy(),
                             rtol=1e-6)
  np.testing.assert_allclose(grad_k, grad_1, rtol=1e-5, atol=1e-7)


def test_batch_prioritized_routing_serves_the_most_confident_first():
  # All four tokens prefer expert 0 (C=1); token 2 is the most confident.
  logits = np.array([[[1.0, 0, 0, 0], [2, 0, 0, 0], [4, 0, 0, 0],
                      [3, 0, 0, 0]]], np.float32)
  common = dict(model_dim=4, num_experts=4, init_scale=1.0)
  for prioritized, winner in ((False, 0), (True, 2)):
    router = routing.SwitchRouter(batch_prioritized=prioritized, **common)
    router.wg.assign(tf.eye(4))
    result = router(tf.constant(logits), padding_mask=tf.ones([1, 4]),
                    capacity=1, training=False)
    assert result.slots()[0].numpy()[0, 0, 0] == winner


@pytest.mark.parametrize("kind,k", [("topk", 3), ("topk", 2), ("top2", 2),
                                    ("top1", 1)])
def test_batch_prioritized_routing_matches_the_reference(kind, k):
  x, wg, mask = inputs(seed=3)
  capacity = 2
  probe = _probe(capacity)
  common = dict(model_dim=M, num_experts=E, init_scale=1.0,
                batch_prioritized=True)
  router = {"topk": lambda: routing.TopKRouter(k=k, **common),
            "top2": lambda: routing.Top2Router(second_expert_policy="all",
                                               **common),
            "top1": lambda: routing.SwitchRouter(**common)}[kind]()
  result, grad = route(router, x, wg, mask, capacity=capacity, probe=probe,
                       training=True)
  args = dict(k=k, capacity=capacity, renormalize=kind != "top1",
              prioritized=True)
  x64, w64 = x.astype(np.float64), wg.astype(np.float64)
  combine, aux, _ = reference_routing(x64, w64, mask, **args)
  np.testing.assert_allclose(result.combine_array().numpy(), combine,
                             atol=1e-6)
  np.testing.assert_allclose(result.aux_loss.numpy(), aux, rtol=1e-5)
  np.testing.assert_allclose(
      grad, reference_grad(x64, w64, mask, probe, 0.5, **args),
      rtol=1e-3, atol=1e-5)
  # The case exercises drops, and priority changes who is dropped.
  assert result.stats.dropped_first.numpy() > 0
  in_order, _, _ = reference_routing(x64, w64, mask,
                                     **{**args, "prioritized": False})
  assert np.abs(in_order - combine).max() > 1e-3


BIAS = np.array([0.5, -0.4, 0.0, 0.2], np.float32)


@pytest.mark.parametrize("kind,k", [("topk", 3), ("top2", 2), ("top1", 1)])
def test_selection_bias_picks_experts_but_not_weights(kind, k):
  x, wg, mask = inputs(seed=4)
  capacity = 3
  probe = _probe(capacity)
  common = dict(model_dim=M, num_experts=E, init_scale=1.0,
                bias_balancing_rate=0.01)
  router = {"topk": lambda: routing.TopKRouter(k=k, **common),
            "top2": lambda: routing.Top2Router(second_expert_policy="all",
                                               **common),
            "top1": lambda: routing.SwitchRouter(**common)}[kind]()
  assert not router.balancing_bias.trainable
  router.balancing_bias.assign(BIAS)
  result, grad = route(router, x, wg, mask, capacity=capacity, probe=probe,
                       training=True, seed=SEED)
  args = dict(k=k, capacity=capacity, renormalize=kind != "top1", bias=BIAS)
  x64, w64 = x.astype(np.float64), wg.astype(np.float64)
  combine, aux, counts = reference_routing(x64, w64, mask, **args)
  np.testing.assert_allclose(result.combine_array().numpy(), combine,
                             atol=1e-6)
  np.testing.assert_allclose(result.aux_loss.numpy(), aux, rtol=1e-5)
  np.testing.assert_array_equal(result.stats.selection_counts.numpy(), counts)
  np.testing.assert_allclose(
      grad, reference_grad(x64, w64, mask, probe, 0.5, **args),
      rtol=1e-3, atol=1e-5)
  unbiased, _, _ = reference_routing(x64, w64, mask,
                                     **{**args, "bias": None})
  assert np.abs(unbiased - combine).max() > 1e-3  # the bias matters here


def test_bias_update_rule_by_hand():
  bias = tf.constant([0.0, 0.5, -0.5, 0.0])
  counts = tf.constant([5.0, 1.0, 2.0, 0.0])  # mean 2: over, under, at, under
  new = routing.bias_balancing_update(bias, counts, rate=0.125)
  np.testing.assert_array_equal(new.numpy(), [-0.125, 0.625, -0.5, 0.125])


def test_bias_balancing_over_three_steps_matches_the_reference():
  # Skewed router weights: expert 0 wins most first choices. Each step
  # routes, counts the selections and updates the bias; the reference does
  # the same in float32 arithmetic for the bias.
  x, wg, mask = inputs(seed=5)
  wg[:, 0] += 1.0
  rate = 0.05
  router = routing.TopKRouter(model_dim=M, num_experts=E, init_scale=1.0,
                              k=2, bias_balancing_rate=rate)
  router.wg.assign(wg)
  bias = np.zeros(E, np.float32)
  history = []
  for _ in range(3):
    result = router(tf.constant(x), padding_mask=tf.constant(mask),
                    capacity=4, training=True)
    _, _, counts = reference_routing(
        x.astype(np.float64), wg.astype(np.float64), mask, k=2, capacity=4,
        bias=bias)
    np.testing.assert_array_equal(result.stats.selection_counts.numpy(),
                                  counts)
    router.update_balancing_bias(result.stats.selection_counts)
    error = np.sign(counts.sum() - E * counts).astype(np.float32)
    bias = bias + np.float32(rate) * error
    np.testing.assert_array_equal(router.balancing_bias.numpy(), bias)
    history.append(counts)
  assert history[0].max() > history[0].mean()  # expert 0 was overloaded ...
  assert router.balancing_bias.numpy()[np.argmax(history[0])] < 0  # ... pays


def test_bias_lives_in_checkpoints(tmp_path):
  config = ModelConfig(d_model=M, moe=MoeConfig(
      num_experts=E, router="topk", num_selected_experts=3,
      bias_balancing_rate=0.01))
  router = routing.make_router(config)
  router.balancing_bias.assign(BIAS)
  path = tf.train.Checkpoint(router=router).write(str(tmp_path / "ckpt"))
  fresh = routing.make_router(config)
  assert np.all(fresh.balancing_bias.numpy() == 0)
  tf.train.Checkpoint(router=fresh).read(path).assert_consumed()
  np.testing.assert_array_equal(fresh.balancing_bias.numpy(), BIAS)
  assert all(v is not fresh.balancing_bias for v in fresh.trainable_variables)
  # Without the flag there is no bias variable (old checkpoints still load).
  plain = routing.make_router(ModelConfig(d_model=M, moe=MoeConfig(
      num_experts=E, router="topk", num_selected_experts=3)))
  assert plain.balancing_bias is None and len(plain.variables) == 1


@pytest.mark.parametrize("flags,flag", [
    (dict(router="top2", renormalize_combine_weights=False),
     "renormalize_combine_weights"),
    (dict(router="topk", num_selected_experts=1),
     "renormalize_combine_weights"),
    (dict(router="topk", num_selected_experts=5), "num_selected_experts"),
    (dict(router="expert_choice", batch_prioritized_routing=True),
     "batch_prioritized_routing"),
    (dict(router="noisy_topk", bias_balancing_rate=0.01),
     "bias_balancing_rate"),
    (dict(router="expert_choice", bias_balancing_rate=0.01),
     "bias_balancing_rate"),
    (dict(router="top2", second_expert_policy="sampling",
          bias_balancing_rate=0.01), "bias_balancing_rate"),
    (dict(router="topk", bias_balancing_rate=-1.0), "bias_balancing_rate"),
])
def test_bad_router_technique_flags_name_the_flag(flags, flag):
  with pytest.raises(ConfigError, match=f"--{flag}"):
    MoeConfig(num_experts=E, **flags)


def test_config_builds_each_router_with_its_options():
  config = ModelConfig(d_model=M, moe=MoeConfig(
      num_experts=E, router="topk", num_selected_experts=3,
      renormalize_combine_weights=False, batch_prioritized_routing=True,
      bias_balancing_rate=0.01))
  router = routing.make_router(config)
  assert type(router) is routing.TopKRouter
  assert (router.k, router.renormalize, router.batch_prioritized,
          router.bias_balancing_rate) == (3, False, True, 0.01)
  assert config.moe.capacity(group_size=16, training=True) == 15  # 1.25*3*4
  for name in ("top2", "top1"):
    router = routing.make_router(ModelConfig(d_model=M, moe=MoeConfig(
        num_experts=E, router=name, batch_prioritized_routing=True,
        bias_balancing_rate=0.01)))
    assert router.batch_prioritized and router.balancing_bias is not None


# -- the MoE layer: every dispatch path, padding -----------------------------

D, H = 8, 8  # layer width and expert hidden width


def _layer(dispatch, **moe):
  tf.random.set_seed(2)
  config = ModelConfig(d_model=D, moe=MoeConfig(
      num_experts=E, expert_hidden_dim=H, router="topk",
      num_selected_experts=3, group_size=6, train_capacity_factor=0.75,
      eval_capacity_factor=0.75, batch_prioritized_routing=True,
      bias_balancing_rate=0.01, z_loss_weight=0.1, dispatch=dispatch, **moe))
  layer = MoeLayer(config=config, causal=False)
  layer.router.balancing_bias.assign(BIAS)
  return layer


def _layer_run(layer, x, mask, probe):
  with tf.GradientTape() as tape:
    tape.watch(x)
    out = layer(x, padding_mask=mask, training=True, seed=SEED)
    loss = tf.reduce_sum(out.outputs * probe) + out.weighted_loss
  grads = tape.gradient(loss, [x, *layer.trainable_variables],
                        unconnected_gradients=tf.UnconnectedGradients.ZERO)
  return out, [tf.convert_to_tensor(g).numpy() for g in grads]


def _batch(rows=3, length=5, seed=4):
  rng = np.random.default_rng(seed)
  x = tf.constant(rng.normal(size=(rows, length, D)), tf.float32)
  mask = np.ones((rows, length), np.float32)
  mask[0, 3:] = 0
  mask[2, 4] = 0
  probe = tf.constant(rng.normal(size=(rows, length, D)), tf.float32)
  return x, tf.constant(mask), probe


def test_every_dispatch_path_gives_the_same_values_and_gradients():
  x, mask, probe = _batch()
  runs = {path: _layer_run(_layer(path), x, mask, probe)
          for path in ("einsum", "index", "sorted")}
  ref_out, ref_grads = runs["einsum"]
  assert ref_out.stats.dropped_second.numpy() > 0
  for path in ("index", "sorted"):
    out, grads = runs[path]
    np.testing.assert_allclose(out.outputs.numpy(), ref_out.outputs.numpy(),
                               atol=1e-5, err_msg=path)
    for a, b in zip(grads, ref_grads):
      np.testing.assert_allclose(a, b, atol=1e-5, err_msg=path)


@pytest.mark.parametrize("dispatch", ["sorted", "index", "einsum"])
def test_padding_is_exact_with_priority_and_bias(dispatch):
  layer = _layer(dispatch)
  x, mask, probe = _batch()
  base, base_grads = _layer_run(layer, x, mask, probe)
  # The same tokens with a padding row and padded columns around them.
  rng = np.random.default_rng(7)
  big = rng.normal(size=(4, 7, D)).astype(np.float32) * 50
  big_mask = np.zeros((4, 7), np.float32)
  big_probe = np.zeros((4, 7, D), np.float32)
  big[1:, 1:6] = x.numpy()
  big_mask[1:, 1:6] = mask.numpy()
  big_probe[1:, 1:6] = probe.numpy()
  padded, padded_grads = _layer_run(layer, tf.constant(big),
                                    tf.constant(big_mask),
                                    tf.constant(big_probe))
  np.testing.assert_allclose(padded.outputs.numpy()[1:, 1:6],
                             base.outputs.numpy(), atol=1e-6)
  assert (padded.outputs.numpy()[big_mask == 0] == 0).all()
  np.testing.assert_array_equal(padded.stats.selection_counts.numpy(),
                                base.stats.selection_counts.numpy())
  np.testing.assert_allclose(padded_grads[0][1:, 1:6], base_grads[0],
                             atol=1e-5)
  for a, b in zip(padded_grads[1:], base_grads[1:]):
    np.testing.assert_allclose(a, b, atol=1e-5)


# -- the training step and checkpoints ---------------------------------------

VOCAB = 32


def _model_config(**moe):
  return ModelConfig(
      src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=16, num_heads=2,
      d_kv=8, d_ff=32, num_encoder_layers=2, num_decoder_layers=2,
      dropout_rate=0.0, attention_dropout_rate=0.0, max_length=16,
      moe=MoeConfig(num_experts=E, expert_hidden_dim=16, group_size=16,
                    router="topk", num_selected_experts=2,
                    bias_balancing_rate=0.01, **moe))


def _token_batches(num, seed=0):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(num):
    inputs = rng.integers(1, VOCAB, size=(4, 6)).astype(np.int32)
    targets = rng.integers(1, VOCAB, size=(4, 6)).astype(np.int32)
    inputs[1, 4:] = 0
    targets[2, 3:] = 0
    out.append({"inputs": tf.constant(inputs), "targets": tf.constant(targets)})
  return out


def test_train_step_updates_each_bias_from_the_whole_steps_counts():
  tf.random.set_seed(1)
  model = model_lib.Transformer(config=_model_config())
  variables = list(model.trainable_variables)
  optimizer = optimizer_lib.Adafactor(optimizer_lib.AdafactorConfig(
      learning_rate=0.1, warmup_steps=1))
  optimizer.build(variables)
  runner = step_lib.StepRunner(
      model=model, optimizer=optimizer, variables=variables,
      strategy=tf.distribute.get_strategy(), label_smoothing=0.1)
  routers = runner.balanced_routers
  assert sorted(routers) == ["decoder/layer_1/moe", "encoder/layer_1/moe"]
  assert not any(r.balancing_bias is v for r in routers.values()
                 for v in variables)  # the optimiser never sees a bias
  expected = {name: np.zeros(E, np.float32) for name in routers}
  for step in range(2):
    micro = _token_batches(2, seed=step)  # two micro-batches per step
    counts = {name: np.zeros(E, np.float32) for name in routers}
    for batch in micro:  # no randomness: the step's forward passes
      stats = model(batch, training=True, seed=SEED).moe_stats
      for name in routers:
        counts[name] += stats[name].selection_counts.numpy()
    result = runner.train_step(micro, seed=tf.constant([5, step]))
    assert result.applied
    for name, router in routers.items():
      assert counts[name].sum() == 2 * float(  # k = 2 choices per token
          sum(np.count_nonzero(b["inputs" if "encoder" in name else
                                 "targets"]) for b in micro))
      error = np.sign(counts[name].sum() - E * counts[name])
      expected[name] = expected[name] + np.float32(0.01) * error.astype(
          np.float32)
      np.testing.assert_array_equal(router.balancing_bias.numpy(),
                                    expected[name], err_msg=name)
  assert any(np.abs(b).max() > 0 for b in expected.values())


def _checkpoint_variables(model_dir, step):
  reader = tf.train.load_checkpoint(f"{model_dir}/ckpt-{step}")
  return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
          if n.startswith(("model/", "optimizer/"))}


@pytest.mark.slow  # three short training runs of a Transformer (~45 s)
def test_resume_with_bias_balancing_is_bitwise_identical(tmp_path):
  config = _model_config(batch_prioritized_routing=True)
  pairs = synthetic.synthetic_pairs(num_pairs=256, vocab_size=VOCAB,
                                    max_length=7)
  def run(name, steps):
    tf.random.set_seed(0)  # the dataset's shuffle order (see test_train.py)
    return train_lib.train(
        model_fn=lambda: model_lib.Transformer(config=config),
        train_dataset=synthetic.pairs_dataset(pairs, batch_size=8, length=8,
                                              shuffle_seed=1),
        model_config=config,
        config=train_lib.TrainConfig(
            model_dir=str(tmp_path / name), train_steps=steps, seed=3,
            log_every=2, checkpoint_every=2, keep_checkpoints=2,
            optimizer=optimizer_lib.AdafactorConfig(warmup_steps=10)))
  run("straight", 4)
  run("halves", 2)
  assert run("halves", 4).step == 4  # restored from ckpt-2
  a = _checkpoint_variables(tmp_path / "straight", 4)
  b = _checkpoint_variables(tmp_path / "halves", 4)
  assert a.keys() == b.keys()
  biases = [n for n in a if "balancing_bias" in n]
  assert len(biases) == 2 and all(np.abs(a[n]).max() > 0 for n in biases)
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)
