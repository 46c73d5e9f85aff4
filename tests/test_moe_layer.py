"""MoeLayer: dense equivalence, exact padding, gradients, configs, XLA."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from m4moe.moe import routing
from m4moe.config import ConfigError, ModelConfig, MoeConfig
from m4moe.moe.layer import MoeLayer, MoeOutput

SEED = tf.constant([1, 2], tf.int32)
D = 8


def make_layer(*, causal=False, d_model=D, init_seed=0, dtype="float32",
               **moe_kwargs):
  moe = dict(num_experts=4, expert_hidden_dim=6, group_size=4)
  moe.update(moe_kwargs)
  config = ModelConfig(d_model=d_model, activation_dtype=dtype,
                       moe=MoeConfig(**moe))
  tf.random.set_seed(init_seed)
  return MoeLayer(config=config, causal=causal)


def dense_ffn(x, wi, wo):
  return tf.nn.relu(x @ wi) @ wo


def random_batch(shape, seed=0, pad_rows=()):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(*shape, D)).astype(np.float32)
  mask = np.ones(shape, np.float32)
  for row, start in pad_rows:
    mask[row, start:] = 0
  return tf.constant(x), tf.constant(mask)


@pytest.mark.parametrize("router", ["top1", "noisy_topk", "expert_choice"])
@pytest.mark.parametrize("training", [False, True])
def test_one_expert_with_ample_capacity_is_a_dense_ffn(router, training):
  layer = make_layer(num_experts=1, router=router, num_selected_experts=1,
                     train_capacity_factor=1.0, group_size=6)
  x, mask = random_batch((2, 5), pad_rows=[(1, 3)])
  out = layer(x, padding_mask=mask, training=training, seed=SEED)
  expected = dense_ffn(x, layer.experts.wi[0], layer.experts.wo[0])
  expected *= mask[..., None]
  np.testing.assert_allclose(out.outputs.numpy(), expected.numpy(),
                             rtol=1e-5, atol=1e-6)


def test_top2_with_identical_experts_is_a_dense_ffn():
  layer = make_layer(num_experts=2, router="top2", group_size=16)
  layer.experts.wi.assign(tf.repeat(layer.experts.wi[:1], 2, axis=0))
  layer.experts.wo.assign(tf.repeat(layer.experts.wo[:1], 2, axis=0))
  x, mask = random_batch((2, 5))
  out = layer(x, padding_mask=mask, training=False)  # no-drop eval
  expected = dense_ffn(x, layer.experts.wi[0], layer.experts.wo[0])
  np.testing.assert_allclose(out.outputs.numpy(), expected.numpy(),
                             rtol=1e-5, atol=1e-6)


def _with_extra_padding(x, mask, seed=9):
  """Inserts pad columns inside and after each row and one all-pad row."""
  rng = np.random.default_rng(seed)
  batch, length = mask.shape
  new_length = length + 3
  layout = np.zeros((batch + 1, new_length), bool)  # True = old token
  for row in range(batch):
    layout[row, [c for c in range(new_length) if c not in (1, 5, 7)]] = True
  new_x = 50 * rng.normal(size=(batch + 1, new_length, D)).astype(np.float32)
  new_mask = np.zeros((batch + 1, new_length), np.float32)
  new_x[layout] = x.numpy().reshape(-1, D)
  new_mask[layout] = mask.numpy().reshape(-1)
  return tf.constant(new_x), tf.constant(new_mask), layout


def _outputs_and_grads(layer, x, mask, *, training, probe):
  with tf.GradientTape() as tape:
    tape.watch(x)
    out = layer(x, padding_mask=mask, training=training, seed=SEED)
    loss = (tf.reduce_sum(out.outputs * probe) + out.weighted_loss)
  variables = layer.trainable_variables
  grads = tape.gradient(loss, [x, *variables],
                        unconnected_gradients=tf.UnconnectedGradients.ZERO)
  return out, [tf.convert_to_tensor(g).numpy() for g in grads]


@pytest.mark.parametrize("router,policy,training,extra", [
    ("top2", "all", True, {}), ("top2", "random", False, {}),
    ("top1", "random", True, {}), ("noisy_topk", "random", False, {}),
    ("expert_choice", "random", True, {}),
    ("top2", "all", True, dict(num_shared_experts=2,
                               shared_expert_hidden_dim=3)),
    ("top2", "all", True, dict(train_capacity_factor=0))])
def test_adding_padding_changes_nothing_for_real_tokens(router, policy,
                                                        training, extra):
  layer = make_layer(router=router, second_expert_policy=policy,
                     **{"train_capacity_factor": 1.0,
                        "eval_capacity_factor": 1.0, "z_loss_weight": 0.1,
                        "no_token_left_behind": False, **extra})
  x, mask = random_batch((2, 6), seed=1, pad_rows=[(0, 4)])
  probe = tf.constant(np.random.default_rng(2).normal(size=(2, 6, D)),
                      tf.float32)
  base, base_grads = _outputs_and_grads(layer, x, mask, training=training,
                                        probe=probe)
  px, pmask, layout = _with_extra_padding(x, mask)
  pprobe = np.zeros(px.shape, np.float32)
  pprobe[layout] = probe.numpy().reshape(-1, D)
  padded, padded_grads = _outputs_and_grads(layer, px, pmask,
                                            training=training,
                                            probe=tf.constant(pprobe))
  real = pmask.numpy() > 0
  np.testing.assert_allclose(padded.outputs.numpy()[layout],
                             base.outputs.numpy().reshape(-1, D), atol=1e-6)
  assert (padded.outputs.numpy()[~real] == 0).all()
  for name in ("aux_loss", "z_loss", "weighted_loss"):
    np.testing.assert_allclose(getattr(padded, name).numpy(),
                               getattr(base, name).numpy(), rtol=1e-6)
  for name, value in base.stats.as_dict().items():
    np.testing.assert_allclose(padded.stats.as_dict()[name].numpy(),
                               value.numpy(), rtol=1e-5, err_msg=name)
  np.testing.assert_allclose(padded_grads[0][layout],
                             base_grads[0].reshape(-1, D), atol=1e-5)
  assert (padded_grads[0][~real] == 0).all()
  for a, b in zip(padded_grads[1:], base_grads[1:]):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_dropped_and_padding_tokens_get_zero_output():
  layer = make_layer(router="top1", train_capacity_factor=0.5, group_size=8)
  layer.router.wg.assign(tf.zeros_like(layer.router.wg))  # all -> expert 0
  x, mask = random_batch((1, 8), pad_rows=[(0, 6)])
  out = layer(x, padding_mask=mask, training=True, seed=SEED)
  norms = np.abs(out.outputs.numpy()[0]).sum(-1)
  # C = ceil(0.5 * 8 / 4) = 1: only the first token reaches expert 0.
  assert norms[0] > 0 and (norms[1:] == 0).all()
  np.testing.assert_allclose(out.stats.dropped_first.numpy(), 5 / 6)


@pytest.mark.parametrize("router", ["top2", "top1", "noisy_topk",
                                    "expert_choice"])
def test_gradients_reach_router_through_combine_and_aux_loss(router):
  layer = make_layer(router=router, second_expert_policy="all",
                     aux_loss_weight=0.0, z_loss_weight=0.0)
  x, mask = random_batch((2, 4))
  with tf.GradientTape(persistent=True) as tape:
    out = layer(x, padding_mask=mask, training=False)
    through_combine = tf.reduce_sum(out.outputs * tf.sin(x))
  assert np.abs(tape.gradient(through_combine,
                              layer.router.wg).numpy()).max() > 0
  if router != "expert_choice":  # its aux loss is the constant 0
    assert np.abs(tape.gradient(out.aux_loss,
                                layer.router.wg).numpy()).max() > 0
  assert np.abs(tape.gradient(out.z_loss, layer.router.wg).numpy()).max() > 0
  assert out.weighted_loss.numpy() == 0


def test_weighted_loss_uses_the_configured_weights():
  layer = make_layer(aux_loss_weight=0.5, z_loss_weight=0.25)
  x, mask = random_batch((2, 4))
  out = layer(x, padding_mask=mask, training=False)
  np.testing.assert_allclose(
      out.weighted_loss.numpy(),
      0.5 * out.aux_loss.numpy() + 0.25 * out.z_loss.numpy(), rtol=1e-6)


def test_expert_choice_in_a_causal_layer_is_rejected():
  with pytest.raises(ConfigError, match="--router"):
    make_layer(causal=True, router="expert_choice")
  make_layer(causal=False, router="expert_choice")  # encoder: fine


@pytest.mark.parametrize("build", [
    lambda: make_layer(num_experts=0),
    lambda: make_layer(router="switch"),
    lambda: make_layer(num_experts=1, router="top2"),
    lambda: make_layer(router="noisy_topk", num_selected_experts=5),
    lambda: make_layer(router="expert_choice", no_token_left_behind=True),
    lambda: make_layer(dispatch="dense"),
    lambda: make_layer(train_capacity_factor=-1.0),
    lambda: make_layer(train_capacity_factor=0.0, dispatch="index"),
])
def test_bad_configs_raise_config_error(build):
  with pytest.raises(ConfigError, match="--"):
    build()


def test_training_randomness_needs_a_seed_and_is_reproducible():
  layer = make_layer(router="top2", second_expert_policy="random",
                     expert_dropout_rate=0.3)
  x, mask = random_batch((2, 4))
  with pytest.raises(ValueError, match="seed"):
    layer(x, padding_mask=mask, training=True)
  a = layer(x, padding_mask=mask, training=True, seed=SEED).outputs
  b = layer(x, padding_mask=mask, training=True, seed=SEED).outputs
  c = layer(x, padding_mask=mask, training=True, seed=SEED + 1).outputs
  np.testing.assert_array_equal(a.numpy(), b.numpy())
  assert not np.allclose(a.numpy(), c.numpy())
  layer(x, padding_mask=mask, training=False)  # eval needs no seed


def test_decoding_steps_match_the_full_sequence_without_drops():
  """Few tokens form one group of their real size; no-drop eval makes each
  token's output independent of its group, so step-wise == full."""
  layer = make_layer(causal=True, router="top2", group_size=256)
  x, mask = random_batch((3, 5))
  full = layer(x, padding_mask=mask, training=False).outputs.numpy()
  for t in range(5):
    out = layer(x[:, t:t + 1], padding_mask=mask[:, t:t + 1],
                training=False).outputs.numpy()
    np.testing.assert_allclose(out[:, 0], full[:, t], rtol=1e-5, atol=1e-6)
  assert layer.group_size(3) == 3 and layer.group_size(None) == 256


