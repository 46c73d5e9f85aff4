"""Tests for m4moe.model.layers: numerics against NumPy on tiny arrays."""

import math

import numpy as np
import pytest
import tensorflow as tf

from m4moe import config as config_lib
from m4moe.model import layers
from m4moe.model import transformer

SEED = tf.constant([3, 4], tf.int32)


def _softmax(x):
  x = x - x.max(-1, keepdims=True)
  e = np.exp(x)
  return e / e.sum(-1, keepdims=True)


def test_init_variable_std_matches_sqrt_scale_over_fan_in():
  tf.random.set_seed(1)
  var = layers.init_variable([400, 500], fan_in=50, scale=0.1, name="w")
  sigma = math.sqrt(0.1 / 50)
  values = var.numpy()
  assert var.dtype == tf.float32
  np.testing.assert_allclose(values.std(), sigma, rtol=0.01)
  # Truncated at 2 * (sigma / 0.8796): nothing beyond that bound.
  assert np.abs(values).max() <= 2 * sigma / 0.87962566103423978 + 1e-7


def test_sinusoidal_positions_hand_values():
  positions = tf.constant([[0, 3]])
  enc = layers.sinusoidal_positions(positions, d_model=4).numpy()
  # Timescales 1 and 10000^(2/4) = 100.
  np.testing.assert_allclose(enc[0, 0], [0, 0, 1, 1], atol=1e-7)
  np.testing.assert_allclose(
      enc[0, 1], [math.sin(3), math.sin(0.03), math.cos(3), math.cos(0.03)],
      rtol=1e-6)
  odd = layers.sinusoidal_positions(positions, d_model=5).numpy()
  assert odd.shape == (1, 2, 5)
  np.testing.assert_array_equal(odd[..., 4], 0)
  assert layers.sinusoidal_positions(
      positions, d_model=4, dtype=tf.bfloat16).dtype == tf.bfloat16


def test_attention_bias_segments_and_causal():
  seg = tf.constant([[1, 1, 2, 0]])
  allowed = layers.attention_bias(seg, seg, causal=False).numpy()[0, 0] == 0
  np.testing.assert_array_equal(allowed, [[1, 1, 0, 0],
                                          [1, 1, 0, 0],
                                          [0, 0, 1, 0],
                                          [0, 0, 0, 0]])
  causal = layers.attention_bias(seg, seg, causal=True).numpy()[0, 0] == 0
  np.testing.assert_array_equal(causal, [[1, 0, 0, 0],
                                         [1, 1, 0, 0],
                                         [0, 0, 1, 0],
                                         [0, 0, 0, 0]])
  cross = layers.attention_bias(seg, tf.constant([[2, 1, 1]]), causal=False)
  assert cross.shape == (1, 1, 4, 3)
  np.testing.assert_array_equal(cross.numpy()[0, 0] == 0,
                                [[0, 1, 1], [0, 1, 1], [1, 0, 0], [0, 0, 0]])


def _reference_attention(mha, x, memory, bias):
  wq, wk, wv, wo = (w.numpy() for w in (mha.wq, mha.wk, mha.wv, mha.wo))
  q = np.einsum("btm,mnd->bntd", x, wq) / math.sqrt(wq.shape[-1])
  k = np.einsum("bsm,mnd->bnsd", memory, wk)
  v = np.einsum("bsm,mnd->bnsd", memory, wv)
  probs = _softmax(q @ k.transpose(0, 1, 3, 2) + bias)
  return np.einsum("bntd,ndm->btm", probs @ v, wo)


