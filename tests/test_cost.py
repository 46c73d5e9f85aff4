"""Tests for m4moe.cost.model: hand-checked counts and agreement with the model."""

import dataclasses
import json
import subprocess
import sys

import pytest

from m4moe import config as config_lib
from m4moe.cost import model as cost
from m4moe.cost import tables as cost_tables
from m4moe.parallel import mesh as mesh_lib


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
      shared_expert=0, layer_norm=72)
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


def test_shared_experts_params_and_flops_by_hand():
  # Two shared experts of width 3 (M = 4): one FFN wi <4, 6>, wo <6, 4> =
  # 48 parameters in the one MoE layer, active for every token, replicated.
  config = _micro(num_shared_experts=2, shared_expert_hidden_dim=3)
  breakdown = cost.param_breakdown(config)
  assert breakdown.shared_expert == 48 and breakdown.expert == 144
  assert cost.num_params(config) == 788 + 48
  assert cost.active_params_per_token(config) == 644 + 48 + 96
  flops = cost.flops_per_token(config, source_length=5, target_length=5)
  assert flops.matmul == 2 * (600 + 48)
  # The default width is the routed experts' (H = 6): 2 x 2 x 4 x 6 = 96.
  assert cost.param_breakdown(
      _micro(num_shared_experts=2)).shared_expert == 96
  # Replicated: the expert axis does not split them, like a dense FFN.
  estimate = cost.estimate_device(config, data_axis=1, expert_axis=3,
                                  batch_tokens=30, sequence_length=5)
  assert estimate.replicated_params == 644 + 48
  forward = cost.flops_per_token(config).forward + int(0.5 * 2 * 48)
  assert estimate.train_flops == 3 * 10 * forward


def test_dropless_experts_run_no_empty_slots():
  # --train_capacity_factor=0 (sorted): the experts run the k = 2 choices
  # of each token, no capacity padding (1.25 runs 2.5 expert slots).
  config = _micro(train_capacity_factor=0)
  estimate = cost.estimate_device(config, data_axis=1, expert_axis=1,
                                  batch_tokens=30, sequence_length=5)
  assert estimate.train_flops == 3 * 30 * cost.flops_per_token(config).forward
  padded = cost.estimate_device(_micro(), data_axis=1, expert_axis=1,
                                batch_tokens=30, sequence_length=5)
  assert padded.train_flops - estimate.train_flops == 3 * 30 * int(0.5 * 2 * 48)


def test_adafactor_slot_sizes():
  assert cost.adafactor_slot_size((7,)) == 7
  assert cost.adafactor_slot_size((4, 5)) == 9
  assert cost.adafactor_slot_size((3, 4, 6)) == 3 * (4 + 6)


def test_device_estimate_by_hand():
  config = _micro()
  estimate = cost.estimate_device(config, data_axis=2, expert_axis=3,
                                  batch_tokens=60, sequence_length=5)
  assert estimate.num_devices == 6
  # The rows are split over data only (the 3 devices of a data row hold
  # the same tokens: m4moe.parallel.sharding's layout on a data x expert mesh).
  assert estimate.tokens_per_device == 30
  assert estimate.replicated_params == 644
  assert estimate.expert_params_per_device == 48
  assert estimate.weight_bytes == estimate.gradient_bytes == 4 * (644 + 48)
  slots = sum(cost.adafactor_slot_size(s.shape)
              for s in cost.variable_specs(config) if s.kind != "expert")
  slots += 2 * (4 + 6)  # One expert's wi <1, 4, 6> and wo <1, 6, 4>.
  assert estimate.optimizer_bytes == 4 * slots
  # Capacity factor 1.25 with k=2: experts run 2.5 slots per token, not 2.
  forward = cost.flops_per_token(config).forward + int(0.5 * 2 * 48)
  assert estimate.train_flops == 3 * 30 * forward
  assert estimate.total_bytes == (estimate.weight_bytes * 2 +
                                  estimate.optimizer_bytes +
                                  estimate.activation_bytes)


