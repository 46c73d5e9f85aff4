"""Sparse -> dense distillation: the mixed loss against a hand computation,
the student's init from the teacher's non-expert weights, a read-only
teacher, exact resume, and the errors of m4moe-distill (named flags)."""

import dataclasses
import hashlib
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from m4moe import config as config_lib
from m4moe.training import distill
from m4moe.model import losses
from m4moe.model import transformer as model_lib
from m4moe.training import optimizer as optimizer_lib
from m4moe.training import rundir
from m4moe.training import loop as train_lib
from m4moe.moe import upcycle
from m4moe.training import checkpointing
from m4moe.training import synthetic

VOCAB = 24


def _configs(**student_overrides):
  teacher = config_lib.ModelConfig(
      src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=16, num_heads=2,
      d_kv=8, d_ff=24, num_encoder_layers=2, num_decoder_layers=2,
      dropout_rate=0.0, attention_dropout_rate=0.0, max_length=32,
      moe=config_lib.MoeConfig(num_experts=4, expert_hidden_dim=12,
                               router="top2", group_size=16,
                               eval_capacity_factor=0.0))
  student = dataclasses.replace(teacher, moe=config_lib.MoeConfig(),
                                **student_overrides)
  return teacher, student


def _teacher_run(tmp_path, config, *, sections=None):
  tf.random.set_seed(1)
  teacher = model_lib.Transformer(config=config)
  # Trained-looking values: no variable (layer norms!) at its init value.
  rng = np.random.default_rng(4)
  for variable in teacher.trainable_variables:
    variable.assign_add(0.1 * rng.normal(size=variable.shape))
  run = tmp_path / "teacher"
  tf.train.CheckpointManager(tf.train.Checkpoint(model=teacher), str(run),
                             max_to_keep=1).save(checkpoint_number=5)
  checkpointing.write_run_config(run, model_config=config,
                                 sections=sections or {})
  return teacher, run


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_mixed_loss_equals_hand_computed_mix():
  rng = np.random.default_rng(0)
  student = rng.normal(size=(2, 3, 5)).astype(np.float32)
  teacher = rng.normal(size=(2, 3, 5)).astype(np.float32) * 3
  targets = np.array([[2, 4, 1], [3, 1, 0]], np.int32)
  weights = (targets != 0).astype(np.float32)
  w, eps = 0.25, 0.1
  log_p = _log_softmax(student.astype(np.float64))
  q_teacher = np.exp(_log_softmax(teacher.astype(np.float64)))
  # The target distribution: w * teacher + (1 - w) * smoothed one-hot.
  one_hot = np.eye(5)[targets]
  q = w * q_teacher + (1 - w) * ((1 - eps) * one_hot + eps / 5)
  want = float(np.sum(-np.sum(q * log_p, -1) * weights))
  got = distill.mixed_token_loss(
      logits=tf.constant(student), teacher_logits=tf.constant(teacher),
      targets=tf.constant(targets), weights=tf.constant(weights),
      teacher_weight=w, label_smoothing=eps)
  np.testing.assert_allclose(float(got), want, rtol=1e-5)
  # w = 0 is the trainer's usual label-smoothed loss; w = 1 the teacher's.
  plain, _ = losses.token_cross_entropy(tf.constant(student),
                                        tf.constant(targets),
                                        label_smoothing=eps)
  zero = distill.mixed_token_loss(
      logits=tf.constant(student), teacher_logits=tf.constant(teacher),
      targets=tf.constant(targets), weights=tf.constant(weights),
      teacher_weight=0.0, label_smoothing=eps)
  np.testing.assert_allclose(float(zero), float(plain), rtol=1e-6)
  soft = float(np.sum(-np.sum(q_teacher * log_p, -1) * weights))
  one = distill.mixed_token_loss(
      logits=tf.constant(student), teacher_logits=tf.constant(teacher),
      targets=tf.constant(targets), weights=tf.constant(weights),
      teacher_weight=1.0, label_smoothing=eps)
  np.testing.assert_allclose(float(one), soft, rtol=1e-5)


