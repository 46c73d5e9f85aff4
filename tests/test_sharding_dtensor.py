"""DTensor backend on virtual CPU devices: sharded == unsharded.

TensorFlow fixes its device list the first time it runs an op, and other test
files in the same pytest process have already done so. The multi-device part
therefore runs in fresh subprocesses: this file is also a script
(``python tests/test_sharding_dtensor.py toy|moe_layer``) that creates 8
virtual CPUs, runs an MoE layer forward + backward on several meshes made of
subsets of those devices, and prints a JSON report that the pytest functions
below check. Part ``toy`` is a minimal GShard Algorithm-2 layer carrying the
paper's annotations; part ``moe_layer`` is the real
:class:`m4moe.moe.layer.MoeLayer` (top-2, random policy, both dispatch
implementations), unannotated, with its expert weights created as
expert-split DVariables by ``Sharding.variable_scope``. One subprocess per
part serves all its tests (module fixtures).
"""

from __future__ import annotations

import inspect
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

MESHES = ("data:1", "data:2,expert:1", "data:1,expert:4", "data:2,expert:2",
          "data:8,expert:1", "expert:8")
# Dimensions: G groups, S group size, E experts, C capacity, M model, H hidden.
G, S, E, M, H = 8, 4, 8, 8, 16
C = 2
# Meshes of each shape: data only, expert only, both, and many devices.
LAYER_MESHES = ("data:2,expert:1", "data:1,expert:4", "data:2,expert:2",
                "data:8,expert:1")


def _einsum_moe(x, wg, wi, wo, sharding):
  """Top-1 GShard Algorithm 2 with the paper's annotation points.

  Args:
    x: <float32>[G, S, M].
    wg: <float32>[M, E]; wi: <float32>[E, M, H]; wo: <float32>[E, H, M].
    sharding: a m4moe.parallel.sharding.Sharding.

  Returns:
    <float32>[G, S, M].
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  x = sharding.split(x, dim=0, axis="data", name="inputs")
  wg = sharding.replicate(wg, name="router_weights")
  wi = sharding.split(wi, dim=0, axis="expert", name="expert_wi")
  wo = sharding.split(wo, dim=0, axis="expert", name="expert_wo")
  gates = tf.nn.softmax(tf.einsum("GSM,ME->GSE", x, wg), axis=-1)
  mask = tf.one_hot(tf.argmax(gates, axis=-1), E)                 # [G,S,E]
  position = tf.cumsum(mask, axis=1, exclusive=True) * mask       # [G,S,E]
  keep = mask * tf.cast(position < C, tf.float32)
  dispatch = keep[..., None] * tf.one_hot(tf.cast(position, tf.int32), C)
  combine = gates[..., None] * dispatch                           # [G,S,E,C]
  dispatched = tf.einsum("GSEC,GSM->EGCM", dispatch, x)
  dispatched = sharding.split(dispatched, dim=0, axis="expert",
                              name="dispatched")
  hidden = tf.nn.relu(tf.einsum("EGCM,EMH->EGCH", dispatched, wi))
  expert_out = tf.einsum("EGCH,EHM->EGCM", hidden, wo)
  expert_out = sharding.split(expert_out, dim=0, axis="expert",
                              name="expert_outputs")
  out = tf.einsum("GSEC,EGCM->GSM", combine, expert_out)
  return sharding.split(out, dim=0, axis="data", name="outputs")


def _initial_values():
  rng = np.random.default_rng(0)
  return {
      "x": rng.normal(size=(G, S, M)).astype(np.float32),
      "wg": rng.normal(size=(M, E)).astype(np.float32),
      "wi": (rng.normal(size=(E, M, H)) / np.sqrt(M)).astype(np.float32),
      "wo": (rng.normal(size=(E, H, M)) / np.sqrt(H)).astype(np.float32),
  }


def _run_on(mesh_text, values):
  """Forward+backward on one mesh; returns numpy results and shard shapes."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from m4moe.parallel import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  if mesh_text is None:
    sharding = sharding_lib.NO_SHARDING
  else:
    shape = sharding_lib.MeshShape.parse(mesh_text)
    sharding = sharding_lib.make_sharding(
        shape, devices=[f"CPU:{i}" for i in range(shape.size)])
  rules = ((r"(^|/)experts/", ("expert",)),)
  with sharding.variable_scope(rules):
    with tf.name_scope("moe"):
      wg = tf.Variable(values["wg"], name="router/wg")
      wi = tf.Variable(values["wi"], name="experts/wi")
      wo = tf.Variable(values["wo"], name="experts/wo")
      slot = tf.Variable(tf.zeros([E, M]), name="experts/wi/vr")
  x = sharding.put(values["x"], ("data",))

  @tf.function
  def step(x):
    with tf.GradientTape() as tape:
      out = _einsum_moe(x, wg, wi, wo, sharding)
      loss = tf.reduce_sum(out * out)
    return out, loss, tape.gradient(loss, [wg, wi, wo])

  out, loss, grads = step(x)
  result = {
      "out": sharding.gather(out).numpy().tolist(),
      "loss": float(sharding.gather(loss).numpy()),
      "grads": [sharding.gather(g).numpy().tolist() for g in grads],
  }
  if sharding.enabled:
    result["types"] = [type(v).__name__ for v in (wg, wi, wo, slot)]
    result["shards"] = {
        "wg": sharding.local_shapes(wg), "wi": sharding.local_shapes(wi),
        "wo": sharding.local_shapes(wo), "slot": sharding.local_shapes(slot),
        "grad_wi": sharding.local_shapes(grads[1]),
        "out": sharding.local_shapes(out),
    }
  return result


