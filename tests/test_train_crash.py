"""Crash safety with real processes: kill -9 inside a save and at random
moments leaves a directory that resumes exactly."""

import signal
import subprocess
import sys

import numpy as np
import tensorflow as tf

CHILD = r'''
import os, signal, sys
import tensorflow as tf
tf.config.experimental.enable_op_determinism()
from tensorflow.python.checkpoint import checkpoint_management as cm
from m4moe.training import optimizer as optimizer_lib
from m4moe.training import loop as train_lib
from m4moe.training import synthetic
import toy_model

model_dir, steps, every, kill_in_save_at = sys.argv[1:5]
if int(kill_in_save_at):
  original = cm.update_checkpoint_state_internal
  def patched(save_dir, *args, **kwargs):
    path = kwargs.get("model_checkpoint_path") or args[0]
    if path.endswith(f"ckpt-{kill_in_save_at}"):
      # TF rewrites the index file only after the data files are complete.
      complete = all(os.path.exists(path + s)
                     for s in (".index", ".data-00000-of-00001"))
      print("DATA_BEFORE_INDEX", complete, flush=True)
      os.kill(os.getpid(), signal.SIGKILL)
    return original(save_dir, *args, **kwargs)
  cm.update_checkpoint_state_internal = patched

pairs = synthetic.synthetic_pairs(num_pairs=512, vocab_size=24, max_length=9)
config = train_lib.TrainConfig(
    model_dir=model_dir, train_steps=int(steps), seed=3, log_every=2,
    checkpoint_every=int(every), keep_checkpoints=3,
    optimizer=optimizer_lib.AdafactorConfig(warmup_steps=20))
train_lib.train(
    model_fn=lambda: toy_model.ToyTranslator(vocab_size=24),
    train_dataset=synthetic.pairs_dataset(pairs, batch_size=8, length=10,
                                          shuffle_seed=1),
    config=config, after_step=lambda s: print("STEP", s, flush=True))
print("DONE", flush=True)
'''


def _child(tmp_path, model_dir, *, steps, every, kill_in_save_at=0):
  script = tmp_path / "child.py"
  script.write_text(CHILD)
  return subprocess.Popen(
      [sys.executable, str(script), str(model_dir), str(steps), str(every),
       str(kill_in_save_at)],
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _final_values(model_dir, step):
  reader = tf.train.load_checkpoint(f"{model_dir}/ckpt-{step}")
  return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
          if n.startswith(("model/", "optimizer/"))}


def _assert_same(a, b):
  assert a.keys() == b.keys()
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_kill9_inside_save_then_at_random_moments(tmp_path):
  straight = tmp_path / "straight"
  proc = _child(tmp_path, straight, steps=10, every=5)
  assert "DONE" in proc.communicate(timeout=120)[0]
  expected = _final_values(straight, 10)

  # 1. Killed after ckpt-6's data files are written, before the index update.
  run = tmp_path / "run"
  proc = _child(tmp_path, run, steps=10, every=3, kill_in_save_at=6)
  out = proc.communicate(timeout=120)[0]
  assert proc.returncode == -signal.SIGKILL
  assert "DATA_BEFORE_INDEX True" in out
  assert (run / "ckpt-6.index").exists()
  assert tf.train.latest_checkpoint(str(run)).endswith("ckpt-3")
  # Debris of a save killed even earlier must not matter either.
  (run / "ckpt-9_temp").mkdir()
  (run / "ckpt-9_temp" / "part-00000-of-00001.data-00000-of-00001").write_bytes(
      b"\0garbage")

  # 2. Killed at (roughly) random moments while saving every step.
  for kill_after_step in (5, 8):
    proc = _child(tmp_path, run, steps=10, every=1)
    for line in proc.stdout:
      if line.strip() == f"STEP {kill_after_step}":
        proc.send_signal(signal.SIGKILL)
        break
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    latest = tf.train.latest_checkpoint(str(run))
    assert latest is not None
    tf.train.load_checkpoint(latest)  # complete and readable

  proc = _child(tmp_path, run, steps=10, every=3)
  assert "DONE" in proc.communicate(timeout=120)[0]
  assert proc.returncode == 0
  _assert_same(expected, _final_values(run, 10))