def test_no_gradient_reaches_the_teacher_logits():
  student = tf.Variable(tf.random.normal([1, 2, 4], seed=1))
  teacher = tf.Variable(tf.random.normal([1, 2, 4], seed=2))
  with tf.GradientTape() as tape:
    loss = distill.mixed_token_loss(
        logits=student, teacher_logits=teacher,
        targets=tf.constant([[1, 2]]), weights=tf.ones([1, 2]),
        teacher_weight=0.5, label_smoothing=0.0)
  grad_student, grad_teacher = tape.gradient(loss, [student, teacher])
  assert grad_teacher is None
  assert np.abs(grad_student.numpy()).sum() > 0


def test_init_copies_the_non_expert_weights_and_leaves_the_moe_ffns_fresh(
    tmp_path):
  teacher_config, student_config = _configs()
  teacher, run = _teacher_run(tmp_path, teacher_config)
  tf.random.set_seed(2)
  student = model_lib.Transformer(config=student_config)
  paths = upcycle.variable_paths(student)
  before = {p: v.numpy() for p, v in paths.items()}
  report = distill.init_student(
      student=student, checkpoint=distill.teacher_checkpoint(run))
  assert report.checkpoint.endswith("ckpt-5")
  # Layer 1 of each stack is MoE in the teacher: its FFN stays fresh.
  assert sorted(report.fresh) == [f"{s}_layers/1/ffn/{w}"
                                  for s in ("decoder", "encoder")
                                  for w in ("wi", "wo")]
  assert sorted(report.unused) == sorted(
      f"{s}_layers/1/ffn/{w}" for s in ("decoder", "encoder")
      for w in ("experts/wi", "experts/wo", "router/wg"))
  assert set(report.copied) | set(report.fresh) == set(paths)
  teacher_paths = upcycle.variable_paths(teacher)
  for path in report.copied:
    np.testing.assert_array_equal(paths[path].numpy(),
                                  teacher_paths[path].numpy(), err_msg=path)
    assert not np.array_equal(before[path], teacher_paths[path].numpy())
  for path in report.fresh:
    np.testing.assert_array_equal(paths[path].numpy(), before[path])
  for name in ("source_embedding/embeddings", "output_projection/kernel",
               "encoder_layers/0/ffn/wi", "decoder_layers/1/ffn_norm/scale",
               "decoder_layers/1/cross_attention/wq"):
    assert name in report.copied


def test_plan_lists_every_unmatched_variable():
  student = {"encoder_layers/0/ffn/wi": (4, 8), "encoder_layers/2/ffn/wi":
             (4, 8), "embed": (10, 4)}
  teacher = {"encoder_layers/0/ffn/wi": (4, 6), "embed": (10, 4),
             "encoder_layers/1/ffn/experts/wi": (2, 4, 3),
             "extra/w": (1,)}
  with pytest.raises(distill.DistillError) as e:
    distill.plan(student, teacher)
  message = str(e.value)
  assert "4 unmatched" in message
  assert "encoder_layers/0/ffn/wi: shape [4, 8] here, [4, 6]" in message
  assert "encoder_layers/2/ffn/wi: not in the teacher" in message
  # Experts whose FFN the student does not have are unmatched too.
  assert "encoder_layers/1/ffn/experts/wi: teacher variable" in message
  assert "extra/w: teacher variable with no place" in message


def test_config_problems_name_the_flag_to_set():
  teacher, student = _configs(d_model=32, num_decoder_layers=3)
  problems = distill.config_problems(student=student, teacher=teacher)
  assert problems == [
      "--d_model=32 differs from the teacher's 16: set --d_model=16",
      "--num_decoder_layers=3 differs from the teacher's 2: set "
      "--num_decoder_layers=2"]
  problems = distill.config_problems(student=teacher, teacher=teacher)
  assert problems == ["the student has --num_experts=4: it must be dense; "
                      "use --student_config=tiny/dense or set "
                      "--num_experts=0"]
  with pytest.raises(distill.DistillError, match="--distill_teacher_weight"):
    distill.DistillConfig(teacher_dir="x", teacher_weight=1.5)


