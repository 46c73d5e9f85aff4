"""Per-op profiles (m4moe/benchmarks/profile.py, m4moe-bench --profile_dir):
op tables of a hand-built trace checked by hand, and of a real tf.profiler
trace of a tiny MoE layer checked for invariants (no timing assertions)."""

import json
import math
import subprocess
import sys

import pytest
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from m4moe.benchmarks import moe_layer
from m4moe.benchmarks import profile

MS = 10**9  # picoseconds per millisecond
TINY = dict(num_experts=4, model_dim=8, hidden_dim=16, num_tokens=32,
            group_size=16, top_k=1)
# The expert FFN's matmul under oneDNN (TF's default CPU build) or without.
MATMUL_TYPES = {"MatMul", "_MklMatMul", "BatchMatMulV2", "_MklBatchMatMulV2",
                "Einsum", "_MklEinsum"}


def _event(line, metadata_id, *, offset_ms=None, duration_ms,
           num_occurrences=None):
  event = line.events.add(metadata_id=metadata_id,
                          duration_ps=int(duration_ms * MS))
  if num_occurrences is None:
    event.offset_ps = int(offset_ms * MS)
  else:
    event.num_occurrences = num_occurrences
  return event


def _xspace() -> xplane_pb2.XSpace:
  """A host plane as TF 2.21 writes it, with durations in whole ms.

  tf_Compute/1: Process [0, 10) holding MatMul_1 [1, 5), GatherV2 [6, 7),
  MatMul_1 [8, 10). tf_Compute/2: Fn (PartitionedCall) [0, 3) with a
  GatherV2 [1, 2) run inline inside it, then MatMul_2 [4, 5). python:
  MatMul_1 aggregated, 3 calls in 3 ms. So MatMul_1: 5 calls, 9 ms;
  GatherV2: 2, 2 ms; Fn: 1, 3 - 1 = 2 ms self; MatMul_2: 1, 1 ms; 14 ms in
  all.
  """
  xspace = xplane_pb2.XSpace()
  xspace.planes.add(name="/host:metadata")
  host = xspace.planes.add(name=profile.HOST_PLANE)
  for i, (name, display) in enumerate([
      ("MatMul_1:MatMul", "MatMul"), ("GatherV2:GatherV2", "GatherV2"),
      ("Fn:PartitionedCall", "PartitionedCall"),
      ("ExecutorState::Process", ""), ("ParallelFor", ""),
      ("MatMul_2:MatMul", "MatMul")], start=1):
    host.event_metadata[i].id = i
    host.event_metadata[i].name = name
    host.event_metadata[i].display_name = display
  host.stat_metadata[1].id = 1
  host.stat_metadata[1].name = "id"
  compute = host.lines.add(id=1, name="tf_Compute/1")
  process = _event(compute, 4, offset_ms=0, duration_ms=10)
  process.stats.add(metadata_id=1, int64_value=7)
  _event(compute, 1, offset_ms=1, duration_ms=4)
  _event(compute, 5, offset_ms=2, duration_ms=1)  # ParallelFor in MatMul
  _event(compute, 2, offset_ms=6, duration_ms=1)
  _event(compute, 1, offset_ms=8, duration_ms=2)
  inline = host.lines.add(id=2, name="tf_Compute/2")
  _event(inline, 3, offset_ms=0, duration_ms=3)
  _event(inline, 2, offset_ms=1, duration_ms=1)
  _event(inline, 6, offset_ms=4, duration_ms=1)
  python = host.lines.add(id=3, name="python")
  _event(python, 1, duration_ms=3, num_occurrences=3)
  xspace.planes.add(name="Task Environment")
  return xspace


def _write(xspace, tmp_path):
  path = tmp_path / "host.xplane.pb"
  path.write_bytes(xspace.SerializeToString())
  return path


def test_op_table_of_a_hand_built_trace(tmp_path):
  path = _write(_xspace(), tmp_path)
  rows = profile.op_table(path, top=5)
  assert [(r["op_name"], r["op_type"], r["count"]) for r in rows] == [
      ("MatMul_1", "MatMul", 5), ("Fn", "PartitionedCall", 1),
      ("GatherV2", "GatherV2", 2),  # Fn and GatherV2 tie at 2 ms: by name
      ("MatMul_2", "MatMul", 1)]
  assert [r["total_ms"] for r in rows] == pytest.approx([9, 2, 2, 1])
  assert [r["percent"] for r in rows] == pytest.approx(
      [900 / 14, 200 / 14, 200 / 14, 100 / 14])