def test_multi_head_attention_matches_numpy():
  tf.random.set_seed(2)
  mha = layers.MultiHeadAttention(d_model=6, num_heads=2, d_kv=3,
                                  dropout_rate=0.0, init_scale=1.0)
  assert mha.wq.shape == (6, 2, 3) and mha.wo.shape == (2, 3, 6)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 3, 6)).astype(np.float32)
  memory = rng.normal(size=(2, 4, 6)).astype(np.float32)
  bias = layers.attention_bias(tf.constant([[1, 1, 0], [1, 1, 1]]),
                               tf.constant([[1, 1, 1, 0], [1, 1, 0, 0]]),
                               causal=False)
  got = mha(tf.constant(x), tf.constant(memory), bias=bias, training=False)
  want = _reference_attention(mha, x, memory, bias.numpy())
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_masked_keys_have_exactly_no_influence():
  tf.random.set_seed(3)
  mha = layers.MultiHeadAttention(d_model=4, num_heads=1, d_kv=4,
                                  dropout_rate=0.0, init_scale=1.0)
  x = tf.random.normal([1, 2, 4])
  memory = tf.random.normal([1, 3, 4])
  bias = layers.attention_bias(tf.constant([[1, 1]]), tf.constant([[1, 1, 0]]),
                               causal=False)
  changed = tf.concat([memory[:, :2], 100.0 * tf.ones([1, 1, 4])], axis=1)
  a = mha(x, memory, bias=bias, training=False)
  b = mha(x, changed, bias=bias, training=False)
  np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_cached_self_attention_equals_full_causal_attention():
  tf.random.set_seed(4)
  mha = layers.MultiHeadAttention(d_model=8, num_heads=2, d_kv=4,
                                  dropout_rate=0.0, init_scale=1.0)
  x = tf.random.normal([2, 5, 8])
  seg = tf.ones([2, 5], tf.int32)
  full = mha(x, x, bias=layers.attention_bias(seg, seg, causal=True),
             training=False)
  keys = tf.zeros([2, 7, 2, 4])
  values = tf.zeros([2, 7, 2, 4])
  for t in range(5):
    out, keys, values = mha.cached_self_attention(
        x[:, t:t + 1], keys=keys, values=values, step=tf.constant(t))
    np.testing.assert_allclose(out.numpy()[:, 0], full.numpy()[:, t],
                               rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(keys.numpy()[:, 5:], 0)


def test_attention_dropout_needs_seed_and_is_deterministic():
  tf.random.set_seed(5)
  mha = layers.MultiHeadAttention(d_model=4, num_heads=2, d_kv=2,
                                  dropout_rate=0.5, init_scale=1.0)
  x = tf.random.normal([1, 3, 4])
  bias = tf.zeros([1, 1, 3, 3])
  with pytest.raises(ValueError, match="needs a seed"):
    mha(x, x, bias=bias, training=True)
  a = mha(x, x, bias=bias, training=True, seed=SEED)
  b = mha(x, x, bias=bias, training=True, seed=SEED)
  c = mha(x, x, bias=bias, training=True, seed=SEED + 1)
  np.testing.assert_array_equal(a.numpy(), b.numpy())
  assert not np.allclose(a.numpy(), c.numpy())


def test_dropout_scaling_and_eval_identity():
  x = tf.ones([1000])
  np.testing.assert_array_equal(
      layers.dropout(x, rate=0.25, training=False, seed=None).numpy(), 1)
  y = layers.dropout(x, rate=0.25, training=True, seed=SEED).numpy()
  np.testing.assert_allclose(np.unique(y), [0.0, 1 / 0.75], rtol=1e-6)
  assert 0.2 < (y == 0).mean() < 0.3
  with pytest.raises(ValueError, match="seed=<int32>"):
    layers.dropout(x, rate=0.25, training=True, seed=None)
  assert layers.fold_seed(None, 3) is None
  assert not np.array_equal(layers.fold_seed(SEED, 0).numpy(),
                            layers.fold_seed(SEED, 1).numpy())


def _numpy_dropout(x, *, rate, seed):
  """The mask of layers.dropout_scale re-derived from the same uint32 draw."""
  n = x.size
  words = tf.random.stateless_uniform(
      [(n + 1) // 2], seed=seed, minval=None, maxval=None,
      dtype=tf.uint32).numpy()
  # Unit 2i takes the low 16 bits of word i, unit 2i+1 the high 16 bits.
  numbers = np.stack([words & 0xFFFF, words >> 16], axis=-1).reshape(-1)[:n]
  keep = (numbers >= round(rate * 65536)).reshape(x.shape)
  scale = np.array(1 / (1 - rate), x.dtype)
  return np.where(keep, x * scale, np.zeros([], x.dtype)), keep


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
@pytest.mark.parametrize("shape", [(3, 5, 7), (2, 4, 6), (1,)])
def test_dropout_mask_is_the_16_bit_numbers_of_the_uint32_draw(dtype, shape):
  x = tf.cast(tf.random.stateless_normal(shape, seed=[1, 2]), dtype)
  out = layers.dropout(x, rate=0.1, training=True, seed=SEED)
  want, keep = _numpy_dropout(x.numpy(), rate=0.1, seed=SEED)
  assert out.dtype == dtype and out.shape == shape
  np.testing.assert_array_equal(out.numpy(), want)
  if keep.size > 50:
    assert 0 < keep.sum() < keep.size
  scale = layers.dropout_scale(tf.constant(shape), rate=0.1, seed=SEED,
                               dtype=dtype).numpy()
  np.testing.assert_array_equal(
      scale, np.where(keep, np.array(1 / 0.9, scale.dtype), 0))


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_dropout_keeps_1_minus_rate_of_a_million_units_scaled(rate):
  x = tf.random.stateless_normal([1000, 1000], seed=[7, 8])
  y = layers.dropout(x, rate=rate, training=True, seed=SEED).numpy()
  kept = y != 0
  sigma = math.sqrt(rate * (1 - rate) / kept.size)
  assert abs(kept.mean() - (1 - rate)) < 4 * sigma
  np.testing.assert_array_equal(
      y[kept], x.numpy()[kept] * np.float32(1 / (1 - rate)))


@pytest.mark.parametrize("rate", [0.1, 0.3, 0.25, 1e-3, 1e-6, 0.999,
                                  1 - 1e-7])
def test_dropout_threshold_keeps_1_minus_rate_to_16_bits(rate):
  threshold = layers.dropout_threshold(rate)
  assert abs((1 - threshold / 65536) - (1 - rate)) <= 2 ** -17
  assert layers.dropout_threshold(0.1) == 6554
  if threshold == 65536:  # every unit dropped
    y = layers.dropout(tf.ones([1000]), rate=rate, training=True, seed=SEED)
    np.testing.assert_array_equal(y.numpy(), 0)


@pytest.mark.parametrize("rate", [1.0, -0.1, 1.5])
def test_dropout_rejects_rates_outside_0_1(rate):
  x = tf.ones([4])
  with pytest.raises(ValueError, match=r"must be in \[0, 1\)"):
    layers.dropout(x, rate=rate, training=True, seed=SEED)


def test_dropout_mask_depends_on_the_seed_only():
  a = layers.dropout(tf.ones([64, 33]), rate=0.2, training=True, seed=SEED)
  b = layers.dropout(tf.fill([64, 33], 2.0), rate=0.2, training=True,
                     seed=SEED)
  c = layers.dropout(tf.ones([64, 33]), rate=0.2, training=True,
                     seed=SEED + [0, 1])
  np.testing.assert_array_equal(a.numpy() == 0, b.numpy() == 0)
  assert (a.numpy() != c.numpy()).mean() > 0.1


def test_dropout_with_unknown_shapes_matches_eager():
  fn = tf.function(
      lambda x: layers.dropout(x, rate=0.1, training=True, seed=SEED),
      input_signature=[tf.TensorSpec([None, None], tf.float32)])
  x = tf.random.stateless_normal([9, 13], seed=[3, 3])
  np.testing.assert_array_equal(
      fn(x).numpy(), layers.dropout(x, rate=0.1, training=True,
                                    seed=SEED).numpy())


@pytest.mark.parametrize("rate, training", [(0.0, True), (0.1, False)])
def test_dropout_off_draws_nothing(rate, training):
  fn = tf.function(lambda x, seed: layers.dropout(
      x, rate=rate, training=training, seed=seed))
  graph = fn.get_concrete_function(
      tf.TensorSpec([4, 6], tf.float32),
      tf.TensorSpec([2], tf.int32)).graph
  assert not [op.type for op in graph.get_operations()
              if "Random" in op.type]
  x = tf.random.stateless_normal([4, 6], seed=[5, 5])
  np.testing.assert_array_equal(fn(x, SEED).numpy(), x.numpy())


def test_layer_norm_matches_numpy_and_keeps_dtype():
  ln = layers.LayerNorm(d_model=4)
  ln.scale.assign([1.0, 2.0, 0.5, 1.0])
  ln.bias.assign([0.0, 1.0, 0.0, -1.0])
  x = np.array([[1.0, 2.0, 4.0, 7.0]], np.float32)
  normed = (x - x.mean()) / np.sqrt(x.var() + 1e-6)
  want = normed * [1.0, 2.0, 0.5, 1.0] + [0.0, 1.0, 0.0, -1.0]
  np.testing.assert_allclose(ln(tf.constant(x)).numpy(), want, rtol=1e-5)
  bf16 = ln(tf.constant(x, tf.bfloat16))
  assert bf16.dtype == tf.bfloat16
  np.testing.assert_allclose(tf.cast(bf16, tf.float32).numpy(), want,
                             rtol=2e-2, atol=2e-2)


def test_dense_ffn_is_wo_relu_wi():
  ffn = layers.DenseFfn(d_model=3, d_ff=5, init_scale=1.0)
  x = np.random.default_rng(1).normal(size=(2, 4, 3)).astype(np.float32)
  want = np.maximum(x @ ffn.wi.numpy(), 0) @ ffn.wo.numpy()
  np.testing.assert_allclose(ffn(tf.constant(x)).numpy(), want, rtol=1e-5,
                             atol=1e-6)
  assert ffn(tf.constant(x, tf.bfloat16)).dtype == tf.bfloat16


def test_dense_ffn_output_scale_scales_output_and_gradients():
  # y = s * wo . relu(wi . x): the value and every gradient are s times the
  # plain layer's (NumPy reference for the value).
  plain = layers.DenseFfn(d_model=3, d_ff=5, init_scale=1.0)
  scaled = layers.DenseFfn(d_model=3, d_ff=5, init_scale=1.0,
                           output_scale=0.125)
  scaled.wi.assign(plain.wi)
  scaled.wo.assign(plain.wo)
  x = tf.constant(np.random.default_rng(2).normal(size=(2, 4, 3)),
                  tf.float32)
  want = np.maximum(x.numpy() @ plain.wi.numpy(), 0) @ plain.wo.numpy()
  np.testing.assert_allclose(scaled(x).numpy(), 0.125 * want, rtol=1e-5,
                             atol=1e-6)
  grads = []
  for ffn in (plain, scaled):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(ffn(x) * x)
    grads.append(tape.gradient(loss, [ffn.wi, ffn.wo]))
  for g_plain, g_scaled in zip(*grads):
    np.testing.assert_allclose(g_scaled.numpy(), 0.125 * g_plain.numpy(),
                               rtol=1e-5, atol=1e-7)


def test_ffn_output_scale_is_validated_and_reaches_the_dense_layers():
  with pytest.raises(ValueError, match="ffn_output_scale"):
    config_lib.ModelConfig(ffn_output_scale=0.0)
  cfg = config_lib.ModelConfig(ffn_output_scale=0.25, num_encoder_layers=1,
                               num_decoder_layers=1)
  model = transformer.Transformer(config=cfg)
  ffns = [m for m in model.submodules if isinstance(m, layers.DenseFfn)]
  assert len(ffns) == 2 and all(f.output_scale == 0.25 for f in ffns)


def test_embedding_lookup_scale_and_tied_logits():
  emb = layers.Embedding(vocab_size=7, d_model=4, init_scale=1.0)
  table = emb.embeddings.numpy()
  ids = tf.constant([[0, 6, 3]])
  np.testing.assert_allclose(emb(ids, dtype=tf.float32).numpy()[0],
                             table[[0, 6, 3]] * 2.0, rtol=1e-6)
  x = np.ones((1, 2, 4), np.float32)
  logits = emb.attend(tf.constant(x, tf.bfloat16))
  assert logits.dtype == tf.float32
  np.testing.assert_allclose(logits.numpy(), x @ table.T, rtol=1e-5)
  proj = layers.OutputProjection(d_model=4, vocab_size=7, init_scale=1.0)
  np.testing.assert_allclose(proj(tf.constant(x)).numpy(),
                             x @ proj.kernel.numpy(), rtol=1e-5)
