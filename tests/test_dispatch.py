"""Einsum (Algorithm 2), index, sorted and block dispatch: same values, same
gradients; the resolver's decisions; the registry holds every path."""

import dataclasses
import inspect

import numpy as np
import pytest
import tensorflow as tf

from m4moe.moe import dispatch
from m4moe.moe import routing
from m4moe.config import DISPATCH_IMPLEMENTATIONS, ModelConfig, MoeConfig
from m4moe.moe.layer import FeedForwardExperts, MoeLayer

SEED = tf.constant([5, 11], tf.int32)
E, M, H = 4, 8, 6


def _routers():
  common = dict(model_dim=M, num_experts=E, init_scale=1.0)
  out = {
      "top2-random": routing.Top2Router(**common),
      "top2-sampling-ntlb": routing.Top2Router(
          second_expert_policy="sampling", no_token_left_behind=True,
          **common),
      "top1-jitter": routing.SwitchRouter(jitter=0.1, **common),
      "top1-ntlb": routing.SwitchRouter(no_token_left_behind=True, **common),
      "noisy_top3": routing.NoisyTopKRouter(k=3, **common),
      "expert_choice": routing.ExpertChoiceRouter(**common),
  }
  rng = np.random.default_rng(0)
  for router in out.values():
    router.wg.assign(rng.normal(size=(M, E)).astype(np.float32))
  return out


ROUTERS = _routers()


def _inputs(num_groups=2, group_size=10, seed=0):
  rng = np.random.default_rng(seed)
  x = tf.constant(rng.normal(size=(num_groups, group_size, M)), tf.float32)
  mask = (rng.random((num_groups, group_size)) > 0.2).astype(np.float32)
  return x, tf.constant(mask)


def _experts():
  tf.random.set_seed(1)
  return FeedForwardExperts(num_experts=E, model_dim=M, hidden_dim=H,
                            init_scale=1.0)


def _run(implementation, router, experts, x, mask, capacity):
  with tf.GradientTape() as tape:
    tape.watch(x)
    result = router(x, padding_mask=mask, capacity=capacity, training=True,
                    seed=SEED)
    y = dispatch.dispatch_combine(x, result, experts,
                                  implementation=implementation)
    loss = tf.reduce_sum(y * tf.sin(tf.range(M, dtype=tf.float32)))
  variables = [router.wg, experts.wi, experts.wo]
  grads = tape.gradient(loss, [x] + variables)
  return y, grads


@pytest.mark.parametrize("name", sorted(ROUTERS))
@pytest.mark.parametrize("capacity", [2, 6])
def test_einsum_and_index_agree_in_values_and_gradients(name, capacity):
  router, experts = ROUTERS[name], _experts()
  x, mask = _inputs()
  y_einsum, g_einsum = _run("einsum", router, experts, x, mask, capacity)
  y_index, g_index = _run("index", router, experts, x, mask, capacity)
  np.testing.assert_allclose(y_index.numpy(), y_einsum.numpy(), atol=1e-5)
  for label, a, b in zip(("x", "wg", "wi", "wo"), g_index, g_einsum):
    np.testing.assert_allclose(tf.convert_to_tensor(a).numpy(),
                               tf.convert_to_tensor(b).numpy(), atol=1e-5,
                               err_msg=label)
  assert np.abs(tf.convert_to_tensor(g_index[1]).numpy()).max() > 0
  # Padding rows get exactly zero output.
  assert (y_index.numpy()[mask.numpy() == 0] == 0).all()


TOKEN_CHOICE = sorted(n for n in ROUTERS if n != "expert_choice")