def _make_sharding(mesh_text):
  from m4moe.parallel import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  if mesh_text is None:
    return sharding_lib.NO_SHARDING
  shape = sharding_lib.MeshShape.parse(mesh_text)
  return sharding_lib.make_sharding(
      shape, devices=[f"CPU:{i}" for i in range(shape.size)])


# The real m4moe.moe.layer.MoeLayer: B*L = 32 tokens, S = 4, so G = 8.
MOE_FLAGS = ("--d_model=8", f"--num_experts={E}", "--expert_hidden_dim=16",
             "--group_size=4", "--train_capacity_factor=1.0",
             "--second_expert_policy=random", "--z_loss_weight=0.01",
             "--dispatch=index")


def _run_moe_layer(mesh_text, dispatch, *, one_device=False):
  """MoeLayer forward+backward (training, top-2 random policy, seeded).

  With ``one_device``, the layer runs on one device with the grouping of
  ``mesh_text``: built with the XLA backend's annotations, which are
  identities outside XLA, it forms one set of groups per ``data`` shard
  (:meth:`m4moe.moe.layer.MoeLayer.group_shards`), as the mesh does.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from m4moe import config as config_lib  # pylint: disable=g-import-not-at-top,g-multiple-import
  from m4moe.moe import layer as moe_layer
  # Once MoeLayer takes sharding= (the annotation call sites), pass it, so
  # the annotated layer is what runs; before that, variable layouts only.
  annotate = "sharding" in inspect.signature(moe_layer.MoeLayer).parameters
  # The router pins its U(0, 1) draws (Sharding.pin_random), so the random
  # policy routes as on one device.
  policy = "random"
  config = config_lib.load_model_config(
      "tiny/moe", MOE_FLAGS + (f"--dispatch={dispatch}",
                               f"--second_expert_policy={policy}"))
  if one_device:
    from m4moe.parallel import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
    sharding = sharding_lib.make_sharding(mesh_text, backend="xla")
  else:
    sharding = _make_sharding(mesh_text)
  tf.random.set_seed(0)  # Same initial weights on every mesh.
  kwargs = {"sharding": sharding} if annotate else {}
  with sharding.variable_scope():
    layer = moe_layer.MoeLayer(config=config, causal=False, **kwargs)
  rng = np.random.default_rng(2)
  rows = (sharding.batch_axis,)  # data, or expert on data:1,expert:4
  x = sharding.put(rng.normal(size=(8, 4, 8)).astype(np.float32), rows)
  mask = np.ones((8, 4), np.float32)
  mask[::3, 2:] = 0.0
  mask = sharding.put(mask, rows)
  seed = sharding.put(tf.constant([3, 4]))

  @tf.function
  def step(x, mask, seed):
    with tf.GradientTape() as tape:
      tape.watch(x)
      out = layer(x, padding_mask=mask, training=True, seed=seed)
      loss = tf.reduce_sum(tf.square(out.outputs)) + out.weighted_loss
    return out.outputs, loss, tape.gradient(loss, [x] + list(
        layer.trainable_variables))

  out, loss, grads = step(x, mask, seed)
  result = {"out": sharding.gather(out).numpy().tolist(),
            "loss": float(sharding.gather(loss).numpy()),
            "grads": [sharding.gather(g).numpy().tolist() for g in grads],
            "dispatch": layer.dispatch}
  if sharding.backend == "dtensor":
    result["shards"] = {v.name: sharding.local_shapes(v)
                        for v in layer.trainable_variables}
  return result


def _layer_layouts(mesh_text):
  """DTensor layouts inside the real MoeLayer, run eagerly (op by op).

  The grouping (``MoeLayer._group``, which has no annotation inside) is run
  on a batch split on its rows over the batch axis (``data``, or ``expert``
  on a mesh without ``data``): the layout DTensor's propagation gives its
  result shows whether any op needed the other shards' tokens (it would
  then be replicated). The dispatched buffers are recorded where the
  experts receive them, after the AllToAll annotation.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.experimental import dtensor  # pylint: disable=g-import-not-at-top
  from m4moe import config as config_lib  # pylint: disable=g-import-not-at-top,g-multiple-import
  from m4moe.moe import layer as moe_layer
  config = config_lib.load_model_config(
      "tiny/moe", MOE_FLAGS + ("--second_expert_policy=all",))
  sharding = _make_sharding(mesh_text)
  seen = {}

  def describe(t):
    return {"specs": list(dtensor.fetch_layout(t).sharding_specs),
            "local": sharding.local_shapes(t)}

  class RecordingExperts(moe_layer.FeedForwardExperts):

    def _to_experts(self, dispatched):
      dispatched = super()._to_experts(dispatched)
      seen["dispatched"] = describe(dispatched)
      return dispatched

  moe = config.moe
  with sharding.variable_scope():
    experts = RecordingExperts(
        num_experts=moe.num_experts, model_dim=config.d_model,
        hidden_dim=moe.expert_hidden_dim, init_scale=config.init_scale,
        sharding=sharding)
    layer = moe_layer.MoeLayer(config=config, causal=False,
                               sharding=sharding, experts=experts)
  rng = np.random.default_rng(2)
  x = rng.normal(size=(8, 4, 8)).astype(np.float32)
  mask = np.ones((8, 4), np.float32)
  mask[::3, 2:] = 0.0
  rows = (sharding.batch_axis,)
  x, mask = sharding.put(x, rows), sharding.put(mask, rows)
  shards = layer.group_shards(8)
  grouped, grouped_mask, position, _ = layer._group(  # pylint: disable=protected-access
      tf.reshape(x, [-1, 8]), tf.reshape(mask, [-1]), shards=shards)
  seen.update(shards=shards, grouped=describe(grouped),
              grouped_mask=describe(grouped_mask),
              position=describe(position))
  out = layer(x, padding_mask=mask, training=False).outputs
  seen["outputs"] = describe(out)
  return seen


