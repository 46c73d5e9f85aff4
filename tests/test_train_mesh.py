"""m4moe-train --mesh: a DTensor mesh of virtual CPUs trains like one device.

Subprocess runs of ``m4moe-train`` on a shrunk tiny MoE (E=4) and the
synthetic task: three steps on ``--num_cpu_devices=4 --mesh=data:1,expert:4``
log the same losses as three steps on one device without a mesh; the mesh
run's checkpoint resumes on one device (mesh -> no mesh) and gives the
straight run's fourth step; three steps with tensor parallelism
(``--num_cpu_devices=2 --mesh=model:2``: heads, d_ff and the expert hidden
width split, Adafactor's update of the split weights included) log the same
finite losses as one device too; bad meshes fail early with actionable
messages.

The equality run's batches have 6 rows, which the mesh's batch axis
(``expert`` on ``data:1,expert:4``: GShard's layout, rows and groups split
over the experts' devices) does not divide, so they are put replicated and
grouped whole, as on one device. With rows it divides, each shard groups
its own tokens (local group dispatching) and with padding the routing is
not that of one device grouping the whole batch; that case is compared
with one device grouping per shard in ``test_sharding_train_step.py``.
"""

import json
import subprocess
import sys

import numpy as np
import pytest

SMALL = ["--config=tiny/moe", "--d_model=32", "--num_heads=2", "--d_kv=16",
         "--d_ff=64", "--num_encoder_layers=2", "--num_decoder_layers=2",
         "--num_experts=4", "--expert_hidden_dim=32", "--group_size=16",
         "--src_vocab_size=64", "--tgt_vocab_size=64", "--synthetic_data",
         "--sequence_length=16", "--batch_tokens=128", "--log_every=1",
         "--eval_every=0", "--deterministic", "--warmup_steps=100",
         "--dev_batch_size=6"]
MESH = ["--num_cpu_devices=4", "--mesh=data:2,expert:2"]
# Expert parallelism on batches of 6 rows (96 tokens of 16), which the
# expert axis does not divide: grouped whole, as on one device.
EQUAL_BATCH = ["--batch_tokens=96"]
EQUAL_MESH = ["--num_cpu_devices=4", "--mesh=data:1,expert:4", *EQUAL_BATCH]
# Tensor parallelism alone (no data axis: groups as on one device).
MODEL_MESH = ["--num_cpu_devices=2", "--mesh=model:2"]


def _run(*args):
  return subprocess.run(
      [sys.executable, "-c", "from m4moe.cli.train import run; run()", *args],
      capture_output=True, text=True, timeout=600)


def _records(model_dir, kind):
  lines = (model_dir / "metrics.jsonl").read_text().splitlines()
  return [r for r in map(json.loads, lines) if r["kind"] == kind]


def _losses(model_dir):
  return {r["step"]: (r["train_ce"], r["train_loss"])
          for r in _records(model_dir, "train")}


@pytest.mark.slow
def test_mesh_run_equals_one_device_and_resumes_without_mesh(tmp_path):
  mesh_dir, plain_dir = tmp_path / "mesh", tmp_path / "plain"
  proc = _run(*SMALL, *EQUAL_MESH, f"--model_dir={mesh_dir}",
              "--train_steps=3")
  assert proc.returncode == 0, proc.stderr[-3000:]
  proc = _run(*SMALL, *EQUAL_BATCH, f"--model_dir={plain_dir}",
              "--train_steps=4")
  assert proc.returncode == 0, proc.stderr[-3000:]
  mesh, plain = _losses(mesh_dir), _losses(plain_dir)
  assert sorted(mesh) == [1, 2, 3]
  for step in (1, 2, 3):
    np.testing.assert_allclose(mesh[step], plain[step], rtol=1e-4,
                               err_msg=f"step {step}")
  assert plain[1] != plain[3]  # Training moves the loss.
  start = _records(mesh_dir, "start")[0]
  assert start["mesh"] == "data:1,expert:4"
  # The mesh's devices, not the strategy's single replica (Table 3's
  # device-hours are computed from it).
  assert start["devices"] == 4
  assert {r["devices"] for r in _records(mesh_dir, "train")} == {4}
  saved = json.loads((mesh_dir / "config.json").read_text())
  assert saved["mesh"] == "data:1,expert:4"
  assert proc.returncode == 0
  # The mesh checkpoint (DVariables, experts split on E) restores on one
  # device and continues exactly like the run that never had a mesh.
  proc = _run(*SMALL, *EQUAL_BATCH, f"--model_dir={mesh_dir}",
              "--train_steps=4")
  assert proc.returncode == 0, proc.stderr[-3000:]
  resumed = _losses(mesh_dir)
  np.testing.assert_allclose(resumed[4], plain[4], rtol=1e-4)


@pytest.mark.slow
def test_model_axis_run_equals_one_device(tmp_path):
  model_dir, plain_dir = tmp_path / "model", tmp_path / "plain"
  proc = _run(*SMALL, *MODEL_MESH, f"--model_dir={model_dir}",
              "--train_steps=3")
  assert proc.returncode == 0, proc.stderr[-3000:]
  proc = _run(*SMALL, f"--model_dir={plain_dir}", "--train_steps=3")
  assert proc.returncode == 0, proc.stderr[-3000:]
  split, plain = _losses(model_dir), _losses(plain_dir)
  assert sorted(split) == [1, 2, 3]
  # Losses after the first step come from weights Adafactor updated on the
  # mesh (the update of model-split weights was once NaN).
  for step in (1, 2, 3):
    assert np.all(np.isfinite(split[step])), f"step {step}"
    np.testing.assert_allclose(split[step], plain[step], rtol=1e-5,
                               err_msg=f"step {step}")
  assert not [r for r in _records(model_dir, "train")
              if r["nonfinite_skipped"]]
  assert _records(model_dir, "start")[0]["mesh"] == "model:2"


def test_bad_meshes_fail_with_the_fix(tmp_path):
  cases = (
      (["--mesh=data:2,expert:2"], "uses 4 devices but 1 are available"),
      (["--num_cpu_devices=8", "--mesh=data:1,expert:8"],
       "--num_experts=4 is not divisible by the mesh's expert:8"),
      (["--mesh=data:2,experts:2"], "mesh axis 'experts' is unknown"),
      # The model axis splits heads (2 here), d_ff and expert hidden H.
      (["--num_cpu_devices=4", "--mesh=model:4"],
       "--num_heads=2 is not divisible by the mesh's model:4 axis"),
  )
  for args, fragment in cases:
    proc = _run(*SMALL, *args, f"--model_dir={tmp_path}/x", "--check_config")
    assert proc.returncode == 2, (args, proc.stderr[-2000:])
    assert fragment in proc.stderr, (args, proc.stderr[-2000:])


def test_check_config_reports_the_mesh(tmp_path):
  proc = _run(*SMALL, *MESH, f"--model_dir={tmp_path}", "--check_config")
  assert proc.returncode == 0, proc.stderr[-2000:]
  effective = json.loads(proc.stdout[:proc.stdout.rindex("}") + 1])
  assert effective["mesh"] == "data:2,expert:2"
  assert effective["devices"] == 4
  assert "config OK" in proc.stdout