@pytest.mark.parametrize("name", TOKEN_CHOICE)
@pytest.mark.parametrize("capacity", [2, 6])
def test_grouped_index_equals_index_in_values_and_gradients(name, capacity):
  # GShard's Gather form per group (what a mesh runs for --dispatch=index):
  # the same values and gradients as the one-device index path, eagerly and
  # compiled by XLA.
  router, experts = ROUTERS[name], _experts()
  x, mask = _inputs(num_groups=3)
  y_index, g_index = _run("index", router, experts, x, mask, capacity)
  y_group, g_group = _run("grouped_index", router, experts, x, mask,
                          capacity)
  np.testing.assert_allclose(y_group.numpy(), y_index.numpy(), atol=1e-5)
  for label, a, b in zip(("x", "wg", "wi", "wo"), g_group, g_index):
    np.testing.assert_allclose(tf.convert_to_tensor(a).numpy(),
                               tf.convert_to_tensor(b).numpy(), atol=1e-5,
                               err_msg=label)
  assert (y_group.numpy()[mask.numpy() == 0] == 0).all()
  if name == "top2-random":  # One compiled check (XLA draws its own random).
    compiled = tf.function(
        lambda path: _run(path, router, experts, x, mask, capacity),
        jit_compile=True)
    y_xla_index, g_xla_index = compiled("index")
    y_xla_group, g_xla_group = compiled("grouped_index")
    np.testing.assert_allclose(y_xla_group.numpy(), y_xla_index.numpy(),
                               atol=1e-5)
    for a, b in zip(g_xla_group, g_xla_index):
      np.testing.assert_allclose(tf.convert_to_tensor(a).numpy(),
                                 tf.convert_to_tensor(b).numpy(), atol=1e-5)


def test_group_slot_tokens_are_the_routers_slots_and_stay_in_group():
  router = ROUTERS["top2-random"]
  x, mask = _inputs(num_groups=3, seed=4)
  result = router(x, padding_mask=mask, capacity=3, training=False)
  slot_token, choice_slot = dispatch._group_slot_tokens(result)  # pylint: disable=protected-access
  want_token, _ = result.slots()  # [G, E, C], S if empty
  np.testing.assert_array_equal(slot_token.numpy(),
                                want_token.numpy().reshape(3, -1))
  kept = result.buffer_position.numpy() >= 0
  want_slot = np.where(kept, result.expert_index.numpy() * 3 +
                       result.buffer_position.numpy(), E * 3)
  np.testing.assert_array_equal(choice_slot.numpy(), want_slot.reshape(3, -1))
  # Group 0 alone gives group 0's slots: nothing is read across groups.
  alone = router(x[:1], padding_mask=mask[:1], capacity=3, training=False)
  np.testing.assert_array_equal(
      dispatch._group_slot_tokens(alone)[0].numpy(), slot_token.numpy()[:1])  # pylint: disable=protected-access


def test_grouped_index_refuses_expert_choice():
  x, mask = _inputs()
  result = ROUTERS["expert_choice"](x, padding_mask=mask, capacity=3,
                                    training=False)
  with pytest.raises(ValueError, match="token-choice router"):
    dispatch.dispatch_combine(x, result, _experts(),
                              implementation="grouped_index")


def _scale_by_expert(dispatched, *, output_layout, training=False, seed=None):
  """Expert e multiplies its buffer by e + 1."""
  del training, seed
  scale = tf.reshape(tf.range(1, E + 1, dtype=dispatched.dtype), [E, 1, 1, 1])
  out = dispatched * scale
  return out if output_layout == "EGCM" else tf.transpose(out, [1, 0, 2, 3])


@pytest.mark.parametrize("implementation", ["einsum", "index"])
def test_combine_is_weighted_sum_over_slots(implementation):
  router = ROUTERS["top2-random"]
  x, mask = _inputs(seed=3)
  result = router(x, padding_mask=mask, capacity=3, training=False)
  y = dispatch.dispatch_combine(x, result, _scale_by_expert,
                                implementation=implementation)
  combine = result.combine_array().numpy()  # [G, S, E, C]
  factor = (combine * np.arange(1, E + 1)[:, None]).sum(axis=(2, 3))
  np.testing.assert_allclose(y.numpy(), factor[..., None] * x.numpy(),
                             rtol=1e-5, atol=1e-6)


def _largest_tensor(fn, *args):
  graph = tf.function(fn).get_concrete_function(*args).graph
  sizes = [int(np.prod(t.shape)) for op in graph.get_operations()
           for t in op.outputs if t.shape.is_fully_defined()]
  return max(sizes)


