"""A full disk during a write: one line naming the failed write, where, the
free space, what is intact and the space needed; non-zero exits; the next
run resumes. The full disk is injected (ENOSPC / TF's ResourceExhaustedError
from SaveV2), since no test can rely on mounting a small file system."""

import errno
import json

import pytest
import tensorflow as tf

from m4moe import errors
from m4moe import optimizer as optimizer_lib
from m4moe import train as train_lib
from m4moe.training import checkpointing
from m4moe.training import synthetic
from m4moe.training import toy_model

VOCAB = 24
PAIRS = synthetic.synthetic_pairs(num_pairs=128, vocab_size=VOCAB, max_length=9)
# What SaveV2 raises on a full disk (the message is the OS's).
DISK_FULL = tf.errors.ResourceExhaustedError(
    None, None, "ckpt-4_temp/part-00000-of-00001.data-00000-of-00001.tempstate"
    "123; No space left on device [Op:SaveV2]")


def _train(model_dir):
  return train_lib.train(
      model_fn=lambda: toy_model.ToyTranslator(vocab_size=VOCAB),
      train_dataset=synthetic.pairs_dataset(PAIRS, batch_size=8, length=10,
                                           shuffle_seed=1),
      config=train_lib.TrainConfig(
          model_dir=str(model_dir), train_steps=6, seed=3, log_every=2,
          checkpoint_every=2, keep_checkpoints=3,
          optimizer=optimizer_lib.AdafactorConfig(warmup_steps=20)))


def test_disk_full_checkpoint_names_it_keeps_the_last_and_resumes(
    tmp_path, monkeypatch):
  real_save = tf.train.CheckpointManager.save

  def save(self, checkpoint_number=None, **kwargs):
    if checkpoint_number == 4:
      raise DISK_FULL
    return real_save(self, checkpoint_number=checkpoint_number, **kwargs)

  monkeypatch.setattr(tf.train.CheckpointManager, "save", save)
  with pytest.raises(checkpointing.CheckpointSaveError) as e:
    _train(tmp_path)
  message = str(e.value)
  ckpt2 = sum(p.stat().st_size for p in tmp_path.glob("ckpt-2.*"))
  assert message.startswith(
      f"saving checkpoint ckpt-4 failed: no space left on device at "
      f"{tmp_path} (")
  assert "the previous checkpoint ckpt-2 is intact and the next start " \
         "resumes from it" in message
  assert f"it needs about {errors.megabytes(ckpt2)}" in message
  assert "\n" not in message
  # A CheckpointError: m4moe-train prints it and exits 1.
  assert isinstance(e.value, checkpointing.CheckpointError)
  assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-2")
  monkeypatch.undo()  # space freed: the next start resumes from ckpt-2
  result = _train(tmp_path)
  assert result.step == 6 and not result.preempted
  starts = [json.loads(line) for line in
            (tmp_path / "metrics.jsonl").read_text().splitlines()]
  starts = [r for r in starts if r["kind"] == "start"]
  assert starts[-1]["resumed_from"].endswith("ckpt-2")
  assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-6")


def test_without_an_earlier_checkpoint_the_size_is_the_variables(tmp_path):
  v = tf.Variable(tf.zeros([10, 20], tf.float32))
  step = tf.Variable(0, dtype=tf.int64)
  keeper = checkpointing.CheckpointKeeper(str(tmp_path), max_to_keep=1, v=v,
                                          step=step)
  assert keeper.checkpoint_bytes() == 10 * 20 * 4 + 8
  keeper.manager.save = lambda **kwargs: (_ for _ in ()).throw(
      OSError(errno.ENOSPC, "No space left on device"))
  with pytest.raises(checkpointing.CheckpointSaveError,
                     match="no earlier checkpoint exists, so the next start "
                     "begins at step 0; it needs about 0.0 MB"):
    keeper.save(1)


def test_other_save_errors_are_not_called_a_full_disk(tmp_path):
  keeper = checkpointing.CheckpointKeeper(
      str(tmp_path), max_to_keep=1, v=tf.Variable(1.0))
  keeper.manager.save = lambda **kwargs: (_ for _ in ()).throw(
      tf.errors.PermissionDeniedError(None, None, "Permission denied"))
  with pytest.raises(tf.errors.PermissionDeniedError):
    keeper.save(1)


@pytest.mark.parametrize("error,full", [
    (OSError(errno.ENOSPC, "No space left on device"), True),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
    (DISK_FULL, True),
    (OSError(errno.EACCES, "Permission denied"), False),
    (RuntimeError("out of memory"), False),
])
def test_is_disk_full(error, full):
  assert errors.is_disk_full(error) == full
