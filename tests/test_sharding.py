"""Sharding API in one process: mesh flags, validation, no-ops, XLA HLO.

The XLA backend needs no real devices: the annotations are compiled into the
HLO (``sharding={devices=[...]}``) that XLA's SPMD partitioner consumes on
TPU, and we check that text. Multi-device DTensor runs are in
``test_sharding_dtensor.py`` (subprocess).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf

from m4moe.parallel import sharding as sharding_lib
from m4moe.parallel.mesh import MeshError, MeshShape, validate_mesh
from test_sharding_dtensor import E, G, H, M, S, _einsum_moe  # pylint: disable=g-bad-import-order


def test_mesh_flag_round_trip():
  mesh = MeshShape.parse(" data:2, expert:4 ")
  assert mesh.axes == (("data", 2), ("expert", 4))
  assert (mesh.size, mesh.axis_size("expert"), mesh.axis_size("model")) == (
      8, 4, 1)
  assert MeshShape.parse(str(mesh)) == mesh
  assert mesh.mesh_axes_of(("model", "expert", None)) == (None, "expert", None)


@pytest.mark.parametrize("text, fragment", [
    ("", "is empty"),
    ("data=2", "is not 'name:size'"),
    ("data:2,batch:2", "axis 'batch' is unknown"),
    ("data:0", "needs a positive integer size"),
    ("expert:2,expert:2", "repeat a name"),
])
def test_bad_mesh_flags_name_the_flag_and_fix(text, fragment):
  with pytest.raises(MeshError, match=fragment) as info:
    MeshShape.parse(text)
  assert "--mesh=" in str(info.value)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"num_devices": 4}, "uses 8 devices but 4 are available"),
    ({"num_experts": 6}, "--num_experts=6 is not divisible by .* expert:4"),
    ({"num_experts": 0}, "the model is dense"),
    ({"num_groups": 3}, "3 groups per step .* not divisible .* data:2"),
    ({"batch_size": 5}, "5 sentences .* data:2"),
])
def test_validate_mesh_errors(kwargs, fragment):
  with pytest.raises(MeshError, match=fragment):
    validate_mesh(MeshShape.parse("data:2,expert:4"), **kwargs)


def test_validate_mesh_accepts_consistent_setup():
  validate_mesh(MeshShape.parse("data:2,expert:4"), num_devices=8,
                num_experts=8, num_groups=4, batch_size=16)


@pytest.mark.parametrize("kwargs, flag", [
    ({"num_heads": 6}, "num_heads"), ({"d_ff": 10}, "d_ff"),
    ({"expert_hidden_dim": 10}, "expert_hidden_dim"),
])
def test_validate_mesh_model_axis_must_divide_the_split_widths(kwargs, flag):
  mesh = MeshShape.parse("data:2,model:4")
  with pytest.raises(MeshError, match=(
      f"--{flag}={kwargs[flag]} is not divisible by the mesh's model:4 "
      r"axis \(--mesh=data:2,model:4\).*e.g. model:2")):
    validate_mesh(mesh, **kwargs)
  validate_mesh(mesh, **{flag: 2 * kwargs[flag]})  # 12, 20, 20 divide.
  validate_mesh(MeshShape.parse("data:2"), **kwargs)  # No model axis.


def test_validate_mesh_model_axis_must_divide_the_shared_experts_width():
  mesh = MeshShape.parse("data:2,model:4")
  with pytest.raises(MeshError, match=(
      r"shared experts' hidden width 90 .*model:4 axis.*e.g. model:2")):
    validate_mesh(mesh, shared_width=90)
  validate_mesh(mesh, shared_width=96)


def test_model_widths_skip_what_the_model_lacks():
  from m4moe import config as config_lib  # pylint: disable=g-import-not-at-top
  from m4moe.parallel.mesh import model_widths  # pylint: disable=g-import-not-at-top
  moe = config_lib.load_model_config("tiny/moe")
  assert model_widths(moe) == {
      "num_experts": 8, "num_heads": moe.num_heads, "d_ff": moe.d_ff,
      "expert_hidden_dim": 256, "shared_width": None}
  shared = config_lib.load_model_config("tiny/moe", (
      "--num_shared_experts=2", "--shared_expert_hidden_dim=96"))
  assert model_widths(shared)["shared_width"] == 192
  dense = config_lib.load_model_config("tiny/dense")
  assert model_widths(dense)["expert_hidden_dim"] is None
  assert model_widths(dense)["d_ff"] == dense.d_ff
  every = config_lib.load_model_config("tiny/moe", ("--moe_layer_interval=1",
                                                    "--moe_layer_offset=0"))
  assert model_widths(every)["d_ff"] is None  # No dense FFN layer.


def test_no_sharding_is_identity():
  x = tf.constant([[1.0, 2.0]])
  s = sharding_lib.NO_SHARDING
  assert not s.enabled
  assert s.replicate(x) is x
  assert s.split(x, dim=1, axis="expert") is x
  assert s.shard(x, ("data", "model")) is x
  assert sharding_lib.make_sharding(None) is s
  assert sharding_lib.make_sharding("data:2", backend="none") is s
  v = s.variable(np.ones([2, 3], np.float32), spec=("expert",), name="w")
  assert isinstance(v, tf.Variable) and "DVariable" not in type(v).__name__
  np.testing.assert_array_equal(v.numpy(), np.ones([2, 3]))
  with s.variable_scope():
    w = tf.Variable(tf.zeros([2]))
  assert "DVariable" not in type(w).__name__


def test_annotation_argument_errors():
  s = sharding_lib.make_sharding("data:2,expert:4", backend="xla")
  x = tf.zeros([4, 6])
  with pytest.raises(MeshError, match="axis 'experts' is unknown"):
    s.split(x, dim=0, axis="experts")
  with pytest.raises(MeshError, match="dim=2 is out of range"):
    s.split(x, dim=2, axis="data")
  with pytest.raises(MeshError, match="longer than the tensor's rank"):
    s.shard(x, ("data", None, None))
  with pytest.raises(MeshError, match="same mesh axis"):
    s.shard(x, ("data", "data"))
  with pytest.raises(MeshError, match="size 6, not divisible by mesh axis "
                     "expert:4"):
    s.split(x, dim=1, axis="expert", name="hidden")


def test_dtensor_mesh_must_match_device_count():
  # This process has one CPU device (no virtual devices configured).
  with pytest.raises(MeshError, match="uses 8 devices but 1 are available"):
    sharding_lib.make_sharding("data:2,expert:4")


def test_variable_rules_pick_weights_and_their_slots():
  s = sharding_lib.NO_SHARDING
  layer = "transformer/encoder_layer_1/"
  # Experts <[E, M, H]>, <[E, H, M]>: E over expert, H over model.
  assert s.spec_for(layer + "moe/experts/wi") == ("expert", None, "model")
  assert s.spec_for(layer + "moe/experts/wo") == ("expert", "model", None)
  # Adafactor: vr drops the last dimension, vc the second-to-last.
  assert s.spec_for("slots_3/transformer/moe/experts/wi/vr") == (
      "expert", None)
  assert s.spec_for(layer + "moe/experts/wi/vc") == ("expert", "model")
  assert s.spec_for(layer + "moe/experts/wo/vr") == ("expert", "model")
  assert s.spec_for(layer + "moe/experts/wo/vc") == ("expert", None)
  assert s.spec_for(layer + "moe/experts/wi/m") == ("expert", None, "model")
  # Attention <[M, A, D]> / <[A, D, M]> on heads; dense FFN on d_ff.
  for block in ("self_attention", "cross_attention"):
    for w in ("wq", "wk", "wv"):
      assert s.spec_for(f"{layer}{block}/{w}") == (None, "model", None)
      assert s.spec_for(f"{layer}{block}/{w}/vr") == (None, "model")
      assert s.spec_for(f"{layer}{block}/{w}/vc") == (None, None)
    assert s.spec_for(f"{layer}{block}/wo") == ("model", None, None)
    assert s.spec_for(f"{layer}{block}/wo/vc") == ("model", None)
  assert s.spec_for(layer + "ffn/wi") == (None, "model")
  assert s.spec_for(layer + "ffn/wi/vr") == (None,)
  assert s.spec_for(layer + "ffn/wi/vc") == ("model",)
  assert s.spec_for(layer + "ffn/wo") == ("model", None)
  assert s.spec_for(layer + "ffn/wo/vr") == ("model",)
  # Replicated: router, layer norms, embeddings.
  for name in ("moe/router/wg", "ffn_norm/scale", "self_attention_norm/bias",
               "ffn_norm/scale/v"):
    assert s.spec_for(layer + name) == (), name
  assert s.spec_for("transformer/source_embedding/embeddings") == ()
  assert sharding_lib.slot_specs(("a", "b", "c")) == {
      "/vr": ("a", "b"), "/vc": ("a", "c"), "/v": ("a", "b", "c"),
      "/m": ("a", "b", "c")}


def test_xla_annotations_are_identities_outside_xla():
  s = sharding_lib.make_sharding("data:2,expert:4", backend="xla")
  x = tf.reshape(tf.range(8.0), [4, 2])
  np.testing.assert_array_equal(s.split(x, dim=0, axis="data"), x)

  @tf.function
  def graph(x):
    return s.split(x, dim=0, axis="expert") * 2.0

  np.testing.assert_array_equal(graph(x), 2.0 * x)


def _annotated_step(sharding):
  rng = np.random.default_rng(0)
  wg = tf.Variable(rng.normal(size=(M, E)).astype(np.float32))
  wi = tf.Variable(rng.normal(size=(E, M, H)).astype(np.float32))
  wo = tf.Variable(rng.normal(size=(E, H, M)).astype(np.float32))

  @tf.function(jit_compile=True)
  def step(x):
    with tf.GradientTape() as tape:
      with tf.name_scope("moe"):
        out = _einsum_moe(x, wg, wi, wo, sharding)
      loss = tf.reduce_sum(out * out)
    return loss, tape.gradient(loss, [wg, wi, wo])

  x = tf.constant(rng.normal(size=(G, S, M)).astype(np.float32))
  return step, x


# Mesh data:2,expert:4: devices 0..7 in row-major (data, expert) order.
# Split over data (mesh dim 0): 2 tiles, each replicated on the 4 expert
# devices of its row. Split over expert: 4 tiles, each on the 2 devices of its
# column: 0,4 | 1,5 | 2,6 | 3,7.
_DATA3 = "{devices=[2,1,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
_EXPERT3 = "{devices=[4,1,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"
_EXPERT4 = "{devices=[4,1,1,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"
_DATA4 = "{devices=[2,1,1,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"


def test_xla_hlo_carries_gshard_annotations():
  s = sharding_lib.make_sharding("data:2,expert:4", backend="xla")
  step, x = _annotated_step(s)
  hlo = step.experimental_get_compiler_ir(x)(stage="hlo")
  found = sharding_lib.hlo_shardings(hlo)
  assert found["moe/inputs"] == _DATA3
  assert found["moe/router_weights"] == "{replicated}"
  assert found["moe/expert_wi"] == _EXPERT3
  assert found["moe/expert_wo"] == _EXPERT3
  assert found["moe/dispatched"] == _EXPERT4
  assert found["moe/expert_outputs"] == _EXPERT4
  assert found["moe/outputs"] == _DATA3
  # The backward pass carries the same annotations on the cotangents.
  assert found["gradient_tape/moe/expert_outputs"] == _EXPERT4
  assert found["gradient_tape/moe/expert_wi"] == _EXPERT3
  # Annotating does not change the numbers.
  loss, grads = step(x)
  ref_loss, ref_grads = _annotated_step(sharding_lib.NO_SHARDING)[0](x)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  for got, want in zip(grads, ref_grads):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_xla_absent_axis_means_not_split():
  s = sharding_lib.make_sharding("data:8", backend="xla")
  step, x = _annotated_step(s)
  found = sharding_lib.hlo_shardings(
      step.experimental_get_compiler_ir(x)(stage="hlo"))
  assert found["moe/inputs"] == "{devices=[8,1,1]0,1,2,3,4,5,6,7}"
  assert found["moe/dispatched"] == "{replicated}"
  assert found["moe/expert_wi"] == "{replicated}"


@pytest.mark.parametrize("dispatch", ("index", "einsum"))
def test_real_moe_layer_hlo_annotations(dispatch):
  from m4moe import config as config_lib  # pylint: disable=g-import-not-at-top,g-multiple-import
  from m4moe.moe import layer as moe_layer
  config = config_lib.load_model_config("tiny/moe", (
      "--d_model=8", "--num_experts=8", "--expert_hidden_dim=16",
      "--group_size=4", f"--dispatch={dispatch}",
      "--second_expert_policy=all"))
  s = sharding_lib.make_sharding("data:2,expert:4", backend="xla")
  layer = moe_layer.MoeLayer(config=config, causal=False, sharding=s)
  x = tf.random.stateless_normal([4, 4, 8], seed=[1, 2])
  mask = tf.ones([4, 4])

  @tf.function(jit_compile=True)
  def step(x, mask):
    with tf.GradientTape() as tape:
      out = layer(x, padding_mask=mask, training=True)
      loss = tf.reduce_sum(tf.square(out.outputs))
    return loss, tape.gradient(loss, layer.trainable_variables)

  found = sharding_lib.hlo_shardings(
      step.experimental_get_compiler_ir(x, mask)(stage="hlo"))
  assert found["groups"] == _DATA3
  assert found["group_mask"] == (
      "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}")
  # Buffers <[E, G, C, M]>: E over expert (4), G stays over data (2), so
  # tile (e, g) is on device 4g + e and no expert's work is repeated.
  assert found["dispatched_groups"] == (
      "{devices=[1,2,1,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}")
  assert found["dispatched"] == "{devices=[4,2,1,1]0,4,1,5,2,6,3,7}"
  assert found["wi"] == _EXPERT3
  assert found["wo"] == _EXPERT3
  # Expert outputs: GECM (both: on a mesh --dispatch=index runs the
  # per-group gathers, grouped_index, whose combine reads GECM), then back
  # to groups.
  assert layer.dispatch == ("grouped_index" if dispatch == "index"
                            else "einsum")
  assert found["expert_outputs"] == "{devices=[2,4,1,1]0,1,2,3,4,5,6,7}"
  assert found["expert_outputs_groups"] == _DATA4
  assert found["combined"] == _DATA3
  assert found["gradient_tape/wi"] == _EXPERT3
  loss, _ = step(x, mask)
  plain = moe_layer.MoeLayer(config=config, causal=False)
  for a, b in zip(plain.trainable_variables, layer.trainable_variables):
    a.assign(b)
  ref = tf.reduce_sum(tf.square(
      plain(x, padding_mask=mask, training=True).outputs))
  np.testing.assert_allclose(loss, ref, rtol=1e-5)


def _train_step_hlo(mesh: str, *, num_experts: int) -> str:
  """HLO of a tiny Transformer's XLA train step annotated for ``mesh``."""
  from m4moe import config as config_lib  # pylint: disable=g-import-not-at-top,g-multiple-import
  from m4moe.model import losses
  from m4moe.model import transformer as model
  config = config_lib.load_model_config("tiny/moe", (
      "--d_model=16", "--num_heads=2", "--d_kv=8", "--d_ff=32",
      "--num_encoder_layers=2", "--num_decoder_layers=2",
      "--src_vocab_size=32", "--tgt_vocab_size=32",
      f"--num_experts={num_experts}",
      "--expert_hidden_dim=16", "--group_size=8", "--dropout_rate=0",
      "--attention_dropout_rate=0", "--second_expert_policy=all"))
  s = sharding_lib.make_sharding(mesh, backend="xla")
  transformer = model.Transformer(config=config, sharding=s)
  batch = {"inputs": tf.fill([4, 4], 5), "targets": tf.fill([4, 4], 6)}

  @tf.function(jit_compile=True)
  def step(batch):
    with tf.GradientTape() as tape:
      out = transformer(batch, training=True)
      xent, weight = losses.token_cross_entropy(out.logits, batch["targets"])
      loss = xent / weight + out.moe_loss
    return loss, tape.gradient(loss, transformer.trainable_variables)

  return step.experimental_get_compiler_ir(batch)(stage="hlo")


