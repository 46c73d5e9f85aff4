"""Dense -> MoE upcycling: the upcycled model computes the dense function at
init (top-2, no drops), errors name the flag, m4moe-train --init_from_dense
starts from the copied weights and a resume ignores it."""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from m4moe import config as config_lib
from m4moe.model import transformer as model_lib
from m4moe.training import optimizer as optimizer_lib
from m4moe.moe import upcycle
from m4moe.training import checkpointing


def _configs(**moe_overrides):
  dense = config_lib.ModelConfig(
      src_vocab_size=40, tgt_vocab_size=36, d_model=16, num_heads=2, d_kv=8,
      d_ff=24, num_encoder_layers=2, num_decoder_layers=2, dropout_rate=0.0,
      attention_dropout_rate=0.0, max_length=32)
  moe = dataclasses.replace(dense, moe=config_lib.MoeConfig(**{
      "num_experts": 4, "expert_hidden_dim": 24, "router": "top2",
      "group_size": 16, "eval_capacity_factor": 0.0, **moe_overrides}))
  return dense, moe


def _dense_run(tmp_path, dense_config):
  tf.random.set_seed(1)
  dense = model_lib.Transformer(config=dense_config)
  run = tmp_path / "dense"
  tf.train.CheckpointManager(tf.train.Checkpoint(model=dense), str(run),
                             max_to_keep=1).save(checkpoint_number=7)
  checkpointing.write_run_config(run, model_config=dense_config, sections={})
  return dense, run


def _trained_dense_run(tmp_path, dense_config, optimizer_config):
  """A dense run whose Adafactor slots are non-zero (two updates)."""
  tf.random.set_seed(1)
  dense = model_lib.Transformer(config=dense_config)
  optimizer = optimizer_lib.Adafactor(optimizer_config)
  variables = dense.trainable_variables
  optimizer.build(variables)
  rng = np.random.default_rng(3)
  for _ in range(2):
    optimizer.apply_gradients(
        [tf.constant(rng.normal(size=v.shape), tf.float32) for v in variables],
        variables)
  run = tmp_path / "dense"
  tf.train.CheckpointManager(
      tf.train.Checkpoint(model=dense, optimizer=optimizer), str(run),
      max_to_keep=1).save(checkpoint_number=2)
  checkpointing.write_run_config(run, model_config=dense_config, sections={})
  return dense, optimizer, run


def _batch():
  rng = np.random.default_rng(0)
  inputs = rng.integers(3, 40, size=(3, 9)).astype(np.int32)
  targets = rng.integers(3, 36, size=(3, 7)).astype(np.int32)
  inputs[1, 5:] = 0  # padding
  targets[2, 4:] = 0
  return {"inputs": tf.constant(inputs), "targets": tf.constant(targets)}


def test_upcycled_top2_model_equals_dense_model_at_init(tmp_path):
  dense_config, moe_config = _configs()
  dense, run = _dense_run(tmp_path, dense_config)
  tf.random.set_seed(2)
  moe = model_lib.Transformer(config=moe_config)
  paths = upcycle.variable_paths(moe)
  router_before = {p: v.numpy() for p, v in paths.items() if "router" in p}
  report = upcycle.upcycle_from_dense(model=moe, dense_dir=run)
  assert report.checkpoint.endswith("ckpt-7")
  # Encoder and decoder layer 1 are MoE: wi and wo expanded, wg fresh.
  assert sorted(report.expanded) == [
      f"{stack}_layers/1/ffn/experts/{w}" for stack in ("decoder", "encoder")
      for w in ("wi", "wo")]
  assert sorted(report.fresh) == sorted(router_before)
  for path, value in router_before.items():
    np.testing.assert_array_equal(paths[path].numpy(), value)
  dense_ffn = dense.encoder_layers[1].ffn.wi.numpy()
  experts = moe.encoder_layers[1].ffn.experts.wi.numpy()
  for e in range(4):
    np.testing.assert_array_equal(experts[e], dense_ffn)
  # The router is not uniform: tokens really pick different expert pairs,
  # and the renormalised top-2 weights (g1 + g2 = 1) give the dense output.
  batch = _batch()
  out = moe(batch, training=False)
  want = dense(batch, training=False).logits.numpy()
  real = batch["targets"].numpy() > 0
  np.testing.assert_allclose(out.logits.numpy()[real], want[real],
                             rtol=1e-5, atol=1e-5)
  load = out.moe_stats["encoder/layer_1/moe"].load.numpy()
  assert np.count_nonzero(load) >= 2


