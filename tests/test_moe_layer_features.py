"""MoE layer features: shared experts, expert output masking, dropless
training and the executed expert FLOPs, against a NumPy reference."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from m4moe.model import layers
from m4moe.moe import routing
from m4moe.config import ConfigError, ModelConfig, MoeConfig, load_model_config
from m4moe.moe.layer import MoeLayer, MoeLayerStats
from m4moe.model.numerics import fold_seed
from m4moe.training import metrics as metrics_lib
from m4moe.training import step as step_lib

SEED = tf.constant([3, 7], tf.int32)
M, E, H, F = 8, 4, 6, 12
PATHS = ("sorted", "index", "einsum")


def make_layer(**moe_kwargs):
  moe = dict(num_experts=E, expert_hidden_dim=H, group_size=8,
             second_expert_policy="all", train_capacity_factor=2.0,
             aux_loss_weight=0.0)
  moe.update(moe_kwargs)
  config = ModelConfig(d_model=M, d_ff=F, moe=MoeConfig(**moe))
  tf.random.set_seed(0)
  return MoeLayer(config=config, causal=False)


def _batch(seed=0):
  """<float32>[2, 3, M] tokens, the last one padding (5 real tokens)."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(2, 3, M))
  mask = np.ones((2, 3))
  mask[1, 2] = 0
  x[1, 2] = 40.0  # a large padding token must change nothing
  return x, mask


def _weights(layer):
  names = ["wg", "wi", "wo"] + (["swi", "swo"] if layer.shared_experts else [])
  variables = [layer.router.wg, layer.experts.wi, layer.experts.wo]
  if layer.shared_experts:
    variables += [layer.shared_experts.wi, layer.shared_experts.wo]
  return dict(zip(names, [v.numpy().astype(np.float64) for v in variables]))


def _relu(a):
  return np.maximum(a, 0.0)


def reference(x, mask, keep, *, wg, wi, wo, swi=None, swo=None, scale=1.0):
  """NumPy MoE layer, top-2 with the ``all`` policy and no drops.

  Each real token: gates = softmax(x wg); its two best experts e1, e2 with
  weights g / (g1 + g2); output scale * sum_k w_k FFN_ek(x) + the shared
  FFN, times ``keep`` (output masking). Padding: 0.
  """
  out = np.zeros_like(x)
  for index in np.ndindex(mask.shape):
    if not mask[index]:
      continue
    t = x[index]
    logits = t @ wg
    gates = np.exp(logits - logits.max())
    gates /= gates.sum()
    top = np.argsort(-gates, kind="stable")[:2]
    weights = gates[top] / gates[top].sum()
    y = scale * sum(w * (_relu(t @ wi[e]) @ wo[e])
                    for w, e in zip(weights, top))
    if swi is not None:
      y = y + _relu(t @ swi) @ swo
    out[index] = keep[index] * y
  return out


def reference_gradients(x, mask, keep, probe, weights, eps=1e-6, scale=1.0):
  """Central differences of sum(reference * probe) in float64."""
  args = {"x": x, **weights}

  def loss():
    return np.sum(reference(args["x"], mask, keep, scale=scale,
                            **{k: v for k, v in args.items() if k != "x"})
                  * probe)

  grads = {}
  for name, value in args.items():
    grad = np.zeros_like(value)
    for i in np.ndindex(value.shape):
      old = value[i]
      value[i] = old + eps
      up = loss()
      value[i] = old - eps
      down = loss()
      value[i] = old
      grad[i] = (up - down) / (2 * eps)
    grads[name] = grad
  return grads


def _layer_values_and_gradients(layer, x, mask, probe, *, training):
  variables = [layer.router.wg, layer.experts.wi, layer.experts.wo]
  if layer.shared_experts:
    variables += [layer.shared_experts.wi, layer.shared_experts.wo]
  xt = tf.constant(x, tf.float32)
  with tf.GradientTape() as tape:
    tape.watch(xt)
    out = layer(xt, padding_mask=tf.constant(mask, tf.float32),
                training=training, seed=SEED)
    loss = tf.reduce_sum(out.outputs * tf.constant(probe, tf.float32))
  grads = tape.gradient(loss, [xt] + variables,
                        unconnected_gradients=tf.UnconnectedGradients.ZERO)
  names = ["x", "wg", "wi", "wo", "swi", "swo"]
  return out, {n: tf.convert_to_tensor(g).numpy() for n, g in zip(names, grads)}


