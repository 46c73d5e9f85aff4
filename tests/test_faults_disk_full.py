"""A full disk during a write: one line naming the failed write, where, the
free space, what is intact and the space needed; non-zero exits; the next
run resumes. The full disk is injected (ENOSPC / TF's ResourceExhaustedError
from SaveV2), since no test can rely on mounting a small file system."""

import errno
import json
import subprocess
import sys

import pytest
import tensorflow as tf
import toy_model

from m4moe import cli
from m4moe import errors
from m4moe.data import fixtures
from m4moe.training import checkpointing
from m4moe.training import loop as train_lib
from m4moe.training import optimizer as optimizer_lib
from m4moe.training import synthetic

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


# Runs a tool's run() with one of its writes replaced by a full disk:
# argv[1] is "module:attribute" to break, the rest the tool's argv.
INJECT = r'''
import errno, importlib, sys
target, tool, *argv = sys.argv[1:]
module_name, attribute = target.split(":")
def full(*args, **kwargs):
  raise OSError(errno.ENOSPC, "No space left on device")
setattr(importlib.import_module(module_name), attribute, full)
sys.argv = [tool, *argv]
importlib.import_module(f"m4moe.cli.{tool}").run()
'''


def _inject(tmp_path, target, tool, *argv):
  script = tmp_path / "inject.py"
  script.write_text(INJECT)
  return subprocess.run([sys.executable, str(script), target, tool, *argv],
                        capture_output=True, text=True, timeout=600,
                        check=False)


def _sources(root):
  sentences = fixtures.english_sentences(40, seed=3, max_words=10)
  fixtures.write_catalog(fixtures.make_catalog("fr", sentences),
                         root / "fr" / "LC_MESSAGES" / "demo.po")
  return root


def test_disk_full_corpus_build_keeps_the_previous_corpus(tmp_path):
  out = tmp_path / "corpus"
  args = ["--norecipe", f"--sources={_sources(tmp_path / 'src')}",
          f"--output_dir={out}", "--split_keys=", "--dev_groups=2",
          "--test_groups=2", "--workers=1"]
  first = subprocess.run([sys.executable, "-m", "m4moe.cli.build_corpus",
                          *args], capture_output=True, text=True,
                         timeout=600, check=False)
  assert first.returncode == 0, first.stderr[-2000:]
  before = (out / "train" / "fr.tsv").read_bytes()
  size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
  full = _inject(tmp_path, "m4moe.data.corpus:_write_splits", "build_corpus",
                 *args)
  assert full.returncode == 1
  lines = [l for l in full.stderr.splitlines() if "no space left" in l]
  assert lines == [
      f"m4moe-build-corpus: error: building the corpus failed: no space left "
      f"on device at {tmp_path} ({lines[0].split(' (')[1].split(')')[0]}); "
      f"the previous corpus at {out} (if any) is intact and the build's "
      f"temporary directory is removed; it needs about "
      f"{errors.megabytes(size)}. Free some space (or choose a directory on "
      "another disk) and re-run the same command"]
  assert "Traceback" not in full.stderr
  assert (out / "train" / "fr.tsv").read_bytes() == before
  assert not list(tmp_path.glob(".corpus.tmp-*"))


def test_disk_full_vocab_keeps_the_previous_models(tmp_path):
  corpus_dir = tmp_path / "c"
  (corpus_dir / "train").mkdir(parents=True)
  (corpus_dir / "train" / "fr.tsv").write_text("a b c\tx y z\n")
  out = tmp_path / "vocab"
  out.mkdir()
  (out / "source.model").write_bytes(b"previous")
  full = _inject(tmp_path, "m4moe.data.vocab:train_sentencepiece", "vocab",
                 f"--corpus_dir={corpus_dir}", f"--output_dir={out}")
  assert full.returncode == 1
  assert (f"m4moe-vocab: error: writing the vocabularies failed: no space "
          f"left on device at {out} (") in full.stderr
  assert "the previous models there (if any) are intact" in full.stderr
  assert "Traceback" not in full.stderr
  assert (out / "source.model").read_bytes() == b"previous"
  assert not list(out.glob(".tmp-*"))


def test_exit_on_disk_full_passes_other_errors_through(tmp_path):
  with pytest.raises(SystemExit) as e:
    with cli.exit_on_disk_full(tool="m4moe-x", action="writing y",
                               path=tmp_path, kept="z is intact",
                               needed_bytes=2_500_000):
      raise DISK_FULL
  assert str(e.value).startswith(
      f"m4moe-x: error: writing y failed: no space left on device at "
      f"{tmp_path} (")
  assert "z is intact; it needs about 2.5 MB." in str(e.value)
  with pytest.raises(PermissionError):
    with cli.exit_on_disk_full(tool="m4moe-x", action="writing y",
                               path=tmp_path, kept="z"):
      raise PermissionError(13, "Permission denied")