def _collectives(mesh_text, dispatch="einsum"):
  """The DTensor collectives of the MoE layer's forward + backward pass.

  DTensor expands a ``tf.function`` into per-device programs with its own
  MLIR passes (not XLA's SPMD partitioner); a relayout becomes
  ``tf.DTensorAllToAll``, ``tf.DTensorAllGather``, ``tf.DTensorAllScatter``
  (a local slice) or ``tf.DTensorAllReduce``, which later passes lower to
  ``CollectiveAllToAllV2``, ``CollectiveGatherV2``... With
  ``TF_CPP_VMODULE=dtensor_mlir_passes=4`` and ``TF_DUMP_GRAPH_PREFIX`` set
  (the worker's environment, see ``_run_worker``) DTensor writes the module
  after every pass; this reads the one after ``DTensorSPMDExpansion``.

  Returns:
    ``{"counts": {op: n}, "ops": [{"op", "input", "output"}]}``: every
    DTensor collective with its input and output sharding specs.
  """
  import os  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from m4moe import config as config_lib  # pylint: disable=g-import-not-at-top,g-multiple-import
  from m4moe.moe import layer as moe_layer
  config = config_lib.load_model_config(
      "tiny/moe", MOE_FLAGS + ("--second_expert_policy=all",
                               f"--dispatch={dispatch}"))
  sharding = _make_sharding(mesh_text)
  with sharding.variable_scope():
    layer = moe_layer.MoeLayer(config=config, causal=False, sharding=sharding)
  rng = np.random.default_rng(2)
  rows = (sharding.batch_axis,)
  x = sharding.put(rng.normal(size=(8, 4, 8)).astype(np.float32), rows)
  mask = np.ones((8, 4), np.float32)
  mask[::3, 2:] = 0.0
  mask = sharding.put(mask, rows)
  name = f"moe_collectives_{dispatch}_" + re.sub(r"\W", "_", mesh_text)

  def step(x, mask):
    with tf.GradientTape() as tape:
      tape.watch(x)
      out = layer(x, padding_mask=mask, training=True)
      loss = tf.reduce_sum(tf.square(out.outputs)) + out.weighted_loss
    return loss, tape.gradient(loss, [x] + list(layer.trainable_variables))

  step.__name__ = name
  tf.function(step)(x, mask)
  dump = os.environ["TF_DUMP_GRAPH_PREFIX"]
  expanded = [f for f in os.listdir(dump)
              if "after_DTensorSPMDExpansion" in f and f"_{name}_" in f]
  assert len(expanded) == 1, (expanded, sorted(os.listdir(dump))[:40])
  text = pathlib.Path(dump, expanded[0]).read_text()
  ops = [{"op": op, "input": src.split(","), "output": dst.split(",")}
         for op, src, dst in re.findall(
             r'"tf\.(DTensor\w+)"\(.*?input_layout = #dtensor\.layout<'
             r'sharding_specs:([\w,]*), .*?output_layout = #dtensor\.layout<'
             r'sharding_specs:([\w,]*), ', text)]
  counts = {}
  for op in re.findall(r'"tf\.(DTensor\w+)"', text):
    counts[op] = counts.get(op, 0) + 1
  return {"counts": counts, "ops": ops, "dispatch": layer.dispatch}