def test_xla_compiled_layer_matches_eager(dispatch="index"):
  # No random draws here: XLA's stateless RNG gives other numbers than the
  # TF kernels (a TensorFlow property), so only deterministic paths compare.
  layer = make_layer(router="top2", dispatch=dispatch,
                     second_expert_policy="all", no_token_left_behind=True,
                     train_capacity_factor=0.75)
  x, mask = random_batch((3, 5), pad_rows=[(2, 2)])
  fn = lambda x, m, s: layer(x, padding_mask=m, training=True, seed=s)
  eager = fn(x, mask, SEED)
  compiled = tf.function(fn, jit_compile=True)(x, mask, SEED)
  np.testing.assert_allclose(compiled.outputs.numpy(), eager.outputs.numpy(),
                             atol=1e-5)
  np.testing.assert_allclose(compiled.aux_loss.numpy(),
                             eager.aux_loss.numpy(), rtol=1e-5)


def test_bfloat16_activations_keep_router_and_losses_in_float32():
  x, mask = random_batch((2, 6), pad_rows=[(1, 4)])
  f32 = make_layer(router="top2", group_size=16)
  bf16 = make_layer(router="top2", group_size=16, dtype="bfloat16")
  for a, b in zip(bf16.trainable_variables, f32.trainable_variables):
    a.assign(b)
  out = bf16(tf.cast(x, tf.bfloat16), padding_mask=mask, training=False)
  ref = f32(x, padding_mask=mask, training=False)
  assert out.outputs.dtype == tf.bfloat16
  assert out.aux_loss.dtype == tf.float32 and bf16.router.wg.dtype == tf.float32
  assert all(v.dtype == tf.float32 for v in bf16.trainable_variables)
  np.testing.assert_allclose(tf.cast(out.outputs, tf.float32).numpy(),
                             ref.outputs.numpy(), rtol=0.05, atol=0.05)
  np.testing.assert_allclose(out.aux_loss.numpy(), ref.aux_loss.numpy(),
                             rtol=1e-5)