def _compare(layer, x, mask, keep, *, training, scale=1.0):
  probe = np.random.default_rng(5).normal(size=x.shape)
  weights = _weights(layer)
  want = reference(x, mask, keep, scale=scale, **weights)
  want_grads = reference_gradients(x.copy(), mask, keep, probe,
                                   {k: v.copy() for k, v in weights.items()},
                                   scale=scale)
  out, grads = _layer_values_and_gradients(layer, x, mask, probe,
                                           training=training)
  np.testing.assert_allclose(out.outputs.numpy(), want, rtol=1e-5, atol=1e-5)
  assert (out.outputs.numpy()[mask == 0] == 0).all()
  for name, want_grad in want_grads.items():
    np.testing.assert_allclose(grads[name], want_grad, rtol=1e-4, atol=1e-4,
                               err_msg=name)
  assert (grads["x"][mask == 0] == 0).all()
  return out


@pytest.mark.parametrize("dispatch", PATHS)
def test_shared_experts_equal_the_numpy_reference(dispatch):
  layer = make_layer(dispatch=dispatch, num_shared_experts=2,
                     shared_expert_hidden_dim=3)
  assert layer.shared_experts.wi.shape == (M, 2 * 3)
  x, mask = _batch()
  out = _compare(layer, x, mask, np.ones(mask.shape), training=True)
  # The shared experts matter: without them the reference differs.
  weights = _weights(layer)
  routed_only = reference(x, mask, np.ones(mask.shape), wg=weights["wg"],
                          wi=weights["wi"], wo=weights["wo"])
  assert np.abs(out.outputs.numpy() - routed_only).max() > 1e-2


@pytest.mark.parametrize("dispatch", PATHS)
def test_expert_output_scale_equals_the_numpy_reference(dispatch):
  # The routed output is scaled, the shared experts' output is not.
  layer = make_layer(dispatch=dispatch, num_shared_experts=1,
                     shared_expert_hidden_dim=3, expert_output_scale=0.25)
  x, mask = _batch()
  out = _compare(layer, x, mask, np.ones(mask.shape), training=True,
                 scale=0.25)
  unscaled = reference(x, mask, np.ones(mask.shape), **_weights(layer))
  assert np.abs(out.outputs.numpy() - unscaled).max() > 1e-2


def test_shared_expert_width_defaults_to_the_expert_width():
  layer = make_layer(num_shared_experts=1)
  assert layer.shared_experts.wi.shape == (M, H)
  assert "shared_experts/ffn/wi" in layer.shared_experts.wi.name
  assert make_layer().shared_experts is None


def _grouped_keep(mask, rate, seed):
  """Per-token output keep scale: the layer's draw, one unit per grouped
  token (real tokens first, in order; here one group of S = 6)."""
  grouped = layers.dropout_scale([1, mask.size], rate=rate,
                                 seed=fold_seed(seed, 2),
                                 dtype=tf.float32).numpy().reshape(-1)
  keep = np.zeros(mask.size)
  real = np.flatnonzero(mask.reshape(-1))
  keep[real] = grouped[:real.size]
  return keep.reshape(mask.shape)


@pytest.mark.parametrize("dispatch", PATHS)
def test_output_masking_equals_the_numpy_reference(dispatch):
  rate = 0.4
  layer = make_layer(dispatch=dispatch, num_shared_experts=1,
                     expert_output_mask_rate=rate)
  x, mask = _batch()
  keep = _grouped_keep(mask, rate, SEED)
  real = keep[mask > 0]
  # Both cases occur with this seed, and kept tokens are scaled 1/(1-p).
  assert (real == 0).any() and (real > 0).any()
  np.testing.assert_allclose(real[real > 0], 1 / (1 - rate), rtol=1e-6)
  out = _compare(layer, x, mask, keep, training=True)
  # A masked token's whole output (routed and shared) is exactly 0.
  assert (out.outputs.numpy()[keep == 0] == 0).all()
  # Eval never masks.
  _compare(layer, x, mask, np.ones(mask.shape), training=False)