def _adafactor_step(mesh_text, values):
  """One m4moe.training.optimizer.Adafactor step on the toy MoE's DVariables."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from m4moe.training import optimizer as optimizer_lib  # pylint: disable=g-import-not-at-top
  sharding = _make_sharding(mesh_text)
  with sharding.variable_scope(((r"(^|/)experts/", ("expert",)),)):
    with tf.name_scope("moe"):
      weights = [tf.Variable(values[k], name=n) for k, n in (
          ("wg", "router/wg"), ("wi", "experts/wi"), ("wo", "experts/wo"))]
    optimizer = optimizer_lib.Adafactor(optimizer_lib.AdafactorConfig(
        learning_rate=0.1, warmup_steps=1))
    optimizer.build(weights)
  x = sharding.put(values["x"], ("data",))

  # Gradients and the update run as two tf.functions: fused into one graph,
  # DTensor (TF 2.21) produced NaN expert weights on data:2,expert:4.
  @tf.function
  def gradients(x):
    with tf.GradientTape() as tape:
      out = _einsum_moe(x, *weights, sharding)
      loss = tf.reduce_mean(tf.square(out - 0.5))
    return tape.gradient(loss, weights)

  @tf.function
  def apply(grads):
    optimizer.apply_gradients(sharding.like_variables(grads, weights),
                              weights)

  apply(gradients(x))
  result = {"params": [sharding.gather(w).numpy().tolist() for w in weights]}
  if sharding.enabled:
    result["slots"] = {
        f"{i}/{k}": sharding.local_shapes(getattr(slot, k))
        for i, slot in enumerate(optimizer.slots) for k in ("vr", "vc")}
  return result


def _random_draws(mesh_text):
  """Stateless U(0,1) draws <float32>[G, S] used on a G-split tensor."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  sharding = _make_sharding(mesh_text)
  x = sharding.put(np.ones((G, S), np.float32), ("data",))
  seed = sharding.put(tf.constant([3, 4]))

  @tf.function
  def draws(x, seed, pin):
    u = tf.random.stateless_uniform(tf.shape(x), seed=seed)
    if pin:
      u = sharding.replicate(u, name="draws")
    return sharding.split(x * u, dim=0, axis="data")

  return {pin: sharding.gather(draws(x, seed, pin)).numpy().tolist()
          for pin in (False, True)}


