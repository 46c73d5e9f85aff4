"""SIGTERM (preemption) with a real process: save at the current step, exit 0,
and a restart resumes from there."""

import signal
import subprocess
import sys

import pytest
import tensorflow as tf

CHILD = r'''
import sys
from m4moe.training import optimizer as optimizer_lib
from m4moe.training import loop as train_lib
from m4moe.training import synthetic
import toy_model

pairs = synthetic.synthetic_pairs(num_pairs=512, vocab_size=24, max_length=9)
config = train_lib.TrainConfig(
    model_dir=sys.argv[1], train_steps=int(sys.argv[2]), seed=3, log_every=2,
    checkpoint_every=1000, optimizer=optimizer_lib.AdafactorConfig())
result = train_lib.train(
    model_fn=lambda: toy_model.ToyTranslator(vocab_size=24),
    train_dataset=synthetic.pairs_dataset(pairs, batch_size=8, length=10),
    config=config, after_step=lambda s: print("STEP", s, flush=True))
print("DONE", result.step, result.preempted, flush=True)
'''


def _child(tmp_path, model_dir, steps):
  script = tmp_path / "child.py"
  script.write_text(CHILD)
  return subprocess.Popen([sys.executable, str(script), str(model_dir),
                           str(steps)], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)


# SIGTERM in the fast suite; Ctrl-C and SIGHUP take the same path (the
# other two are in `pytest -m slow`).
@pytest.mark.parametrize("sig", [
    signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow),
    pytest.param(signal.SIGHUP, marks=pytest.mark.slow)])
def test_sigterm_saves_and_exits_cleanly(tmp_path, sig):
  run = tmp_path / "run"
  proc = _child(tmp_path, run, 100000)
  for line in proc.stdout:
    if line.strip() == "STEP 4":
      proc.send_signal(sig)
      break
  rest = proc.communicate(timeout=60)[0]
  assert proc.returncode == 0
  done = [l.split() for l in rest.splitlines() if l.startswith("DONE")]
  assert done and done[0][2] == "True"  # preempted
  last = int(done[0][1])
  assert 4 <= last < 100
  assert tf.train.latest_checkpoint(str(run)).endswith(f"ckpt-{last}")
  records = [l for l in (run / "metrics.jsonl").read_text().splitlines()]
  assert '"reason": "preempted"' in records[-1]
  assert f'"step": {last}' in records[-1]
  # A restart resumes from that checkpoint and finishes.
  proc = _child(tmp_path, run, last + 2)
  out = proc.communicate(timeout=120)[0]
  assert f"DONE {last + 2} False" in out
  assert out.split()[:2] == ["STEP", str(last + 1)]


def test_a_second_ctrl_c_stops_at_once():
  import os  # pylint: disable=g-import-not-at-top
  from m4moe.training import checkpointing  # pylint: disable=g-import-not-at-top
  # Python's own handler, as in a terminal (a shell starts background jobs
  # with SIGINT ignored, and pytest may have been started as one).
  outer = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    with checkpointing.PreemptionGuard() as guard:
      os.kill(os.getpid(), signal.SIGINT)
      assert guard.requested
      with pytest.raises(KeyboardInterrupt, match="second Ctrl-C"):
        os.kill(os.getpid(), signal.SIGINT)
    # The previous handler is back: Python's, which raises KeyboardInterrupt.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
  finally:
    signal.signal(signal.SIGINT, outer)
