"""Tests for m4moe.cost: hand-checked counts and agreement with the model."""

import dataclasses

import pytest

from m4moe import config as config_lib
from m4moe import cost


def _micro(**moe_overrides) -> config_lib.ModelConfig:
  """V_s=10, V_t=7, M=4, N=2, K=3, F=5; 2 encoder + 1 decoder layers; E=3,
  H=6, MoE at layer 1 of each stack (only the encoder has a layer 1)."""
  moe = dict(num_experts=3, expert_hidden_dim=6, moe_layer_interval=2,
             moe_layer_offset=1, router="top2", group_size=4)
  moe.update(moe_overrides)
  return config_lib.ModelConfig(
      src_vocab_size=10, tgt_vocab_size=7, d_model=4, num_heads=2, d_kv=3,
      d_ff=5, num_encoder_layers=2, num_decoder_layers=1, max_length=5,
      moe=config_lib.MoeConfig(**moe))


def test_micro_config_parameters_by_hand():
  # embeddings 10*4 + 7*4 = 68; output projection 4*7 = 28;
  # attention block 3*(4*2*3) + 2*3*4 = 96, four blocks (enc self x2,
  # dec self, dec cross) = 384; layer norms (scale+bias, 8 each): encoder
  # 2 per layer + final = 5, decoder 3 + final = 4, so 72; dense FFNs (enc 0,
  # dec 0) 2*(4*5) each = 80; router 4*3 = 12; experts 3*(4*6 + 6*4) = 144.
  breakdown = cost.param_breakdown(_micro())
  assert breakdown == cost.ParamBreakdown(
      embedding=68, output=28, attention=384, ffn=80, router=12, expert=144,
      layer_norm=72)
  assert cost.num_params(_micro()) == 788
  assert cost.num_params(_micro(), share_target_embedding=True) == 760
  assert cost.num_moe_layers(_micro()) == 1
  assert cost.num_experts_total(_micro()) == 3
  assert cost.params_per_expert(_micro()) == 48
  # All but the experts (644) plus k=2 experts of 48.
  assert cost.active_params_per_token(_micro()) == 644 + 96
  assert cost.active_params_per_token(_micro(router="top1")) == 644 + 48
  # noisy top-k adds the noise weights w_noise <M, E> to the router.
  noisy = cost.param_breakdown(_micro(router="noisy_topk",
                                      num_selected_experts=3))
  assert noisy.router == 2 * 12
  assert cost.active_params_per_token(
      _micro(router="noisy_topk", num_selected_experts=3)) == 644 + 12 + 144


def test_micro_config_flops_by_hand():
  flops = cost.flops_per_token(_micro(), source_length=5, target_length=5)
  # 2 x (attention 384 + dense FFN 80 + router 12 + softmax 28 + 2 experts 96).
  assert flops.matmul == 2 * 600
  # 4 N K per key: encoder 2 layers x 5 keys, decoder 1 x (5 self + 5 cross).
  assert flops.attention == 4 * 2 * 3 * (2 * 5 + 1 * (5 + 5))
  assert flops.forward == 1200 + 480
  assert flops.train == 3 * flops.forward
  assert flops.einsum_dispatch == 0
  # Tying the softmax removes a variable but not its matmul.
  tied = cost.model_cost(_micro(), source_length=5, target_length=5,
                         share_target_embedding=True)
  assert tied.flops == flops
  # Lengths default to --max_length (5 here).
  assert cost.flops_per_token(_micro()) == flops


def test_einsum_dispatch_flops_use_training_capacity():
  config = _micro(dispatch="einsum", train_capacity_factor=1.5)
  capacity = config.moe.capacity(group_size=4, training=True)  # ceil(4) = 4
  flops = cost.flops_per_token(config)
  assert flops.einsum_dispatch == 4 * 3 * capacity * 4 * 1  # 4 E C M x layers
  assert flops.forward == cost.flops_per_token(_micro()).forward


def test_dense_config_has_no_experts():
  config = config_lib.load_model_config("tiny/dense")
  result = cost.model_cost(config)
  assert result.num_moe_layers == 0
  assert result.num_experts_total == 0
  assert result.params.expert == result.params.router == 0
  assert result.active_params_per_token == result.num_params


