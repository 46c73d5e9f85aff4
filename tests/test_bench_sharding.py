"""m4moe-bench sharding: per-device memory of the real sharded step.

Runs the benchmark's own child processes on D = 1 and 2 virtual CPUs
(mesh ``expert:D``, E = 4*D) and checks the record: its fields, its sums,
that each device's expert weights stay the same as E and D grow together,
and that ``cost_model_*`` is m4moe.cost.model's estimate for the same setting.
The live-activation counter is checked in this process on a hand-sized
graph, and the CLI's bad flags are refused before any process starts.
"""

import gc

import pytest
import tensorflow as tf
from tensorflow.python.framework import op_callbacks

from m4moe import config as config_lib
from m4moe.cost import model as cost
from m4moe.benchmarks import sharding
from m4moe.cli import bench

FIELDS = ("devices", "experts", "tokens_per_device",
          "per_device_activation_bytes", "per_device_expert_weight_bytes",
          "per_device_total_bytes", "cost_model_total_bytes")


@pytest.fixture(scope="module")
def records():
  return {d: sharding.measure_in_subprocess(sharding.ShardingPoint(devices=d))
          for d in (1, 2)}


@pytest.mark.slow  # runs the sharding benchmark: `pytest -m slow`
def test_record_fields_and_sums(records):
  for d, record in records.items():
    assert record["benchmark"] == "sharding"
    assert all(k in record for k in FIELDS), record
    assert record["devices"] == d and record["experts"] == 4 * d
    assert record["mesh"] == f"expert:{d}"
    assert record["tokens_per_device"] == 64
    assert record["update_applied"] is True
    assert record["per_device_activation_bytes"] > 0
    assert record["per_device_total_bytes"] == (
        record["per_device_weight_bytes"] +
        record["per_device_gradient_bytes"] +
        record["per_device_optimizer_bytes"] +
        record["per_device_activation_bytes"])


@pytest.mark.slow  # runs the sharding benchmark: `pytest -m slow`
def test_expert_weights_per_device_stay_flat(records):
  point = sharding.ShardingPoint(devices=1)
  # E/D = 4 experts of wi <M, H> and wo <H, M>, float32, in 1 + 1 MoE layers.
  want = 4 * (2 * point.d_model * point.expert_hidden_dim) * 4 * 2
  for record in records.values():
    assert record["per_device_expert_weight_bytes"] == want
  # The replicated router <M, E> grows with E; nothing else does.
  grown = (records[2]["per_device_weight_bytes"] -
           records[1]["per_device_weight_bytes"])
  assert grown == 2 * point.d_model * 4 * 4  # 2 routers, 4 more experts


@pytest.mark.slow  # runs the sharding benchmark: `pytest -m slow`
def test_cost_model_fields_are_m4moe_cost(records):
  for d, record in records.items():
    point = sharding.ShardingPoint(devices=d)
    config = config_lib.load_model_config("tiny/moe", point.model_flags())
    estimate = cost.estimate_device(
        config, data_axis=1, expert_axis=d, batch_tokens=64 * d,
        sequence_length=8)
    assert record["cost_model_total_bytes"] == estimate.total_bytes
    assert record["cost_model_activation_bytes"] == estimate.activation_bytes
    # Both count the same expert shards.
    assert (record["cost_model_expert_weight_bytes"] ==
            record["per_device_expert_weight_bytes"])


@pytest.fixture(scope="module")
def data_records():
  return {d: sharding.measure_in_subprocess(
      sharding.ShardingPoint(devices=d, layout="data")) for d in (1, 2)}


@pytest.mark.slow  # runs the sharding benchmark: `pytest -m slow`
def test_unfused_cost_model_matches_the_measured_activations(records,
                                                             data_records):
  # The eager DTensor step keeps what TensorFlow's tape keeps: the unfused
  # table (m4moe.cost.unfused) must account for it within 10% on both
  # layouts (it is within 0.1%: only scalars are not listed); the fused
  # estimate (one tensor per sub-layer) describes another execution.
  for layout, by_devices in (("expert", records), ("data", data_records)):
    for d, record in by_devices.items():
      assert record["mesh"] == f"{layout}:{d}"
      measured = record["per_device_activation_bytes"]
      unfused = record["cost_model_unfused_activation_bytes"]
      assert abs(unfused / measured - 1) <= 0.10, (layout, d, unfused,
                                                   measured)
      assert record["cost_model_unfused_activations_vs_measured"] == (
          pytest.approx(unfused / measured))
      assert abs(record["cost_model_unfused_total_vs_measured"] - 1) <= 0.10
      assert record["cost_model_activation_bytes"] < 0.5 * measured
      # Only the activations differ between the two estimates.
      assert (record["cost_model_unfused_total_bytes"] - unfused ==
              record["cost_model_total_bytes"] -
              record["cost_model_activation_bytes"])


