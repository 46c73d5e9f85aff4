"""A full disk while ``m4moe-train`` appends to ``metrics.jsonl``: one line
naming the file and the free space, no half record left in the log, and a
resume whose checkpoint and log agree. The full disk is injected (an
``OSError(ENOSPC)`` from the log file's write, after half the record was
written, as a real full disk does)."""

import errno
import json

import numpy as np
import pytest
import tensorflow as tf

from m4moe.training import checkpointing
from m4moe.training import loop as train_lib
from m4moe.training import metrics_log
from m4moe.training import optimizer as optimizer_lib
from m4moe.training import synthetic
import toy_model

VOCAB = 24


def _train(model_dir):
  pairs = synthetic.synthetic_pairs(num_pairs=128, vocab_size=VOCAB,
                                    max_length=9)
  tf.random.set_seed(3)  # the shuffle's seeds: the same in every run
  return train_lib.train(
      model_fn=lambda: toy_model.ToyTranslator(vocab_size=VOCAB),
      train_dataset=synthetic.pairs_dataset(pairs, batch_size=8, length=10,
                                           shuffle_seed=1),
      config=train_lib.TrainConfig(
          model_dir=str(model_dir), train_steps=6, seed=3, log_every=1,
          checkpoint_every=2, keep_checkpoints=3,
          optimizer=optimizer_lib.AdafactorConfig(warmup_steps=20)))


class _FillsUp:
  """The log file; the write of the step-5 train record writes half of it,
  then the disk is full."""

  def __init__(self, file):
    self._file = file
    self.failed = False

  def write(self, data):
    text = data.decode() if isinstance(data, bytes) else data
    if self.failed:  # the rest of the record, or a retry
      raise OSError(errno.ENOSPC, "No space left on device")
    if '"kind": "train"' in text and '"step": 5,' in text:
      self.failed = True
      return self._file.write(data[:len(data) // 2])
    return self._file.write(data)

  def __getattr__(self, name):
    return getattr(self._file, name)


def test_disk_full_while_logging_names_the_file_and_resumes(tmp_path,
                                                            monkeypatch):
  straight = tmp_path / "straight"
  _train(straight)
  run = tmp_path / "run"

  def full_open(path, *args, **kwargs):
    return _FillsUp(open(path, *args, **kwargs))  # pylint: disable=W1514

  monkeypatch.setattr(metrics_log, "open", full_open, raising=False)
  with pytest.raises(checkpointing.CheckpointError) as e:
    _train(run)
  monkeypatch.undo()

  log = run / "metrics.jsonl"
  message = str(e.value)
  assert message.startswith(f"appending to {log} failed: no space left on "
                            f"device at {run} (")
  assert " MB free there)" in message
  assert "resumes from ckpt-4 and cuts the log back to it" in message
  assert "\n" not in message
  # No half record: every line is whole, the last one is step 4's.
  lines = log.read_text().splitlines()
  records = [json.loads(line) for line in lines]
  assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3, 4]

  result = _train(run)  # space freed
  assert result.step == 6
  records = metrics_log.read_metrics(log)
  assert [r["step"] for r in records if r["kind"] == "train"] == list(
      range(1, 7))
  assert records[-1]["kind"] == "end"
  assert [r for r in records if r["kind"] == "start"][-1][
      "resumed_from"].endswith("ckpt-4")
  for name, want in _weights(straight / "ckpt-6").items():
    np.testing.assert_array_equal(want, _weights(run / "ckpt-6")[name],
                                  err_msg=name)


def _weights(prefix):
  reader = tf.train.load_checkpoint(str(prefix))
  return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
          if n.startswith(("model/", "optimizer/"))}