def test_expert_init_is_truncated_normal_with_fan_in_scale():
  config = ModelConfig(d_model=64, init_scale=0.1,
                       moe=MoeConfig(num_experts=4, expert_hidden_dim=256))
  tf.random.set_seed(0)
  layer = MoeLayer(config=config, causal=False)
  assert layer.experts.wi.shape == (4, 64, 256)
  assert layer.experts.wo.shape == (4, 256, 64)
  for weight, fan_in in ((layer.experts.wi, 64), (layer.experts.wo, 256)):
    sigma = (0.1 / fan_in) ** 0.5
    values = weight.numpy()
    # One initialiser for dense and expert weights (m4moe.model.initializers): the
    # realised std is sigma (nominal std sigma would give 0.88 sigma),
    # from a normal of nominal std sigma / 0.8796 truncated at 2 nominal.
    nominal = sigma / 0.87962566103423978
    assert np.abs(values).max() <= 2 * nominal + 1e-7
    assert 0.95 * sigma < values.std() < 1.05 * sigma


def test_moe_output_is_nest_compatible():
  layer = make_layer()
  x, mask = random_batch((2, 4))
  out = layer(x, padding_mask=mask, training=False)
  flat = tf.nest.flatten(out)
  # The router's stats and the layer's 3 executed-compute stats.
  assert len(flat) == 4 + len(dataclasses.fields(routing.RouterStats)) + 3
  assert isinstance(tf.nest.pack_sequence_as(out, flat), MoeOutput)