def test_output_masking_is_seeded_separately_from_expert_dropout():
  x, mask = _batch(seed=1)
  masked = (_grouped_keep(mask, 0.5, SEED) == 0) & (mask > 0)
  x, mask = tf.constant(x, tf.float32), tf.constant(mask, tf.float32)
  zeroed = []
  for dropout in (0.0, 0.5):
    # A wide shared expert (no expert dropout) keeps unmasked outputs
    # nonzero even where expert dropout zeroes a routed expert's hidden.
    layer = make_layer(expert_output_mask_rate=0.5, num_shared_experts=1,
                       shared_expert_hidden_dim=32,
                       expert_dropout_rate=dropout)
    with pytest.raises(ValueError, match="seed"):
      layer(x, padding_mask=mask, training=True)
    a = layer(x, padding_mask=mask, training=True, seed=SEED).outputs
    b = layer(x, padding_mask=mask, training=True, seed=SEED).outputs
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    zeroed.append(np.abs(a.numpy()).sum(-1) == 0)
  # The same tokens are masked with and without expert dropout: the draw's.
  np.testing.assert_array_equal(zeroed[0], masked | (mask.numpy() == 0))
  np.testing.assert_array_equal(zeroed[1], zeroed[0])
  other = layer(x, padding_mask=mask, training=True, seed=SEED + 1).outputs
  assert not np.array_equal(np.abs(other.numpy()).sum(-1) == 0, zeroed[0])


def test_output_masking_drops_the_configured_fraction():
  rng = np.random.default_rng(0)
  x = tf.constant(rng.normal(size=(50, 80, M)), tf.float32)
  mask = tf.ones((50, 80))
  out = make_layer(expert_output_mask_rate=0.3, group_size=512)(
      x, padding_mask=mask, training=True, seed=SEED).outputs.numpy()
  dropped = np.mean(np.abs(out).sum(-1) == 0)
  # 4000 tokens: the standard error of the fraction is 0.0072.
  assert abs(dropped - 0.3) < 0.03


def _skewed_layer(**kwargs):
  # wg = 0: every gate is 1/E, so every token's choices are experts 0 and 1.
  layer = make_layer(**kwargs)
  layer.router.wg.assign(tf.zeros_like(layer.router.wg))
  return layer


def _run(layer, x, mask, probe):
  with tf.GradientTape() as tape:
    tape.watch(x)
    out = layer(x, padding_mask=mask, training=True, seed=SEED)
    loss = tf.reduce_sum(out.outputs * probe)
  grads = tape.gradient(loss, [x, *layer.trainable_variables])
  return out, [tf.convert_to_tensor(g).numpy() for g in grads]


def test_dropless_training_drops_nothing_and_equals_a_large_capacity():
  rng = np.random.default_rng(2)
  x = tf.constant(rng.normal(size=(2, 4, M)), tf.float32)
  mask = tf.constant([[1, 1, 1, 1], [1, 1, 1, 0]], tf.float32)
  probe = tf.constant(rng.normal(size=(2, 4, M)), tf.float32)
  dropless, dropless_grads = _run(
      _skewed_layer(train_capacity_factor=0), x, mask, probe)
  assert dropless.stats.dropped_first.numpy() == 0
  assert dropless.stats.dropped_second.numpy() == 0
  assert dropless.stats.expert_assignments_per_token.numpy() == 2.0
  # C = ceil(2.0 * 2 * 8 / 4) = 8 = S: the large-capacity run.
  large, large_grads = _run(_skewed_layer(train_capacity_factor=2.0),
                            x, mask, probe)
  np.testing.assert_allclose(dropless.outputs.numpy(), large.outputs.numpy(),
                             rtol=1e-6, atol=1e-6)
  for a, b in zip(dropless_grads, large_grads):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  # C = 4 < 7 tokens per expert: that capacity drops.
  small, _ = _run(_skewed_layer(train_capacity_factor=1.0), x, mask, probe)
  assert small.stats.dropped_first.numpy() == pytest.approx(3 / 7)


