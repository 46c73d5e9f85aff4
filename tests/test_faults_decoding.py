"""Exact expert capacity, and decoding that does not depend on the batch."""

import math

import numpy as np
import pytest
import tensorflow as tf

from m4moe import config as config_lib
from m4moe.inference import beam_search as decoding
from m4moe.model import transformer as model_lib
from m4moe.moe import layer as moe_layer
from m4moe.moe import routing


# ---------------------------------------------------------------------------
# MoeConfig.capacity: ceil(cf * k * S / E) in exact rational arithmetic.

@pytest.mark.parametrize("cf, router, s, e, expected", [
    # 1.1 * 2 * 25 / 5 is exactly 11; in floats it is 11.000000000000002.
    (1.1, "top2", 25, 5, 11),
    (1.1, "top2", 26, 5, 12),      # 11.44 -> 12
    (0.7, "top1", 30, 7, 3),       # 0.7 * 30 / 7 = 3 exactly (float: 3.0000000000000004)
    (1.25, "top2", 256, 8, 80),    # tiny/moe training: 80 exactly
    (1.0, "top2", 8192, 128, 128),  # GShard rows: 2S/E
    (0.1, "top1", 3, 8, 1),        # tiny raw value: at least one slot
    (4.0, "top2", 3, 2, 3),        # at most S slots
])
def test_capacity_hand_checked(cf, router, s, e, expected):
  moe = config_lib.MoeConfig(num_experts=e, router=router,
                             train_capacity_factor=cf, eval_capacity_factor=cf)
  assert moe.capacity(group_size=s, training=True) == expected
  assert moe.capacity(group_size=s, training=False) == expected


def test_capacity_example_from_issue_is_not_off_by_one():
  moe = config_lib.MoeConfig(num_experts=5, train_capacity_factor=1.1)
  assert 1.1 * 2 * 25 / 5 > 11  # the float product overshoots...
  assert moe.capacity(group_size=25, training=True) == 11  # ...C does not


