"""--route_by=language: language routing, its batches and its validation."""

import json

from absl import flags as absl_flags
import numpy as np
import pytest
import tensorflow as tf

from m4moe import config as config_lib
from m4moe.inference import beam_search as decoding
from m4moe.inference import extraction
from m4moe.model import transformer as model_lib
from m4moe.moe import routing
from m4moe.moe import task_routing
from m4moe.config import ConfigError
from m4moe.data import packing
from m4moe.moe.layer import MoeLayer

LANGUAGES = ("de", "fr", "ja")


def _config(**moe_overrides) -> config_lib.ModelConfig:
  moe = dict(num_experts=4, expert_hidden_dim=16, group_size=64,
             route_by="language", routing_languages=LANGUAGES,
             second_expert_policy="all", train_capacity_factor=4.0)
  moe.update(moe_overrides)
  return config_lib.ModelConfig(
      src_vocab_size=40, tgt_vocab_size=40, d_model=16, num_heads=2, d_kv=8,
      d_ff=32, num_encoder_layers=2, num_decoder_layers=2, dropout_rate=0.0,
      attention_dropout_rate=0.0, max_length=16,
      moe=config_lib.MoeConfig(**moe))


def _expected(layer: MoeLayer, x: np.ndarray, language: int) -> np.ndarray:
  """sum_k w_k FFN_{e_k}(x) with the language's experts, in numpy."""
  experts, weights = extraction.language_route(layer, index=language)
  wi, wo = layer.experts.wi.numpy(), layer.experts.wo.numpy()
  return sum(w * np.maximum(x @ wi[e], 0) @ wo[e]
             for e, w in zip(experts, weights))


@pytest.mark.parametrize("router,training", [
    ("top2", False), ("top2", True), ("top1", False), ("top1", True),
    ("noisy_topk", False)])
def test_every_token_of_a_sentence_gets_its_languages_experts(router,
                                                              training):
  tf.random.set_seed(0)
  config = _config(router=router, num_selected_experts=2)
  layer = MoeLayer(config=config, causal=False)
  # Make the gate decisive and different per language.
  layer.router.wg.assign(tf.random.normal([3, 4], stddev=3.0, seed=1))
  x = np.random.default_rng(0).normal(size=(3, 5, 16)).astype(np.float32)
  mask = np.ones((3, 5), np.float32)
  mask[1, 3:] = 0
  languages = np.array([[2] * 5, [0] * 5, [2] * 5], np.int32)
  out = layer(tf.constant(x), padding_mask=tf.constant(mask),
              training=training, seed=tf.constant([3, 4]),
              languages=tf.constant(languages)).outputs.numpy()
  for b in range(3):
    for t in range(5):
      if mask[b, t]:
        np.testing.assert_allclose(
            out[b, t], _expected(layer, x[b, t], languages[b, t]),
            rtol=1e-5, atol=1e-5)
      else:
        np.testing.assert_array_equal(out[b, t], 0.0)


def test_router_choices_depend_on_the_language_only():
  config = _config()
  router = routing.make_router(config)
  assert tuple(router.wg.shape) == (3, 4)  # the per-language gate
  languages = tf.constant([[0, 1, 2, 1, 0, 2, 2, 1]])
  result = router(task_routing.one_hot_languages(languages, num_languages=3),
                  padding_mask=tf.ones([1, 8]), capacity=8, training=False)
  choices = result.expert_index.numpy()[0]
  weights = result.combine_weights.numpy()[0]
  for lang in range(3):
    rows = np.flatnonzero(languages.numpy()[0] == lang)
    assert (choices[rows] == choices[rows[0]]).all()
    np.testing.assert_array_equal(weights[rows], weights[rows[:1]].repeat(
        len(rows), axis=0))