def test_op_table_by_type_folds_the_nodes_of_a_type(tmp_path):
  rows = profile.op_table(_write(_xspace(), tmp_path), top=5, by="op_type")
  assert [(r["op_name"], r["op_type"], r["count"]) for r in rows] == [
      ("(2 ops)", "MatMul", 6), ("(1 op)", "GatherV2", 2),
      ("(1 op)", "PartitionedCall", 1)]
  assert [r["total_ms"] for r in rows] == pytest.approx([10, 2, 2])
  assert rows[0]["percent"] == pytest.approx(1000 / 14)
  (_, rest) = profile.op_table(_write(_xspace(), tmp_path), top=1,
                               by="op_type")
  assert rest["op_name"] == "(other 2 op types)" and rest["count"] == 3
  with pytest.raises(ValueError, match="by='type'"):
    profile.op_table(_write(_xspace(), tmp_path), top=1, by="type")


def test_op_table_sums_the_rest_into_one_row(tmp_path):
  rows = profile.op_table(_write(_xspace(), tmp_path), top=1)
  assert rows[1] == {"op_name": "(other 3 ops)", "op_type": "", "count": 4,
                     "total_ms": pytest.approx(5),
                     "percent": pytest.approx(500 / 14)}
  assert sum(r["percent"] for r in rows) == pytest.approx(100)
  (rest,) = profile.op_table(_write(_xspace(), tmp_path), top=0)
  assert rest["count"] == 9 and rest["percent"] == pytest.approx(100)
  with pytest.raises(ValueError, match="top=-1"):
    profile.op_table(_write(_xspace(), tmp_path), top=-1)


def _reference_xspace() -> xplane_pb2.XSpace:
  """A host plane with MatMul_1 [0, 4) and Sum [5, 8) on one thread."""
  xspace = xplane_pb2.XSpace()
  host = xspace.planes.add(name=profile.HOST_PLANE)
  for i, (name, display) in enumerate([("MatMul_1:MatMul", "MatMul"),
                                       ("Sum_3:Sum", "Sum")], start=1):
    host.event_metadata[i].id = i
    host.event_metadata[i].name = name
    host.event_metadata[i].display_name = display
  line = host.lines.add(id=1, name="tf_Compute/1")
  _event(line, 1, offset_ms=0, duration_ms=4)
  _event(line, 2, offset_ms=5, duration_ms=3)
  return xspace


def test_extra_table_ranks_op_types_by_time_beyond_the_reference(tmp_path):
  # Per call (2 calls each): the case has MatMul 5 ms, GatherV2 1 and
  # PartitionedCall 1 (self time); the reference MatMul 2 and Sum 1.5.
  case = _write(_xspace(), tmp_path)
  (tmp_path / "ref").mkdir()
  reference = _write(_reference_xspace(), tmp_path / "ref")
  rows = profile.extra_table(case, reference, top=5, calls=2)
  assert [(r["op_type"], r["ms_per_call"], r["reference_ms_per_call"],
           r["extra_ms"]) for r in rows] == [
               ("MatMul", 5, 2, 3), ("GatherV2", 1, 0, 1),
               ("PartitionedCall", 1, 0, 1), ("Sum", 0, 1.5, -1.5),
               ("(total)", 7, 3.5, 3.5)]
  top, rest, total = profile.extra_table(case, reference, top=1, calls=2)
  assert top["op_type"] == "MatMul"
  assert (rest["op_type"], rest["extra_ms"]) == ("(other 3 op types)", 0.5)
  assert top["extra_ms"] + rest["extra_ms"] == total["extra_ms"]
  with pytest.raises(ValueError, match="calls=0"):
    profile.extra_table(case, reference, top=1, calls=0)


def test_op_table_failure_modes(tmp_path):
  no_host = xplane_pb2.XSpace()
  no_host.planes.add(name="/device:TPU:0")
  with pytest.raises(ValueError, match="/host:CPU"):
    profile.op_table(_write(no_host, tmp_path), top=3)
  dangling = _xspace()
  dangling.planes[1].lines[0].events.add(metadata_id=99, offset_ps=0)
  with pytest.raises(ValueError, match="metadata_id 99"):
    profile.op_table(_write(dangling, tmp_path), top=3)
  empty = xplane_pb2.XSpace()
  empty.planes.add(name=profile.HOST_PLANE)
  assert profile.op_table(_write(empty, tmp_path), top=3) == []


