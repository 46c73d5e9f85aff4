"""Checkpoints across meshes: A -> B -> one device -> A, unsharded export.

Runs in a subprocess (8 virtual CPUs; see test_sharding_dtensor.py). The
weights of the annotated toy MoE layer of ``test_sharding_dtensor`` are saved
with ``tf.train.Checkpoint`` on mesh ``data:2,expert:4`` (expert weights are
E-split DVariables), restored on other meshes and on one device without
DTensor, and the eval loss is compared. The per-device data files are then
searched for the bytes of every expert: each must be stored exactly once.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

MESH_A = "data:2,expert:4"
RESTORE_ON = ("data:8", "expert:8", "data:4,expert:2", None)


def _weights_on(sharding, values):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with sharding.variable_scope(((r"(^|/)experts/", ("expert",)),)):
    with tf.name_scope("moe"):
      return {name: tf.Variable(values[name], name=scope)
              for name, scope in (("wg", "router/wg"), ("wi", "experts/wi"),
                                  ("wo", "experts/wo"))}


def _eval_loss(sharding, weights, x):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from test_sharding_dtensor import _einsum_moe  # pylint: disable=g-import-not-at-top

  @tf.function
  def loss(x):
    out = _einsum_moe(x, weights["wg"], weights["wi"], weights["wo"], sharding)
    return tf.reduce_mean(tf.square(out - 0.5))

  return float(sharding.gather(loss(sharding.put(x, ("data",)))).numpy())


def _worker(workdir: str) -> None:
  from m4moe.parallel import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  sharding_lib.configure_virtual_cpus(8)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from test_sharding_dtensor import _initial_values, _make_sharding  # pylint: disable=g-import-not-at-top
  values = _initial_values()
  x = values.pop("x")
  zeros = {k: np.zeros_like(v) for k, v in values.items()}
  report = {}
  mesh_a = _make_sharding(MESH_A)
  weights = _weights_on(mesh_a, values)
  report["loss_a"] = _eval_loss(mesh_a, weights, x)
  report["shards_a"] = {k: mesh_a.local_shapes(v) for k, v in weights.items()}
  path_a = tf.train.Checkpoint(**weights).write(os.path.join(workdir, "a"))
  report["files_a"] = sorted(os.listdir(workdir))
  report["losses"] = {}
  for mesh_text in RESTORE_ON:
    sharding = _make_sharding(mesh_text)
    restored = _weights_on(sharding, zeros)
    tf.train.Checkpoint(**restored).read(path_a).assert_consumed()
    report["losses"][str(mesh_text)] = _eval_loss(sharding, restored, x)
  # One device -> write -> back onto mesh A.
  plain = _weights_on(sharding_lib.NO_SHARDING, values)
  path_1 = tf.train.Checkpoint(**plain).write(os.path.join(workdir, "one"))
  back = _weights_on(mesh_a, zeros)
  tf.train.Checkpoint(**back).read(path_1).assert_consumed()
  report["losses"]["one->A"] = _eval_loss(mesh_a, back, x)
  # Unsharded export of the mesh-A checkpoint, restored on mesh A.
  path_u = sharding_lib.export_unsharded(path_a,
                                         os.path.join(workdir, "u", "a"))
  again = _weights_on(mesh_a, zeros)
  tf.train.Checkpoint(**again).read(path_u).assert_consumed()
  report["losses"]["export->A"] = _eval_loss(mesh_a, again, x)
  report["files_u"] = sorted(os.listdir(os.path.join(workdir, "u")))
  print("REPORT " + json.dumps(report))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("ckpt")
  env = dict(os.environ)
  here = str(pathlib.Path(__file__).parent)
  env["PYTHONPATH"] = os.pathsep.join(
      [here] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
  proc = subprocess.run([sys.executable, __file__, str(workdir)],
                        capture_output=True, text=True, timeout=300,
                        check=False, env=env)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("REPORT ")]
  assert proc.returncode == 0 and lines, proc.stderr[-4000:]
  return dict(json.loads(lines[-1][len("REPORT "):]), workdir=str(workdir))


def test_restore_on_other_meshes_gives_identical_eval_loss(report):
  assert set(report["losses"]) == {"data:8", "expert:8", "data:4,expert:2",
                                   "None", "one->A", "export->A"}
  for where, loss in report["losses"].items():
    assert loss == pytest.approx(report["loss_a"], rel=1e-6, abs=0), where


def test_every_expert_is_stored_exactly_once(report):
  from test_sharding_dtensor import E, _initial_values  # pylint: disable=g-import-not-at-top
  assert report["shards_a"]["wi"] == [[E // 4, 8, 16]] * 8
  workdir = pathlib.Path(report["workdir"])
  data = [workdir / f for f in report["files_a"]
          if f.startswith("a.data-")]
  assert len(data) > 1  # One file per device shard, not one gathered file.
  blob = b"".join(p.read_bytes() for p in data)
  values = _initial_values()
  for name in ("wi", "wo"):
    for e in range(E):
      assert blob.count(values[name][e].tobytes()) == 1, (name, e)
  assert blob.count(values["wg"].tobytes()) == 1  # Replicated: saved once.
  total = sum(values[n].nbytes for n in ("wg", "wi", "wo"))
  assert sum(p.stat().st_size for p in data) < total + 4096


def test_export_writes_a_single_unsharded_file(report):
  assert [f for f in report["files_u"] if ".data-" in f] == [
      "a.data-00000-of-00001"]


def test_export_rejects_a_missing_checkpoint(tmp_path):
  from m4moe.parallel import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  with pytest.raises(sharding_lib.MeshError, match="cannot read checkpoint"):
    sharding_lib.export_unsharded(str(tmp_path / "nope"), str(tmp_path / "u"))


if __name__ == "__main__":
  _worker(sys.argv[1])