def _fingerprint(directory, text):
  directory.mkdir(parents=True, exist_ok=True)
  for name in (rundir.SOURCE_MODEL, rundir.TARGET_MODEL):
    (directory / name).write_text(f"{text} {name}")
  return rundir.VocabFingerprint.of_dir(directory).to_dict()


def test_prepare_refuses_unusable_teachers_with_the_flag_to_fix(tmp_path):
  teacher_config, student_config = _configs()
  common = dict(student=student_config, model_dir=str(tmp_path / "student"),
                vocab_dir="", languages=())
  empty = tmp_path / "empty"
  empty.mkdir()
  prepared = distill.prepare(
      config=distill.DistillConfig(teacher_dir=str(empty)), **common)
  assert prepared.problems == (
      f"--teacher_dir={empty} has no checkpoint (no 'checkpoint' index "
      "file): pass the model_dir of a trained MoE m4moe-train run",)
  # A dense "teacher".
  dense_dir = tmp_path / "dense"
  tf.train.CheckpointManager(
      tf.train.Checkpoint(model=model_lib.Transformer(config=student_config)),
      str(dense_dir), max_to_keep=1).save(checkpoint_number=1)
  checkpointing.write_run_config(dense_dir, model_config=student_config,
                                 sections={})
  prepared = distill.prepare(
      config=distill.DistillConfig(teacher_dir=str(dense_dir)), **common)
  assert "is a dense run" in prepared.problems[0]
  # Vocabulary: the teacher's fingerprint against --vocab_dir.
  _, run = _teacher_run(tmp_path, teacher_config, sections={
      "vocab": _fingerprint(tmp_path / "vocab_a", "a"),
      "languages": ["de", "fr"]})
  _fingerprint(tmp_path / "vocab_b", "b")
  config = distill.DistillConfig(teacher_dir=str(run))
  prepared = distill.prepare(config=config, **{
      **common, "vocab_dir": str(tmp_path / "vocab_b"),
      "languages": ("de", "ja")})
  assert len(prepared.problems) == 2, prepared.problems
  assert prepared.problems[0].startswith(
      f"--vocab_dir: {tmp_path / 'vocab_b' / rundir.SOURCE_MODEL} is not the "
      "source vocabulary")
  assert f"pass --vocab_dir={tmp_path / 'vocab_a'}" in prepared.problems[0]
  assert prepared.problems[1].startswith(
      "--languages: the teacher") and "not trained on ja" in (
          prepared.problems[1])
  prepared = distill.prepare(config=config, **{
      **common, "vocab_dir": str(tmp_path / "vocab_a"), "languages": ("fr",)})
  assert prepared.problems == ()
  assert prepared.warm_start is not None and not prepared.resumed
  assert prepared.section == {
      "teacher_dir": str(run.resolve()),
      "teacher_checkpoint": str((run / "ckpt-5").resolve()),
      "teacher_weight": 0.25}
  # A student with another width: the flag is named.
  prepared = distill.prepare(config=config, **{
      **common, "vocab_dir": str(tmp_path / "vocab_a"),
      "student": dataclasses.replace(student_config, d_ff=48)})
  assert prepared.problems == (
      "--d_ff=48 differs from the teacher's 24: set --d_ff=24",)


VOCAB_PAIRS = synthetic.synthetic_pairs(num_pairs=256, vocab_size=VOCAB,
                                        max_length=9)


def _train_student(tmp_path, *, teacher_dir, steps, name="student",
                   weight=0.25):
  teacher_config, student_config = _configs()
  prepared = distill.prepare(
      config=distill.DistillConfig(teacher_dir=str(teacher_dir),
                                   teacher_weight=weight),
      student=student_config, model_dir=str(tmp_path / name), vocab_dir="",
      languages=())
  assert prepared.problems == ()
  teacher = distill.load_teacher(config=teacher_config,
                                 checkpoint=prepared.teacher_checkpoint)
  config = train_lib.TrainConfig(
      model_dir=str(tmp_path / name), train_steps=steps, seed=3,
      log_every=2, checkpoint_every=2, eval_every=0,
      optimizer=optimizer_lib.AdafactorConfig(warmup_steps=10))
  # The shuffle order depends on the global seed when the dataset is made.
  tf.random.set_seed(0)
  dataset = synthetic.pairs_dataset(VOCAB_PAIRS, batch_size=8, length=10,
                                    shuffle_seed=1)
  result = train_lib.train(
      model_fn=lambda: model_lib.Transformer(config=student_config),
      train_dataset=dataset,
      config=config, model_config=student_config,
      run_sections={distill.SECTION: dict(prepared.section)},
      warm_start=prepared.warm_start,
      token_loss=distill.DistillationLoss(teacher=teacher,
                                          teacher_weight=weight))
  return result, teacher, prepared


