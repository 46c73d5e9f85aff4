"""Per-layer rematerialisation of the real Transformer gives the same update."""

import numpy as np
import pytest
import tensorflow as tf

from m4moe import config as config_lib
from m4moe.model import transformer as model_lib
from m4moe.training import optimizer as optimizer_lib
from m4moe.training import synthetic
from m4moe.training import remat
from m4moe.training import step as step_lib

VOCAB = 48


def _config():
  return config_lib.ModelConfig(
      src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=32, num_heads=2,
      d_kv=16, d_ff=64, num_encoder_layers=2, num_decoder_layers=2,
      dropout_rate=0.1, attention_dropout_rate=0.1, max_length=16,
      moe=config_lib.MoeConfig(num_experts=4, expert_hidden_dim=32,
                               group_size=64))


def _runner(model):
  variables = list(model.trainable_variables)
  optimizer = optimizer_lib.Adafactor(optimizer_lib.AdafactorConfig())
  optimizer.build(variables)
  return step_lib.StepRunner(model=model, optimizer=optimizer,
                             variables=variables,
                             strategy=tf.distribute.get_strategy(),
                             label_smoothing=0.1)


def _layers(model):
  return [*model.encoder_layers, *model.decoder_layers]


@pytest.mark.slow
def test_remat_gives_the_same_update():
  config = _config()
  tf.random.set_seed(0)
  plain = model_lib.Transformer(config=config)
  tf.random.set_seed(0)
  rematted = model_lib.Transformer(config=config)
  names = [v.name for v in rematted.trainable_variables]
  classes = [type(layer) for layer in _layers(rematted)]
  assert not any(layer.remat for layer in _layers(rematted))
  assert remat.apply_remat(rematted) == 4
  assert all(layer.remat for layer in _layers(rematted))
  # An option, not a class swap: same classes, same variables.
  assert [type(layer) for layer in _layers(rematted)] == classes
  assert [v.name for v in rematted.trainable_variables] == names
  pairs = synthetic.synthetic_pairs(num_pairs=16, vocab_size=VOCAB)
  batch = next(iter(synthetic.pairs_dataset(pairs, batch_size=16, length=10,
                                            shuffle_seed=None)))
  seed = tf.constant([5, 0], tf.int32)
  results = [_runner(m).train_step([batch], seed=seed)
             for m in (plain, rematted)]
  assert results[0].applied and results[1].applied
  np.testing.assert_allclose(results[0].ce_sum, results[1].ce_sum, rtol=1e-6)
  np.testing.assert_allclose(results[0].grad_norm, results[1].grad_norm,
                             rtol=1e-5)
  for a, b in zip(plain.trainable_variables, rematted.trainable_variables):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6,
                               err_msg=a.name)


def test_constructor_option_sets_every_layer():
  tf.random.set_seed(0)
  model = model_lib.Transformer(config=_config(), remat=True)
  assert [layer.remat for layer in _layers(model)] == [True] * 4
  assert all(remat.supports_remat(layer) for layer in _layers(model))


class _CountingLayer(tf.Module):
  """y = tanh(x w) * scale, counting how often the body runs."""

  def __init__(self, *, remat_on):
    super().__init__()
    self.remat = remat_on
    self.w = tf.Variable([[0.5, -1.0], [2.0, 0.25]])
    self.runs = 0

  @remat.rematerializable
  def __call__(self, x, *, scale, training):
    del training
    self.runs += 1
    return tf.tanh(x @ self.w) * scale


@pytest.mark.parametrize("remat_on, runs", [(False, 1), (True, 2)])
def test_option_recomputes_the_body_in_the_backward_pass(remat_on, runs):
  layer = _CountingLayer(remat_on=remat_on)
  x = tf.constant([[1.0, 2.0], [-0.5, 0.3]])
  scale = tf.constant(3.0)
  with tf.GradientTape() as tape:
    tape.watch([x, scale])
    y = layer(x, scale=scale, training=True)
    loss = tf.reduce_sum(y * y)
  grads = tape.gradient(loss, [x, scale, layer.w])
  assert layer.runs == runs  # forward, plus the recomputation with remat
  # The float keyword argument is differentiated too; values are exact.
  h = np.tanh(x.numpy() @ layer.w.numpy())
  np.testing.assert_allclose(grads[1], np.sum(2 * h * h * 3.0), rtol=1e-6)
  np.testing.assert_allclose(y, h * 3.0, rtol=1e-6)


def test_apply_remat_rejects_layers_without_the_option():
  class Plain(tf.Module):

    def __call__(self, x):
      return x

  class Model(tf.Module):

    def __init__(self, layers):
      super().__init__()
      self.encoder_layers = layers

  with pytest.raises(ValueError, match="Plain in Model.encoder_layers has no "
                     "remat option"):
    remat.apply_remat(Model([Plain()]))
  with pytest.raises(ValueError, match="--remat needs a model with "
                     "encoder_layers / decoder_layers"):
    remat.apply_remat(Model([]))