def test_unknown_static_shapes_use_full_groups():
  layer = make_layer(causal=True, router="top2", group_size=4,
                     no_token_left_behind=True)
  fn = tf.function(
      lambda x, m: layer(x, padding_mask=m, training=False).outputs,
      input_signature=[tf.TensorSpec([None, None, D]),
                       tf.TensorSpec([None, None])])
  for shape in ((3, 5), (2, 1)):  # 15 tokens; 2 tokens < group_size
    x, mask = random_batch(shape, pad_rows=[(1, 1)])
    eager = layer(x, padding_mask=mask, training=False).outputs
    np.testing.assert_allclose(fn(x, mask).numpy(), eager.numpy(),
                               atol=1e-6)


def test_layer_runs_a_router_and_experts_passed_in():
  built = make_layer(router="top1", init_seed=3)
  config = built.config
  given = MoeLayer(config=config, causal=False, router=built.router,
                   experts=built.experts, name="given")
  assert given.router is built.router and given.experts is built.experts
  assert ([v.name for v in given.trainable_variables] ==
          [v.name for v in built.trainable_variables])
  x, mask = random_batch((2, 5), pad_rows=[(1, 3)])
  np.testing.assert_array_equal(
      given(x, padding_mask=mask, training=False).outputs,
      built(x, padding_mask=mask, training=False).outputs)


def test_router_or_experts_that_disagree_with_the_config_are_rejected():
  layer = make_layer(router="top1")
  other = make_layer(router="top2", num_experts=8, expert_hidden_dim=6)
  with pytest.raises(ConfigError, match="--router=top1 needs a SwitchRouter"):
    MoeLayer(config=layer.config, causal=False, router=other.router)
  with pytest.raises(ConfigError, match=r"expert weights wi \[E, M, H\] have "
                     r"shape \[8, 8, 6\], the config says \[4, 8, 6\]"):
    MoeLayer(config=layer.config, causal=False, experts=other.experts)
  with pytest.raises(ConfigError, match=r"router weights wg \[M, E\] have "
                     r"shape \[8, 4\], the config says \[8, 8\] "
                     r"\(--d_model=8, --num_experts=8"):
    MoeLayer(config=other.config, causal=False,
             router=make_layer(router="top2").router)


@pytest.mark.parametrize("rows", [0, 1, 7])
@pytest.mark.parametrize("with_keep", [False, True])
@pytest.mark.parametrize("rows_hint,max_weight", [(None, 0), (10**6, 0),
                                                  (None, 1 << 17)])