def _checkpoint_values(path):
  reader = tf.train.load_checkpoint(path)
  return {k: reader.get_tensor(k)
          for k in reader.get_variable_to_shape_map()
          if k.startswith(("model/", "optimizer/"))}


def _tree_digest(directory):
  digest = hashlib.sha256()
  for path in sorted(pathlib.Path(directory).rglob("*")):
    if path.is_file():
      digest.update(path.name.encode() + path.read_bytes())
  return digest.hexdigest()


@pytest.mark.slow  # trains a teacher and a student: `pytest -m slow`
def test_teacher_unchanged_student_learns_and_resume_is_exact(tmp_path):
  teacher_config, _ = _configs()
  teacher_model, run = _teacher_run(tmp_path, teacher_config)
  on_disk = _tree_digest(run)
  result, teacher, prepared = _train_student(tmp_path, teacher_dir=run,
                                             steps=4)
  assert result.step == 4
  # The teacher: not trainable, values as in its checkpoint, files intact,
  # and not part of the student's checkpoints.
  assert not teacher.trainable_variables
  want = upcycle.variable_paths(teacher_model)
  for path, variable in upcycle.variable_paths(teacher).items():
    np.testing.assert_array_equal(variable.numpy(), want[path].numpy())
  assert _tree_digest(run) == on_disk
  straight = _checkpoint_values(result.last_checkpoint)
  assert not any("expert" in k or "router" in k for k in straight)
  # The run records the teacher checkpoint it distils from.
  assert json.loads((tmp_path / "student" / "config.json").read_text())[
      distill.SECTION] == prepared.section
  # Resume: 2 steps, then 2 more in a new call, equals 4 straight bitwise.
  first, _, _ = _train_student(tmp_path, teacher_dir=run, steps=2,
                               name="halves")
  assert first.step == 2
  resumed, _, again = _train_student(tmp_path, teacher_dir=run, steps=4,
                                     name="halves")
  assert again.resumed and again.warm_start is None
  assert resumed.step == 4
  halves = _checkpoint_values(resumed.last_checkpoint)
  assert straight.keys() == halves.keys()
  for key, value in straight.items():
    np.testing.assert_array_equal(value, halves[key], err_msg=key)
  # The teacher's share changes the update: the same 2 steps without it.
  without, _, _ = _train_student(tmp_path, teacher_dir=run, steps=2,
                                 name="w0", weight=0.0)
  a = _checkpoint_values(str(tmp_path / "halves" / "ckpt-2"))
  b = _checkpoint_values(without.last_checkpoint)
  key = "model/decoder_layers/0/ffn/wi/.ATTRIBUTES/VARIABLE_VALUE"
  assert not np.array_equal(a[key], b[key])