def test_expert_only_mesh_splits_the_batch_over_the_experts_devices():
  # expert:3 (GShard's layout): tokens and experts on the same 3 devices.
  config = _micro()
  for data, expert, tokens in ((1, 3, 20), (2, 3, 30), (2, 1, 30),
                               (1, 1, 60)):
    estimate = cost.estimate_device(config, data_axis=data,
                                    expert_axis=expert, batch_tokens=60,
                                    sequence_length=5)
    assert estimate.tokens_per_device == tokens, (data, expert)


def test_device_estimate_with_a_model_axis_by_hand():
  # _micro with d_ff 6 so that model:2 divides heads A=2, F=6 and H=6.
  config = dataclasses.replace(_micro(), d_ff=6)
  estimate = cost.estimate_device(config, data_axis=2, expert_axis=1,
                                  model_axis=2, batch_tokens=40,
                                  sequence_length=5)
  assert estimate.num_devices == 4
  assert estimate.tokens_per_device == 20  # The model axis shares tokens.
  # Whole: embeddings 68, softmax 28, router 12, layer norms 72 = 180.
  # Halved: attention 4 x 96 / 2 = 192, dense FFNs 2 x 2 x 4 x 6 / 2 = 48.
  assert estimate.replicated_params == 180 + 192 + 48
  # Experts 3 x (4 x 6 + 6 x 4) = 144, H split in two (E on one device).
  assert estimate.expert_params_per_device == 72
  assert estimate.weight_bytes == estimate.gradient_bytes == 4 * (420 + 72)
  # Adafactor slots of the local shapes: embeddings 10+4, 7+4; softmax
  # 4+7; router 4+3; layer norms 72; per attention block q/k/v <4, 1, 3>
  # 3 x 4 x (1 + 3) and output <1, 3, 4> 1 x (3 + 4): 55, four blocks 220;
  # dense FFN wi <4, 3> 7 and wo <3, 4> 7, two layers 28; experts wi
  # <3, 4, 3> 3 x 7 and wo <3, 3, 4> 3 x 7: 42.
  assert estimate.optimizer_bytes == 4 * (14 + 11 + 11 + 7 + 72 + 220 + 28 +
                                          42)
  # Activations per token: attention block M + 4 A D / 2 + A / 2 x 5 keys
  # = 4 + 12 + 5 = 21, encoder 2 blocks, decoder self + cross: 84; dense
  # FFNs 2 x (M + F / 2) = 14; MoE int(M + E + 2.5 x (M + H / 2)) = 24;
  # logits 7. float32, 20 tokens.
  assert estimate.activation_bytes == 4 * 20 * (84 + 14 + 24 + 7)
  # FLOPs per token: router + softmax 2 x (12 + 28) = 80 whole; halved:
  # 2 x (attention 384 + FFN 96 + 2 experts 96) + QK^T/AV 480 = 1632 -> 816;
  # the capacity's extra 0.5 x 2 experts x 96 = 48 -> 24.
  assert estimate.train_flops == 3 * 20 * (80 + 816 + 24)
  assert estimate.total_bytes == (2 * estimate.weight_bytes +
                                  estimate.optimizer_bytes +
                                  estimate.activation_bytes)


def test_model_axis_halves_exactly_the_split_parts():
  config = config_lib.load_model_config("tiny/moe")
  one = cost.estimate_device(config, data_axis=2, expert_axis=2,
                             batch_tokens=4096)
  two = cost.estimate_device(config, data_axis=2, expert_axis=2,
                             model_axis=2, batch_tokens=4096)
  breakdown = cost.param_breakdown(config)
  whole = breakdown.embedding + breakdown.output + breakdown.router + (
      breakdown.layer_norm)
  assert two.replicated_params == whole + (
      breakdown.attention + breakdown.ffn) // 2
  assert one.replicated_params == breakdown.non_expert
  assert two.expert_params_per_device * 2 == one.expert_params_per_device
  assert two.tokens_per_device == one.tokens_per_device
  assert two.num_devices == 2 * one.num_devices
  assert two.train_flops < one.train_flops
  assert two.activation_bytes < one.activation_bytes