@pytest.mark.slow  # runs the sharding benchmark: `pytest -m slow`
def test_unfused_table_splits_like_the_measured_op_types(records):
  # The rows' op types against the record's activation_bytes_by_op, at
  # E = 8 on expert:2: every listed op type within 1%, or within 256 bytes
  # for the op types that also make the losses' scalars the table omits.
  from collections import Counter  # pylint: disable=g-import-not-at-top
  from m4moe.cost import unfused as cost_unfused  # pylint: disable=g-import-not-at-top
  point = sharding.ShardingPoint(devices=2)
  config = config_lib.load_model_config("tiny/moe", point.model_flags())
  estimated = Counter()
  for row in cost_unfused.kept_tensors(config, tokens=64, source_length=8,
                                       target_length=8):
    for op in row.ops:
      estimated[op] += row.bytes // len(row.ops)
  measured = records[2]["activation_bytes_by_op"]
  for op, want in estimated.items():
    got = measured.get(op, 0)
    assert abs(got - want) <= max(0.01 * want, 256), (op, got, want)
  unlisted = sum(n for op, n in measured.items() if op not in estimated)
  # Shape and StridedSlice scalars, DivNoNan per-group <[G, E]> fractions.
  assert unlisted <= 256, unlisted


def test_live_activation_counter():
  counter = sharding._LiveActivations()  # pylint: disable=protected-access
  w = tf.Variable(tf.ones([8, 16]))
  x = tf.ones([4, 8])
  op_callbacks.add_op_callback(counter)
  try:
    outside = tf.matmul(x, w)  # no tape: not an activation
    with tf.GradientTape() as tape:
      h = tf.matmul(x, w)  # <float32>[4, 16], 256 bytes; w's read excluded
      r = tf.nn.relu(h)  # 256 bytes, kept by the tape for Relu's gradient
      same = tf.identity(r)  # the same buffer
      assert counter.live == 512 and counter.peak == 512
      del h, same  # MatMul's gradient needs x and w, not h
      gc.collect()
      assert counter.live == 256
      loss = tf.reduce_sum(r)
    tape.gradient(loss, w)
  finally:
    op_callbacks.remove_op_callback(counter)
  assert counter.peak == 512  # h and r; the scalar loss came after h died
  assert counter.peak_by_op == {"MatMul": 256, "Relu": 256}
  del outside


def test_views_of_tensors_the_step_did_not_compute_are_not_activations():
  # Under DTensor a DVariable's read runs out of sight of op callbacks; a
  # relayout, cast or identity of such a tensor re-expresses a weight.
  counter = sharding._LiveActivations()  # pylint: disable=protected-access
  read = tf.ones([64, 64])  # made before the step: like an unseen read
  op_callbacks.add_op_callback(counter)
  try:
    with tf.GradientTape() as tape:
      tape.watch(read)
      view = tf.identity(read)
      assert counter.live == 0
      doubled = view * 2.0  # computed: an activation (16 KiB)
      assert counter.live == 64 * 64 * 4
      again = tf.identity(doubled)  # a view of an activation: same buffer
      assert counter.live == 64 * 64 * 4
      loss = tf.reduce_sum(again)
    tape.gradient(loss, read)
  finally:
    op_callbacks.remove_op_callback(counter)
  assert counter.peak_by_op["Mul"] == 64 * 64 * 4
  assert "Identity" not in counter.peak_by_op


@pytest.mark.parametrize("flag, message", [
    ("--sharding_devices=1,x", "positive integers"),
    ("--sharding_devices=0", "--sharding_devices=0: give positive integers"),
    ("--sharding_layouts=model", "unknown"),
    ("--tokens_per_device=12", "multiple of --sequence_length=8"),
    ("--sequence_length=128", "multiple of --sequence_length=128"),
    ("--model_dim=0", "--model_dim=0 must be >= 1"),
    ("--hidden_dim=-4", "--hidden_dim=-4 must be >= 1"),
    ("--num_heads=0", "--num_heads=0 must be >= 1"),
])
def test_cli_rejects_bad_flags(flag, message):
  flag_values = bench.flags.FLAGS
  name = flag.split("=")[0][2:]
  flag_values(["m4moe-bench", flag])
  try:
    with pytest.raises(bench.app.UsageError, match=message):
      bench.main(["m4moe-bench", "sharding"])
  finally:
    flag_values[name].unparse()