def _worker(part: str) -> None:
  """Runs one part ("toy" or "moe_layer") and prints its JSON report."""
  from m4moe.parallel import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  sharding_lib.configure_virtual_cpus(8)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  report = {}
  if part == "collectives":
    for mesh_text in COLLECTIVE_MESHES:
      report[mesh_text] = _collectives(mesh_text)
    report["index/expert:4"] = _collectives("expert:4", dispatch="index")
  elif part == "toy":
    values = _initial_values()
    report["reference"] = _run_on(None, values)
    for mesh_text in MESHES:
      report[mesh_text] = _run_on(mesh_text, values)
    report["draws"] = {str(m): _random_draws(m) for m in (None, "data:8")}
    report["adafactor"] = {str(m): _adafactor_step(m, values)
                           for m in (None, "data:2,expert:4", "expert:8")}
  else:
    from m4moe.moe import layer as moe_layer  # pylint: disable=g-import-not-at-top
    report["annotated"] = "sharding" in inspect.signature(
        moe_layer.MoeLayer).parameters
    for dispatch in ("index", "einsum"):
      for mesh_text in (None,) + LAYER_MESHES:
        key = f"moe_layer/{dispatch}/{mesh_text}"
        try:
          report[key] = _run_moe_layer(mesh_text, dispatch)
        except tf.errors.OpError as e:  # Reported per case, checked below.
          report[key] = {"error": e.message[:2000]}
        if mesh_text is not None:
          report[key + "/one_device"] = _run_moe_layer(
              mesh_text, dispatch, one_device=True)
    for mesh_text in LAYOUT_MESHES:
      report[f"layouts/{mesh_text}"] = _layer_layouts(mesh_text)
  print("REPORT " + json.dumps(report))


def _run_worker(part: str, *, env: dict[str, str] | None = None) -> dict:
  proc = subprocess.run([sys.executable, str(pathlib.Path(__file__)), part],
                        capture_output=True, text=True, timeout=900,
                        check=False,
                        env=None if env is None else {**os.environ, **env})
  lines = [l for l in proc.stdout.splitlines() if l.startswith("REPORT ")]
  assert proc.returncode == 0 and lines, (
      f"worker {part!r} failed (exit code {proc.returncode}); a crash "
      "(-11) inside DTensor usually means an indexing like t[:, tf.newaxis] "
      "on a rank>=2 tensor (use tf.expand_dims):\n" + proc.stderr[-4000:])
  return json.loads(lines[-1][len("REPORT "):])


@pytest.fixture(scope="module")
def report():
  return _run_worker("toy")


@pytest.fixture(scope="module")
def layer_report():
  return _run_worker("moe_layer")


@pytest.fixture(scope="module")
def collectives_report(tmp_path_factory):
  dump = tmp_path_factory.mktemp("dtensor_mlir")
  return _run_worker("collectives", env={
      "TF_DUMP_GRAPH_PREFIX": str(dump),
      "TF_CPP_VMODULE": "dtensor_mlir_passes=4"})


@pytest.mark.parametrize("mesh_text", MESHES)
def test_forward_and_gradients_match_one_device(report, mesh_text):
  ref, got = report["reference"], report[mesh_text]
  np.testing.assert_allclose(got["out"], ref["out"], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got["loss"], ref["loss"], rtol=1e-5)
  for g_got, g_ref in zip(got["grads"], ref["grads"]):
    np.testing.assert_allclose(g_got, g_ref, rtol=1e-5, atol=1e-5)
  # The reference routes some tokens past capacity, so dropping is exercised.
  assert 0 < np.count_nonzero(np.abs(ref["out"]).sum(-1) == 0) < G * S


@pytest.mark.parametrize("mesh_text", MESHES)
def test_each_device_holds_its_experts_only(report, mesh_text):
  from m4moe.parallel.mesh import MeshShape  # pylint: disable=g-import-not-at-top
  shape = MeshShape.parse(mesh_text)
  experts = E // shape.axis_size("expert")
  rows = G // shape.axis_size("data")
  shards = report[mesh_text]["shards"]
  assert report[mesh_text]["types"] == ["DVariable"] * 4
  assert shards["wi"] == [[experts, M, H]] * shape.size
  assert shards["wo"] == [[experts, H, M]] * shape.size
  assert shards["slot"] == [[experts, M]] * shape.size
  assert shards["grad_wi"] == [[experts, M, H]] * shape.size
  assert shards["wg"] == [[M, E]] * shape.size
  assert shards["out"] == [[rows, S, M]] * shape.size