@pytest.mark.parametrize("kwargs, match", [
    (dict(data_axis=1, expert_axis=2, batch_tokens=8), "not divisible"),
    (dict(data_axis=0, expert_axis=1, batch_tokens=8), ">= 1"),
    (dict(data_axis=1, expert_axis=1, model_axis=0, batch_tokens=8), ">= 1"),
    (dict(data_axis=4, expert_axis=3, batch_tokens=3), "at least one token"),
    (dict(data_axis=1, expert_axis=3, batch_tokens=2), "at least one token"),
    # _micro's d_ff is 5: model:2 cannot split the dense FFN.
    (dict(data_axis=1, expert_axis=1, model_axis=2, batch_tokens=8),
     "--d_ff=5 is not divisible by the mesh's model:2"),
    (dict(data_axis=1, expert_axis=1, model_axis=3, batch_tokens=8),
     "--num_heads=2 is not divisible by the mesh's model:3"),
])
def test_device_estimate_rejects_bad_meshes(kwargs, match):
  with pytest.raises(ValueError, match=match):
    cost.estimate_device(_micro(), **kwargs)


_TINY_CASES = [("tiny/moe", {}, False), ("tiny/dense", {}, False),
               ("tiny/moe", {}, True),
               ("tiny/moe", {"router": "top1"}, False),
               ("tiny/moe", {"router": "noisy_topk",
                             "num_selected_experts": 3}, False),
               ("tiny/moe", {"num_shared_experts": 2,
                             "shared_expert_hidden_dim": 64}, False)]


@pytest.mark.parametrize("name, moe_overrides, tied", _TINY_CASES)
def test_counts_match_built_model_variables(name, moe_overrides, tied):
  from m4moe.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
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


def test_einsum_dispatch_keeps_its_masks_for_the_backward_pass():
  index = cost.estimate_device(_micro(), data_axis=1, expert_axis=3,
                               batch_tokens=12, sequence_length=5)
  einsum = cost.estimate_device(_micro(dispatch="einsum"), data_axis=1,
                                expert_axis=3, batch_tokens=12,
                                sequence_length=5)
  # dispatch_mask + combine_weights <[G, S, E, C]>: 2 E C per token; S = 4,
  # C = ceil(1.25 * 2 * 4 / 3) = 4; 4 tokens per device, 1 MoE layer, float32.
  assert einsum.activation_bytes - index.activation_bytes == 4 * 4 * 2 * 3 * 4


# GShard section 5 on the zoo's Table 1 rows: MoE(E, L) on E devices.
_TABLE1 = ("gshard/moe_128e_12l", "gshard/moe_512e_12l",
           "gshard/moe_2048e_12l", "gshard/moe_128e_36l",
           "gshard/moe_512e_36l", "gshard/moe_2048e_36l",
           "gshard/moe_2048e_60l")
_M, _H, _GIB = 1024, 8192, 2**30


def _scaling_row(name: str, **kwargs) -> cost.ExpertScalingRow:
  return cost.expert_scaling_row(name, config_lib.load_model_config(name),
                                 **kwargs)


@pytest.mark.parametrize("name", _TABLE1)
def test_scaling_row_holds_one_expert_per_moe_layer(name):
  row = _scaling_row(name)
  layers = row.num_layers // 2  # MoE replaces every other FFN.
  assert row.device.num_devices == row.num_experts
  assert row.experts_per_device == layers
  assert row.params_per_expert == 2 * _M * _H == 16_777_216
  # E/n = 1 expert of each of the L/2 MoE layers, float32.
  assert row.expert_bytes == layers * 16_777_216 * 4
  assert row.expert_bytes == {12: 0.375, 36: 1.125, 60: 1.875}[
      row.num_layers] * _GIB
  # Table 3 batch / cores: 1M / 128 = 8192, 1M / 512 = 4M / 2048 = 2048.
  assert row.device.tokens_per_device == (8192 if row.num_experts == 128
                                          else 2048)
  assert (row.device.batch_tokens ==
          row.device.tokens_per_device * row.num_experts)
  assert row.state_bytes == (row.replicated_bytes + row.expert_bytes) * 2 + (
      row.device.optimizer_bytes)


