"""Tests for m4moe.cost.unfused: the tensors TensorFlow's tape keeps.

The table is checked by hand on a micro config here; its agreement with the
measured step is in tests/test_bench_sharding.py.
"""

import dataclasses

import pytest

from m4moe import config as config_lib
from m4moe.cost import model as cost
from m4moe.cost import unfused as cost_unfused


def _micro(**overrides) -> config_lib.ModelConfig:
  """M=4, A=2, D=3, F=5, Vt=7; 2 encoder + 1 decoder layers; E=3, K=2, H=6,
  S=4 (C = ceil(1.25 * 2 * 4 / 3) = 4), MoE at encoder layer 1 only; no
  dropout, float32, top2, einsum dispatch."""
  moe = dict(num_experts=3, expert_hidden_dim=6, moe_layer_interval=2,
             moe_layer_offset=1, router="top2", group_size=4,
             dispatch="einsum")
  fields = dict(src_vocab_size=10, tgt_vocab_size=7, d_model=4, num_heads=2,
                d_kv=3, d_ff=5, num_encoder_layers=2, num_decoder_layers=1,
                max_length=4, dropout_rate=0.0, attention_dropout_rate=0.0)
  fields.update(overrides)
  return config_lib.ModelConfig(moe=config_lib.MoeConfig(**moe), **fields)


def _bytes(rows, sub_layer: str, shape: str) -> int:
  return sum(r.bytes for r in rows if r.sub_layer == sub_layer and
             r.shape == shape)


def test_micro_table_by_hand():
  config = _micro()
  assert config.moe.capacity(group_size=4, training=True) == 4
  # N = 8 tokens per stream (2 rows of L = 4), so G = 2 groups of S = 4.
  rows = cost_unfused.kept_tensors(config, tokens=8, source_length=4,
                                   target_length=4)
  # Embeddings: 2 stacks x 4 tensors [N, M] = 8 x 32 floats = 1024 bytes.
  assert _bytes(rows, "embedding", "[N, M]") == 1024
  # Layer norms: 2 x 2 + 1 (encoder) + 3 x 1 + 1 (decoder) = 9, each with
  # 5 [N, M] (5 x 32 x 4 = 640 bytes) and 3 [N, 1] (3 x 8 x 4 = 96 bytes).
  assert _bytes(rows, "layer_norm", "[N, M]") == 9 * 640
  assert _bytes(rows, "layer_norm", "[N, 1]") == 9 * 96
  # Attention blocks: 2 encoder self + 1 decoder self + 1 cross = 4, each
  # q, q scaled, k, v, context [N, A, D] = 5 x 8 x 6 x 4 = 960 bytes.
  assert _bytes(rows, "attention", "[N, A, D]") == 4 * 960
  # Scores and probabilities [B, A, Q, U] = 2 x (2 x 2 x 4 x 4) x 4 = 512
  # bytes per block.
  assert _bytes(rows, "encoder/self_attention", "[B, A, Ls, Ls]") == 2 * 512
  assert _bytes(rows, "decoder/self_attention", "[B, A, Lt, Lt]") == 512
  assert _bytes(rows, "decoder/cross_attention", "[B, A, Lt, Ls]") == 512
  # Dense FFNs (encoder layer 0, decoder layer 0): Relu [N, F] 160 bytes.
  assert _bytes(rows, "dense_ffn", "[N, F]") == 2 * 160
  # The one MoE layer: 13 router tensors [G, S, E] = 13 x 24 x 4 bytes.
  assert _bytes(rows, "moe/router", "[G, S, E]") == 13 * 24 * 4
  # Expert buffers [E, G, C, M] = 3 x 2 x 4 x 4 = 96 floats, twice; the
  # expert hidden [E, G, C, H] = 144 floats.
  assert _bytes(rows, "moe/experts", "[E, G, C, M]") == 2 * 96 * 4
  assert _bytes(rows, "moe/experts", "[E, G, C, H]") == 144 * 4
  # Dispatch mask and combine array [G, S, E, C] = 96 floats each; the
  # combine array's one-hots: [G, S, K, E] (2 x 48 floats), [G, S, K, C]
  # (64 floats), and the weights' ExpandDims [G, S, K, 1] (16 floats).
  assert _bytes(rows, "moe/dispatch", "[G, S, E, C]") == 2 * 96 * 4
  assert _bytes(rows, "moe/dispatch", "[G, S, K, E]") == 2 * 48 * 4
  assert _bytes(rows, "moe/dispatch", "[G, S, K, C]") == 64 * 4
  # Loss: logits, their reshape, z - max and exp [N, Vt] = 4 x 56 floats.
  assert _bytes(rows, "loss", "[N, Vt]") == 4 * 56 * 4
  # Everything: 16,864 bytes outside the MoE layer (embeddings 1024,
  # shift_right 32, biases 128 + 256, layer norms 5760 + 864, attention
  # 3840 + 1024 + 512 + 512 + 512 (outputs [N, M] x 4), residuals 7 x 128,
  # dense FFNs 320 + 256, loss 896 + 32) and 6,200 in it.
  assert sum(r.bytes for r in rows) == 16864 + 6200
  assert cost_unfused.activation_bytes(
      config, tokens=8, source_length=4, target_length=4) == 23064