@pytest.fixture(scope="module")
def index_trace(tmp_path_factory):
  """A tf.profiler trace of 2 calls of a tiny MoE layer (index, no XLA)."""
  point = moe_layer.LayerPoint(**TINY)
  logdir = tmp_path_factory.mktemp("profile")
  fn = moe_layer.moe_case(point, dispatch="index", jit=False)
  return logdir, fn, profile.profile_call(fn, logdir=logdir, reps=2)


def test_profile_call_writes_an_xplane(index_trace):
  logdir, _, trace = index_trace
  assert trace.is_file() and trace.name.endswith(".xplane.pb")
  assert trace.is_relative_to(logdir / "plugins" / "profile")
  with pytest.raises(ValueError, match="--reps=0"):
    profile.profile_call(lambda: None, logdir=logdir, reps=0)


def test_profile_call_twice_into_one_logdir(index_trace):
  logdir, fn, first = index_trace
  second = profile.profile_call(fn, logdir=logdir, reps=1)
  assert second.is_file()  # a new run dir, or first's file rewritten
  assert profile.op_table(second, top=3)


def test_op_table_of_a_real_moe_trace(index_trace):
  _, _, trace = index_trace
  rows = profile.op_table(trace, top=1000)  # every op, no remainder row
  assert len(rows) > 10
  assert sum(r["percent"] for r in rows) == pytest.approx(100, abs=1e-6)
  assert all(r["count"] > 0 and r["total_ms"] >= 0 for r in rows)
  assert [r["total_ms"] for r in rows] == sorted(
      (r["total_ms"] for r in rows), reverse=True)
  types = {r["op_type"] for r in rows}
  assert "GatherV2" in types  # the index dispatch's gather of token rows
  assert types & MATMUL_TYPES, types
  assert not any(":" in r["op_name"] for r in rows)
  top = profile.op_table(trace, top=3)
  assert len(top) == 4 and top[:3] == rows[:3]
  assert top[3]["count"] == sum(r["count"] for r in rows[3:])
  by_type = profile.op_table(trace, top=1000, by="op_type")
  assert sorted(r["op_type"] for r in by_type) == sorted(types)
  for row in by_type:
    assert row["total_ms"] == pytest.approx(sum(
        r["total_ms"] for r in rows if r["op_type"] == row["op_type"]))
  assert [r["total_ms"] for r in by_type] == sorted(
      (r["total_ms"] for r in by_type), reverse=True)
  assert sum(r["total_ms"] for r in by_type) == pytest.approx(
      sum(r["total_ms"] for r in rows))


def _bench(*args, **kwargs):
  return subprocess.run([sys.executable, "-m", "m4moe.cli.bench", *args],
                        capture_output=True, text=True, check=False, **kwargs)


@pytest.mark.slow
def test_cli_profile_dir_prints_one_line_per_case(tmp_path):
  proc = _bench(
      "moe_layer", "--experts=4", "--top_ks=1", "--dispatches=index",
      "--jit=off", "--reps=1", "--warmup=1", "--matmul_size=0",
      "--model_dim=8", "--hidden_dim=16", "--num_tokens=32",
      "--group_size=16", f"--profile_dir={tmp_path}", "--profile_top=3")
  assert proc.returncode == 0, proc.stderr[-3000:]
  records = [json.loads(line) for line in proc.stdout.splitlines()]
  profiles = {r["case"]: r for r in records
              if r["benchmark"] == "moe_layer_profile"}
  assert [r["benchmark"] for r in records] == ["moe_layer"] * 2 + [
      "moe_layer_profile"] * 2  # timed first, then profiled
  assert set(profiles) == {"moe_index_nojit", "dense_nojit"}
  for case, record in profiles.items():
    assert record["num_experts"] == 4 and record["group_size"] == 16
    assert record["trace"].startswith(
        str(tmp_path / f"E4_K1_M8_H16_N32_S16_cf1.25_{case}"))
    for table in ("ops", "op_types"):
      assert len(record[table]) == 4
      assert math.isclose(sum(r["percent"] for r in record[table]), 100,
                          abs_tol=1e-3)


def test_cli_profile_dir_is_moe_layer_and_recipe_step_only(tmp_path):
  proc = _bench("train_step", f"--profile_dir={tmp_path}")
  assert proc.returncode != 0
  assert ("--profile_dir profiles moe_layer, recipe_step only, not "
          "train_step") in proc.stderr