def test_capacity_matches_exact_rationals_over_many_settings():
  rng = np.random.default_rng(14)
  exact_integer_cases = float_errors = 0
  for _ in range(3000):
    decimals = int(rng.integers(0, 4))
    numerator = int(rng.integers(1, 4000))
    cf_text = f"{numerator}e-{decimals}"
    cf = float(cf_text)
    k = int(rng.integers(1, 5))
    e = int(rng.integers(k, 300))
    s = int(rng.integers(1, 5000))
    if rng.random() < 0.5:  # make cf * k * S / E an exact integer
      s = e * 10**decimals // math.gcd(numerator * k, 10**decimals) * int(
          rng.integers(1, 4))
    moe = config_lib.MoeConfig(num_experts=e, router="noisy_topk",
                               num_selected_experts=k,
                               train_capacity_factor=cf)
    # Integer arithmetic: cf = numerator / 10**decimals.
    num, den = numerator * k * s, 10**decimals * e
    expected = max(1, min(s, -(-num // den)))
    assert moe.capacity(group_size=s, training=True) == expected, (
        cf_text, k, s, e)
    exact_integer_cases += num % den == 0
    float_ceil = max(1, min(s, math.ceil(cf * k * s / e)))
    float_errors += float_ceil != expected
  # The hard cases were exercised: the float formula is off in some.
  assert exact_integer_cases > 1000
  assert float_errors > 20


def test_capacity_eval_factor_zero_is_no_drop_and_bad_group_is_rejected():
  moe = config_lib.MoeConfig(num_experts=4, eval_capacity_factor=0.0)
  assert moe.capacity(group_size=37, training=False) == 37
  with pytest.raises(ValueError, match="group_size=0"):
    moe.capacity(group_size=0, training=True)


# ---------------------------------------------------------------------------
# Per-group capacity in the routers, per-row groups in the MoE layer.

def _routers():
  # Built at collection time, maybe after another module enabled op
  # determinism (which refuses unseeded random ops).
  tf.random.set_seed(11)
  common = dict(model_dim=6, num_experts=4, init_scale=4.0)
  return [
      ("top2", routing.Top2Router(second_expert_policy="all", **common)),
      ("top2_ntlb", routing.Top2Router(second_expert_policy="all",
                                       no_token_left_behind=True, **common)),
      ("top1", routing.SwitchRouter(**common)),
      ("noisy_top3", routing.NoisyTopKRouter(k=3, **common)),
      ("expert_choice", routing.ExpertChoiceRouter(**common)),
  ]


@pytest.mark.parametrize("label,router", _routers(),
                         ids=[r[0] for r in _routers()])
def test_group_capacity_equals_routing_each_group_alone(label, router):
  del label
  rng = np.random.default_rng(3)
  x = tf.constant(rng.normal(size=(4, 7, 6)).astype(np.float32))
  mask = np.ones([4, 7], np.float32)
  mask[1, 5:] = 0
  mask[2, :] = 0  # an empty group: cap 0
  mask[3, 0] = 0
  mask = tf.constant(mask)
  caps = [3, 1, 0, 2]
  together = router(x, padding_mask=mask, capacity=4, training=False,
                    group_capacity=tf.constant(caps))
  slot_token, slot_weight = together.slots()
  for g, cap in enumerate(caps):
    if cap == 0:
      assert np.all(slot_token[g].numpy() == 7)  # every slot empty
      continue
    alone = router(x[g:g + 1], padding_mask=mask[g:g + 1], capacity=cap,
                   training=False)
    token, weight = alone.slots()
    # Same slots, then the slots past the cap stay empty.
    np.testing.assert_array_equal(slot_token[g, :, :cap], token[0])
    np.testing.assert_allclose(slot_weight[g, :, :cap], weight[0])
    assert np.all(slot_token[g, :, cap:].numpy() == 7)
    assert np.all(slot_weight[g, :, cap:].numpy() == 0)
  # The capacity really binds somewhere (else the test proves nothing).
  assert float(together.stats.dropped_first) > 0


def _moe_layer(**moe_kwargs):
  moe = dict(num_experts=4, expert_hidden_dim=6, group_size=64,
             eval_capacity_factor=1.0)
  moe.update(moe_kwargs)
  config = config_lib.ModelConfig(d_model=8, init_scale=4.0,
                                  moe=config_lib.MoeConfig(**moe))
  tf.random.set_seed(0)
  return moe_layer.MoeLayer(config=config, causal=False)


@pytest.mark.parametrize("dispatch", ["sorted", "index", "einsum"])
@pytest.mark.parametrize("router", ["top2", "expert_choice"])
def test_row_groups_depend_only_on_the_row(dispatch, router):
  layer = _moe_layer(dispatch=dispatch, router=router)
  rng = np.random.default_rng(5)
  x = rng.normal(size=(3, 9, 8)).astype(np.float32)
  mask = np.ones([3, 9], np.float32)
  mask[0, 6:] = 0
  mask[2, 2:] = 0
  def run(rows, row_mask):
    return layer(tf.constant(rows), padding_mask=tf.constant(row_mask),
                 training=False, group_per_row=True).outputs.numpy()
  together = run(x, mask)
  # Row 0 alone, unpadded: capacity from its 6 real tokens either way.
  alone = run(x[:1, :6], mask[:1, :6])
  np.testing.assert_allclose(together[0, :6], alone[0], rtol=1e-5, atol=1e-6)
  # Other rows' contents do not matter; padding outputs are exactly 0.
  other = x.copy()
  other[1:] = rng.normal(size=(2, 9, 8))
  np.testing.assert_allclose(run(other, mask)[0], together[0], rtol=1e-5,
                             atol=1e-6)
  assert np.all(together[mask == 0] == 0)
  # The batch groups (not per row) make row 0 depend on the others here.
  batched = layer(tf.constant(x), padding_mask=tf.constant(mask),
                  training=False).outputs.numpy()
  assert not np.allclose(batched[0, :6], alone[0], atol=1e-4)


def test_row_groups_with_an_unknown_length_equal_static_ones():
  layer = _moe_layer(dispatch="index")
  rng = np.random.default_rng(8)
  x = tf.constant(rng.normal(size=(2, 5, 8)).astype(np.float32))
  mask = tf.constant([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], tf.float32)
  static = layer(x, padding_mask=mask, training=False,
                 group_per_row=True).outputs
  fn = tf.function(lambda x, m: layer(x, padding_mask=m, training=False,
                                      group_per_row=True).outputs,
                   input_signature=[tf.TensorSpec([None, None, 8]),
                                    tf.TensorSpec([None, None])])
  np.testing.assert_allclose(fn(x, mask), static, rtol=1e-5, atol=1e-6)
  # Rows longer than --max_length (512 here) fail with a clear message.
  with pytest.raises(tf.errors.InvalidArgumentError, match="--max_length=512"):
    fn(tf.zeros([1, 513, 8]), tf.ones([1, 513]))


def test_every_router_capacity_comes_from_moe_config(monkeypatch):
  calls, seen = [], []
  original = config_lib.MoeConfig.capacity

  def spy_capacity(self, *, group_size, training):
    value = original(self, group_size=group_size, training=training)
    calls.append((group_size, value))
    return value

  original_call = routing.Top2Router.__call__

  def spy_router(self, x, **kwargs):
    seen.append((kwargs["capacity"], kwargs.get("group_capacity")))
    return original_call(self, x, **kwargs)

  monkeypatch.setattr(config_lib.MoeConfig, "capacity", spy_capacity)
  monkeypatch.setattr(routing.Top2Router, "__call__", spy_router)
  layer = _moe_layer(num_experts=5, eval_capacity_factor=1.1)
  x = tf.zeros([2, 25, 8])
  mask = np.ones([2, 25], np.float32)
  mask[1, 20:] = 0
  layer(x, padding_mask=tf.constant(mask), training=False)
  layer(x, padding_mask=tf.constant(mask), training=False, group_per_row=True)
  values = dict(calls)
  (batch_c, batch_g), (row_c, row_g) = seen
  # Batch groups: one group of S = min(group_size, 50 tokens) = 50.
  assert batch_g is None and batch_c == values[50] == 22
  assert row_c == values[25] == 11  # 1.1 * 2 * 25 / 5, exactly
  np.testing.assert_array_equal(row_g, [values[25], values[20]])


# ---------------------------------------------------------------------------
# The model's decode routing: dead beams, bad input.

def _small_model(name="gshard/moe_128e_12l"):
  cfg = config_lib.load_model_config(
      name, src_vocab_size=30, tgt_vocab_size=20, d_model=16, num_heads=2,
      d_kv=8, d_ff=32, num_encoder_layers=2, num_decoder_layers=2,
      dropout_rate=0.0, attention_dropout_rate=0.0, init_scale=4.0,
      max_length=16, expert_hidden_dim=16, num_experts=4, group_size=64)
  tf.random.set_seed(7)
  return model_lib.Transformer(config=cfg)


def test_dead_rows_change_nothing_for_live_rows_at_a_decode_step():
  model = _small_model()
  inputs = np.array([[5, 6, 7, 1, 0], [8, 9, 1, 0, 0]], np.int32)
  enc = decoding.tile_beams(model.encode(inputs), 3)
  cache = model.init_cache(batch_size=6, max_length=4)
  live = tf.constant([True, False, True, True, True, False])
  def step(tokens):
    return model.decode_step(encoder_output=enc, token_ids=tf.constant(tokens),
                             cache=cache, step=0, live=live)[0].numpy()
  a = step([2, 3, 4, 5, 6, 7])
  b = step([2, 11, 4, 5, 6, 19])  # only dead rows differ
  np.testing.assert_array_equal(a[live.numpy()], b[live.numpy()])
  # A live row's logits do not depend on the other live rows either.
  c = step([2, 3, 13, 5, 6, 7])
  np.testing.assert_allclose(a[0], c[0], rtol=1e-6)
  np.testing.assert_allclose(a[3:5], c[3:5], rtol=1e-6)


def test_per_sentence_routing_rejects_packed_batches():
  model = _small_model()
  ids = tf.constant([[5, 6, 1, 7, 1]], tf.int32)
  batch = {"inputs": ids, "targets": ids,
           "inputs_segment_ids": tf.constant([[1, 1, 1, 2, 2]]),
           "inputs_positions": tf.constant([[0, 1, 2, 0, 1]])}
  with pytest.raises(ValueError, match="inputs_positions, inputs_segment_ids"):
    model(batch, training=False, per_sentence_routing=True)
  model(batch, training=False)  # the GShard batch groups accept packing


def _zoo_entries():
  import pathlib  # pylint: disable=g-import-not-at-top
  zoo = pathlib.Path(__file__).resolve().parent.parent / "configs"
  return sorted(str(p.relative_to(zoo).with_suffix(""))
                for p in zoo.rglob("*.flags"))


@pytest.mark.parametrize("name", _zoo_entries())
def test_every_zoo_config_decodes_batch_invariantly(name):
  # The entry's routing settings (router, experts, capacity factors,
  # dispatch) at tiny widths and depth.
  cfg = config_lib.load_model_config(
      name, src_vocab_size=30, tgt_vocab_size=20, d_model=16, num_heads=2,
      d_kv=8, d_ff=32, num_encoder_layers=2, num_decoder_layers=2,
      dropout_rate=0.0, attention_dropout_rate=0.0, init_scale=4.0,
      max_length=16, expert_hidden_dim=8)
  tf.random.set_seed(3)
  model = model_lib.Transformer(config=cfg)
  beam = decoding.BeamSearchConfig(beam_size=2, alpha=0.6,
                                   max_decode_length=5)
  sources = np.array([[4, 9, 12, 7, 1, 0], [5, 1, 0, 0, 0, 0],
                      [8, 8, 3, 22, 17, 1]], np.int32)
  beside = decoding.translate_ids(model, sources, config=beam)
  repeated = decoding.translate_ids(model, sources[[0, 0]], config=beam)
  alone = decoding.translate_ids(model, sources[:1, :5], config=beam)
  uncached = decoding.translate_ids_uncached(model, sources, config=beam)
  for out, row in [(beside, 0), (repeated, 0), (repeated, 1)]:
    np.testing.assert_array_equal(out.sequences[row], alone.sequences[0])
    np.testing.assert_allclose(out.scores[row], alone.scores[0], rtol=1e-5)
  np.testing.assert_array_equal(uncached.sequences, beside.sequences)
  np.testing.assert_allclose(uncached.scores, beside.scores, rtol=1e-5)
