"""Local group dispatching (GShard §3.2): each data shard groups its own rows.

On a mesh whose ``data`` axis (size D) divides the batch's B rows, the MoE
layer compacts padding and forms groups within each shard of B/D rows, never
across shards. These tests run on one device: a layer built with the XLA
backend's sharding (annotations are identities outside XLA) groups exactly
as the mesh does, which is how the multi-device tests get their one-device
reference (``test_sharding_dtensor.py``, ``test_sharding_train_step.py``).
"""

import re

import numpy as np
import pytest
import tensorflow as tf

from m4moe.parallel import sharding as sharding_lib
from m4moe.config import ModelConfig, MoeConfig
from m4moe.moe.layer import MoeLayer

# Dimensions: B rows, L length, M d_model, E experts.
B, L, M, E = 4, 6, 8, 4


def _layer(mesh=None, *, dispatch="einsum", init_seed=0, **moe_kwargs):
  moe = dict(num_experts=E, expert_hidden_dim=6, group_size=4,
             train_capacity_factor=0.5, second_expert_policy="all",
             dispatch=dispatch)
  moe.update(moe_kwargs)
  sharding = sharding_lib.make_sharding(mesh, backend="xla")
  tf.random.set_seed(init_seed)
  return MoeLayer(config=ModelConfig(d_model=M, moe=MoeConfig(**moe)),
                  causal=False, sharding=sharding)


def _batch(*, seed=0, rows=B, pad=((0, 3), (3, 4))):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(rows, L, M)).astype(np.float32)
  mask = np.ones((rows, L), np.float32)
  for row, start in pad:
    mask[row, start:] = 0
  return tf.constant(x), tf.constant(mask)


def _outputs_and_input_grads(layer, x, mask):
  with tf.GradientTape() as tape:
    tape.watch(x)
    out = layer(x, padding_mask=mask, training=True)
    loss = tf.reduce_sum(tf.square(out.outputs))
  return out.outputs.numpy(), tape.gradient(loss, x).numpy()


def test_group_shards_is_the_batch_axis_when_it_divides_the_rows():
  assert _layer(None).group_shards(B) == 1
  assert _layer("data:1").group_shards(B) == 1
  # No data axis: the rows are split over the experts' devices (GShard).
  assert _layer("data:1,expert:2").group_shards(B) == 2
  assert _layer("expert:4").group_shards(B) == 4
  assert _layer("expert:4").group_shards(6) == 1
  two = _layer("data:2,expert:2")
  assert two.group_shards(4) == 2
  # An odd eval batch, or a row count unknown statically: one shard.
  assert two.group_shards(5) == 1 and two.group_shards(None) == 1


def test_each_group_holds_tokens_of_one_shard_real_ones_first():
  layer = _layer("data:2")
  # Token features: feature 0 is the token's index in the batch (+1).
  index = np.arange(1, B * L + 1, dtype=np.float32)
  tokens = np.zeros((B * L, M), np.float32)
  tokens[:, 0] = index
  _, mask = _batch()
  mask = tf.reshape(mask, [-1])
  grouped, grouped_mask, position, source = layer._group(  # pylint: disable=protected-access
      tf.constant(tokens), mask, shards=2)
  assert source is None  # on a mesh: batched gathers, autodiff gradients
  # 12 tokens per shard, S = 4: 3 groups per shard, G = 6.
  assert grouped.shape == (6, 4, M) and position.shape == (2, 12)
  token_of_slot = grouped.numpy()[..., 0].reshape(2, 12) - 1
  mask = mask.numpy().reshape(2, 12)
  for d in range(2):
    own = np.arange(d * 12, (d + 1) * 12)
    assert set(token_of_slot[d].astype(int)) == set(own)  # Nothing crosses.
    real = own[mask[d] > 0]
    padding = own[mask[d] == 0]
    np.testing.assert_array_equal(token_of_slot[d],
                                  np.concatenate([real, padding]))
    np.testing.assert_array_equal(grouped_mask.numpy().reshape(2, 12)[d],
                                  np.sort(mask[d])[::-1])
    # position inverts the grouping within the shard.
    np.testing.assert_array_equal(token_of_slot[d][position.numpy()[d]], own)


def test_one_shard_groups_the_whole_batch_as_without_a_mesh():
  x, mask = _batch()
  plain = _layer(None)
  one = _layer("data:1")
  got = _outputs_and_input_grads(one, x, mask)
  want = _outputs_and_input_grads(plain, x, mask)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dispatch", ("einsum", "index"))
@pytest.mark.parametrize("mesh", ("data:2", "data:4,expert:2", "expert:2"))
def test_each_shard_computes_as_if_it_were_the_whole_batch(mesh, dispatch):
  # Values and input gradients of shard d's rows equal the layer run on
  # those rows alone (same weights): no token's routing depends on another
  # shard. Capacity 1 per expert drops tokens: another grouping would show.
  x, mask = _batch()
  layer = _layer(mesh, dispatch=dispatch)
  shards = layer.group_shards(B)
  out, grad = _outputs_and_input_grads(layer, x, mask)
  alone = _layer(None, dispatch=dispatch)
  rows = B // shards
  for d in range(shards):
    part = slice(d * rows, (d + 1) * rows)
    want_out, want_grad = _outputs_and_input_grads(alone, x[part], mask[part])
    np.testing.assert_allclose(out[part], want_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad[part], want_grad, rtol=1e-5, atol=1e-6)
  # ... and not the global grouping: padding compacted across shards routes
  # some tokens differently.
  global_out, _ = _outputs_and_input_grads(alone, x, mask)
  assert not np.allclose(out, global_out, atol=1e-4)