def test_index_dispatch_never_builds_a_gsec_tensor():
  num_groups, group_size, capacity = 2, 32, 16
  x, mask = _inputs(num_groups, group_size)
  router, experts = ROUTERS["top2-random"], _experts()
  gsec = num_groups * group_size * E * capacity

  def layer(implementation):
    def fn(x, mask):
      result = router(x, padding_mask=mask, capacity=capacity,
                      training=False)
      return dispatch.dispatch_combine(x, result, experts,
                                       implementation=implementation)
    return fn

  assert _largest_tensor(layer("einsum"), x, mask) >= gsec
  # Index path: buffers (E*G*C + 1 zero row) * max(M, H) at most (here
  # 1032 < 4096).
  assert _largest_tensor(layer("index"), x, mask) <= (
      (E * num_groups * capacity + 1) * max(M, H))


def test_index_dispatch_compiles_with_xla():
  router, experts = ROUTERS["top1-ntlb"], _experts()
  x, mask = _inputs()

  def fn(x, mask):
    result = router(x, padding_mask=mask, capacity=3, training=False)
    return dispatch.index_dispatch_combine(x, result, experts)

  compiled = tf.function(fn, jit_compile=True)
  np.testing.assert_allclose(compiled(x, mask).numpy(), fn(x, mask).numpy(),
                             atol=1e-5)


def test_unknown_implementation_is_rejected():
  router = ROUTERS["top1-jitter"]
  x, mask = _inputs()
  result = router(x, padding_mask=mask, capacity=3, training=False)
  with pytest.raises(ValueError, match="--dispatch"):
    dispatch.dispatch_combine(x, result, _scale_by_expert,
                              implementation="dense")


def _layer_results(router, implementations, *, training):
  """Outputs and gradients of equal-weight MoeLayers, one per dispatch.

  Drops (capacity factor 0.75), expert dropout, jitter and z-loss all on.
  Returns {implementation: [outputs, d x, d weights...]} as dense tensors.
  """
  tf.random.set_seed(2)  # initialisers under op determinism
  layers = {}
  for implementation in implementations:
    config = ModelConfig(d_model=M, moe=MoeConfig(
        num_experts=E, expert_hidden_dim=H, router=router, group_size=6,
        num_selected_experts=2, train_capacity_factor=0.75,
        expert_dropout_rate=0.3, router_jitter=0.1, z_loss_weight=0.1,
        dispatch=implementation))
    layers[implementation] = MoeLayer(config=config, causal=False)
    assert layers[implementation].dispatch == implementation
  first = layers[implementations[0]]
  for layer in layers.values():
    for a, b in zip(layer.trainable_variables, first.trainable_variables):
      a.assign(b)
  x, mask = _inputs(num_groups=3, group_size=5, seed=4)
  results = {}
  for implementation, layer in layers.items():
    with tf.GradientTape() as tape:
      tape.watch(x)
      out = layer(x, padding_mask=mask, training=training, seed=SEED)
      loss = tf.reduce_sum(out.outputs * tf.cos(x)) + out.weighted_loss
    grads = tape.gradient(loss, [x, *layer.trainable_variables],
                          unconnected_gradients=tf.UnconnectedGradients.ZERO)
    # (Eval: the index layer runs the block path, IndexedSlices gradients.)
    results[implementation] = [tf.convert_to_tensor(t).numpy()
                               for t in [out.outputs, *grads]]
  return results


@pytest.mark.parametrize("router", ["top2", "top1", "noisy_topk",
                                    "expert_choice"])
def test_layers_with_either_dispatch_agree_with_dropout_and_drops(router):
  results = _layer_results(router, ("einsum", "index"), training=True)
  for a, b in zip(results["index"], results["einsum"]):
    np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("name", [n for n in ROUTERS if n != "expert_choice"])
@pytest.mark.parametrize("capacity", [10, 2])  # no-drop (C = S) and drops
def test_block_dispatch_matches_index_in_values_and_gradients(name, capacity):
  x, mask = _inputs()
  experts = _experts()
  y_index, g_index = _run("index", ROUTERS[name], experts, x, mask, capacity)
  y_block, g_block = _run("block", ROUTERS[name], experts, x, mask, capacity)
  np.testing.assert_allclose(y_block, y_index, rtol=1e-5, atol=1e-6)
  for a, b in zip(g_block, g_index):
    np.testing.assert_allclose(tf.convert_to_tensor(a),
                               tf.convert_to_tensor(b), rtol=1e-4, atol=1e-5)