@pytest.mark.parametrize("layers, total_ratio", [(12, 1.022), (36, 1.025)])
def test_per_device_memory_is_nearly_constant_at_equal_tokens(layers,
                                                              total_ratio):
  # At T tokens per device and one expert per layer per device, only three
  # terms depend on E (n_moe = L/2 MoE layers, float32 = 4 bytes):
  #   router wg <M, E>: weight + gradient 2 * 4 M E; Adafactor slot 4 (M + E);
  #   gates <E> per token: 4 T E.   (E C = E ceil(2T/E) = 2T for all three E.)
  # So total(2048E) - total(128E) = n_moe * 1920 * (8 M + 4 + 4 T) bytes.
  tokens = 2048
  small = _scaling_row(f"gshard/moe_128e_{layers}l", tokens_per_device=tokens)
  large = _scaling_row(f"gshard/moe_2048e_{layers}l", tokens_per_device=tokens)
  n_moe, grown = layers // 2, 2048 - 128
  growth = n_moe * grown * (8 * _M + 4 + 4 * tokens)
  assert large.device.total_bytes - small.device.total_bytes == growth
  # Training FLOPs: only the router's 2 M E per token and pass grows (x3).
  assert (large.device.train_flops - small.device.train_flops ==
          3 * tokens * n_moe * 2 * _M * grown)
  ratios = cost.scaling_ratios(small, large)
  print(f"{layers}L 2048E/128E at {tokens} tokens/device: {ratios}")
  assert ratios["total_bytes"] == pytest.approx(total_ratio, abs=5e-4)
  assert ratios["total_bytes"] < 1.03  # The model itself grows ~15.6x:
  assert 15.5 < ratios["num_params"] < 15.7
  assert ratios["activation_bytes"] < 1.03 and ratios["state_bytes"] < 1.03


def test_paper_batches_give_the_128e_rows_four_times_the_tokens():
  # Table 3 puts 1M tokens on 128 cores (8192 each) but 4M on 2048 (2048
  # each), so at the paper's batches the 128E row holds more, not less.
  paper = _scaling_row("gshard/moe_128e_12l")
  equal = _scaling_row("gshard/moe_128e_12l", tokens_per_device=2048)
  large = _scaling_row("gshard/moe_2048e_12l")
  assert paper.state_bytes == equal.state_bytes
  # Activations are T x (values per token), and per token only the einsum
  # masks 2 E C per MoE layer depend on T (C = 2T/E: 128 at T = 8192, 32 at
  # T = 2048): 4 bytes x 8192 tokens x 6 layers x 2 x 128 E x (128 - 32) C.
  assert (paper.device.activation_bytes - 4 * equal.device.activation_bytes ==
          4 * 8192 * 6 * 2 * 128 * (128 - 32))
  assert cost.scaling_ratios(paper, large)["total_bytes"] == pytest.approx(
      0.320, abs=5e-4)


def test_scaling_row_rejects_dense_and_empty_devices():
  with pytest.raises(ValueError, match="dense"):
    _scaling_row("tiny/dense")
  with pytest.raises(ValueError, match="tokens_per_device=0"):
    _scaling_row("tiny/moe", tokens_per_device=0)


def _info_table1(*args: str) -> str:
  result = subprocess.run(
      [sys.executable, "-m", "m4moe.cli.info", "--table1", *args],
      capture_output=True, text=True, timeout=60, check=False)
  assert result.returncode == 0, result.stderr
  return result.stdout