@pytest.mark.parametrize("kwargs, match", [
    (dict(train_capacity_factor=0, dispatch="index"), "--dispatch=sorted"),
    (dict(train_capacity_factor=0, dispatch="einsum"), "--dispatch=sorted"),
    (dict(train_capacity_factor=0, router="expert_choice"), "token-choice"),
    (dict(train_capacity_factor=-1.0), "dropless"),
    (dict(num_shared_experts=-1), "--num_shared_experts"),
    (dict(shared_expert_hidden_dim=-2), "--shared_expert_hidden_dim"),
    (dict(expert_output_mask_rate=1.0), "--expert_output_mask_rate"),
    (dict(expert_output_scale=0.0), "--expert_output_scale"),
])
def test_bad_feature_flags_name_the_flag_and_the_fix(kwargs, match):
  with pytest.raises(ConfigError, match=match):
    MoeConfig(num_experts=E, **kwargs)


def test_dropless_is_refused_on_a_mesh():
  from m4moe.parallel import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  config = ModelConfig(d_model=M, moe=MoeConfig(num_experts=E,
                                                train_capacity_factor=0))
  mesh = sharding_lib.make_sharding("data:2", backend="xla")
  with pytest.raises(ConfigError, match="--train_capacity_factor"):
    MoeLayer(config=config, causal=False, sharding=mesh)


def _one_hot_tokens(kinds):
  """<float32>[1, len, M]: token kind k is the unit vector e_k (-1: pad)."""
  x = np.zeros((1, len(kinds), M), np.float32)
  for i, kind in enumerate(kinds):
    if kind >= 0:
      x[0, i, kind] = 1.0
  mask = np.array([[float(k >= 0) for k in kinds]], np.float32)
  return tf.constant(x), tf.constant(mask)


@pytest.mark.parametrize("dispatch", PATHS)
def test_executed_flops_count_random_policy_skips_by_hand(dispatch):
  # Kind 0 (logits [20, 0, 0, 0]): the renormalised second gate is
  # 1/(e^20 + 1) ~ 2e-9, so the random policy (2 g2 > U) skips it (U, a
  # float32 in [0, 1), would have to be 0). Kind 1 (logits [0, 0, 5, 5]):
  # g2 = 1/2 and 2 g2 = 1 > U always. Four kind-0 and two kind-1 tokens:
  # 4 + 2*2 = 8 assignments for 6 real tokens; no capacity drops (C = S).
  layer = make_layer(dispatch=dispatch, second_expert_policy="random",
                     train_capacity_factor=4.0, num_shared_experts=1,
                     shared_expert_hidden_dim=3)
  wg = np.zeros((M, E), np.float32)
  wg[0] = [20, 0, 0, 0]
  wg[1] = [0, 0, 5, 5]
  layer.router.wg.assign(wg)
  x, mask = _one_hot_tokens([0, 1, 0, 0, -1, 1, 0, -1])
  stats = layer(x, padding_mask=mask, training=True, seed=SEED).stats
  assert isinstance(stats, MoeLayerStats)
  np.testing.assert_allclose(stats.expert_assignments_per_token, 8 / 6)
  # Routed: 8/6 x 4 M H = 256; shared: 4 M x 3 = 96; dense FFN: 4 M F = 384.
  np.testing.assert_allclose(stats.expert_flops_per_token, 256 + 96)
  np.testing.assert_allclose(stats.expert_flops_dense_fraction, 352 / 384)
  # The router's drop statistics do not see policy skips.
  assert stats.dropped_first.numpy() == stats.dropped_second.numpy() == 0
  # At eval the policy dispatches every second choice: 2 per token.
  stats = layer(x, padding_mask=mask, training=False).stats
  np.testing.assert_allclose(stats.expert_assignments_per_token, 2.0)