def test_shared_experts_start_silent_so_the_upcycled_model_equals_dense(
    tmp_path):
  dense_config, moe_config = _configs(num_shared_experts=1,
                                      shared_expert_hidden_dim=8)
  dense, run = _dense_run(tmp_path, dense_config)
  tf.random.set_seed(2)
  moe = model_lib.Transformer(config=moe_config)
  paths = upcycle.variable_paths(moe)
  shared = sorted(p for p in paths if "shared_experts" in p)
  assert shared and any(p.endswith("/wi") for p in shared)
  wi_before = {p: paths[p].numpy() for p in shared if p.endswith("/wi")}
  report = upcycle.upcycle_from_dense(model=moe, dense_dir=run)
  assert sorted(report.zeroed) == [p for p in shared if p.endswith("/wo")]
  assert set(shared) <= set(report.fresh)
  for path in report.zeroed:
    assert not np.any(paths[path].numpy())
  for path, value in wi_before.items():  # wi keeps its initialisation
    np.testing.assert_array_equal(paths[path].numpy(), value)
    assert np.any(value)
  batch = _batch()
  real = batch["targets"].numpy() > 0
  np.testing.assert_allclose(
      moe(batch, training=False).logits.numpy()[real],
      dense(batch, training=False).logits.numpy()[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("factored", [True, False])
def test_optimizer_state_is_copied_by_path(tmp_path, factored):
  dense_config, moe_config = _configs()
  opt_config = optimizer_lib.AdafactorConfig(beta1=0.9, factored=factored)
  dense, dense_opt, run = _trained_dense_run(tmp_path, dense_config,
                                             opt_config)
  moe = model_lib.Transformer(config=moe_config)
  optimizer = optimizer_lib.Adafactor(opt_config)
  optimizer.build(moe.trainable_variables)
  report = upcycle.upcycle_from_dense(model=moe, dense_dir=run)
  copied = upcycle.upcycle_optimizer(optimizer=optimizer, model=moe,
                                     report=report, dense_dir=run)
  assert int(optimizer.iterations.numpy()) == 2
  slot_of = lambda model, opt, path: opt.slots[
      list(upcycle.variable_paths(model)).index(path)]
  names = ("vr", "vc", "m") if factored else ("v", "m")
  for moe_path, dense_path in [
      ("encoder_layers/1/ffn/experts/wi", "encoder_layers/1/ffn/wi"),
      ("decoder_layers/1/ffn/experts/wo", "decoder_layers/1/ffn/wo"),
      ("decoder_layers/0/cross_attention/wq",
       "decoder_layers/0/cross_attention/wq"),
      ("target_embedding/embeddings", "target_embedding/embeddings")]:
    mine = slot_of(moe, optimizer, moe_path)
    theirs = slot_of(dense, dense_opt, dense_path)
    for name in names:
      want = getattr(theirs, name).numpy()
      got = getattr(mine, name).numpy()
      assert np.abs(want).max() > 0
      np.testing.assert_array_equal(got, np.broadcast_to(want, got.shape))
  router = slot_of(moe, optimizer, "encoder_layers/1/ffn/router/wg")
  for name in names:
    assert not np.any(getattr(router, name).numpy())
  routers = {i for i, path in enumerate(upcycle.variable_paths(moe))
             if "router" in path}
  assert routers and copied == sum(
      getattr(slots, name) is not None
      for i, slots in enumerate(optimizer.slots) if i not in routers
      for name in ("vr", "vc", "v", "m"))


def test_optimizer_state_that_does_not_fit_is_refused(tmp_path):
  dense_config, moe_config = _configs()
  _, _, run = _trained_dense_run(
      tmp_path, dense_config, optimizer_lib.AdafactorConfig(factored=True))
  moe = model_lib.Transformer(config=moe_config)
  optimizer = optimizer_lib.Adafactor(
      optimizer_lib.AdafactorConfig(factored=False))
  optimizer.build(moe.trainable_variables)
  report = upcycle.upcycle_from_dense(model=moe, dense_dir=run)
  with pytest.raises(upcycle.UpcycleError, match="--factored") as info:
    upcycle.upcycle_optimizer(optimizer=optimizer, model=moe, report=report,
                              dense_dir=run)
  assert "encoder_layers/1/ffn/experts/wi/v: the dense checkpoint has no " \
         "such slot" in str(info.value)
  assert int(optimizer.iterations.numpy()) == 0  # nothing half-copied
  _, moe_run = _dense_run(tmp_path / "plain", dense_config)
  with pytest.raises(upcycle.UpcycleError, match="holds no optimiser state"):
    upcycle.upcycle_optimizer(
        optimizer=optimizer, model=moe, dense_dir=moe_run,
        report=upcycle.upcycle_from_dense(model=moe, dense_dir=moe_run))


def test_top1_router_does_not_renormalise_so_logits_differ(tmp_path):
  dense_config, moe_config = _configs(router="top1")
  dense, run = _dense_run(tmp_path, dense_config)
  moe = model_lib.Transformer(config=moe_config)
  upcycle.upcycle_from_dense(model=moe, dense_dir=run)
  batch = _batch()
  gap = np.abs(moe(batch, training=False).logits.numpy() -
               dense(batch, training=False).logits.numpy()).max()
  assert gap > 1e-3  # the Switch combine weight is the gate, < 1


def test_config_problems_name_the_flag_to_set():
  dense_config, moe_config = _configs(expert_hidden_dim=12)
  problems = upcycle.config_problems(config=moe_config, dense=dense_config)
  assert problems == [
      "--expert_hidden_dim=12 differs from the dense run's --d_ff=24: each "
      "expert starts as a copy of the dense FFN, set --expert_hidden_dim=24"]
  wide = dataclasses.replace(moe_config, d_model=32)
  assert any("set --d_model=16" in p for p in upcycle.config_problems(
      config=wide, dense=dense_config))
  assert upcycle.config_problems(config=_configs()[1], dense=dense_config) == []
  assert "MoE run" in upcycle.config_problems(
      config=moe_config, dense=moe_config)[0]
  scaled = dataclasses.replace(dense_config, ffn_output_scale=0.125)
  assert any("--ffn_output_scale=1" in p for p in upcycle.config_problems(
      config=_configs()[1], dense=scaled))


def test_plan_lists_every_unmatched_variable():
  dense = {"emb": (5, 4), "layer/ffn/wi": (4, 8), "layer/ffn/wo": (8, 4),
           "extra/w": (2,)}
  model = {"emb": (5, 4), "layer/ffn/experts/wi": (3, 4, 6),
           "layer/ffn/experts/wo": (3, 8, 4), "layer/ffn/router/wg": (4, 3),
           "new/w": (1,)}
  with pytest.raises(upcycle.UpcycleError) as info:
    upcycle.plan(model, dense)
  message = str(info.value)
  assert "3 unmatched variable(s)" in message
  assert "layer/ffn/experts/wi [3, 4, 6] cannot hold E copies" in message
  assert "--expert_hidden_dim=8" in message
  assert "new/w: not in the dense checkpoint" in message
  assert "extra/w: dense variable with no place" in message
  fixed_model = {**model, "layer/ffn/experts/wi": (3, 4, 8)}
  fixed_dense = {**dense, "new/w": (1,)}
  del fixed_dense["extra/w"]
  copied, expanded, fresh = upcycle.plan(fixed_model, fixed_dense)
  assert copied == {"emb": "emb", "new/w": "new/w"}
  assert expanded == {"layer/ffn/experts/wi": "layer/ffn/wi",
                      "layer/ffn/experts/wo": "layer/ffn/wo"}
  assert fresh == ["layer/ffn/router/wg"]


def test_dense_checkpoint_errors(tmp_path):
  with pytest.raises(upcycle.UpcycleError, match="has no checkpoint"):
    upcycle.dense_checkpoint(tmp_path)
  _, moe_config = _configs()
  model = model_lib.Transformer(config=moe_config)
  tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(tmp_path),
                             max_to_keep=1).save(checkpoint_number=1)
  checkpointing.write_run_config(tmp_path, model_config=moe_config,
                                 sections={})
  with pytest.raises(upcycle.UpcycleError, match="is an MoE run"):
    upcycle.dense_checkpoint(tmp_path)


SMALL = ["--d_model=32", "--num_heads=2", "--d_kv=16", "--d_ff=64",
         "--num_encoder_layers=2", "--num_decoder_layers=2",
         "--src_vocab_size=64", "--tgt_vocab_size=64", "--dropout_rate=0",
         "--attention_dropout_rate=0", "--synthetic_data",
         "--sequence_length=16", "--batch_tokens=256", "--log_every=1",
         "--eval_every=0", "--deterministic", "--warmup_steps=100"]
MOE = ["--config=tiny/moe", "--num_experts=4", "--group_size=64", *SMALL]


def _train(*args):
  return subprocess.run(
      [sys.executable, "-c", "from m4moe.cli.train import run; run()", *args],
      capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # a training CLI run end to end: `pytest -m slow`
def test_train_cli_init_from_dense(tmp_path):
  dense_dir = tmp_path / "dense"
  proc = _train("--config=tiny/dense", *SMALL, f"--model_dir={dense_dir}",
                "--train_steps=2")
  assert proc.returncode == 0, proc.stderr[-2000:]
  # Wrong expert width: refused before anything is written.
  bad = tmp_path / "bad"
  proc = _train(*MOE, "--expert_hidden_dim=32", f"--model_dir={bad}",
                f"--init_from_dense={dense_dir}", "--train_steps=1")
  assert proc.returncode == 2
  assert "set --expert_hidden_dim=64" in proc.stderr
  assert not bad.exists()
  # Upcycled: one step later, every copied weight is still next to the
  # dense one (a fresh init is nowhere near).
  up = tmp_path / "up"
  proc = _train(*MOE, "--expert_hidden_dim=64", f"--model_dir={up}",
                f"--init_from_dense={dense_dir}", "--init_from_dense_optimizer",
                "--train_steps=1")
  assert proc.returncode == 0, proc.stderr[-2000:]
  dense = tf.train.load_checkpoint(str(dense_dir / "ckpt-2"))
  moe = tf.train.load_checkpoint(str(up / "ckpt-1"))
  suffix = "/.ATTRIBUTES/VARIABLE_VALUE"
  for key in ("model/source_embedding/embeddings",
              "model/decoder_layers/0/ffn/wi",
              "model/encoder_layers/1/self_attention/wq"):
    want = dense.get_tensor(key + suffix)
    got = moe.get_tensor(key + suffix)
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max(), key
  # The optimiser went on from the dense run's 2 updates.
  assert moe.get_tensor("optimizer/iterations" + suffix) == 3
  dense_wi = dense.get_tensor("model/encoder_layers/1/ffn/wi" + suffix)
  experts = moe.get_tensor("model/encoder_layers/1/ffn/experts/wi" + suffix)
  assert experts.shape == (4, 32, 64)
  for e in range(4):
    assert np.abs(experts[e] - dense_wi).max() < 0.05 * np.abs(dense_wi).max()
  # A resume ignores the flag and says so.
  proc = _train(*MOE, "--expert_hidden_dim=64", f"--model_dir={up}",
                f"--init_from_dense={dense_dir}", "--train_steps=2")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "--init_from_dense" in proc.stderr and "is ignored" in proc.stderr
  assert json.loads(proc.stdout.strip().splitlines()[-1])["step"] == 2


def test_prepare_checks_flags_before_training(tmp_path):
  dense_config, moe_config = _configs()
  _, _, run = _trained_dense_run(
      tmp_path, dense_config, optimizer_lib.AdafactorConfig(factored=True))
  checkpointing.write_run_config(run, model_config=dense_config, sections={
      "train": {"optimizer": {"factored": True, "beta1": 0.0}}})
  new_dir = str(tmp_path / "new")
  common = dict(model_dir=new_dir, config=moe_config, mesh=False,
                optimizer=optimizer_lib.AdafactorConfig(factored=False,
                                                        beta1=0.9))
  warm, problems, notice = upcycle.prepare(dense_dir=str(run),
                                           copy_optimizer=True, **common)
  assert warm is not None and notice is None
  assert problems == [
      "--init_from_dense_optimizer: --factored=False does not fit the dense "
      "run's factored=True slots: set --factored=True or drop the flag",
      "--init_from_dense_optimizer: --beta1=0.9 does not fit the dense "
      "run's beta1=0.0 slots: set --beta1=0.0 or drop the flag"]
  assert upcycle.prepare(dense_dir=str(run), copy_optimizer=False,
                         **common)[1] == []
  assert upcycle.prepare(dense_dir="", copy_optimizer=True, **common)[1] == [
      "--init_from_dense_optimizer needs --init_from_dense"]
  assert "--mesh" in upcycle.prepare(
      dense_dir=str(run), copy_optimizer=False,
      **{**common, "mesh": True})[1][0]
  # A run directory with a checkpoint is a resume: no warm start, a notice.
  warm, problems, notice = upcycle.prepare(
      dense_dir=str(run), copy_optimizer=True,
      **{**common, "model_dir": str(run)})
  assert warm is None and problems == [] and "is ignored" in notice


@pytest.mark.parametrize("copy_optimizer", [True, False])
def test_the_warm_start_returns_its_start_record(tmp_path, copy_optimizer):
  """What m4moe-train logs as the ``start`` record's ``warm_start``: where
  the schedule starts (the dense updates only with the optimiser state)."""
  dense_config, moe_config = _configs()
  opt_config = optimizer_lib.AdafactorConfig(factored=True)
  _, _, run = _trained_dense_run(tmp_path, dense_config, opt_config)
  checkpointing.write_run_config(run, model_config=dense_config, sections={
      "train": {"optimizer": {"factored": True, "beta1": 0.0}}})
  warm, problems, _ = upcycle.prepare(
      dense_dir=str(run), model_dir=str(tmp_path / "new"),
      copy_optimizer=copy_optimizer, config=moe_config, optimizer=opt_config,
      mesh=False)
  assert problems == []
  moe = model_lib.Transformer(config=moe_config)
  optimizer = optimizer_lib.Adafactor(opt_config)
  optimizer.build(moe.trainable_variables)
  record = warm(moe, optimizer)
  assert record == {
      "kind": "upcycled", "init_from_dense": str(run),
      "checkpoint": str(run / "ckpt-2"),
      "dense_step": None,  # this stand-in checkpoint has no step counter
      "optimizer_iterations": 2 if copy_optimizer else 0,
      "steps": "counted from the upcycling (dense_step not included)"}
  json.dumps(record)  # it goes into metrics.jsonl


def test_the_start_record_reads_the_dense_runs_step(tmp_path):
  run = tmp_path / "dense"
  tf.train.CheckpointManager(
      tf.train.Checkpoint(step=tf.Variable(20, dtype=tf.int64)), str(run),
      max_to_keep=1).save(checkpoint_number=20)
  report = upcycle.UpcycleReport(checkpoint=str(run / "ckpt-20"), copied={},
                                 expanded={}, fresh=())
  record = upcycle.start_record(report=report, dense_dir=run,
                                optimizer_iterations=0)
  assert record["dense_step"] == 20
