"""Continuing a finished run in a new directory (m4moe-train --continue_from)
and the recipes' continued models (m4moe.pipeline.plan ModelRun.continue_from)."""

import dataclasses
import hashlib
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from m4moe.pipeline import plan as main_job
from m4moe.pipeline import recipes as recipes_lib
from m4moe.training import optimizer as optimizer_lib
from m4moe.training import loop as train_lib
from m4moe.training import continuation
from m4moe.training import rundir
from m4moe.training import metrics_log
from m4moe.training import synthetic
import toy_model

VOCAB = 24
PAIRS = synthetic.synthetic_pairs(num_pairs=512, vocab_size=VOCAB, max_length=9)


def _train(model_dir, steps):
  tf.random.set_seed(0)  # the shuffle order must not depend on earlier runs
  config = train_lib.TrainConfig(
      model_dir=str(model_dir), train_steps=steps, seed=3, log_every=2,
      checkpoint_every=4, keep_checkpoints=2,
      optimizer=optimizer_lib.AdafactorConfig(warmup_steps=20))
  return train_lib.train(
      model_fn=lambda: toy_model.ToyTranslator(vocab_size=VOCAB + 1,
                                               poison_token=VOCAB),
      train_dataset=synthetic.pairs_dataset(PAIRS, batch_size=8, length=10,
                                            shuffle_seed=1),
      config=config)


def _variables(model_dir, step):
  reader = tf.train.load_checkpoint(f"{model_dir}/ckpt-{step}")
  return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
          if n.startswith(("model/", "optimizer/"))}


def _digest(directory: pathlib.Path) -> dict[str, str]:
  return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes())
          .hexdigest() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_continued_copy_equals_a_straight_run_and_leaves_the_source(
    tmp_path):
  _train(tmp_path / "straight", 8)
  _train(tmp_path / "short", 4)
  (tmp_path / "short" / "train.lock").write_text("stale\n")
  before = _digest(tmp_path / "short")
  assert continuation.copy_run(source=tmp_path / "short",
                               model_dir=tmp_path / "long") == 4
  assert not (tmp_path / "long" / "train.lock").exists()
  result = _train(tmp_path / "long", 8)
  assert result.step == 8
  a, b = _variables(tmp_path / "straight", 8), _variables(tmp_path / "long", 8)
  assert a.keys() == b.keys() and len(a) > 10
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)
  # The copy's log continues the source's: every step once.
  steps = [r["step"] for r in metrics_log.read_metrics(
      tmp_path / "long" / "metrics.jsonl", "train")]
  assert steps == [2, 4, 6, 8]
  assert _digest(tmp_path / "short") == before  # untouched
  assert rundir.checkpoint_steps(tmp_path / "short") == [4]
  # Once the new run has checkpoints, a re-run resumes its own.
  assert continuation.copy_run(source=tmp_path / "short",
                               model_dir=tmp_path / "long") is None
  assert rundir.checkpoint_steps(tmp_path / "long")[-1] == 8


def _fake_run(directory: pathlib.Path, steps=(4,)) -> pathlib.Path:
  directory.mkdir(parents=True)
  (directory / rundir.CONFIG_FILENAME).write_text("{}\n")
  for step in steps:
    (directory / f"ckpt-{step}.index").write_bytes(b"i")
    (directory / f"ckpt-{step}.data-00000-of-00001").write_bytes(b"d")
  return directory


