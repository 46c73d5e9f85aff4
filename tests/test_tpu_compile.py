"""The TPU path, compile-only: a GShard zoo row's training step, lowered.

No TPU here. This lowers (``experimental_get_compiler_ir(...)(stage=
"hlo")``, TensorFlow to XLA HLO, as TPUStrategy's compile does first) one
training step -- forward, label-smoothed loss plus the MoE loss, gradients
and the row's own Adafactor update, in one ``jit_compile`` function -- of
``gshard/moe_128e_12l`` shrunk in width, depth and E (router, policy,
capacity, dispatch and MoE placement are the row's) under the ``"xla"``
sharding backend on the 8-device mesh ``data:2,expert:4``.

What CPU XLA emits: the lowered HLO carries the GShard annotations as
``custom_call_target="Sharding"`` ops with tile assignments over the 8
device ids, and no collective at all. TensorFlow lowers for one device;
turning annotations into AllToAll (dispatch, combine) and AllReduce
(replicated weights' gradients over ``data``) is the SPMD partitioner's job
in the TPU compiler, which cannot run here. So the test checks what the
partitioner will be given: the dispatched buffers split on E over
``expert`` and on G over ``data``, every tile assignment a permutation of
the 8 devices, and that the lowered program has no collective of its own.
(Per-layer annotation of the tiny Transformer is ``test_sharding.py``'s.)
"""

import re

import pytest
import tensorflow as tf

from m4moe import config as config_lib
from m4moe.cost import model as cost
from m4moe.model import losses
from m4moe.training import optimizer as optimizer_lib
from m4moe.parallel import sharding as sharding_lib

ROW = "gshard/moe_128e_12l"
REDUCED = ("--d_model=16", "--num_heads=2", "--d_kv=8", "--d_ff=32",
           "--num_encoder_layers=2", "--num_decoder_layers=2",
           "--src_vocab_size=32", "--tgt_vocab_size=32", "--num_experts=8",
           "--expert_hidden_dim=16", "--group_size=8")
MESH = "data:2,expert:4"
COLLECTIVES = ("all-to-all", "all-reduce", "all-gather", "reduce-scatter",
               "collective-permute", "collective-broadcast")
# <[E, G, C, M]> buffers: E over expert (4), G over data (2).
DISPATCHED = "{devices=[4,2,1,1]0,4,1,5,2,6,3,7}"


def _config():
  return config_lib.load_model_config(ROW, REDUCED)


@pytest.fixture(scope="module")
def hlo():
  from m4moe.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  s = sharding_lib.make_sharding(MESH, backend="xla")
  tf.random.set_seed(0)
  transformer = model_lib.Transformer(config=_config(), sharding=s)
  variables = list(transformer.trainable_variables)
  optimizer = optimizer_lib.Adafactor(config_lib.load_optimizer_config(ROW))
  optimizer.build(variables)
  batch = {"inputs": tf.fill([4, 4], 5), "targets": tf.fill([4, 4], 6)}

  @tf.function(jit_compile=True)
  def train_step(batch, seed):
    with tf.GradientTape() as tape:
      out = transformer(batch, training=True, seed=seed)
      xent, weight = losses.token_cross_entropy(
          out.logits, batch["targets"], label_smoothing=0.1)
      loss = xent / weight + out.moe_loss
    grads = tape.gradient(loss, variables)
    optimizer.apply_gradients(grads, variables)
    return loss

  return train_step.experimental_get_compiler_ir(
      batch, tf.constant([1, 2]))(stage="hlo")


def test_reduced_row_keeps_the_rows_moe():
  config, full = _config(), config_lib.load_model_config(ROW)
  for field in ("router", "second_expert_policy", "train_capacity_factor",
                "dispatch"):
    assert getattr(config.moe, field) == getattr(full.moe, field)
  assert config.moe.dispatch == "einsum"
  assert cost.num_moe_layers(config) == 2  # every other layer, 2 + 2


def test_expert_buffers_are_annotated_for_the_partitioner(hlo):
  found = sharding_lib.hlo_shardings(hlo)
  dispatched = {v for k, v in found.items()
                if k.rsplit("/", 1)[-1] == "dispatched" and
                "gradient_tape" not in k}
  assert dispatched == {DISPATCHED}


def test_tile_assignments_use_the_8_devices(hlo):
  shardings = re.findall(r"sharding=(\{[^}]*\})", hlo)
  assert len(shardings) > 20
  for sharding in shardings:
    if sharding == "{replicated}":
      continue
    ids = re.fullmatch(r"\{devices=\[[0-9,]+\]([0-9,]+)"
                       r"( last_tile_dim_replicate)?\}", sharding)
    assert ids, sharding
    assert sorted(int(i) for i in ids.group(1).split(",")) == list(range(8))


def test_lowered_step_has_no_collectives_on_cpu(hlo):
  ops = re.findall(r"= \S+ ([a-z-]+)\(", hlo)
  assert "custom-call" in ops
  assert not set(COLLECTIVES) & set(ops)
