"""A trainer killed inside a checkpoint save, at each point of the save.

TensorFlow's save of ``ckpt-N`` goes: (1) the sharded writer writes
``ckpt-N_temp/part-*`` (each file as ``*.tempstate<digits>`` first, renamed
when complete); (2) the merge renames the data files to ``ckpt-N.data-*``,
writes ``ckpt-N.index`` in place and deletes ``ckpt-N_temp/``; (3) the
``checkpoint`` state file is rewritten (temp file + rename). A child
trainer is killed inside each step, by a hook on the TF function of that
step: SIGKILL between two steps, or ``RLIMIT_FSIZE`` (the kernel kills the
process with SIGXFSZ when the write crosses the limit) in the middle of a
file being written. No sleeps: the kill point is exact.

Each kill is followed by a resume that must finish, equal an uninterrupted
run bitwise and leave ``metrics.jsonl`` with each step once. The kills in
the first save are the ones that bricked a run (nothing complete was saved
yet); the middle and last saves are in the slow suite.
"""

import json
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from m4moe.training import checkpointing
from m4moe.training import loop as train_lib
from m4moe.training import metrics_log
from m4moe.training import optimizer as optimizer_lib
from m4moe.training import synthetic
import toy_model

VOCAB, STEPS, EVERY = 24, 6, 2
SETTINGS = dict(train_steps=STEPS, seed=3, log_every=1,
                checkpoint_every=EVERY, keep_checkpoints=3)

CHILD = r'''
import os, resource, signal, sys
import tensorflow as tf
tf.config.experimental.enable_op_determinism()
from tensorflow.python.checkpoint import checkpoint_management
from tensorflow.python.ops import gen_io_ops, io_ops
from m4moe.training import loop as train_lib
from m4moe.training import optimizer as optimizer_lib
from m4moe.training import synthetic
import toy_model

model_dir, step, point, settings = sys.argv[1:5]
target = f"ckpt-{step}"


def kill_within_next_write(limit):
  """The next write past ``limit`` bytes of any file kills the process."""
  signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it
  resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))


def names(value):
  value = value.numpy() if hasattr(value, "numpy") else value
  return value.decode() if isinstance(value, bytes) else str(value)


real_save, real_merge = io_ops.save_v2, gen_io_ops.merge_v2_checkpoints
real_state = checkpoint_management.update_checkpoint_state_internal


def save_v2(prefix, *args, **kwargs):
  if point == "part_data" and f"/{target}_temp/" in names(prefix):
    kill_within_next_write(200)
  return real_save(prefix, *args, **kwargs)


def merge(prefixes, destination, *args, **kwargs):
  if names(destination).endswith("/" + target):
    if point == "before_merge":
      os.kill(os.getpid(), signal.SIGKILL)
    if point == "merged_index":
      kill_within_next_write(40)
  return real_merge(prefixes, destination, *args, **kwargs)


def state(save_dir, *args, **kwargs):
  path = kwargs.get("model_checkpoint_path") or args[0]
  if point == "state_file" and path.endswith(target):
    kill_within_next_write(10)
  return real_state(save_dir, *args, **kwargs)


io_ops.save_v2 = save_v2
gen_io_ops.merge_v2_checkpoints = merge
checkpoint_management.update_checkpoint_state_internal = state
pairs = synthetic.synthetic_pairs(num_pairs=128, vocab_size=24, max_length=9)
tf.random.set_seed(3)  # the shuffle's seeds, as in the test process
train_lib.train(
    model_fn=lambda: toy_model.ToyTranslator(vocab_size=24),
    train_dataset=synthetic.pairs_dataset(pairs, batch_size=8, length=10,
                                          shuffle_seed=1),
    config=train_lib.TrainConfig(
        model_dir=model_dir, **eval(settings),
        optimizer=optimizer_lib.AdafactorConfig(warmup_steps=20)))
print("NOT KILLED", flush=True)
'''


def _train(model_dir):
  pairs = synthetic.synthetic_pairs(num_pairs=128, vocab_size=VOCAB,
                                    max_length=9)
  # The dataset's shuffle takes the global seed that is current when it is
  # built: the same in every run, whatever ran before in this process.
  tf.random.set_seed(3)
  return train_lib.train(
      model_fn=lambda: toy_model.ToyTranslator(vocab_size=VOCAB),
      train_dataset=synthetic.pairs_dataset(pairs, batch_size=8, length=10,
                                           shuffle_seed=1),
      config=train_lib.TrainConfig(
          model_dir=str(model_dir), **SETTINGS,
          optimizer=optimizer_lib.AdafactorConfig(warmup_steps=20)))


def _weights(prefix):
  reader = tf.train.load_checkpoint(str(prefix))
  return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
          if n.startswith(("model/", "optimizer/"))}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
  run = tmp_path_factory.mktemp("straight")
  assert _train(run).step == STEPS
  return _weights(run / f"ckpt-{STEPS}")


