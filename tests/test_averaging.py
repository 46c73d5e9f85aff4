"""Checkpoint averaging (m4moe.training.averaging, m4moe-average): the mean
of known weights, the run's checkpoints untouched, --checkpoint=averaged,
and every bad request refused with the kept steps named."""

import hashlib
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from m4moe import config as config_lib
from m4moe.model import transformer as model_lib
from m4moe.training import rundir
from m4moe.training import averaging
from m4moe.training import checkpointing

SMALL = ["--d_model=16", "--num_heads=2", "--d_kv=8", "--d_ff=32",
         "--num_encoder_layers=1", "--num_decoder_layers=1",
         "--num_experts=4", "--expert_hidden_dim=8", "--group_size=8"]


def _config() -> config_lib.ModelConfig:
  return config_lib.load_model_config("tiny/moe", SMALL, src_vocab_size=40,
                                      tgt_vocab_size=30)


def _run(tmp_path: pathlib.Path, steps=(100, 200, 300, 400)) -> pathlib.Path:
  """A run directory whose checkpoint of step s holds weights w0 + s/100,
  where w0 is the initialisation."""
  tf.random.set_seed(0)
  model_dir = tmp_path / "run"
  config = _config()
  checkpointing.write_run_config(model_dir, model_config=config, sections={})
  model = model_lib.Transformer(config=config)
  initial = [v.numpy() for v in model.variables]
  keeper = checkpointing.CheckpointKeeper(str(model_dir), max_to_keep=5,
                                          model=model)
  for step in steps:
    for v, w0 in zip(model.variables, initial):
      v.assign(w0 + step / 100)
    keeper.save(step)
  return model_dir


def _restored(prefix: str) -> list[np.ndarray]:
  model = model_lib.Transformer(config=_config())
  status = tf.train.Checkpoint(model=model).read(prefix)
  status.expect_partial().assert_existing_objects_matched()
  return [v.numpy() for v in model.variables]


def _digests(model_dir: pathlib.Path) -> dict[str, str]:
  return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
          for p in model_dir.iterdir() if p.is_file()}


def test_mean_of_the_last_k_and_the_run_left_untouched(tmp_path):
  model_dir = _run(tmp_path)
  before = _digests(model_dir)
  step_100 = _restored(str(model_dir / "ckpt-100"))
  result = averaging.average_checkpoints(model_dir=model_dir, last=3)
  assert result.steps == (200, 300, 400)
  assert result.path == str(model_dir / "averaged" / "ckpt-400")
  # (2 + 3 + 4) / 3 = 3 above the initialisation, i.e. 2 above ckpt-100.
  for got, ref in zip(_restored(result.path), step_100):
    np.testing.assert_allclose(got, ref + 2.0, rtol=0, atol=1e-5)
  assert averaging.read_record(model_dir) == {
      "steps": [200, 300, 400], "checkpoint": "ckpt-400"}
  assert _digests(model_dir) == before  # only averaged/ was added
  assert rundir.resolve_checkpoint(model_dir, "averaged") == result.path
  # Again with other steps: replaces the earlier average, leaves nothing.
  result = averaging.average_checkpoints(model_dir=model_dir,
                                         steps=[100, 400])
  for got, ref in zip(_restored(result.path), step_100):
    np.testing.assert_allclose(got, ref + 1.5, rtol=0, atol=1e-5)
  assert averaging.read_record(model_dir)["steps"] == [100, 400]
  assert sorted(p.name for p in model_dir.iterdir() if p.is_dir()) == [
      "averaged"]
  assert rundir.checkpoint_steps(model_dir / "averaged") == [400]


def test_a_killed_average_leaves_the_previous_one_usable(tmp_path):
  model_dir = _run(tmp_path)
  averaging.average_checkpoints(model_dir=model_dir, last=2)
  # Killed between the two renames: the old average is aside, the new one
  # is still partial.
  (model_dir / "averaged").rename(model_dir / ".averaged.old")
  (model_dir / ".averaged.partial").mkdir()
  (model_dir / ".averaged.partial" / "junk").write_text("half-written")
  result = averaging.average_checkpoints(model_dir=model_dir, last=3)
  assert result.steps == (200, 300, 400)
  assert not (model_dir / ".averaged.old").exists()
  assert not (model_dir / ".averaged.partial").exists()
  assert averaging.read_record(model_dir)["steps"] == [200, 300, 400]


@pytest.mark.parametrize("kwargs,message", [
    (dict(last=5), r"cannot average the last 5 checkpoints, it keeps "
     r"ckpt-100, ckpt-200, ckpt-300, ckpt-400; pass --last=4 or fewer"),
    (dict(last=1), r"at least 2 checkpoints, got 1"),
    (dict(steps=[200, 250, 999]), r"no checkpoint of step\(s\) 250, 999 "
     r"\(it keeps ckpt-100"),
])
def test_bad_requests_name_the_kept_checkpoints(tmp_path, kwargs, message):
  model_dir = _run(tmp_path)
  with pytest.raises(averaging.AveragingError, match=message):
    averaging.average_checkpoints(model_dir=model_dir, **kwargs)
  assert not (model_dir / "averaged").exists()


def test_not_a_run_or_too_few_checkpoints(tmp_path):
  with pytest.raises(rundir.RunDirError, match="config.json not found"):
    averaging.average_checkpoints(model_dir=tmp_path / "nope")
  model_dir = _run(tmp_path, steps=(100,))
  with pytest.raises(averaging.AveragingError,
                     match=r"it keeps ckpt-100, and averaging needs at least 2; "
                     "train with --keep_checkpoints=2 or more"):
    averaging.average_checkpoints(model_dir=model_dir, last=5)


def test_a_checkpoint_of_another_model_is_refused(tmp_path):
  model_dir = _run(tmp_path)
  other = config_lib.load_model_config(
      "tiny/moe", [*SMALL, "--d_ff=64"], src_vocab_size=40, tgt_vocab_size=30)
  keeper = checkpointing.CheckpointKeeper(
      str(model_dir), max_to_keep=5, model=model_lib.Transformer(config=other))
  keeper.save(500)
  with pytest.raises(averaging.AveragingError,
                     match=r"ckpt-500: cannot read the model .* leave it out "
                     "with --steps"):
    averaging.average_checkpoints(model_dir=model_dir, last=2)


def test_checkpoint_averaged_without_an_average_says_what_to_run(tmp_path):
  model_dir = _run(tmp_path)
  with pytest.raises(rundir.RunDirError,
                     match=r"no averaged checkpoint .* run m4moe-average "
                     rf"--model_dir={model_dir} first"):
    rundir.resolve_checkpoint(model_dir, "averaged")


def test_cli(tmp_path):
  model_dir = _run(tmp_path)
  cmd = [sys.executable, "-m", "m4moe.cli.average",
         f"--model_dir={model_dir}"]
  proc = subprocess.run([*cmd, "--last=2"], capture_output=True, text=True,
                        check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.strip() == (
      f"{model_dir}/averaged/ckpt-400: mean of 2 checkpoints (steps 300, "
      "400)")
  proc = subprocess.run([*cmd, "--steps=100,x"], capture_output=True,
                        text=True, check=False)
  assert proc.returncode == 1
  assert "--steps=100,x: give integer checkpoint steps" in proc.stderr
  proc = subprocess.run([*cmd, "--last=9"], capture_output=True, text=True,
                        check=False)
  assert proc.returncode == 1
  assert "m4moe-average: error: " in proc.stderr
  assert "pass --last=4 or fewer" in proc.stderr