@pytest.mark.parametrize("mesh_text", ("data:2,expert:4", "expert:8"))
def test_adafactor_step_on_dvariables_matches_one_device(report, mesh_text):
  from m4moe.parallel.mesh import MeshShape  # pylint: disable=g-import-not-at-top
  ref, got = report["adafactor"]["None"], report["adafactor"][mesh_text]
  for p_got, p_ref, p_init in zip(got["params"], ref["params"],
                                  [_initial_values()[k]
                                   for k in ("wg", "wi", "wo")]):
    np.testing.assert_allclose(p_got, p_ref, rtol=1e-5, atol=1e-6)
    assert not np.allclose(p_ref, p_init)  # The step changed the weights.
  shape = MeshShape.parse(mesh_text)
  per_device = E // shape.axis_size("expert")
  slots = got["slots"]  # Factored slots of wg [M,E], wi [E,M,H], wo [E,H,M].
  assert slots["0/vr"] == [[M]] * shape.size
  assert slots["1/vr"] == [[per_device, M]] * shape.size
  assert slots["1/vc"] == [[per_device, H]] * shape.size
  assert slots["2/vr"] == [[per_device, H]] * shape.size


def test_replicate_pins_stateless_random_draws(report):
  # DTensor draws stateless random numbers per shard of the op's output
  # layout; drawing replicated (replicate() right after the random op) gives
  # the single-device values whatever the mesh.
  draws = report["draws"]
  want = draws["None"]["true"]
  np.testing.assert_array_equal(draws["None"]["false"], want)
  np.testing.assert_array_equal(draws["data:8"]["true"], want)
  assert not np.array_equal(draws["data:8"]["false"], want)


@pytest.mark.parametrize("dispatch", ("index", "einsum"))
@pytest.mark.parametrize("mesh_text", LAYER_MESHES)
def test_real_moe_layer_matches_one_device(layer_report, mesh_text,
                                           dispatch):
  # The reference is one device grouping like the mesh: one set of groups
  # per data shard (local group dispatching, GShard's groups per device).
  ref = layer_report[f"moe_layer/{dispatch}/{mesh_text}/one_device"]
  got = layer_report[f"moe_layer/{dispatch}/{mesh_text}"]
  # Under DTensor --dispatch=index runs the per-group gathers (GShard's
  # Gather form; the one-device index path does not partition).
  assert got["dispatch"] == {"index": "grouped_index",
                             "einsum": "einsum"}[dispatch]
  assert "error" not in got, got.get("error")
  np.testing.assert_allclose(got["out"], ref["out"], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got["loss"], ref["loss"], rtol=1e-5)
  for g_got, g_ref in zip(got["grads"], ref["grads"]):
    np.testing.assert_allclose(g_got, g_ref, rtol=1e-5, atol=1e-5)
  from m4moe.parallel.mesh import MeshShape  # pylint: disable=g-import-not-at-top
  shape = MeshShape.parse(mesh_text)
  per_device = E // shape.axis_size("expert")
  for name, shards in got["shards"].items():
    if "/experts/" in name:
      assert [s[0] for s in shards] == [per_device] * shape.size, name
    else:
      assert len({tuple(s) for s in shards}) == 1, name


@pytest.mark.parametrize("dispatch", ("index", "einsum"))
@pytest.mark.parametrize("mesh_text", LAYER_MESHES)
def test_groups_are_per_data_shard(layer_report, mesh_text, dispatch):
  # Every mesh here splits the rows (over data, or over expert on
  # data:1,expert:4). Rows 0, 3, 6 are half padding: compacted per shard,
  # the real tokens share groups with other tokens than in one compaction
  # of the batch, and with capacity 1 per group that reroutes some of them.
  global_groups = layer_report[f"moe_layer/{dispatch}/None"]
  local_groups = layer_report[f"moe_layer/{dispatch}/{mesh_text}/one_device"]
  assert not np.allclose(local_groups["out"], global_groups["out"])


# Meshes whose layouts inside the layer are checked (data x expert).
LAYOUT_MESHES = ("data:2,expert:2", "data:2,expert:1", "data:1,expert:4",
                 "data:8,expert:1")