def test_block_layout_rows_hold_any_assignment_and_beat_no_drop_buffers():
  block, num_blocks = dispatch.block_layout(num_choices=256, num_experts=8)
  assert (block, num_blocks) == (16, 24)  # 256 + 8*15 = 376 <= 384 rows
  # All 256 choices on one expert, or spread with maximal padding, fit.
  assert block * num_blocks >= 256 + 8 * (block - 1)
  assert dispatch.block_rows_are_fewer(num_choices=256, num_experts=8,
                                       buffer_rows=8 * 128)
  # Training capacity (cf 1.25): the buffers are smaller, blocks unused.
  assert not dispatch.block_rows_are_fewer(num_choices=2048, num_experts=32,
                                           buffer_rows=32 * 80)


def test_no_drop_layer_uses_blocks_and_equals_buffer_path():
  config = ModelConfig(d_model=M, moe=MoeConfig(
      num_experts=E, expert_hidden_dim=H, group_size=16,
      eval_capacity_factor=0.0, dispatch="index"))
  layer = MoeLayer(config=config, causal=True)
  rng = np.random.default_rng(3)
  x = tf.constant(rng.normal(size=(3, 5, M)), tf.float32)
  mask = tf.constant(rng.random((3, 5)) > 0.3, tf.float32)
  grouped, grouped_mask, _, _ = layer._group(tf.reshape(x, [-1, M]),
                                             tf.reshape(mask, [-1]))
  result = layer.router(grouped, padding_mask=grouped_mask,
                        capacity=grouped.shape[1], training=False)
  layout = dispatch.BufferLayout(
      num_groups=grouped.shape[0], group_size=grouped.shape[1],
      num_selected=result.expert_index.shape[-1], num_experts=E,
      capacity=result.capacity)
  assert layer.resolve_dispatch(training=False, layout=layout) == "block"
  out = layer(x, padding_mask=mask, training=False).outputs
  buffers = dispatch.index_dispatch_combine(grouped, result, layer.experts)
  position = layer._group(tf.reshape(x, [-1, M]), tf.reshape(mask, [-1]))[2]
  expected = tf.reshape(tf.gather(tf.reshape(buffers, [-1, M]), position),
                        x.shape)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
  compiled = tf.function(lambda x: layer(x, padding_mask=mask,
                                         training=False).outputs,
                         jit_compile=True)
  np.testing.assert_allclose(compiled(x), expected, rtol=1e-5, atol=1e-6)


def test_layer_without_block_dispatch_keeps_the_buffers():
  config = ModelConfig(d_model=M, moe=MoeConfig(
      num_experts=E, expert_hidden_dim=H, group_size=16,
      eval_capacity_factor=0.0, dispatch="index"))
  tf.random.set_seed(5)
  blocks = MoeLayer(config=config, causal=True)
  buffers = MoeLayer(config=config, causal=True, router=blocks.router,
                     experts=blocks.experts, allow_block_dispatch=False)
  layout = dispatch.BufferLayout(num_groups=1, group_size=15, num_selected=2,
                                 num_experts=E, capacity=15)
  assert blocks.resolve_dispatch(training=False, layout=layout) == "block"
  assert buffers.resolve_dispatch(training=False, layout=layout) == "index"
  rng = np.random.default_rng(6)
  x = tf.constant(rng.normal(size=(3, 5, M)), tf.float32)
  mask = tf.ones([3, 5])
  np.testing.assert_allclose(
      buffers(x, padding_mask=mask, training=False).outputs,
      blocks(x, padding_mask=mask, training=False).outputs,
      rtol=1e-5, atol=1e-6)