def test_capacity_and_aux_loss_still_apply_in_training():
  # Four tokens of one language, top1, C = ceil(1.0 * 1 * 4 / 4) = 1: the
  # language's expert takes one token and drops three; the aux loss of a
  # single expert taking everything is E * 1 * P_e > 1.
  config = _config(router="top1", train_capacity_factor=1.0)
  layer = MoeLayer(config=config, causal=False)
  out = layer(tf.ones([1, 4, 16]), padding_mask=tf.ones([1, 4]),
              training=True, languages=tf.zeros([1, 4], tf.int32))
  np.testing.assert_allclose(out.stats.dropped_first, 0.75)
  assert float(out.aux_loss) > 1.0
  assert np.count_nonzero(np.abs(out.outputs.numpy()).sum(-1)) == 1


def _batch(languages, *, seed=0):
  rng = np.random.default_rng(seed)
  inputs = rng.integers(2, 40, size=(len(languages), 7)).astype(np.int32)
  targets = rng.integers(2, 40, size=(len(languages), 6)).astype(np.int32)
  inputs[:, -1], targets[:, -1] = 1, 1
  inputs, targets = tf.constant(inputs), tf.constant(targets)
  return {"inputs": inputs, "targets": targets,
          **task_routing.language_features(tf.constant(languages),
                                           inputs=inputs, targets=targets)}


def _loss(model, batch, **kwargs):
  out = model(batch, **kwargs)
  ce = tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=batch["targets"], logits=out.logits)
  return tf.reduce_mean(ce) + out.moe_loss


def test_gradients_reach_exactly_the_gate_rows_of_the_batchs_languages():
  tf.random.set_seed(1)
  model = model_lib.Transformer(config=_config())
  batch = _batch([0, 2, 0, 2])  # no "fr" (row 1)
  with tf.GradientTape() as tape:
    loss = _loss(model, batch, training=True, seed=tf.constant([1, 2]))
  gates = [layer.ffn.router.wg for layer in
           [*model.encoder_layers, *model.decoder_layers] if layer.is_moe]
  assert len(gates) == 2
  for grad in tape.gradient(loss, gates):
    norms = np.linalg.norm(grad.numpy(), axis=1)
    assert norms[0] > 0 and norms[2] > 0
    assert norms[1] == 0


@pytest.mark.slow
def test_training_loss_decreases_on_a_tiny_fixture():
  tf.random.set_seed(2)
  model = model_lib.Transformer(config=_config())
  batch = _batch([0, 1, 2, 0, 1, 2], seed=3)
  optimizer = tf.keras.optimizers.Adam(2e-2)

  def step(i):
    with tf.GradientTape() as tape:
      loss = _loss(model, batch, training=True, seed=tf.constant([7, i]))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  losses = [float(step(i)) for i in range(25)]
  assert np.isfinite(losses).all()
  assert losses[-1] < 0.5 * losses[0], losses


def test_decoding_routes_by_the_rows_language_and_is_batch_invariant():
  tf.random.set_seed(3)
  model = model_lib.Transformer(config=_config())
  batch = _batch([0, 2, 1])
  beam = decoding.BeamSearchConfig(beam_size=2, max_decode_length=6)
  together = decoding.translate_ids(model, batch["inputs"], config=beam,
                                    languages=tf.constant([0, 2, 1]))
  for row, lang in enumerate([0, 2, 1]):
    alone = decoding.translate_ids(model, batch["inputs"][row:row + 1],
                                   config=beam,
                                   languages=tf.constant([lang]))
    np.testing.assert_array_equal(alone.sequences[0],
                                  together.sequences[row])
  # Cached decoding equals the teacher-forced pass routed per sentence.
  out = model(batch, training=False, per_sentence_routing=True)
  encoded = model.encode(batch["inputs"], languages=tf.constant([0, 2, 1]))
  cache = model.init_cache(batch_size=3, max_length=6)
  logits, _ = model.decode_step(encoder_output=encoded,
                                token_ids=tf.zeros([3], tf.int32),
                                cache=cache, step=0)
  np.testing.assert_allclose(logits, out.logits[:, 0], rtol=1e-5, atol=1e-5)