@pytest.mark.parametrize("mesh_text", LAYOUT_MESHES)
def test_grouping_stays_on_each_data_shard(layer_report, mesh_text):
  from m4moe.parallel.mesh import MeshShape  # pylint: disable=g-import-not-at-top
  shape = MeshShape.parse(mesh_text)
  data, expert = shape.axis_size("data"), shape.axis_size("expert")
  got = layer_report[f"layouts/{mesh_text}"]

  def split(name):  # Spec entries, a mesh axis of size 1 meaning whole.
    return [a if a != "unsharded" and shape.axis_size(a) > 1 else None
            for a in got[name]["specs"]]

  # The batch axis: data, or expert on a mesh without data (GShard's
  # layout: groups and experts split over the same devices).
  axis, rows = ("data", data) if data > 1 or expert == 1 else ("expert",
                                                                expert)
  assert got["shards"] == rows
  # Grouped tokens <[G, S, M]>, G = 8: split on G over the batch axis by the
  # layout propagation of the grouping's own ops (no annotation inside
  # _group), so no device held another shard's tokens.
  assert split("grouped") == [axis if rows > 1 else None, None, None]
  assert got["grouped"]["local"] == [[G // rows, S, 8]] * shape.size
  assert got["grouped_mask"]["local"] == [[G // rows, S]] * shape.size
  # Positions <[D, N/D]>: each shard's own.
  assert got["position"]["local"] == [[1, 32 // rows]] * shape.size
  # Dispatched buffers <[E, G, C, M]> (eval capacity C = S): E split over
  # expert; G still over data on a data x expert mesh, whole on expert:4
  # (the AllToAll: each device now holds its experts' buffers of all G).
  groups = data if axis == "data" else 1
  assert split("dispatched") == ["expert" if expert > 1 else None,
                                 "data" if groups > 1 else None, None, None]
  assert got["dispatched"]["local"] == [
      [E // expert, G // groups, S, 8]] * shape.size
  assert got["outputs"]["local"] == [[8 // rows, 4, 8]] * shape.size


# Meshes whose DTensor collectives are read: GShard's layout (G and E
# split over the same devices) and a data x expert mesh for contrast.
COLLECTIVE_MESHES = ("expert:4", "expert:8", "data:2,expert:2")


@pytest.mark.parametrize("mesh_text", ("expert:4", "expert:8"))
def test_dispatch_and_combine_are_all_to_all(collectives_report, mesh_text):
  # On expert:D the groups are split over the devices that hold the
  # experts: the dispatch (G-split -> E-split buffers), the combine (back)
  # and their two gradients are four AllToAlls, and no token activation is
  # ever all-gathered (no AllGather at all).
  got = collectives_report[mesh_text]
  assert got["counts"].get("DTensorAllToAll") == 4, got["counts"]
  assert "DTensorAllGather" not in got["counts"], got["ops"]
  moves = [(o["input"], o["output"]) for o in got["ops"]
           if o["op"] == "DTensorAllToAll"]
  # Buffers <[E, G, C, M]> (EGCM in, GECM out of the experts): the expert
  # axis moves between G and E, nothing else is split.
  g_to_e = (["unsharded", "expert", "unsharded", "unsharded"],
            ["expert", "unsharded", "unsharded", "unsharded"])
  assert g_to_e in moves, moves
  assert all(sorted(src) == sorted(dst) == sorted(g_to_e[0])
             for src, dst in moves), moves


def test_grouped_index_dispatch_is_all_to_all_too(collectives_report):
  # --dispatch=index on expert:4: the per-group gathers run on each
  # device's own groups; the buffers move to the E split and back by
  # AllToAll, and no tensor is all-gathered.
  got = collectives_report["index/expert:4"]
  assert got["dispatch"] == "grouped_index"
  assert got["counts"].get("DTensorAllToAll", 0) >= 2, got["counts"]
  assert "DTensorAllGather" not in got["counts"], got["ops"]


def test_data_x_expert_mesh_all_gathers_expert_outputs(collectives_report):
  # On data:2,expert:2 DTensor splits the rows and groups over data only
  # (one mesh axis per tensor dimension), so every device of a data row
  # holds the same groups: going to the E-split buffers is a local slice
  # (AllScatter) and coming back an AllGather over expert, not an AllToAll.
  got = collectives_report["data:2,expert:2"]
  assert "DTensorAllToAll" not in got["counts"], got["ops"]
  gathers = [(o["input"], o["output"]) for o in got["ops"]
             if o["op"] == "DTensorAllGather"]
  assert gathers and all("expert" in src and "expert" not in dst
                         for src, dst in gathers), gathers


if __name__ == "__main__":
  _worker(sys.argv[1])
