"""Tests for m4moe.model.transformer: packing, padding, causality, cached decoding."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from m4moe.cost import model as cost
from m4moe.model import losses
from m4moe.config import ModelConfig, MoeConfig
from m4moe.model.transformer import (DecoderCache, EncoderOutput, ModelOutput,
                         Transformer, shift_right)

SEED = tf.constant([7, 11], tf.int32)

SOURCES = [[5, 6, 7, 8, 1], [9, 10, 1], [11, 12, 13, 1]]
TARGETS = [[20, 21, 22, 1], [23, 24, 25, 26, 27, 1], [28, 1]]


def tiny_config(*, moe: bool = False, **overrides) -> ModelConfig:
  values = dict(src_vocab_size=50, tgt_vocab_size=40, d_model=16,
                num_heads=2, d_kv=8, d_ff=32, num_encoder_layers=2,
                num_decoder_layers=2, dropout_rate=0.0,
                attention_dropout_rate=0.0, max_length=32)
  values.update(overrides)
  if moe:
    values["moe"] = MoeConfig(num_experts=4, expert_hidden_dim=16,
                              group_size=8, train_capacity_factor=2.0,
                              eval_capacity_factor=0.0)
  return ModelConfig(**values)


def build(config: ModelConfig, seed: int = 0, **kwargs) -> Transformer:
  tf.random.set_seed(seed)
  return Transformer(config=config, **kwargs)


def padded(rows, length):
  return tf.constant([row + [0] * (length - len(row)) for row in rows],
                     tf.int32)


def unpacked_batch(length_in=8, length_tgt=8):
  return {"inputs": padded(SOURCES, length_in),
          "targets": padded(TARGETS, length_tgt)}


def _pack(rows, length):
  ids, segs, pos = [], [], []
  for k, row in enumerate(rows):
    ids += row
    segs += [k + 1] * len(row)
    pos += list(range(len(row)))
  pad = [0] * (length - len(ids))
  return [tf.constant([x + pad], tf.int32) for x in (ids, segs, pos)]


def packed_batch():
  inputs, in_seg, in_pos = _pack(SOURCES, 14)
  targets, tgt_seg, tgt_pos = _pack(TARGETS, 14)
  return {"inputs": inputs, "inputs_segment_ids": in_seg,
          "inputs_positions": in_pos, "targets": targets,
          "targets_segment_ids": tgt_seg, "targets_positions": tgt_pos}


MODEL_KINDS = [False, True]


def test_shift_right_restarts_in_every_segment():
  targets = tf.constant([[3, 4, 1, 5, 1, 0]])
  segments = tf.constant([[1, 1, 1, 2, 2, 0]])
  np.testing.assert_array_equal(shift_right(targets).numpy(),
                                [[0, 3, 4, 1, 5, 1]])
  np.testing.assert_array_equal(shift_right(targets, segment_ids=segments).numpy(),
                                [[0, 3, 4, 0, 5, 0]])


@pytest.mark.parametrize("moe", MODEL_KINDS)
def test_packed_row_equals_separate_rows(moe):
  model = build(tiny_config(moe=moe))
  separate = model(unpacked_batch(), training=False).logits.numpy()
  packed = model(packed_batch(), training=False).logits.numpy()[0]
  start = 0
  for k, row in enumerate(TARGETS):
    np.testing.assert_allclose(packed[start:start + len(row)],
                               separate[k, :len(row)], rtol=1e-5, atol=1e-5)
    start += len(row)


@pytest.mark.parametrize("moe", MODEL_KINDS)
def test_padding_does_not_change_real_positions(moe):
  model = build(tiny_config(moe=moe))
  short = model(unpacked_batch(6, 6), training=False)
  long = model(unpacked_batch(11, 9), training=False)
  for k, row in enumerate(TARGETS):
    np.testing.assert_allclose(long.logits.numpy()[k, :len(row)],
                               short.logits.numpy()[k, :len(row)],
                               rtol=1e-5, atol=1e-5)
  if moe:
    np.testing.assert_allclose(long.aux_loss.numpy(), short.aux_loss.numpy(),
                               rtol=1e-5)


@pytest.mark.parametrize("moe", MODEL_KINDS)
def test_padding_does_not_change_training_loss_or_gradients(moe):
  config = tiny_config(moe=moe)
  if moe:
    config = dataclasses.replace(config, moe=dataclasses.replace(
        config.moe, second_expert_policy="all"))
  model = build(config)

  def loss_and_grads(batch):
    with tf.GradientTape() as tape:
      out = model(batch, training=True, seed=SEED)
      loss_sum, _ = losses.token_cross_entropy(out.logits, batch["targets"])
      total = loss_sum + out.moe_loss
    return total.numpy(), tape.gradient(total, model.trainable_variables)

  short_loss, short_grads = loss_and_grads(unpacked_batch(6, 6))
  long_loss, long_grads = loss_and_grads(unpacked_batch(12, 10))
  np.testing.assert_allclose(long_loss, short_loss, rtol=1e-5)
  for var, a, b in zip(model.trainable_variables, short_grads, long_grads):
    np.testing.assert_allclose(tf.convert_to_tensor(b).numpy(),
                               tf.convert_to_tensor(a).numpy(),
                               rtol=1e-4, atol=1e-6, err_msg=var.name)


def test_decoder_is_causal():
  model = build(tiny_config())
  batch = unpacked_batch()
  changed = dict(batch)
  changed["targets"] = tf.tensor_scatter_nd_update(
      batch["targets"], [[1, 3]], [33])
  a = model(batch, training=False).logits.numpy()
  b = model(changed, training=False).logits.numpy()
  # Logits at t depend on targets[:t]: positions 0..3 cannot see targets[3].
  np.testing.assert_array_equal(a[:, :4], b[:, :4])
  assert not np.allclose(a[1, 4], b[1, 4])
  np.testing.assert_array_equal(a[[0, 2]], b[[0, 2]])


def test_encoder_sees_the_whole_source():
  model = build(tiny_config())
  batch = unpacked_batch()
  changed = dict(batch)
  changed["inputs"] = tf.tensor_scatter_nd_update(batch["inputs"], [[0, 3]],
                                                  [40])
  a = model(batch, training=False).logits.numpy()
  b = model(changed, training=False).logits.numpy()
  assert not np.allclose(a[0, 0], b[0, 0])
  np.testing.assert_array_equal(a[1:], b[1:])


def _teacher_forced_by_steps(model, inputs, targets, max_length, *,
                             compiled):
  """Runs decode_step over all positions, in a tf.function while loop or
  eagerly."""

  def run(inputs, targets):
    enc = model.encode(inputs)
    length = targets.shape[1]
    cache = model.init_cache(batch_size=inputs.shape[0], max_length=max_length)
    decoder_inputs = shift_right(targets)
    out = tf.TensorArray(tf.float32, size=length)

    def body(t, cache, out):
      logits, cache = model.decode_step(
          encoder_output=enc, token_ids=decoder_inputs[:, t], cache=cache,
          step=t)
      return t + 1, cache, out.write(t, logits)

    _, cache, out = tf.while_loop(lambda t, *_: t < length, body,
                                  (tf.constant(0), cache, out))
    return tf.transpose(out.stack(), [1, 0, 2]), cache

  return (tf.function(run) if compiled else run)(inputs, targets)


@pytest.mark.parametrize("moe", MODEL_KINDS)
def test_cached_decoding_equals_teacher_forcing(moe):
  model = build(tiny_config(moe=moe))
  batch = unpacked_batch(8, 7)
  full = model(batch, training=False).logits.numpy()
  stepped, cache = _teacher_forced_by_steps(
      model, batch["inputs"], batch["targets"], max_length=10, compiled=moe)
  assert isinstance(cache, DecoderCache)
  assert cache.keys[0].shape == (3, 10, 2, 8)
  for k, row in enumerate(TARGETS):
    np.testing.assert_allclose(stepped.numpy()[k, :len(row)],
                               full[k, :len(row)], rtol=1e-5, atol=1e-5)


def test_caches_tile_along_batch_for_beam_search():
  model = build(tiny_config())
  batch = unpacked_batch()
  enc = model.encode(batch["inputs"])
  cache = model.init_cache(batch_size=3, max_length=5)
  tokens = tf.constant([0, 0, 0])
  logits, cache = model.decode_step(encoder_output=enc, token_ids=tokens,
                                    cache=cache, step=tf.constant(0))

  def tile(t):
    return tf.repeat(t, 2, axis=0)

  tiled_enc = tf.nest.map_structure(tile, enc)
  tiled_cache = tf.nest.map_structure(tile, cache)
  assert isinstance(tiled_enc, EncoderOutput)
  assert isinstance(tiled_cache, DecoderCache)
  next_tokens = tf.constant([3, 4, 5])
  want, _ = model.decode_step(encoder_output=enc, token_ids=next_tokens,
                              cache=cache, step=tf.constant(1))
  got, _ = model.decode_step(encoder_output=tiled_enc,
                             token_ids=tile(next_tokens), cache=tiled_cache,
                             step=tf.constant(1))
  np.testing.assert_allclose(got.numpy(), tile(want).numpy(), rtol=1e-6,
                             atol=1e-6)
  assert logits.shape == (3, 40)


def test_dropout_is_seeded_and_required():
  model = build(tiny_config(dropout_rate=0.2, attention_dropout_rate=0.1))
  batch = unpacked_batch()
  with pytest.raises(ValueError,
                     match=r"--dropout_rate=0.2.*seed=<int32>\[2\]"):
    model(batch, training=True)
  a = model(batch, training=True, seed=SEED).logits.numpy()
  b = model(batch, training=True, seed=SEED).logits.numpy()
  c = model(batch, training=True, seed=SEED + 1).logits.numpy()
  d = model(batch, training=False).logits.numpy()
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, c)
  assert not np.allclose(a, d)


@pytest.mark.parametrize("moe", MODEL_KINDS)
def test_every_variable_gets_a_gradient(moe):
  model = build(tiny_config(moe=moe, dropout_rate=0.1))
  batch = unpacked_batch()
  with tf.GradientTape() as tape:
    out = model(batch, training=True, seed=SEED)
    loss = losses.mean_token_cross_entropy(out.logits, batch["targets"])
    loss += out.moe_loss
  grads = tape.gradient(loss, model.trainable_variables)
  for var, grad in zip(model.trainable_variables, grads):
    assert grad is not None, var.name
    assert np.abs(tf.convert_to_tensor(grad).numpy()).max() > 0, var.name


@pytest.mark.parametrize("share,moe", [(False, False), (True, False),
                                       (False, True)])
def test_parameter_count_matches_cost_model(share, moe):
  config = tiny_config(moe=moe)
  model = build(config, share_target_embedding=share)
  count = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
  assert count == cost.num_params(config, share_target_embedding=share)
  assert (model.output_projection is None) == share


def test_tied_softmax_uses_target_embedding():
  model = build(tiny_config(), share_target_embedding=True)
  batch = unpacked_batch()
  before = model(batch, training=False).logits.numpy()
  model.target_embedding.embeddings.assign(
      model.target_embedding.embeddings * 2.0)
  after = model(batch, training=False).logits.numpy()
  assert not np.allclose(before, after)


@pytest.mark.parametrize("moe", MODEL_KINDS)
def test_bfloat16_activations_stay_close_to_float32(moe):
  f32 = build(tiny_config(moe=moe))
  bf16 = build(tiny_config(moe=moe, activation_dtype="bfloat16"))
  for a, b in zip(f32.trainable_variables, bf16.trainable_variables):
    b.assign(a)
    assert b.dtype == tf.float32
  batch = unpacked_batch()
  want = f32(batch, training=False).logits.numpy()
  out = bf16(batch, training=False)
  assert out.logits.dtype == tf.float32
  got = out.logits.numpy()
  mask = batch["targets"].numpy() != 0
  error = np.abs(got - want)[mask].max()
  assert error < 0.05 * np.abs(want[mask]).max(), error
  loss_f32 = losses.mean_token_cross_entropy(want, batch["targets"])
  loss_bf16 = losses.mean_token_cross_entropy(got, batch["targets"])
  np.testing.assert_allclose(loss_bf16.numpy(), loss_f32.numpy(), rtol=1e-2)
  enc = bf16.encode(batch["inputs"])
  assert enc.encoded.dtype == tf.bfloat16
  logits, cache = bf16.decode_step(
      encoder_output=enc, token_ids=tf.zeros([3], tf.int32),
      cache=bf16.init_cache(batch_size=3, max_length=4), step=tf.constant(0))
  assert logits.dtype == tf.float32 and cache.keys[0].dtype == tf.bfloat16
  # The cached single step and the full-sequence pass sum in other orders:
  # both are bfloat16 (8 significant bits), so they agree to bfloat16
  # precision, the bound of the float32 comparison above (oneDNN's bfloat16
  # kernels differ between CPUs: 0.033 of max |logit| 2.0 was seen on one).
  step_error = np.abs(logits.numpy() - got[:, 0]).max()
  assert step_error < 0.05 * np.abs(got[:, 0]).max(), step_error


def test_bad_batches_and_arguments_fail_clearly():
  model = build(tiny_config())
  batch = unpacked_batch()
  with pytest.raises(ValueError, match="no 'targets' key"):
    model({"inputs": batch["inputs"]}, training=False)
  half_packed = dict(batch, inputs_segment_ids=tf.ones([3, 8], tf.int32))
  with pytest.raises(ValueError, match="inputs_positions"):
    model(half_packed, training=False)
  with pytest.raises(ValueError, match=r"length 33 > --max_length=32"):
    model(unpacked_batch(33, 8), training=False)
  with pytest.raises(ValueError, match="must be int32"):
    model({"inputs": tf.zeros([3, 8]), "targets": batch["targets"]},
          training=False)
  with pytest.raises(ValueError, match=r"\[1, --max_length=32\]"):
    model.init_cache(batch_size=2, max_length=64)


def test_dense_model_has_no_moe_outputs():
  out = build(tiny_config())(unpacked_batch(), training=False)
  assert dict(out.moe_stats) == {}
  assert out.moe_loss.numpy() == 0.0 and out.aux_loss.numpy() == 0.0


def test_moe_losses_and_stats_per_layer():
  config = tiny_config(moe=True)
  model = build(config)
  with pytest.raises(ValueError, match=r"MoE --router=top2.*needs seed="):
    model(unpacked_batch(), training=True)
  out = model(unpacked_batch(), training=True, seed=SEED)
  assert sorted(out.moe_stats) == ["decoder/layer_1/moe",
                                   "encoder/layer_1/moe"]
  assert out.aux_loss.numpy() > 0
  np.testing.assert_allclose(
      out.moe_loss.numpy(),
      config.moe.aux_loss_weight * out.aux_loss.numpy()
      + config.moe.z_loss_weight * out.z_loss.numpy(), rtol=1e-5)


def test_expert_choice_is_rejected_in_the_decoder():
  config = dataclasses.replace(tiny_config(), moe=MoeConfig(
      num_experts=4, expert_hidden_dim=16, router="expert_choice"))
  with pytest.raises(ValueError, match="expert_choice"):
    Transformer(config=config)


def test_tiny_moe_model_overfits_a_fixed_batch():
  model = build(tiny_config(moe=True, d_model=32, d_kv=16))
  batch = unpacked_batch()
  optimizer_vars = model.trainable_variables
  adam = _Adam(optimizer_vars, learning_rate=1e-2)

  @tf.function
  def train_step(step):
    seed = tf.random.experimental.stateless_fold_in(SEED, step)
    with tf.GradientTape() as tape:
      out = model(batch, training=True, seed=seed)
      loss = losses.mean_token_cross_entropy(out.logits, batch["targets"])
      total = loss + out.moe_loss
    adam.apply(tape.gradient(total, optimizer_vars))
    return loss, out

  history = []
  for step in range(60):
    loss, out = train_step(tf.constant(step))
    history.append(float(loss))
  assert history[-1] < 0.2 * history[0], (history[0], history[-1])
  # ModelOutput (with its RouterStats) can be returned from a tf.function.
  assert isinstance(out, ModelOutput)
  assert sorted(out.moe_stats) == ["decoder/layer_1/moe", "encoder/layer_1/moe"]
  assert np.isfinite(out.moe_loss.numpy()) and out.moe_loss.numpy() > 0


class _Adam:
  """Plain Adam over tf.Variables (the project optimizer is Adafactor)."""

  def __init__(self, variables, *, learning_rate: float):
    self.variables = variables
    self.learning_rate = learning_rate
    self.t = tf.Variable(0.0)
    self.m = [tf.Variable(tf.zeros_like(v)) for v in variables]
    self.v = [tf.Variable(tf.zeros_like(v)) for v in variables]

  def apply(self, grads):
    self.t.assign_add(1.0)
    correction = tf.sqrt(1 - 0.999 ** self.t) / (1 - 0.9 ** self.t)
    for var, grad, m, v in zip(self.variables, grads, self.m, self.v):
      grad = tf.convert_to_tensor(grad)
      m.assign(0.9 * m + 0.1 * grad)
      v.assign(0.999 * v + 0.001 * tf.square(grad))
      var.assign_sub(self.learning_rate * correction * m /
                     (tf.sqrt(v) + 1e-8))