def test_transformer_train_step_hlo_annotates_every_moe_layer():
  hlo = _train_step_hlo("data:2,expert:4", num_experts=8)
  # One MoE layer per stack (interval 2, offset 1): 2 layers, each with its
  # wi/wo split on E forwards and backwards.
  assert hlo.count(_EXPERT3) == 2 * 2 * 2
  groups = [l for l in hlo.splitlines()
            if 'custom_call_target="Sharding"' in l and
            re.search(r'op_name="([^"]*/)?groups/', l)]
  assert len(groups) == 2 and all(_DATA3 in l for l in groups)


def test_transformer_hlo_annotates_tensor_parallel_blocks():
  found = sharding_lib.hlo_shardings(
      _train_step_hlo("data:2,expert:2,model:2", num_experts=4))
  forward = {k: v for k, v in found.items()
             if not k.startswith("gradient_tape")}

  def annotations(name):  # One per call site: name, name_1, name_2, ...
    return [v for k, v in forward.items()
            if re.fullmatch(rf"(.*/)?{name}(_\d+)?", k)]

  # Device d sits at (data, expert, model) = row-major coordinates of d.
  # Heads <[B, L, A, D]>: B over data, A over model, replicated over expert.
  heads = "{devices=[2,1,2,1,2]0,2,1,3,4,6,5,7 last_tile_dim_replicate}"
  # Block outputs <[B, L, M]>: B over data only (after the all-reduce).
  whole = "{devices=[2,1,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
  # Six attention blocks (2 encoder self, 2 decoder self + 2 cross).
  for name in ("wq_heads", "context", "attention_output"):
    assert len(annotations(name)) == 6, name
  assert set(annotations("wq_heads")) == set(annotations("context")) == {
      heads}
  assert len(annotations("wk_heads")) == 6  # Cross k/v come from encode.
  assert set(annotations("attention_output")) == {whole}
  # Weights: wq <[M, A, D]> on A, wo <[A, D, M]> on A (model only).
  assert set(annotations("wq")) == {
      "{devices=[1,2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"}
  # Dense FFN (layer 0 of each stack): hidden <[B, L, F]> on F.
  assert set(annotations("ffn_hidden")) == {
      "{devices=[2,1,2,2]0,2,1,3,4,6,5,7 last_tile_dim_replicate}"}
  assert len(annotations("ffn_hidden")) == 2
  assert set(annotations("ffn_output")) == {whole}
  # Experts (layer 1 of each stack): hidden <[E, G, C, H]> with E over
  # expert, G over data, H over model: every device its own tile.
  assert annotations("expert_hidden") == [
      "{devices=[2,2,1,2]0,1,4,5,2,3,6,7}"] * 2