def test_padding_in_one_shard_changes_nothing_in_the_other():
  layer = _layer("data:2")
  x, mask = _batch()
  before, _ = _outputs_and_input_grads(layer, x, mask)
  more_padding = mask.numpy()
  more_padding[2, 1:] = 0  # Shard 1 (rows 2, 3) loses real tokens.
  after, _ = _outputs_and_input_grads(layer, x, tf.constant(more_padding))
  np.testing.assert_array_equal(after[:2], before[:2])
  assert not np.allclose(after[2:], before[2:])


def test_local_groups_compile_under_xla():
  layer = _layer("data:2,expert:2", dispatch="index")
  x, mask = _batch()
  compiled = tf.function(
      lambda x, mask: layer(x, padding_mask=mask, training=True).outputs,
      jit_compile=True)
  want, _ = _outputs_and_input_grads(layer, x, mask)
  np.testing.assert_allclose(compiled(x, mask), want, rtol=1e-5, atol=1e-6)


_HLO_ANNOTATION = re.compile(
    r"= (\w+)\[([\d,]*)\][^ ]* custom-call\(.*custom_call_target=\"Sharding\","
    r" sharding=\{(?:devices=\[([\d,]+)\][^}]*|replicated)\}.*"
    r"op_name=\"([^\"]*)/XlaSharding(?:_\d+)?\"")
_COLLECTIVES = ("all-to-all", "all-gather", "all-reduce", "reduce-scatter",
                "collective-permute")


def _annotations(hlo):
  """{annotation name: (shape, tiles per dimension or None if replicated)}."""
  found = {}
  for match in _HLO_ANNOTATION.finditer(hlo):
    _, shape, tiles, name = match.groups()
    shape = [int(d) for d in shape.split(",") if d]
    tiles = None if tiles is None else [
        int(t) for t in tiles.split(",")][:len(shape)]
    found[name.rsplit("/", 1)[-1] if "gradient_tape" not in name
          else name] = (shape, tiles)
  return found


@pytest.mark.parametrize("mesh", ("data:2,expert:2", "data:2,expert:4",
                                  "data:4,expert:2"))
def test_xla_step_keeps_tokens_on_their_data_shard(mesh):
  # The MoE layer's forward and backward pass, compiled with the XLA
  # backend's annotations over 4 and 8 devices. What the SPMD partitioner
  # would receive (stage "hlo"): every token-activation tensor is split on
  # data (never replicated: a replicated annotation would make the
  # partitioner all-gather the tokens), the buffers <[E, G, C, M]> on E.
  layer = _layer(mesh, dispatch="einsum", num_experts=8)
  shape = sharding_lib.MeshShape.parse(mesh)
  data, expert = shape.axis_size("data"), shape.axis_size("expert")
  x, mask = _batch()

  @tf.function(jit_compile=True)
  def step(x, mask):
    with tf.GradientTape() as tape:
      tape.watch(x)
      out = layer(x, padding_mask=mask, training=True)
      loss = tf.reduce_sum(tf.square(out.outputs))
    return loss, tape.gradient(loss, [x] + list(layer.trainable_variables))

  ir = step.experimental_get_compiler_ir(x, mask)
  found = _annotations(ir(stage="hlo"))
  assert found["shard_tokens"] == ([data, B * L // data, M], [data, 1, 1])
  for name in ("groups", "combined", "gradient_tape/combined"):
    tokens, tiles = found[name]
    assert tokens[-1] == M and tiles == [data, 1, 1], name
  # Buffers: E over expert, G over data (GECM after the experts).
  assert found["dispatched"][1] == [expert, data, 1, 1]
  assert found["expert_outputs"][1] == [data, expert, 1, 1]
  # Every annotated tensor of token activations (rank 3, last dimension M:
  # [D, N/D, M] shards, [G, S, M] groups; not the expert weights) is split
  # on data.
  for name, (tokens, tiles) in found.items():
    if (len(tokens) == 3 and tokens[-1] == M and
        name.rsplit("/", 1)[-1] not in ("wi", "wo")):
      assert tiles is not None and tiles[0] == data, name
  # What XLA:CPU emits (stage "optimized_hlo"): ONE partition. TensorFlow's
  # jit_compile builds XLA programs with default ExecutableBuildOptions
  # (GetExecutableBuildOptions in tensorflow/compiler/jit/
  # device_compiler_client.cc sets no num_partitions and no
  # use_spmd_partitioning), so the SPMD partitioner never runs off TPU:
  # no collective at all (no all-to-all to check here, and no all-gather),
  # the Sharding annotations are dropped and the parameters keep their full
  # logical shapes. On a TPU (TPUStrategy with
  # experimental_spmd_xla_partitioning) the annotations above are its input.
  optimized = ir(stage="optimized_hlo")
  for op in _COLLECTIVES:
    assert f" {op}(" not in optimized and f" {op}-start(" not in optimized
  assert 'custom_call_target="Sharding"' not in optimized
  assert "num_partitions" not in optimized.split("\n", 1)[0]
  assert f"f32[{B},{L},{M}]" in re.search(
      r"entry_computation_layout=\{\(([^)]*)\)", optimized).group(1)
