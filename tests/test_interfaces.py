"""The typed team contract: the models satisfy the Protocols, and the batch
keys are what the pipeline produces and the step runner passes on."""

import inspect

import numpy as np
import pytest
import tensorflow as tf

from m4moe import config as config_lib
from m4moe.model import interfaces
from m4moe.model import transformer as model_lib
from m4moe.data import packing
from m4moe.training import synthetic
import toy_model
from m4moe.training import step as step_lib

_METHODS = {
    interfaces.TrainableModel: ("__call__",),
    interfaces.TranslationModel: ("__call__", "encode", "init_cache",
                                  "decode_step"),
}


def _transformer():
  tf.random.set_seed(0)
  return model_lib.Transformer(config=config_lib.ModelConfig(
      src_vocab_size=16, tgt_vocab_size=16, d_model=8, num_heads=2, d_kv=4,
      d_ff=16, num_encoder_layers=2, num_decoder_layers=2, max_length=8,
      moe=config_lib.MoeConfig(num_experts=2, expert_hidden_dim=8,
                               group_size=8)))


def _parameters(fn):
  """(name, kind, has default) of every parameter but ``self``."""
  return [(p.name, p.kind, p.default is not inspect.Parameter.empty)
          for p in inspect.signature(fn).parameters.values()
          if p.name != "self"]


def _check_signatures(model, protocol):
  for name in _METHODS[protocol]:
    assert (_parameters(getattr(type(model), name)) ==
            _parameters(getattr(protocol, name))), name


def test_transformer_is_a_translation_model():
  model = _transformer()
  assert isinstance(model, interfaces.TranslationModel)
  assert isinstance(model, interfaces.TrainableModel)
  _check_signatures(model, interfaces.TranslationModel)
  batch = {"inputs": tf.constant([[3, 4, 1, 0]]),
           "targets": tf.constant([[5, 1, 0]])}
  assert isinstance(model(batch, training=False), interfaces.ModelOutputLike)


def test_toy_translator_is_trainable_but_does_not_decode():
  toy = toy_model.ToyTranslator()
  assert isinstance(toy, interfaces.TrainableModel)
  assert not isinstance(toy, interfaces.TranslationModel)
  _check_signatures(toy, interfaces.TrainableModel)
  batch = next(iter(synthetic.synthetic_parallel_dataset(batch_size=2)))
  assert isinstance(toy(batch, training=False), interfaces.ModelOutputLike)


def test_protocols_reject_an_object_without_the_methods():
  class EncodeOnly:

    def __call__(self, batch, *, training, seed=None):
      return None

    def encode(self, inputs):
      return inputs

  assert isinstance(EncodeOnly(), interfaces.TrainableModel)
  assert not isinstance(EncodeOnly(), interfaces.TranslationModel)
  assert not isinstance(object(), interfaces.TrainableModel)


def test_batch_keys_are_what_the_pipeline_produces():
  assert interfaces.MODEL_KEYS == step_lib.MODEL_KEYS
  assert interfaces.REQUIRED_MODEL_KEYS == ("inputs", "targets")
  # The training pipeline's elements are dict(zip(packing.FEATURES, ...)).
  # (plus LANGUAGE_FEATURES for --route_by=language).
  assert sorted(packing.FEATURES + packing.LANGUAGE_FEATURES) == sorted(
      interfaces.MODEL_KEYS)
  packed = packing.pack_pairs([[5, 6, 1], [7, 1]], [[8, 1], [9, 9, 1]],
                              length=8, languages=[0, 1])
  assert sorted(packed) == sorted(interfaces.MODEL_KEYS)
  # Unpacked fixture batches carry the required keys only.
  element = synthetic.synthetic_parallel_dataset(batch_size=2).element_spec
  assert sorted(element) == sorted(interfaces.REQUIRED_MODEL_KEYS)


@pytest.mark.parametrize("extra", ["lang", "source_text"])
def test_step_runner_passes_only_the_model_keys(extra):
  batch = {"inputs": tf.zeros([1, 2], tf.int32),
           "targets": tf.zeros([1, 2], tf.int32),
           "targets_segment_ids": tf.zeros([1, 2], tf.int32),
           extra: tf.constant(["x"])}
  features = step_lib.model_features(batch)
  assert sorted(features) == ["inputs", "targets", "targets_segment_ids"]
  np.testing.assert_array_equal(features["inputs"], batch["inputs"])