def test_info_table1_json_has_one_row_per_zoo_row():
  info = json.loads(_info_table1("--json"))
  assert [row["config"] for row in info["rows"]] == list(_TABLE1)
  for row in info["rows"]:
    assert row["devices"] == int(row["model"][4:].split("E")[0])
    assert row["expert_bytes"] == (row["experts_per_device"] *
                                   row["params_per_expert"] * 4)
    assert row["total_bytes"] == (row["replicated_bytes"] +
                                  row["expert_bytes"] +
                                  row["gradient_bytes"] +
                                  row["optimizer_bytes"] +
                                  row["activation_bytes"])
  assert sorted(info["ratios"]) == ["12L", "36L"]  # 60L has no 128E row.


def test_info_table1_text_states_the_verdict():
  text = _info_table1("--tokens_per_device=2048").splitlines()
  rows = [line for line in text if line.startswith("MoE(")]
  assert [line.split()[0] + line.split()[1] for line in rows] == [
      "MoE(128E,12L)", "MoE(512E,12L)", "MoE(2048E,12L)", "MoE(128E,36L)",
      "MoE(512E,36L)", "MoE(2048E,36L)", "MoE(2048E,60L)"]
  assert any("12L: roughly constant (x1.022" in line for line in text)
  paper = _info_table1()
  assert "12L: NOT constant (x0.320)" in paper


def test_cost_tables_table1_rows_ratios_and_verdict():
  names = ("gshard/moe_128e_12l", "gshard/moe_2048e_12l")
  info = cost_tables.table1(tokens_per_device=2048, sequence_length=64,
                            names=names)
  small, large = info["rows"]
  assert (small["config"], large["config"]) == names
  assert (small["devices"], large["devices"]) == (128, 2048)
  assert small["seq_len"] == large["seq_len"] == 64
  for row, name in zip(info["rows"], names):
    expected = cost.expert_scaling_row(
        name, config_lib.load_model_config(name), tokens_per_device=2048,
        sequence_length=64)
    assert row["total_bytes"] == expected.device.total_bytes
    assert row["train_flops"] == expected.device.train_flops
  ratio = info["ratios"]["12L"]
  assert ratio["total_bytes"] == pytest.approx(
      large["total_bytes"] / small["total_bytes"])
  sentence = cost_tables.verdict(layers="12L", ratio=ratio, large_row=large,
                                 small_row=small)
  assert "12L: roughly constant" in sentence
  doubled = {**ratio, "total_bytes": cost_tables.ROUGHLY_CONSTANT * 1.01}
  assert "NOT constant" in cost_tables.verdict(
      layers="12L", ratio=doubled, large_row=large, small_row=small)


def test_cost_tables_collect_compares_paper_rows_only():
  paper = config_lib.load_model_config("gshard/moe_128e_12l")
  info = cost_tables.collect(paper, source="x", sequence_length=32)
  assert info["num_params"] == cost.num_params(paper)
  assert info["paper"]["paper_weights"] == 12.5e9
  assert info["paper"]["weights_vs_paper"] == pytest.approx(
      cost.num_params(paper) / 12.5e9 - 1)
  assert "device" not in info
  assert cost_tables.collect(_micro(), source="m")["paper"] is None
  with pytest.raises(ValueError, match=(
      r"--d_ff=5 is not divisible .* \(--mesh=model:2\)")):
    cost_tables.collect(_micro(), source="m", batch_tokens=8,
                        mesh=mesh_lib.MeshShape.parse("model:2"))
  info = cost_tables.collect(
      dataclasses.replace(_micro(), d_ff=6), source="m", batch_tokens=40,
      sequence_length=5, mesh=mesh_lib.MeshShape.parse("data:2,model:2"))
  assert info["mesh"] == "data:2,model:2"
  assert info["device"]["model_axis"] == 2
  assert info["device"]["num_devices"] == 4
  assert info["device"]["params_per_device"] == 420 + 72
