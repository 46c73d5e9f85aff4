"""Two processes on loopback (DTensor multi-client) train like one process.

Launch (what the test does, with two free ports)::

  for i in 0 1; do
    DTENSOR_CLIENT_ID=$i DTENSOR_NUM_CLIENTS=2 DTENSOR_JOB_NAME=worker \\
    DTENSOR_JOBS=localhost:PORT0,localhost:PORT1 \\
    python tests/test_sharding_multiclient.py &
  done; wait

Each process owns 2 virtual CPUs; the mesh ``data:2,expert:2`` spans the 4
devices of both. Both run 3 SGD steps of the annotated toy MoE layer of
``test_sharding_dtensor`` and print their losses, which must equal a
single-process run without DTensor.
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

MESH = "data:2,expert:2"
STEPS = 3
LEARNING_RATE = 0.01


def _train(sharding, values):
  """3 SGD steps; returns the losses and the final expert-0 weights sum."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from test_sharding_dtensor import _einsum_moe  # pylint: disable=g-import-not-at-top
  with sharding.variable_scope(((r"(^|/)experts/", ("expert",)),)):
    with tf.name_scope("moe"):
      weights = [tf.Variable(values[k], name=n) for k, n in (
          ("wg", "router/wg"), ("wi", "experts/wi"), ("wo", "experts/wo"))]
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
  return {"losses": losses, "wi_sum": float(final.sum()),
          "local_wi": (sharding.local_shapes(weights[1])
                       if sharding.enabled else None)}


def _worker() -> None:
  from tensorflow.experimental import dtensor  # pylint: disable=g-import-not-at-top
  dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=2)
  from m4moe import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  from test_sharding_dtensor import _initial_values  # pylint: disable=g-import-not-at-top
  result = _train(sharding_lib.make_sharding(MESH), _initial_values())
  result["client"] = dtensor.client_id()
  print("REPORT " + json.dumps(result), flush=True)


def _free_ports(n):
  socks = [socket.socket() for _ in range(n)]
  for s in socks:
    s.bind(("localhost", 0))
  ports = [s.getsockname()[1] for s in socks]
  for s in socks:
    s.close()
  return ports


@pytest.fixture(scope="module")
def reports():
  jobs = ",".join(f"localhost:{p}" for p in _free_ports(2))
  procs = []
  for client in range(2):
    env = dict(os.environ, DTENSOR_CLIENT_ID=str(client),
               DTENSOR_NUM_CLIENTS="2", DTENSOR_JOB_NAME="worker",
               DTENSOR_JOBS=jobs)
    procs.append(subprocess.Popen(
        [sys.executable, str(pathlib.Path(__file__))], env=env, text=True,
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
  from m4moe import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  from test_sharding_dtensor import _initial_values  # pylint: disable=g-import-not-at-top
  want = _train(sharding_lib.NO_SHARDING, _initial_values())
  assert sorted(r["client"] for r in reports) == [0, 1]
  for report in reports:
    np.testing.assert_allclose(report["losses"], want["losses"], rtol=1e-5)
    np.testing.assert_allclose(report["wi_sum"], want["wi_sum"], rtol=1e-5)
  assert want["losses"][-1] < want["losses"][0]  # It does train.


def test_each_client_holds_only_its_experts(reports):
  from test_sharding_dtensor import E, H, M  # pylint: disable=g-import-not-at-top
  for report in reports:  # 2 local devices, E/2 experts each.
    assert report["local_wi"] == [[E // 2, M, H]] * 2


if __name__ == "__main__":
  _worker()
