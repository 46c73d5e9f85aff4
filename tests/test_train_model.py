"""Training the real (small) MoE Transformer: dev CE falls well below the
unigram baseline."""


import pytest

from m4moe import config as config_lib
from m4moe.model import transformer as model_lib
from m4moe.training import optimizer as optimizer_lib
from m4moe.training import loop as train_lib
from m4moe.training import synthetic

VOCAB = 48


def _config(**overrides):
  values = dict(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=32,
                num_heads=2, d_kv=16, d_ff=64, num_encoder_layers=2,
                num_decoder_layers=2, dropout_rate=0.1,
                attention_dropout_rate=0.1, max_length=16,
                moe=config_lib.MoeConfig(num_experts=4, expert_hidden_dim=32,
                                         group_size=64))
  values.update(overrides)
  return config_lib.ModelConfig(**values)


@pytest.mark.slow
def test_small_moe_transformer_learns_well_below_unigram(tmp_path):
  pairs = synthetic.synthetic_pairs(num_pairs=2048, vocab_size=VOCAB,
                                    max_length=7, reverse=False)
  config = _config(dropout_rate=0.0, attention_dropout_rate=0.0)
  result = train_lib.train(
      model_fn=lambda: model_lib.Transformer(config=config),
      train_dataset=synthetic.pairs_dataset(pairs[128:], batch_size=32,
                                            length=8, shuffle_seed=0),
      dev_datasets={"syn": synthetic.pairs_dataset(
          pairs[:128], batch_size=64, length=8, shuffle_seed=None,
          repeat=False)},
      model_config=config,
      config=train_lib.TrainConfig(
          model_dir=str(tmp_path), train_steps=150, log_every=50,
          checkpoint_every=1000,
          # A constant rate of 1/sqrt(400) = 0.05 (relative step size).
          optimizer=optimizer_lib.AdafactorConfig(warmup_steps=400)))
  unigram = synthetic.unigram_cross_entropy(pairs)
  assert result.dev_ce["syn"] < 0.5 * unigram, (result.dev_ce, unigram)
