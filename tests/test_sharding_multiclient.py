"""Two processes on loopback (DTensor multi-client) train like one process.

Launch (what the test does, with two free ports)::

  for i in 0 1; do
    DTENSOR_CLIENT_ID=$i DTENSOR_NUM_CLIENTS=2 DTENSOR_JOB_NAME=worker \\
    DTENSOR_JOBS=localhost:PORT0,localhost:PORT1 \\
    python tests/test_sharding_multiclient.py worker CHECKPOINT_DIR &
  done; wait

Each process owns 2 virtual CPUs; the mesh ``expert:2,data:2`` spans the 4
devices of both with the expert axis across the processes (device i sits
at expert i // 2, so client c holds experts [c*E/2, (c+1)*E/2) only). Both
run 3 SGD steps of the annotated toy MoE layer of ``test_sharding_dtensor``
and print their losses, which must equal a single-process run without
DTensor; then both write one checkpoint of the trained weights together and
report the eval loss (a fixed other input). That checkpoint must restore in
one process without a mesh and, in a fresh process
(``python tests/test_sharding_multiclient.py restore PREFIX``), on the mesh
``data:1,expert:4`` of 4 virtual CPUs, each with the same eval loss.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

MESH = "expert:2,data:2"  # expert axis across the two clients
RESTORE_MESH = "data:1,expert:4"
STEPS = 3
LEARNING_RATE = 0.01


def _weights(sharding, values):
  """[wg, wi, wo] variables (experts split on E) holding ``values``."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with sharding.variable_scope(((r"(^|/)experts/", ("expert",)),)):
    with tf.name_scope("moe"):
      return [tf.Variable(values[k], name=n) for k, n in (
          ("wg", "router/wg"), ("wi", "experts/wi"), ("wo", "experts/wo"))]


def _eval_loss(sharding, weights):
  """Loss of the layer on a fixed input other than the training one."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from test_sharding_dtensor import _einsum_moe, _initial_values  # pylint: disable=g-import-not-at-top
  x = sharding.put(_initial_values()["x"][::-1] * 0.5, ("data",))
  loss = tf.reduce_mean(tf.square(_einsum_moe(x, *weights, sharding) - 0.5))
  return float(sharding.gather(loss).numpy())


def _checkpoint(weights):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.train.Checkpoint(wg=weights[0], wi=weights[1], wo=weights[2])


def _train(sharding, values):
  """3 SGD steps; losses, final weights' sums, eval loss, local shards."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.experimental import dtensor  # pylint: disable=g-import-not-at-top
  from test_sharding_dtensor import _einsum_moe  # pylint: disable=g-import-not-at-top
  weights = _weights(sharding, values)
  x = sharding.put(values["x"], ("data",))

  @tf.function
  def step(x):
    with tf.GradientTape() as tape:
      out = _einsum_moe(x, *weights, sharding)
      loss = tf.reduce_mean(tf.square(out - 0.5))
    for w, g in zip(weights, tape.gradient(loss, weights)):
      w.assign_sub(LEARNING_RATE * g)
    return loss

  losses = [float(sharding.gather(step(x)).numpy()) for _ in range(STEPS)]
  final = sharding.gather(weights[1]).numpy()
  local = None
  if sharding.enabled:  # this client's devices' shards of wi
    local = [float(np.asarray(t).sum())
             for t in dtensor.unpack(weights[1].read_value())]
  return {"losses": losses, "wi_sum": float(final.sum()),
          "wi_expert_sums": [float(e.sum()) for e in final],
          "eval_loss": _eval_loss(sharding, weights),
          "local_wi": (sharding.local_shapes(weights[1])
                       if sharding.enabled else None),
          "local_wi_sums": local, "weights": weights}


def _worker(checkpoint_dir: str) -> None:
  from tensorflow.experimental import dtensor  # pylint: disable=g-import-not-at-top
  dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=2)
  from m4moe.parallel import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  from test_sharding_dtensor import _initial_values  # pylint: disable=g-import-not-at-top
  result = _train(sharding_lib.make_sharding(MESH), _initial_values())
  # Both clients write the one checkpoint (each its own shards).
  result["checkpoint"] = _checkpoint(result.pop("weights")).write(
      os.path.join(checkpoint_dir, "ckpt"))
  result["client"] = dtensor.client_id()
  print("REPORT " + json.dumps(result), flush=True)