def _kill_in_save(tmp_path, run, *, step, point):
  script = tmp_path / "child.py"
  script.write_text(CHILD)
  proc = subprocess.run(
      [sys.executable, str(script), str(run), str(step), point,
       repr(SETTINGS)], capture_output=True, text=True, timeout=300,
      check=False)
  assert proc.returncode in (-signal.SIGKILL, -signal.SIGXFSZ), (
      proc.returncode, proc.stdout, proc.stderr[-3000:])


def _leftovers(run, step):
  """What the killed save left, by name (the scenario really happened)."""
  temp = run / f"ckpt-{step}_temp"
  return {
      "part_data": any(".tempstate" in p.name for p in temp.glob("part-*")),
      "before_merge": (temp / "part-00000-of-00001.index").is_file() and
                      not (run / f"ckpt-{step}.index").exists(),
      "merged_index": temp.is_dir() and checkpointing.verify_checkpoint(
          str(run / f"ckpt-{step}")) is not None,
      "state_file": any(run.glob("checkpoint.tmp*")) and
                    (run / f"ckpt-{step}.index").is_file(),
  }


POINTS = ("part_data", "before_merge", "merged_index", "state_file")


def _check_kill_and_resume(tmp_path, straight, caplog, *, step, point):
  run = tmp_path / "run"
  _kill_in_save(tmp_path, run, step=step, point=point)
  found = _leftovers(run, step)
  assert found[point], found
  logged = [r["step"] for r in metrics_log.read_metrics(
      run / "metrics.jsonl", "train")]
  assert logged == list(range(1, step + 1))  # step N is logged, then saved

  caplog.set_level("WARNING")
  result = _train(run)

  assert result.step == STEPS and result.stopped_by == "train_steps"
  got = _weights(run / f"ckpt-{STEPS}")
  assert got.keys() == straight.keys()
  for name in straight:
    np.testing.assert_array_equal(straight[name], got[name], err_msg=name)
  records = metrics_log.read_metrics(run / "metrics.jsonl")
  steps = [r["step"] for r in records if r["kind"] == "train"]
  assert steps == list(range(1, STEPS + 1))  # each step once, none twice
  assert [r["kind"] for r in records].count("end") == 1
  # Only what the killed save created is gone; the run's files are whole.
  assert not list(run.glob("*_temp")) and not list(run.glob("*.tmp*"))
  assert not (run / "damaged").exists()
  for kept in tf.train.get_checkpoint_state(
      str(run)).all_model_checkpoint_paths:
    assert checkpointing.verify_checkpoint(kept) is None
  return records, [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("point", POINTS)
def test_kill_in_the_first_save_starts_over_cleanly(tmp_path, straight,
                                                    caplog, point):
  records, messages = _check_kill_and_resume(tmp_path, straight, caplog,
                                             step=EVERY, point=point)
  start = [r for r in records if r["kind"] == "start"][-1]
  if point == "state_file":
    # The checkpoint was complete, only its commit was cut: resumed from it.
    assert start["resumed_from"].endswith(f"ckpt-{EVERY}")
    return
  assert start["resumed_from"] is None and start["step"] == 0
  [line] = [m for m in messages if m.startswith("No complete checkpoint")]
  assert f"the save of ckpt-{EVERY} was killed before it finished" in line
  assert f"ckpt-{EVERY}_temp" in line and "starting from step 0" in line
  assert f"back to step 0 (dropped {EVERY} record(s) of steps 1-{EVERY}" \
      in line
  assert "\n" not in line
  assert start["metrics_cut"]["records"] == EVERY
  assert any(p.endswith(f"ckpt-{EVERY}_temp")
             for p in start["removed_leftovers"])


@pytest.mark.slow
@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("step", [2 * EVERY, STEPS], ids=["middle", "last"])
def test_kill_in_a_later_save_resumes_from_the_previous(
    tmp_path, straight, caplog, step, point):
  records, messages = _check_kill_and_resume(tmp_path, straight, caplog,
                                             step=step, point=point)
  start = [r for r in records if r["kind"] == "start"][-1]
  # The state file still names the previous checkpoint (a complete but
  # uncommitted ckpt-N is newer than it and is saved again).
  resumed = step - EVERY
  assert start["resumed_from"].endswith(f"ckpt-{resumed}")
  [line] = [m for m in messages if m.startswith("Resuming from")]
  assert f"back to step {resumed} (dropped {EVERY} record(s)" in line


def test_a_lost_run_with_a_stale_temp_dir_is_still_refused(tmp_path):
  """The guard stays: progress past the first save whose checkpoints are
  gone is not restarted, even beside a killed later save's leftovers."""
  run = tmp_path / "run"
  run.mkdir()
  lines = [{"kind": "start", "step": 0}] + [
      {"kind": "train", "step": s} for s in range(1, 7)]
  (run / "metrics.jsonl").write_text(
      "".join(json.dumps(r) + "\n" for r in lines))
  (run / "ckpt-6_temp").mkdir()
  (run / "ckpt-6_temp" / "part-00000-of-00001.index").write_bytes(b"\0")
  before = (run / "metrics.jsonl").read_bytes()
  with pytest.raises(checkpointing.CheckpointError,
                     match="records training up to step 6"):
    _train(run)
  assert (run / "metrics.jsonl").read_bytes() == before
