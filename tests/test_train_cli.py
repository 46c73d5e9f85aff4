"""m4moe-train end to end: --check_config, config layering, MirroredStrategy
on two logical CPUs gives the single-device update."""

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

SMALL = ["--config=tiny/dense", "--d_model=32", "--num_heads=2", "--d_kv=16",
         "--d_ff=64", "--num_encoder_layers=1", "--num_decoder_layers=1",
         "--src_vocab_size=64", "--tgt_vocab_size=64", "--dropout_rate=0",
         "--attention_dropout_rate=0", "--synthetic_data",
         "--sequence_length=16", "--batch_tokens=256", "--log_every=1",
         "--eval_every=0", "--deterministic", "--warmup_steps=100"]


def _run(*args):
  return subprocess.run(
      [sys.executable, "-c", "from m4moe.cli.train import run; run()", *args],
      capture_output=True, text=True, timeout=300)


def test_check_config_prints_effective_config_and_exits(tmp_path):
  proc = _run(*SMALL, f"--model_dir={tmp_path}", "--check_config",
              "--num_cpu_devices=2")
  assert proc.returncode == 0, proc.stderr[-2000:]
  effective = json.loads(proc.stdout[:proc.stdout.rindex("}") + 1])
  assert effective["model"]["d_model"] == 32          # command line wins
  assert effective["model"]["num_heads"] == 2
  assert effective["model"]["moe"]["num_experts"] == 0  # from tiny/dense
  assert effective["devices"] == 2
  assert "config OK" in proc.stdout
  assert not list(tmp_path.iterdir())  # nothing trained or written


def test_check_config_reports_problems(tmp_path):
  proc = _run("--config=tiny/moe", f"--model_dir={tmp_path}",
              "--check_config", f"--corpus_dir={tmp_path}/nope",
              f"--vocab_dir={tmp_path}/nope")
  assert proc.returncode == 2
  assert "source.model is missing" in proc.stderr
  assert "no train/*.tsv" in proc.stderr
  proc = _run("--config=tiny/moe", f"--model_dir={tmp_path}", "--check_config")
  assert proc.returncode == 2
  assert "--corpus_dir, --tfds_name or --synthetic_data" in proc.stderr


@pytest.mark.slow  # a training CLI run end to end: `pytest -m slow`
def test_mirrored_two_devices_equals_one_device(tmp_path):
  for devices in (1, 2):
    proc = _run(*SMALL, f"--model_dir={tmp_path}/d{devices}",
                "--train_steps=2", f"--num_cpu_devices={devices}")
    assert proc.returncode == 0, proc.stderr[-2000:]
  a = tf.train.load_checkpoint(f"{tmp_path}/d1/ckpt-2")
  b = tf.train.load_checkpoint(f"{tmp_path}/d2/ckpt-2")
  names = [n for n in a.get_variable_to_shape_map() if n.startswith("model/")]
  assert len(names) > 10
  for name in names:
    np.testing.assert_allclose(a.get_tensor(name), b.get_tensor(name),
                               rtol=1e-5, atol=1e-6, err_msg=name)
  start = json.loads((tmp_path / "d2" / "metrics.jsonl").read_text()
                     .splitlines()[0])
  assert start["devices"] == 2
  saved = json.loads((tmp_path / "d2" / "config.json").read_text())
  assert saved["model"]["d_model"] == 32 and saved["data"]["synthetic"]


@pytest.mark.slow  # a training CLI run end to end: `pytest -m slow`
def test_continue_from_trains_a_copy_and_checks_its_source(tmp_path):
  from m4moe.training import rundir  # pylint: disable=g-import-not-at-top
  done, longer = tmp_path / "done", tmp_path / "longer"
  proc = _run(*SMALL, f"--model_dir={done}", "--train_steps=2",
              "--checkpoint_every=2")
  assert proc.returncode == 0, proc.stderr[-2000:]
  proc = _run(*SMALL, f"--model_dir={tmp_path / 'x'}", "--check_config",
              f"--continue_from={tmp_path / 'nothing'}")
  assert proc.returncode == 2
  assert f"--continue_from={tmp_path / 'nothing'} holds no ckpt-<step>" in (
      proc.stderr)
  # Other model flags than the run had: refused before anything is copied.
  proc = _run(*SMALL, "--d_ff=128", f"--model_dir={longer}",
              "--train_steps=4", f"--continue_from={done}")
  assert proc.returncode == 2
  assert "trained another model (--d_ff: checkpoint 64 vs now 128)" in (
      proc.stderr)
  assert not longer.exists()
  proc = _run(*SMALL, f"--model_dir={longer}", "--train_steps=4",
              "--checkpoint_every=2", f"--continue_from={done}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert f"continues {done} from its step 2" in proc.stderr
  assert rundir.checkpoint_steps(longer)[-1] == 4
  assert rundir.checkpoint_steps(done) == [2]  # left as it was
  assert json.loads(proc.stdout.strip().splitlines()[-1])["step"] == 4