def _restored_eval_loss(sharding, prefix):
  """Eval loss of the checkpoint ``prefix`` restored on ``sharding``."""
  from test_sharding_dtensor import _initial_values  # pylint: disable=g-import-not-at-top
  zeros = {k: np.zeros_like(v) for k, v in _initial_values().items()}
  weights = _weights(sharding, zeros)
  _checkpoint(weights).read(prefix).assert_existing_objects_matched()
  return _eval_loss(sharding, weights)


def _restore_worker(prefix: str) -> None:
  from m4moe.parallel import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  sharding_lib.configure_virtual_cpus(4)
  sharding = sharding_lib.make_sharding(RESTORE_MESH)
  print("REPORT " + json.dumps(
      {"eval_loss": _restored_eval_loss(sharding, prefix)}), flush=True)


def _free_ports(n):
  socks = [socket.socket() for _ in range(n)]
  for s in socks:
    s.bind(("localhost", 0))
  ports = [s.getsockname()[1] for s in socks]
  for s in socks:
    s.close()
  return ports


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
  checkpoint_dir = tmp_path_factory.mktemp("two_clients")
  jobs = ",".join(f"localhost:{p}" for p in _free_ports(2))
  procs = []
  for client in range(2):
    env = dict(os.environ, DTENSOR_CLIENT_ID=str(client),
               DTENSOR_NUM_CLIENTS="2", DTENSOR_JOB_NAME="worker",
               DTENSOR_JOBS=jobs)
    procs.append(subprocess.Popen(
        [sys.executable, str(pathlib.Path(__file__)), "worker",
         str(checkpoint_dir)], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE))
  out = []
  for proc in procs:
    # Wait for every client in turn. Only on a failure (timeout, interrupt)
    # kill the others: a client that is still finishing its last step after
    # its peer exited must be left to finish.
    try:
      stdout, stderr = proc.communicate(timeout=300)
    except BaseException:
      for other in procs:
        if other.poll() is None:
          other.kill()
      raise
    lines = [l for l in stdout.splitlines() if l.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, stderr[-4000:]
    out.append(json.loads(lines[-1][len("REPORT "):]))
  return out


def test_two_clients_train_like_one_process(reports):
  from m4moe.parallel import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  from test_sharding_dtensor import _initial_values  # pylint: disable=g-import-not-at-top
  want = _train(sharding_lib.NO_SHARDING, _initial_values())
  assert sorted(r["client"] for r in reports) == [0, 1]
  for report in reports:
    np.testing.assert_allclose(report["losses"], want["losses"], rtol=1e-5)
    np.testing.assert_allclose(report["wi_sum"], want["wi_sum"], rtol=1e-5)
  assert want["losses"][-1] < want["losses"][0]  # It does train.


def test_each_client_holds_only_its_experts(reports):
  from m4moe.parallel import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  from test_sharding_dtensor import E, H, M, _initial_values  # pylint: disable=g-import-not-at-top
  want = _train(sharding_lib.NO_SHARDING, _initial_values())
  for report in reports:  # 2 local devices, E/2 experts each.
    assert report["local_wi"] == [[E // 2, M, H]] * 2
    # The expert axis spans the clients: client c's two devices (one per
    # data row) both hold experts c*E/2 .. (c+1)*E/2 - 1, and no others.
    c = report["client"]
    half = sum(want["wi_expert_sums"][c * E // 2:(c + 1) * E // 2])
    np.testing.assert_allclose(report["local_wi_sums"], [half, half],
                               rtol=1e-5)
  other = sum(want["wi_expert_sums"][E // 2:])
  assert abs(sum(want["wi_expert_sums"][:E // 2]) - other) > 1e-3


def test_two_client_checkpoint_restores_on_one_process(reports):
  from m4moe.parallel import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  prefixes = {r["checkpoint"] for r in reports}
  assert len(prefixes) == 1  # one checkpoint, written by both clients
  got = _restored_eval_loss(sharding_lib.NO_SHARDING, prefixes.pop())
  for report in reports:
    np.testing.assert_allclose(got, report["eval_loss"], rtol=1e-5)


def test_two_client_checkpoint_restores_on_another_mesh(reports):
  proc = subprocess.run(
      [sys.executable, str(pathlib.Path(__file__)), "restore",
       reports[0]["checkpoint"]],
      capture_output=True, text=True, timeout=300, check=False)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("REPORT ")]
  assert proc.returncode == 0 and lines, proc.stderr[-4000:]
  got = json.loads(lines[-1][len("REPORT "):])["eval_loss"]
  for report in reports:
    np.testing.assert_allclose(got, report["eval_loss"], rtol=1e-5)


if __name__ == "__main__":
  if sys.argv[1] == "worker":
    _worker(sys.argv[2])
  else:
    _restore_worker(sys.argv[2])