def test_row_groups_are_resolved_and_run_from_the_registry(monkeypatch):
  # Decoding's per-token groups (one token per row, dead rows as padding):
  # the per-row call goes through resolve_dispatch and DISPATCH_PATHS like
  # the batch-group call, with its own static sizes (G = rows, S = 1, C = 1).
  config = ModelConfig(d_model=M, moe=MoeConfig(
      num_experts=E, expert_hidden_dim=H, group_size=16,
      eval_capacity_factor=1.0, dispatch="index"))
  tf.random.set_seed(9)
  blocks = MoeLayer(config=config, causal=True)
  buffers = MoeLayer(config=config, causal=True, router=blocks.router,
                     experts=blocks.experts, allow_block_dispatch=False)
  layouts, ran = [], []
  resolve = dispatch.resolve_dispatch

  def spy_resolve(**kwargs):
    layouts.append(kwargs["layout"])
    return resolve(**kwargs)

  monkeypatch.setattr(dispatch, "resolve_dispatch", spy_resolve)
  def recording(name, path):
    def run(*args, **kwargs):
      ran.append(name)
      return path(*args, **kwargs)
    return run

  for name, path in list(dispatch.DISPATCH_PATHS.items()):
    monkeypatch.setitem(dispatch.DISPATCH_PATHS, name, recording(name, path))
  rng = np.random.default_rng(7)
  x = tf.constant(rng.normal(size=(6, 1, M)), tf.float32)
  mask = tf.constant([[1], [0], [1], [1], [0], [1]], tf.float32)
  got = blocks(x, padding_mask=mask, training=False,
               group_per_row=True).outputs.numpy()
  want = buffers(x, padding_mask=mask, training=False,
                 group_per_row=True).outputs.numpy()
  assert ran == ["block", "index"]
  assert layouts[0] == dispatch.BufferLayout(
      num_groups=6, group_size=1, num_selected=2, num_experts=E, capacity=1)
  assert layouts[1] is None  # allow_block_dispatch=False
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert np.all(got[[1, 4]] == 0) and np.all(np.abs(got[[0, 2, 3, 5]]) > 0)
  # Each live row gets what it gets alone: its top-2 experts.
  for row in (0, 3):
    alone = blocks(x[row:row + 1], padding_mask=mask[row:row + 1],
                   training=False, group_per_row=True).outputs
    np.testing.assert_allclose(got[row:row + 1], alone, rtol=1e-5, atol=1e-6)
  # Every requested path runs per-row groups to the same outputs.
  ran.clear()
  for requested in DISPATCH_IMPLEMENTATIONS:
    moe = dataclasses.replace(config.moe, dispatch=requested)
    other = MoeLayer(config=dataclasses.replace(config, moe=moe), causal=True,
                     router=blocks.router, experts=blocks.experts,
                     allow_block_dispatch=False)
    np.testing.assert_allclose(
        other(x, padding_mask=mask, training=False,
              group_per_row=True).outputs, want, rtol=1e-5, atol=1e-6,
        err_msg=requested)
  assert sorted(ran) == sorted(DISPATCH_IMPLEMENTATIONS)


def test_slot_order_rows_by_hand():
  # E = 3, G = 1, C = 2: slots e * 2 + c. Choices 0..5 go to experts
  # 2, 0, 2, 1, 0, 1 at positions 1, 0, 0, -, 1, 0; choice 3 is dropped.
  slots = tf.constant([5, 0, 4, 6, 1, 2])
  row, counts = dispatch._slot_order_rows(slots, num_slots=6, num_experts=3)
  # Rows in slot order: expert 0: choices 1, 4; expert 1: 5; expert 2:
  # 2 (position 0), 0 (position 1); then the dropped choice 3.
  order = np.argsort(row.numpy())
  assert order.tolist() == [1, 4, 5, 2, 0, 3]
  assert counts.numpy().tolist() == [2, 1, 2, 1]


def test_sorted_rows_meet_their_experts_weights_by_hand():
  experts = FeedForwardExperts(num_experts=2, model_dim=1, hidden_dim=1,
                               init_scale=1.0)
  experts.wi.assign([[[1.0]], [[2.0]]])
  experts.wo.assign([[[10.0]], [[100.0]]])
  rows = tf.constant([[1.0], [2.0], [3.0], [-4.0]])  # 2 rows, 1 row, 1 dropped
  out = experts.rows(rows, tf.constant([2, 1]))
  # Expert 0: 10 * relu(x); expert 1: 200 * relu(x); the dropped row: 0.
  assert out.numpy().ravel().tolist() == [10.0, 20.0, 600.0, 0.0]