def test_check_names_what_is_wrong_and_changes_nothing(tmp_path):
  source = _fake_run(tmp_path / "done", steps=(4, 8))
  assert continuation.check(source=source, model_dir=tmp_path / "new") == 8
  assert not (tmp_path / "new").exists()
  with pytest.raises(continuation.ContinuationError,
                     match="holds no ckpt-<step>"):
    continuation.check(source=tmp_path / "missing", model_dir=tmp_path / "n")
  with pytest.raises(continuation.ContinuationError, match="--model_dir itself"):
    continuation.check(source=tmp_path / "empty_dir",
                       model_dir=tmp_path / "empty_dir")
  busy = tmp_path / "busy"
  busy.mkdir()
  (busy / "notes.txt").write_text("mine\n")
  with pytest.raises(continuation.ContinuationError,
                     match=r"holds files but no checkpoint \(notes.txt\)"):
    continuation.copy_run(source=source, model_dir=busy)
  assert (busy / "notes.txt").read_text() == "mine\n"  # not deleted
  # An existing run directory is never copied over, whatever the source.
  own = _fake_run(tmp_path / "own", steps=(2,))
  assert continuation.check(source=tmp_path / "missing", model_dir=own) is None


def test_an_interrupted_copy_is_redone_from_scratch(tmp_path):
  source = _fake_run(tmp_path / "done", steps=(4,))
  target = tmp_path / "runs" / "long"
  partial = tmp_path / "runs" / ".long.continue.partial"
  partial.mkdir(parents=True)
  (partial / "ckpt-4.index").write_bytes(b"half")  # killed mid-copy
  (tmp_path / "runs" / "long").mkdir()  # an empty directory is fine
  assert continuation.copy_run(source=source, model_dir=target) == 4
  assert not partial.exists()
  assert (target / "ckpt-4.index").read_bytes() == b"i"
  assert sorted(p.name for p in target.iterdir()) == sorted(
      p.name for p in source.iterdir())


def _recipe(**extended):
  base = recipes_lib.ModelRun(name="dense", config="tiny/dense", train_steps=100,
                           seeds=(1, 2), lane=0, eval_every=10)
  longer = dataclasses.replace(base, name="dense_long", train_steps=200,
                               continue_from="dense")
  longer = dataclasses.replace(longer, **extended)
  return recipes_lib.Recipe(
      name="r", description="", languages=("de", "fr"),
      use_packaged_corpus_recipe=False, source_vocab_size=300,
      target_vocab_size=300, models=(base, longer),
      baseline=dataclasses.replace(base, name="bilingual", seeds=(),
                                   lane=1),
      batch_tokens=64, sequence_length=8, eval_max_sentences=1, beam_size=1)


def test_a_recipe_continues_each_seed_after_the_baselines(tmp_path):
  stages = main_job.plan(_recipe(), run_dir=tmp_path, cache_dir=tmp_path)
  names = [s.name for s in stages]
  trains = [n for n in names if n.startswith("train_")]
  assert trains == ["train_dense_s1", "train_dense_s2", "train_bilingual_de",
                    "train_bilingual_fr", "train_dense_long_s1",
                    "train_dense_long_s2"]
  for seed in (1, 2):
    flags = stages[names.index(f"train_dense_long_s{seed}")].flag_values()
    assert flags["continue_from"] == str(tmp_path / "models" / f"dense_s{seed}")
    assert flags["model_dir"] == str(tmp_path / "models" / f"dense_long_s{seed}")
    assert flags["seed"] == str(seed) and flags["train_steps"] == "200"
  assert "continue_from" not in stages[names.index("train_dense_s1")].args
  # Both budgets are reported.
  report = stages[names.index("report")].flag_values()["models"].split(",")
  assert [pathlib.Path(p).stem for p in report] == [
      "dense_s1", "dense_s2", "dense_long_s1", "dense_long_s2"]


@pytest.mark.parametrize("change, message", [
    (dict(continue_from="nope"), "not an earlier model"),
    (dict(seeds=(1, 3)), "its seeds differs"),
    (dict(lane=1), "its lane differs"),
    (dict(extra_flags=("--d_model=64",)), "its extra_flags differs"),
    (dict(train_steps=100), "give it a larger budget"),
])
def test_a_recipe_refuses_a_continuation_that_is_not_one(change, message):
  with pytest.raises(ValueError, match=message):
    _recipe(**change)