def test_missing_languages_are_refused():
  model = model_lib.Transformer(config=_config())
  batch = _batch([0])
  with pytest.raises(ValueError, match="batch has no inputs_languages"):
    model({"inputs": batch["inputs"], "targets": batch["targets"]},
          training=False)
  with pytest.raises(ValueError, match=r"encode\(\) needs languages"):
    model.encode(batch["inputs"])
  layer = MoeLayer(config=_config(), causal=False)
  with pytest.raises(ValueError, match="needs languages=<int32>"):
    layer(tf.ones([1, 2, 16]), padding_mask=tf.ones([1, 2]), training=False)


@pytest.mark.parametrize("overrides,match", [
    ({"router": "expert_choice"}, r"--route_by='language' is invalid.*"
     "token-choice --router"),
    ({"eval_capacity_factor": 1.0}, r"--eval_capacity_factor=1.0 is invalid"
     r".*--eval_capacity_factor=0"),
    ({"routing_languages": ("de", "de")}, "repeated: de"),
    ({"routing_languages": ("de", "")}, "non-empty language codes"),
    ({"route_by": "sentence"}, "choose one of token, language"),
])
def test_config_validation(overrides, match):
  with pytest.raises(ConfigError, match=match):
    _config(**overrides)


def test_language_routing_needs_languages_and_known_ones():
  config = _config(routing_languages=())  # valid: m4moe-train fills it in
  with pytest.raises(ConfigError, match="needs the routing languages"):
    model_lib.Transformer(config=config)
  with pytest.raises(ConfigError, match="'xx' has no row.*de, fr, ja"):
    _config().moe.language_index("xx")
  token = _config(route_by="token")
  with pytest.raises(ConfigError, match="routes tokens, not languages"):
    token.moe.language_index("de")
  # A token-routed model ignores language features.
  assert not model_lib.Transformer(config=token).routes_by_language


def test_config_round_trips_through_json_and_flags():
  config = _config()
  again = config_lib.config_from_dict(
      json.loads(json.dumps(config.to_dict())))
  assert again == config
  flags_ = config.to_flags()
  assert "--route_by=language" in flags_
  assert "--routing_languages=de,fr,ja" in flags_
  flag_values = absl_flags.FlagValues()
  config_lib.define_model_flags(flag_values)
  flag_values(["prog", *flags_])
  assert config_lib.model_config_from_flags(flag_values) == config


def test_routing_language_of_a_pair():
  assert task_routing.routing_language(source_lang="de",
                                       target_lang="en") == "de"
  assert task_routing.routing_language(source_lang="en",
                                       target_lang="ja") == "ja"
  with pytest.raises(task_routing.LanguageRoutingError):
    task_routing.routing_language(source_lang="en", target_lang="en")
  np.testing.assert_array_equal(
      task_routing.language_ids(["ja", "de"], routing_languages=LANGUAGES),
      [2, 0])
  with pytest.raises(task_routing.LanguageRoutingError, match="xx"):
    task_routing.language_ids(["xx"], routing_languages=LANGUAGES)


def test_packed_rows_carry_each_pairs_language_per_token():
  assert packing.LANGUAGE_FEATURES == task_routing.KEYS
  sources = [[5, 6, 1], [7, 1], [8, 8, 8, 1], [9, 1]]
  targets = [[3, 1], [4, 4, 1], [5, 1], [6, 1]]
  rows = packing.pack_pairs(sources, targets, length=8,
                            languages=[2, 0, 1, 2])
  for side in ("inputs", "targets"):
    seg = rows[f"{side}_segment_ids"]
    langs = rows[f"{side}_languages"]
    assert (langs[seg == 0] == 0).all()
    for r in range(seg.shape[0]):
      for s in np.unique(seg[r][seg[r] > 0]):
        values = np.unique(langs[r][seg[r] == s])
        assert len(values) == 1
  # Row 0 holds pairs 0, 1 and 3 (first fit); row 1 pair 2.
  np.testing.assert_array_equal(rows["inputs_languages"][0, :6],
                                [2, 2, 2, 0, 0, 2])
  np.testing.assert_array_equal(rows["inputs_languages"][1, :4], [1] * 4)
  with pytest.raises(ValueError, match="one routing-language index per pair"):
    packing.pack_pairs(sources, targets, length=8, languages=[0])
