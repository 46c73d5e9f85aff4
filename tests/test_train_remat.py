"""Per-layer rematerialisation of the real Transformer gives the same update."""

import numpy as np
import tensorflow as tf

from m4moe import config as config_lib
from m4moe import model as model_lib
from m4moe import optimizer as optimizer_lib
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


def test_remat_gives_the_same_update():
  config = _config()
  tf.random.set_seed(0)
  plain = model_lib.Transformer(config=config)
  tf.random.set_seed(0)
  rematted = model_lib.Transformer(config=config)
  names = [v.name for v in rematted.trainable_variables]
  assert remat.apply_remat(rematted) == 4
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