def test_resume_refuses_another_teacher_weight_or_a_missing_teacher_ckpt(
    tmp_path):
  teacher_config, student_config = _configs()
  _, run = _teacher_run(tmp_path, teacher_config)
  student_dir = tmp_path / "student"
  prepared = distill.prepare(
      config=distill.DistillConfig(teacher_dir=str(run)),
      student=student_config, model_dir=str(student_dir), vocab_dir="",
      languages=())
  # What a distillation run that saved a checkpoint leaves behind.
  tf.train.CheckpointManager(
      tf.train.Checkpoint(model=model_lib.Transformer(config=student_config)),
      str(student_dir), max_to_keep=1).save(checkpoint_number=2)
  checkpointing.write_run_config(student_dir, model_config=student_config,
                                 sections={distill.SECTION: prepared.section})
  common = dict(student=student_config, model_dir=str(tmp_path / "student"),
                vocab_dir="", languages=())
  prepared = distill.prepare(config=distill.DistillConfig(
      teacher_dir=str(run), teacher_weight=0.5), **common)
  assert prepared.problems == (
      "--distill_teacher_weight=0.5 differs from this run's 0.25: pass "
      "--distill_teacher_weight=0.25 to resume, or use a fresh --model_dir",)
  for path in run.glob("ckpt-5.*"):
    path.rename(run / ("moved-" + path.name))
  # A newer teacher checkpoint exists, but the recorded one is gone.
  tf.train.CheckpointManager(
      tf.train.Checkpoint(model=model_lib.Transformer(config=teacher_config)),
      str(run), max_to_keep=2).save(checkpoint_number=9)
  prepared = distill.prepare(
      config=distill.DistillConfig(teacher_dir=str(run)), **common)
  assert len(prepared.problems) == 1
  assert "ckpt-5, is gone" in prepared.problems[0]


SMALL = ["--d_model=32", "--num_heads=2", "--d_kv=16", "--d_ff=64",
         "--num_encoder_layers=2", "--num_decoder_layers=2",
         "--src_vocab_size=64", "--tgt_vocab_size=64", "--dropout_rate=0",
         "--attention_dropout_rate=0", "--synthetic_data",
         "--sequence_length=16", "--batch_tokens=256", "--log_every=1",
         "--eval_every=0", "--deterministic", "--warmup_steps=100"]


def _tool(tool, *args):
  return subprocess.run(
      [sys.executable, "-c", f"from m4moe.cli.{tool} import run; run()",
       *args], capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_distill_cli_runs_and_names_bad_flags(tmp_path):
  teacher = tmp_path / "teacher"
  proc = _tool("train", "--config=tiny/moe", "--num_experts=4",
               "--expert_hidden_dim=32", "--group_size=64", *SMALL,
               f"--model_dir={teacher}", "--train_steps=1")
  assert proc.returncode == 0, proc.stderr[-2000:]
  student = tmp_path / "student"
  bad = [  # (flags, messages); the student dir stays unwritten
      (["--d_model=48", "--num_experts=4", "--expert_hidden_dim=32"],
       ["--d_model=48 differs from the teacher's 32: set --d_model=32",
        "the student has --num_experts=4: it must be dense"]),
      (["--mesh=data:1"], ["--mesh is not supported by m4moe-distill"]),
  ]
  for extra, messages in bad:
    proc = _tool("distill", "--student_config=tiny/dense", *SMALL,
                 f"--teacher_dir={teacher}", f"--model_dir={student}",
                 "--train_steps=1", *extra)
    assert proc.returncode == 2, (extra, proc.stderr[-2000:])
    for message in messages:
      assert message in proc.stderr, (extra, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    assert not student.exists()
  proc = _tool("distill", "--student_config=tiny/dense", *SMALL,
               f"--teacher_dir={tmp_path / 'nowhere'}",
               f"--model_dir={student}", "--train_steps=1")
  assert proc.returncode == 2 and "has no checkpoint" in proc.stderr
  proc = _tool("distill", "--student_config=tiny/dense", *SMALL,
               f"--teacher_dir={teacher}", f"--model_dir={student}",
               "--train_steps=2")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert json.loads(proc.stdout.strip().splitlines()[-1])["step"] == 2
  suffix = "/.ATTRIBUTES/VARIABLE_VALUE"
  teacher_ckpt = tf.train.load_checkpoint(str(teacher / "ckpt-1"))
  student_ckpt = tf.train.load_checkpoint(str(student / "ckpt-2"))
  # Two small steps from the teacher's weights: still next to them.
  for key in ("model/source_embedding/embeddings",
              "model/decoder_layers/0/ffn/wi",
              "model/encoder_layers/1/self_attention/wq"):
    want = teacher_ckpt.get_tensor(key + suffix)
    got = student_ckpt.get_tensor(key + suffix)
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max(), key
  assert student_ckpt.get_tensor(
      "model/encoder_layers/1/ffn/wi" + suffix).shape == (32, 64)