def test_every_row_names_its_op_types():
  rows = cost_unfused.kept_tensors(_micro(), tokens=8, source_length=4,
                                   target_length=4)
  for row in rows:
    # ``ops`` lists the tensors of one instance; count is instances x that.
    assert row.ops and row.count % len(row.ops) == 0, row
    assert row.elements > 0 and row.itemsize in (1, 4), row


def test_estimate_device_unfused_changes_only_the_activations():
  config = _micro()
  fused = cost.estimate_device(config, data_axis=2, expert_axis=1,
                               batch_tokens=16, sequence_length=4)
  unfused = cost.estimate_device(config, data_axis=2, expert_axis=1,
                                 batch_tokens=16, sequence_length=4,
                                 execution="unfused")
  assert fused.execution == "fused" and unfused.execution == "unfused"
  assert unfused.activation_bytes == 23064  # 8 tokens per device, as above
  assert unfused.activation_bytes > fused.activation_bytes
  same = ("weight_bytes", "gradient_bytes", "optimizer_bytes", "train_flops",
          "tokens_per_device", "expert_params_per_device")
  for name in same:
    assert getattr(unfused, name) == getattr(fused, name), name
  assert unfused.total_bytes - fused.total_bytes == (
      unfused.activation_bytes - fused.activation_bytes)


def test_a_dense_model_has_no_moe_rows():
  config = dataclasses.replace(_micro(), moe=config_lib.MoeConfig())
  rows = cost_unfused.kept_tensors(config, tokens=8, source_length=4,
                                   target_length=4)
  assert not [r for r in rows if r.sub_layer.startswith("moe/")]
  # Three dense FFNs now: Relu [N, F] 160 bytes each.
  assert _bytes(rows, "dense_ffn", "[N, F]") == 3 * 160


@pytest.mark.parametrize("overrides, moe, match", [
    ({"activation_dtype": "bfloat16"}, {}, "activation_dtype=bfloat16"),
    ({"dropout_rate": 0.1}, {}, "dropout_rate=0.1"),
    ({}, {"router": "top1"}, "router=top1"),
    ({}, {"dispatch": "sorted"}, "dispatch=sorted"),
    ({}, {"expert_dropout_rate": 0.2}, "expert_dropout_rate=0.2"),
])
def test_unfused_refuses_settings_its_table_does_not_describe(overrides, moe,
                                                              match):
  config = _micro(**overrides)
  if moe:
    config = dataclasses.replace(config, moe=dataclasses.replace(config.moe,
                                                                 **moe))
  with pytest.raises(ValueError, match=match):
    cost.estimate_device(config, data_axis=1, expert_axis=1, batch_tokens=8,
                         execution="unfused")
  # The fused estimate still works.
  cost.estimate_device(config, data_axis=1, expert_axis=1, batch_tokens=8)


def test_unknown_execution_and_model_axis_are_refused():
  with pytest.raises(ValueError, match="execution='xla' is unknown"):
    cost.estimate_device(_micro(), data_axis=1, expert_axis=1,
                         batch_tokens=8, execution="xla")
  with pytest.raises(ValueError, match="model axis of 2"):
    cost.estimate_device(_micro(d_ff=4), data_axis=1, expert_axis=1,
                         model_axis=2, batch_tokens=8, execution="unfused")


def test_info_shows_the_unfused_estimate_or_why_not():
  from m4moe.cost import tables as cost_tables  # pylint: disable=g-import-not-at-top
  from m4moe.parallel import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  mesh = mesh_lib.MeshShape.parse("data:2")
  info = cost_tables.collect(_micro(), source="micro", batch_tokens=16,
                             sequence_length=4, mesh=mesh)
  assert info["device"]["execution"] == "fused"
  unfused = info["device_unfused"]
  assert unfused["activation_bytes"] == 23064
  assert (unfused["total_bytes"] - unfused["activation_bytes"] ==
          info["device"]["total_bytes"] - info["device"]["activation_bytes"])
  info = cost_tables.collect(_micro(dropout_rate=0.1), source="micro",
                             batch_tokens=16, sequence_length=4, mesh=mesh)
  assert "--dropout_rate=0.1 (use 0)" in info["device_unfused"]["unavailable"]
  assert "activation_bytes" not in info["device_unfused"]