@pytest.mark.parametrize("name", [n for n in ROUTERS if n != "expert_choice"])
@pytest.mark.parametrize("capacity", [2, 6, 10])  # drops ... none (C = S)
def test_sorted_dispatch_matches_index_in_values_and_gradients(name, capacity):
  x, mask = _inputs()
  experts = _experts()
  y_index, g_index = _run("index", ROUTERS[name], experts, x, mask, capacity)
  y_sorted, g_sorted = _run("sorted", ROUTERS[name], experts, x, mask,
                           capacity)
  np.testing.assert_allclose(y_sorted, y_index, rtol=1e-5, atol=1e-6)
  for label, a, b in zip(("x", "wg", "wi", "wo"), g_sorted, g_index):
    np.testing.assert_allclose(tf.convert_to_tensor(a),
                               tf.convert_to_tensor(b), rtol=1e-4, atol=1e-5,
                               err_msg=label)
  assert (y_sorted.numpy()[mask.numpy() == 0] == 0).all()


def test_sorted_dispatch_rejects_the_expert_choice_router():
  x, mask = _inputs()
  result = ROUTERS["expert_choice"](x, padding_mask=mask, capacity=3,
                                    training=False)
  with pytest.raises(ValueError, match="token-choice"):
    dispatch.sorted_dispatch_combine(x, result, _experts().rows)