def test_executed_flops_count_capacity_drops_by_hand():
  # top1, wg = 0: all 6 real tokens choose expert 0; C = ceil(0.5*8/4) = 1.
  layer = _skewed_layer(router="top1", train_capacity_factor=0.5)
  x, mask = _one_hot_tokens([0, 1, 2, -1, 3, 4, 5, -1])
  stats = layer(x, padding_mask=mask, training=True, seed=SEED).stats
  np.testing.assert_allclose(stats.expert_assignments_per_token, 1 / 6)
  np.testing.assert_allclose(stats.expert_flops_per_token, 4 * M * H / 6)
  np.testing.assert_allclose(stats.dropped_first, 5 / 6)


def test_executed_flops_of_expert_choice_count_filled_slots():
  # k = 2, S = 8, E = 4, factor 1: C = 4 slots per expert, all filled from
  # the 6 real tokens: 16 assignments for 6 tokens.
  layer = make_layer(router="expert_choice", num_selected_experts=2,
                     train_capacity_factor=1.0)
  x, mask = _one_hot_tokens([0, 1, 2, -1, 3, 4, 5, -1])
  stats = layer(x, padding_mask=mask, training=True, seed=SEED).stats
  np.testing.assert_allclose(stats.expert_assignments_per_token, 16 / 6)


def test_layer_stats_are_router_stats_and_nest_compatible():
  layer = make_layer(num_shared_experts=1)
  x, mask = _batch()
  out = layer(tf.constant(x, tf.float32), padding_mask=mask, training=False)
  names = [f.name for f in dataclasses.fields(MoeLayerStats)]
  assert names[:len(dataclasses.fields(routing.RouterStats))] == [
      f.name for f in dataclasses.fields(routing.RouterStats)]
  flat = tf.nest.flatten(out.stats)
  again = tf.nest.pack_sequence_as(out.stats, flat)
  assert isinstance(again, MoeLayerStats)
  assert again.expert_flops_per_token.numpy() == pytest.approx(
      2 * 4 * M * H + 4 * M * H)


def test_expert_compute_means_per_stack_by_hand():
  router = {
      "encoder/layer_0/moe": {"expert_flops_dense_fraction": 0.5,
                              "expert_flops_per_token": 10.0, "load_cv": 1.0},
      "encoder/layer_1/moe": {"expert_flops_dense_fraction": 1.0,
                              "expert_flops_per_token": 30.0},
      "decoder/layer_1/moe": {"expert_flops_dense_fraction": 0.25},
      "toy/moe": {"load_cv": 0.3},
  }
  assert metrics_lib.expert_compute_means(router) == {
      "decoder": {"expert_flops_dense_fraction": 0.25},
      "encoder": {"expert_flops_dense_fraction": 0.75,
                  "expert_flops_per_token": 20.0}}


def test_model_reports_executed_compute_per_moe_layer_and_stack():
  from m4moe.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  config = load_model_config(
      "tiny/moe", ["--moe_layer_interval=1", "--moe_layer_offset=0",
                   "--num_encoder_layers=2", "--num_decoder_layers=2",
                   "--second_expert_policy=all", "--train_capacity_factor=0",
                   "--d_model=16", "--d_ff=32", "--expert_hidden_dim=16"],
      src_vocab_size=20, tgt_vocab_size=20)
  # Every layer is an MoE layer with interval 1, offset 0.
  assert config.moe_layer_indices(2) == (0, 1)
  tf.random.set_seed(0)
  model = model_lib.Transformer(config=config)
  batch = {"inputs": tf.constant([[3, 4, 5, 1, 0]]),
           "targets": tf.constant([[6, 7, 1, 0, 0]])}
  out = model(batch, training=True, seed=SEED)
  router = step_lib.flat_router_stats(out.moe_stats)
  assert sorted(router) == ["decoder/layer_0/moe", "decoder/layer_1/moe",
                            "encoder/layer_0/moe", "encoder/layer_1/moe"]
  means = metrics_lib.expert_compute_means(
      {k: {n: v.numpy() for n, v in s.items()} for k, s in router.items()})
  # Dropless, policy all: 2 experts of width 16 = the dense FFN's 32.
  for stack in ("encoder", "decoder"):
    assert means[stack]["expert_assignments_per_token"] == 2.0
    assert means[stack]["expert_flops_dense_fraction"] == 1.0