def test_expert_ffn_values_and_gradients_equal_autodiff(
    rows, with_keep, rows_hint, max_weight, monkeypatch):
  # The hand-written gradient against autodiff of the same formula, in both
  # matmul forms of the input gradients (rows_hint: few rows, the transposed
  # form; many, transpose_b for the tall wo; a small weight, transpose_b for
  # both); dropped hidden units (keep = 0) and ReLU's dead units both
  # occur, and an expert may get no rows.
  from m4moe.moe import layer as moe_layer_lib  # pylint: disable=g-import-not-at-top
  assert 10**6 >= moe_layer_lib.TRANSPOSE_B_MIN_ROWS
  monkeypatch.setattr(moe_layer_lib, "TRANSPOSE_B_MAX_WEIGHT", max_weight)
  rng = np.random.default_rng(rows)
  x = tf.constant(rng.normal(size=(rows, 5)), tf.float32)
  wi = tf.constant(rng.normal(size=(5, 6)), tf.float32)
  wo = tf.constant(rng.normal(size=(6, 5)), tf.float32)

  def _expert_ffn(x, wi, wo, keep):
    return moe_layer_lib._expert_ffn(x, wi, wo, keep, rows=rows_hint)  # pylint: disable=protected-access

  keep = (tf.constant((rng.random((rows, 6)) > 0.3) / 0.7, tf.float32)
          if with_keep else None)
  dy = tf.constant(rng.normal(size=(rows, 5)), tf.float32)

  def reference(x, wi, wo):
    h = tf.nn.relu(tf.matmul(x, wi))
    return tf.matmul(h * keep if with_keep else h, wo)

  results = []
  for fn in (_expert_ffn, reference):
    with tf.GradientTape() as tape:
      tape.watch([x, wi, wo])
      y = fn(x, wi, wo, keep) if fn is _expert_ffn else fn(x, wi, wo)
      loss = tf.reduce_sum(y * dy)
    results.append([y] + tape.gradient(loss, [x, wi, wo]))
  for label, got, want in zip(("y", "x", "wi", "wo"), *results):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5,
                               atol=1e-5, err_msg=label)
  if rows:
    assert np.abs(results[0][2].numpy()).max() > 0


def test_expert_ffn_gradient_by_hand():
  # One row, M = H = 1: y = relu(x*wi)*wo; at x=2, wi=3, wo=5, dy=1:
  # dy/dx = wi*wo = 15, dy/dwi = x*wo = 10, dy/dwo = relu(6) = 6; with
  # wi = -3 the unit is dead and every gradient is 0.
  from m4moe.moe.layer import _expert_ffn  # pylint: disable=g-import-not-at-top
  for w, want in ((3.0, [15.0, 10.0, 6.0]), (-3.0, [0.0, 0.0, 0.0])):
    x, wi, wo = (tf.constant([[v]]) for v in (2.0, w, 5.0))
    with tf.GradientTape() as tape:
      tape.watch([x, wi, wo])
      y = _expert_ffn(x, wi, wo)
    grads = tape.gradient(y, [x, wi, wo])
    assert [float(g.numpy()[0, 0]) for g in grads] == want


@pytest.mark.parametrize("jit", [False, True])
def test_per_expert_matmuls_above_32_experts_equal_the_batched_einsum(jit):
  # E=40 (over the former limit of 32): the EGCM buffers run one 2-D matmul
  # pair per expert, the GECM layout the batched einsums; same values and
  # gradients, with and without XLA.
  from m4moe.moe.layer import FeedForwardExperts  # pylint: disable=g-import-not-at-top
  tf.random.set_seed(0)
  experts = FeedForwardExperts(num_experts=40, model_dim=4, hidden_dim=6,
                               init_scale=1.0)
  rng = np.random.default_rng(0)
  buffers = tf.constant(rng.normal(size=(40, 2, 3, 4)), tf.float32)
  dy = tf.constant(rng.normal(size=(40, 2, 3, 4)), tf.float32)

  def run(layout):
    with tf.GradientTape() as tape:
      tape.watch(buffers)
      y = experts(buffers, output_layout=layout)
      if layout == "GECM":
        y = tf.transpose(y, [1, 0, 2, 3])
      loss = tf.reduce_sum(y * dy)
    return [y] + tape.gradient(loss, [buffers, experts.wi, experts.wo])

  per_expert = tf.function(lambda: run("EGCM"), jit_compile=jit)
  graph = tf.function(lambda: run("EGCM")).get_concrete_function().graph
  matmuls = [op for op in graph.get_operations() if op.type == "MatMul"]
  assert len(matmuls) >= 2 * 40  # one forward pair per expert
  for label, got, want in zip(("y", "x", "wi", "wo"), per_expert(),
                              run("GECM")):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5,
                               atol=1e-5, err_msg=label)