@pytest.mark.parametrize("router", ["top2", "top1", "noisy_topk"])
@pytest.mark.parametrize("training", [True, False])
def test_sorted_layer_equals_index_layer_with_dropout_and_drops(router,
                                                                training):
  results = _layer_results(router, ("index", "sorted"), training=training)
  for a, b in zip(results["sorted"], results["index"]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_sorted_layer_applies_expert_dropout_deterministically():
  def make(rate):
    return MoeLayer(config=ModelConfig(d_model=M, moe=MoeConfig(
        num_experts=E, expert_hidden_dim=H, group_size=6,
        expert_dropout_rate=rate, second_expert_policy="all",
        dispatch="sorted")), causal=False)
  tf.random.set_seed(3)
  plain, dropped = make(0.0), make(0.5)
  for a, b in zip(dropped.trainable_variables, plain.trainable_variables):
    a.assign(b)
  x, mask = _inputs(num_groups=3, group_size=5, seed=4)
  run = lambda layer: layer(x, padding_mask=mask, training=True,
                            seed=SEED).outputs.numpy()
  np.testing.assert_array_equal(run(dropped), run(dropped))  # same seed
  assert np.abs(run(dropped) - run(plain)).max() > 1e-3


def test_sorted_dispatch_falls_back_where_it_cannot_run():
  tf.random.set_seed(4)
  config = ModelConfig(d_model=M, moe=MoeConfig(
      num_experts=E, expert_hidden_dim=H, router="expert_choice",
      dispatch="sorted"))
  assert MoeLayer(config=config, causal=False).dispatch == "index"


def test_registry_holds_every_path_with_one_signature():
  assert sorted(dispatch.DISPATCH_PATHS) == sorted(
      (*DISPATCH_IMPLEMENTATIONS, "block", "grouped_index"))
  protocol = list(inspect.signature(
      dispatch.DispatchPath.__call__).parameters.values())[1:]  # no self
  for name, path in dispatch.DISPATCH_PATHS.items():
    params = list(inspect.signature(path).parameters.values())
    assert [(p.name, p.kind) for p in params] == [
        (p.name, p.kind) for p in protocol], name
  x, mask = _inputs()
  result = ROUTERS["top2-random"](x, padding_mask=mask, capacity=10,
                                  training=False)
  outputs = {name: path(x, result, _experts(), training=False, seed=None)
             for name, path in dispatch.DISPATCH_PATHS.items()}
  for name, y in outputs.items():
    np.testing.assert_allclose(y, outputs["einsum"], rtol=1e-5, atol=1e-6,
                               err_msg=name)


_NO_DROP = dispatch.BufferLayout(num_groups=2, group_size=64, num_selected=2,
                                 num_experts=8, capacity=64)
_TRAIN_CAPACITY = dispatch.BufferLayout(num_groups=2, group_size=64,
                                        num_selected=2, num_experts=32,
                                        capacity=5)
_DYNAMIC_G = dataclasses.replace(_NO_DROP, num_groups=None)
_EXPERT_CHOICE = dataclasses.replace(_NO_DROP, num_selected=None)


@pytest.mark.parametrize(
    "requested, backend, router, training, dropout, layout, expected", [
        # No sizes yet (MoeLayer.dispatch): the configured path, corrected.
        ("sorted", "none", "top2", True, 0.0, None, "sorted"),
        ("index", "none", "top1", True, 0.0, None, "index"),
        ("einsum", "none", "top2", True, 0.0, None, "einsum"),
        ("sorted", "none", "expert_choice", False, 0.0, None, "index"),
        # On a mesh: index and sorted run per group (token choice); expert
        # choice takes the einsums under DTensor, index under XLA.
        ("sorted", "xla", "top2", True, 0.0, None, "grouped_index"),
        ("sorted", "dtensor", "top2", True, 0.0, None, "grouped_index"),
        ("index", "dtensor", "top1", False, 0.0, _NO_DROP, "grouped_index"),
        ("index", "dtensor", "top2", True, 0.3, None, "grouped_index"),
        ("einsum", "dtensor", "top2", True, 0.0, None, "einsum"),
        ("einsum", "xla", "top2", True, 0.0, None, "einsum"),
        ("index", "dtensor", "expert_choice", False, 0.0, None, "einsum"),
        ("sorted", "xla", "expert_choice", False, 0.0, None, "index"),
        ("index", "xla", "expert_choice", False, 0.0, None, "index"),
        # Blocks: index, one device, per-token view, static G, no dropout,
        # and fewer rows than the buffers.
        ("index", "none", "top2", False, 0.0, _NO_DROP, "block"),
        ("index", "none", "top2", True, 0.0, _NO_DROP, "block"),
        ("index", "none", "top2", True, 0.3, _NO_DROP, "index"),
        ("index", "none", "top2", False, 0.3, _NO_DROP, "block"),
        ("index", "xla", "top2", False, 0.0, _NO_DROP, "grouped_index"),
        ("index", "none", "expert_choice", False, 0.0, _EXPERT_CHOICE,
         "index"),
        ("index", "none", "top2", False, 0.0, _DYNAMIC_G, "index"),
        ("index", "none", "top2", True, 0.0, _TRAIN_CAPACITY, "index"),
        ("sorted", "none", "top2", False, 0.0, _NO_DROP, "sorted"),
        ("einsum", "none", "top2", False, 0.0, _NO_DROP, "einsum"),
    ])
def test_resolver_decisions(requested, backend, router, training, dropout,
                            layout, expected):
  assert dispatch.resolve_dispatch(
      requested=requested, backend=backend, router=router, training=training,
      expert_dropout_rate=dropout, layout=layout) == expected


def test_bfloat16_runs_the_static_buffers_instead_of_sorted_rows():
  # oneDNN builds a bfloat16 matmul per new row count: static shapes win.
  def resolve(dtype, requested="sorted"):
    return dispatch.resolve_dispatch(
        requested=requested, backend="none", router="topk", training=True,
        expert_dropout_rate=0.0, activation_dtype=dtype)
  assert resolve("float32") == "sorted"
  assert resolve("bfloat16") == "index"
  assert resolve("bfloat16", "einsum") == "einsum"


def test_resolver_and_layout_reject_bad_values():
  with pytest.raises(ValueError, match="--dispatch=einsum or index or sorted"):
    dispatch.resolve_dispatch(requested="block", backend="none",
                              router="top2", training=False,
                              expert_dropout_rate=0.0)
  with pytest.raises(ValueError, match="group_size=0 must be >= 1"):
    dataclasses.replace(_NO_DROP, group_size=0)


def test_block_path_refuses_expert_dropout_when_training():
  x, mask = _inputs()
  result = ROUTERS["top1-ntlb"](x, padding_mask=mask, capacity=10,
                                training=False)
  experts = FeedForwardExperts(num_experts=E, model_dim=M, hidden_dim=H,
                               init_scale=1.0, dropout_rate=0.2)
  with pytest.raises(ValueError, match="no expert dropout"):
    dispatch.dispatch_combine(x, result, experts, implementation="block",
                              training=True, seed=SEED)
  # At eval the rate does not apply: blocks equal the buffers.
  np.testing.assert_allclose(
      dispatch.dispatch_combine(x, result, experts, implementation="block"),
      dispatch.dispatch_combine(x, result, experts, implementation="index"),
      rtol=1e-5, atol=1e-6)