def test_tiny_moe_and_dense_have_equal_active_flops():
  moe = config_lib.load_model_config("tiny/moe")
  dense = config_lib.load_model_config("tiny/dense")
  moe_flops = cost.flops_per_token(moe, source_length=64, target_length=64)
  dense_flops = cost.flops_per_token(dense, source_length=64, target_length=64)
  router = cost.param_breakdown(moe).router
  print(f"tiny/moe {moe_flops.forward:,} vs tiny/dense {dense_flops.forward:,} "
        f"forward FLOPs per token (router {2 * router:,})")
  assert moe_flops.forward - dense_flops.forward == 2 * router
  assert abs(moe_flops.forward / dense_flops.forward - 1) < 0.02
  assert cost.num_params(moe) > cost.num_params(dense)


def test_adafactor_slot_sizes():
  assert cost.adafactor_slot_size((7,)) == 7
  assert cost.adafactor_slot_size((4, 5)) == 9
  assert cost.adafactor_slot_size((3, 4, 6)) == 3 * (4 + 6)


def test_device_estimate_by_hand():
  config = _micro()
  estimate = cost.estimate_device(config, data_axis=2, expert_axis=3,
                                  batch_tokens=60, sequence_length=5)
  assert estimate.num_devices == 6
  assert estimate.tokens_per_device == 10
  assert estimate.replicated_params == 644
  assert estimate.expert_params_per_device == 48
  assert estimate.weight_bytes == estimate.gradient_bytes == 4 * (644 + 48)
  slots = sum(cost.adafactor_slot_size(s.shape)
              for s in cost.variable_specs(config) if s.kind != "expert")
  slots += 2 * (4 + 6)  # One expert's wi <1, 4, 6> and wo <1, 6, 4>.
  assert estimate.optimizer_bytes == 4 * slots
  # Capacity factor 1.25 with k=2: experts run 2.5 slots per token, not 2.
  forward = cost.flops_per_token(config).forward + int(0.5 * 2 * 48)
  assert estimate.train_flops == 3 * 10 * forward
  assert estimate.total_bytes == (estimate.weight_bytes * 2 +
                                  estimate.optimizer_bytes +
                                  estimate.activation_bytes)


@pytest.mark.parametrize("kwargs, match", [
    (dict(data_axis=1, expert_axis=2, batch_tokens=8), "not divisible"),
    (dict(data_axis=0, expert_axis=1, batch_tokens=8), ">= 1"),
    (dict(data_axis=4, expert_axis=3, batch_tokens=8), "at least one token"),
])
def test_device_estimate_rejects_bad_meshes(kwargs, match):
  with pytest.raises(ValueError, match=match):
    cost.estimate_device(_micro(), **kwargs)


_TINY_CASES = [("tiny/moe", {}, False), ("tiny/dense", {}, False),
               ("tiny/moe", {}, True),
               ("tiny/moe", {"router": "top1"}, False),
               ("tiny/moe", {"router": "noisy_topk",
                             "num_selected_experts": 3}, False)]


@pytest.mark.parametrize("name, moe_overrides, tied", _TINY_CASES)
def test_counts_match_built_model_variables(name, moe_overrides, tied):
  from m4moe import model as model_lib  # pylint: disable=g-import-not-at-top
  base = config_lib.load_model_config(name, src_vocab_size=300,
                                      tgt_vocab_size=200)
  moe = config_lib.MoeConfig(**{**dataclasses.asdict(base.moe),
                                **moe_overrides})
  config = dataclasses.replace(base, moe=moe)
  transformer = model_lib.Transformer(config=config,
                                      share_target_embedding=tied)
  variables = transformer.trainable_variables
  specs = cost.variable_specs(config, share_target_embedding=tied)
  assert sorted(tuple(v.shape.as_list()) for v in variables) == sorted(
      s.shape for s in specs)
  assert sum(v.shape.num_elements() for v in variables) == cost.num_params(
      config, share_target_embedding=tied)
