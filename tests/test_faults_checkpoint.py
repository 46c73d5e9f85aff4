"""Faults of a run directory: damaged checkpoints, a lost or garbage state
file, stale temp directories of killed saves, two writers, a --model_dir that
is a file. Each test injects the fault and checks where the run resumed,
that nothing was deleted, and what the error says."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from m4moe.training import optimizer as optimizer_lib
from m4moe.training import loop as train_lib
from m4moe.training import checkpointing
from m4moe.training import synthetic
import toy_model
from m4moe.training import metrics_log
from m4moe import run_lock

VOCAB = 24
PAIRS = synthetic.synthetic_pairs(num_pairs=256, vocab_size=VOCAB, max_length=9)
DATA = ".data-00000-of-00001"


def _config(model_dir, **overrides):
  values = dict(model_dir=str(model_dir), train_steps=6, seed=3, log_every=2,
                checkpoint_every=2, keep_checkpoints=3,
                optimizer=optimizer_lib.AdafactorConfig(warmup_steps=20))
  values.update(overrides)
  return train_lib.TrainConfig(**values)


def _train(model_dir, **overrides):
  # Dataset.shuffle's order depends on the global seed when the dataset is
  # built, which an earlier train() call sets: fix it so that a run's
  # batches do not depend on what ran before it in this process.
  tf.random.set_seed(0)
  return train_lib.train(
      model_fn=lambda: toy_model.ToyTranslator(vocab_size=VOCAB),
      train_dataset=synthetic.pairs_dataset(PAIRS, batch_size=8, length=10,
                                           shuffle_seed=1),
      config=_config(model_dir, **overrides))


def _start_records(model_dir):
  return metrics_log.read_metrics(model_dir / "metrics.jsonl", kind="start")


def _weights(prefix):
  reader = tf.train.load_checkpoint(str(prefix))
  return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
          if n.startswith("model/")}


def _truncate_data(prefix):
  data = pathlib.Path(f"{prefix}{DATA}")
  data.write_bytes(data.read_bytes()[:data.stat().st_size // 2])


def _delete_index(prefix):
  pathlib.Path(f"{prefix}.index").unlink()


def _flip_bytes(prefix):
  data = pathlib.Path(f"{prefix}{DATA}")
  raw = bytearray(data.read_bytes())
  for i in range(0, len(raw), 97):  # inside the tensors, not only padding
    raw[i] ^= 0x5A
  data.write_bytes(bytes(raw))


def _flip_index(prefix):
  index = pathlib.Path(f"{prefix}.index")
  raw = bytearray(index.read_bytes())
  raw[10] ^= 0xFF
  index.write_bytes(bytes(raw))


def _delete_all(prefix):
  prefix = pathlib.Path(prefix)
  for path in prefix.parent.glob(f"{prefix.name}.*"):
    path.unlink()


@pytest.mark.parametrize("damage,reason", [
    (_truncate_data, "Read less bytes than requested"),
    (_delete_index, "ckpt-6.index is missing"),
    (_flip_bytes, "does not match"),
    (_flip_index, "block checksum mismatch"),
    (_delete_all, "the state file names it but no ckpt-6.* file exists"),
])
def test_damaged_newest_checkpoint_falls_back_and_is_kept_aside(
    tmp_path, damage, reason):
  run = tmp_path / "run"
  _train(run, train_steps=6)
  files_before = sorted(p.name for p in run.glob("ckpt-6*"))
  damaged_bytes = {}
  damage(run / "ckpt-6")
  for name in files_before:
    if (run / name).exists():
      damaged_bytes[name] = (run / name).read_bytes()

  result = _train(run, train_steps=8)

  assert result.step == 8
  start = _start_records(run)[-1]
  assert start["step"] == 4
  assert start["resumed_from"].endswith("ckpt-4")
  [skipped] = start["damaged_checkpoints"]
  assert skipped["path"] == "ckpt-6"  # relative to the model dir
  assert reason in skipped["reason"]
  # The damaged files are kept, byte for byte, under damaged/ckpt-6/.
  if damaged_bytes:
    assert skipped["moved_to"] == "damaged/ckpt-6"
    kept = run / "damaged" / "ckpt-6"
    assert sorted(p.name for p in kept.iterdir()) == sorted(damaged_bytes)
    for name, raw in damaged_bytes.items():
      assert (kept / name).read_bytes() == raw
  else:
    assert skipped["moved_to"] is None
    assert not (run / "damaged").exists()
  # The new ckpt-6 is the redone step 6, intact; training went on to 8.
  assert checkpointing.verify_checkpoint(str(run / "ckpt-6")) is None
  assert tf.train.latest_checkpoint(str(run)).endswith("ckpt-8")


def test_fallback_resume_equals_a_straight_run(tmp_path):
  straight = tmp_path / "straight"
  _train(straight, train_steps=8)
  run = tmp_path / "run"
  _train(run, train_steps=6)
  _flip_bytes(run / "ckpt-6")
  _train(run, train_steps=8)
  expected, got = _weights(straight / "ckpt-8"), _weights(run / "ckpt-8")
  assert expected.keys() == got.keys()
  for name in expected:
    np.testing.assert_array_equal(expected[name], got[name], err_msg=name)


@pytest.mark.parametrize("state", [None, "\x00\x01 garbage {{{", ""])
def test_missing_or_garbage_state_file_is_rebuilt_from_disk(tmp_path, state):
  run = tmp_path / "run"
  _train(run, train_steps=6)
  train_records = metrics_log.read_metrics(run / "metrics.jsonl", "train")
  if state is None:
    (run / "checkpoint").unlink()
  else:
    (run / "checkpoint").write_text(state)

  recovery = checkpointing.recover_checkpoints(run)

  assert recovery.latest == str(run / "ckpt-6")
  assert "rebuilt it from the checkpoint files" in recovery.state_rebuilt
  ckpt_state = tf.train.get_checkpoint_state(str(run))
  assert [os.path.basename(p) for p in ckpt_state.all_model_checkpoint_paths
          ] == ["ckpt-2", "ckpt-4", "ckpt-6"]
  # Training resumes at 6: the records of steps 1..6 are the first run's.
  result = _train(run, train_steps=8)
  assert result.step == 8
  assert _start_records(run)[-1]["resumed_from"].endswith("ckpt-6")
  after = metrics_log.read_metrics(run / "metrics.jsonl", "train")
  assert after[:len(train_records)] == train_records
  assert [r["step"] for r in after] == [2, 4, 6, 8]


def test_no_intact_checkpoint_stops_until_a_backup_is_put_back(tmp_path):
  run, backup = tmp_path / "run", tmp_path / "backup"
  _train(run, train_steps=2, keep_checkpoints=1)
  backup.mkdir()
  for path in run.glob("ckpt-2.*"):
    shutil.copy(path, backup / path.name)
  _train(run, train_steps=4, keep_checkpoints=1)  # ckpt-2 rotated out
  assert sorted(p.name for p in run.glob("ckpt-*")) == [
      "ckpt-4.data-00000-of-00001", "ckpt-4.index"]
  _truncate_data(run / "ckpt-4")
  metrics = (run / "metrics.jsonl").read_bytes()

  with pytest.raises(checkpointing.CheckpointError) as error:
    _train(run, train_steps=6, keep_checkpoints=1)
  message = str(error.value)
  assert "has no intact checkpoint left" in message
  assert f"{run / 'ckpt-4'} is damaged" in message
  assert "Read less bytes" in message
  assert str(run / "damaged" / "ckpt-4") in message
  assert "use a fresh --model_dir" in message
  assert (run / "metrics.jsonl").read_bytes() == metrics
  assert (run / "damaged" / "ckpt-4" / "ckpt-4.index").is_file()

  # Started again: still no silent restart; the earlier damage is named.
  with pytest.raises(checkpointing.CheckpointError,
                     match=r"ckpt-4 is gone \(the state file names it.*"
                           r"damaged checkpoints kept from earlier starts"):
    _train(run, train_steps=6, keep_checkpoints=1)
  assert (run / "metrics.jsonl").read_bytes() == metrics

  # As the message says: an intact checkpoint copied back is resumed from.
  for path in backup.iterdir():
    shutil.copy(path, run / path.name)
  assert _train(run, train_steps=6, keep_checkpoints=1).step == 6
  assert _start_records(run)[-1]["resumed_from"] == "ckpt-2"


def test_lost_checkpoints_with_metrics_are_not_silently_restarted(tmp_path):
  run = tmp_path / "run"
  _train(run, train_steps=4)
  for path in run.glob("ckpt-*"):
    path.unlink()
  (run / "checkpoint").unlink()
  metrics = (run / "metrics.jsonl").read_bytes()
  with pytest.raises(checkpointing.CheckpointError,
                     match=r"records training up to step 4.*holds no "
                           r"checkpoint"):
    _train(run, train_steps=6)
  assert (run / "metrics.jsonl").read_bytes() == metrics


def test_run_stopped_before_its_first_checkpoint_starts_over(tmp_path):
  run = tmp_path / "run"

  def crash(step):
    if step == 3:
      raise KeyboardInterrupt  # like Ctrl-C before any checkpoint

  with pytest.raises(KeyboardInterrupt):
    train_lib.train(
        model_fn=lambda: toy_model.ToyTranslator(vocab_size=VOCAB),
        train_dataset=synthetic.pairs_dataset(PAIRS, batch_size=8, length=10,
                                             shuffle_seed=1),
        config=_config(run, train_steps=6, checkpoint_every=5),
        after_step=crash)
  assert not list(run.glob("ckpt-*"))
  assert metrics_log.read_metrics(run / "metrics.jsonl", "train")
  result = _train(run, train_steps=6, checkpoint_every=5)
  assert result.step == 6
  steps = [r["step"] for r in metrics_log.read_metrics(run / "metrics.jsonl")
           if r["kind"] == "train"]
  assert steps == [2, 4, 6]  # the first attempt's records were replaced


def test_stale_temp_dirs_of_killed_saves_are_removed_only_if_ours(tmp_path):
  run = tmp_path / "run"
  _train(run, train_steps=2)
  stale = run / "ckpt-3_temp"
  stale.mkdir()
  (stale / "part-00000-of-00001.index").write_bytes(b"\0half")
  (stale / f"part-00000-of-00001{DATA}").write_bytes(b"\0half")
  state_tmp = run / ("checkpoint.tmp" + "0123456789abcdef" * 2)
  state_tmp.write_text("model_checkpoint_path: ")
  foreign = run / "ckpt-5_temp"
  foreign.mkdir()
  (foreign / "notes.txt").write_text("mine")
  lookalike = run / "ckpt-x_temp"
  lookalike.mkdir()

  result = _train(run, train_steps=4)

  assert result.step == 4
  assert _start_records(run)[-1]["resumed_from"].endswith("ckpt-2")
  assert not stale.exists() and not state_tmp.exists()
  assert (foreign / "notes.txt").read_text() == "mine"
  assert lookalike.is_dir()


def test_second_writer_is_refused_naming_the_owner(tmp_path):
  run = tmp_path / "run"
  run.mkdir()
  with run_lock.RunLock(run):
    with pytest.raises(run_lock.RunLockedError,
                       match=rf"in use by pid {os.getpid()} on "):
      _train(run, train_steps=2)
  assert not list(run.glob("ckpt-*"))  # the refused run wrote nothing
  assert _train(run, train_steps=2).step == 2  # released on exit


CHILD = r'''
import sys
from m4moe.training import optimizer as optimizer_lib
from m4moe.training import loop as train_lib
from m4moe.training import synthetic
import toy_model

pairs = synthetic.synthetic_pairs(num_pairs=256, vocab_size=24, max_length=9)
config = train_lib.TrainConfig(
    model_dir=sys.argv[1], train_steps=100000, seed=3, log_every=2,
    checkpoint_every=1, keep_checkpoints=2,
    optimizer=optimizer_lib.AdafactorConfig(warmup_steps=20))
train_lib.train(
    model_fn=lambda: toy_model.ToyTranslator(vocab_size=24),
    train_dataset=synthetic.pairs_dataset(pairs, batch_size=8, length=10,
                                         shuffle_seed=1),
    config=config, after_step=lambda s: print("STEP", s, flush=True))
'''


def test_lock_of_a_kill9ed_trainer_does_not_block_the_next(tmp_path):
  run = tmp_path / "run"
  script = tmp_path / "child.py"
  script.write_text(CHILD)
  # The child imports toy_model from tests/ (on PYTHONPATH: conftest.py).
  proc = subprocess.Popen([sys.executable, str(script), str(run)],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True)
  try:
    for line in proc.stdout:
      if line.strip() == "STEP 3":
        break
    with pytest.raises(run_lock.RunLockedError,
                       match=rf"in use by pid {proc.pid} on .*child\.py"):
      _train(run, train_steps=2)
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
  assert proc.returncode == -signal.SIGKILL
  last = int(tf.train.latest_checkpoint(str(run)).rsplit("-", 1)[1])
  assert last >= 2  # STEP n prints before ckpt-n is saved
  result = _train(run, train_steps=last + 1)
  assert result.step == last + 1
  assert _start_records(run)[-1]["step"] == last


def test_model_dir_that_is_a_file_or_cannot_be_created(tmp_path):
  afile = tmp_path / "afile"
  afile.write_text("not a run")
  with pytest.raises(checkpointing.ModelDirError,
                     match=r"is a file, not a directory"):
    _train(afile)
  assert afile.read_text() == "not a run"
  with pytest.raises(checkpointing.ModelDirError,
                     match=rf"cannot be created: {afile} is a file"):
    _train(afile / "run")
  if os.geteuid() == 0:
    # root may write anywhere by permission bits; sysfs refuses mkdir.
    unwritable = pathlib.Path("/sys/m4moe_test_run/run")
  else:
    parent = tmp_path / "readonly"
    parent.mkdir(mode=0o500)
    unwritable = parent / "run"
  with pytest.raises(checkpointing.ModelDirError,
                     match=r"cannot be created.*choose a directory you can "
                           r"write to"):
    _train(unwritable)


SMALL = ["--config=tiny/dense", "--d_model=32", "--num_heads=2", "--d_kv=16",
         "--d_ff=64", "--num_encoder_layers=1", "--num_decoder_layers=1",
         "--src_vocab_size=64", "--tgt_vocab_size=64", "--synthetic_data",
         "--sequence_length=16", "--batch_tokens=256", "--eval_every=0",
         "--train_steps=2"]


def _cli(*args):
  return subprocess.run(
      [sys.executable, "-c", "from m4moe.cli.train import run; run()",
       *SMALL, *args],
      capture_output=True, text=True, timeout=300, check=False)


def test_cli_errors_are_clean(tmp_path):
  afile = tmp_path / "afile"
  afile.write_text("x")
  proc = _cli(f"--model_dir={afile}")
  assert proc.returncode == 2
  assert f"m4moe-train: --model_dir={afile} is a file" in proc.stderr
  assert "Traceback" not in proc.stderr

  run = tmp_path / "run"
  run.mkdir()
  with run_lock.RunLock(run):
    proc = _cli(f"--model_dir={run}")
  assert proc.returncode == 1
  assert f"m4moe-train: {run} is in use by pid {os.getpid()}" in proc.stderr
  assert "Traceback" not in proc.stderr
  assert not list(run.glob("ckpt-*"))
  lock = json.loads((run / "train.lock").read_text())
  assert lock["pid"] == os.getpid()
