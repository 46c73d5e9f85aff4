"""Training loop on the stand-in model: learning, exact resume, accumulation,
non-finite guard, metrics and summaries."""

import glob
import os
import json

import numpy as np
import pytest
import tensorflow as tf

from m4moe.training import optimizer as optimizer_lib
from m4moe.training import rundir
from m4moe.training import loop as train_lib
from m4moe.training import step as step_lib
from m4moe.training import synthetic
import toy_model
from m4moe.training import metrics as metrics_lib
from m4moe.training import metrics_log

VOCAB = 24
PAIRS = synthetic.synthetic_pairs(num_pairs=512, vocab_size=VOCAB, max_length=9)


def _config(tmp_path, name="run", **overrides):
  values = dict(model_dir=str(tmp_path / name), train_steps=8, seed=3,
                log_every=2, checkpoint_every=4, keep_checkpoints=2,
                optimizer=optimizer_lib.AdafactorConfig(warmup_steps=20))
  values.update(overrides)
  return train_lib.TrainConfig(**values)


def _train(config, *, dataset=None, **kwargs):
  # Dataset.shuffle's order depends on the global seed at the time the
  # dataset is built, which an earlier train() call sets: fix it here so a
  # run's batches do not depend on what ran before it in this process.
  tf.random.set_seed(0)
  kwargs.setdefault("model_fn", lambda: toy_model.ToyTranslator(
      vocab_size=VOCAB + 1, poison_token=VOCAB))
  return train_lib.train(
      train_dataset=dataset or synthetic.pairs_dataset(
          PAIRS, batch_size=8, length=10, shuffle_seed=1),
      config=config, **kwargs)


def _variables(model_dir, step):
  reader = tf.train.load_checkpoint(f"{model_dir}/ckpt-{step}")
  names = [n for n in reader.get_variable_to_shape_map()
           if n.startswith(("model/", "optimizer/"))
           and "OPTIMIZER_SLOT" not in n]
  return {n: reader.get_tensor(n) for n in names}


def _dev():
  return {"xx": synthetic.pairs_dataset(PAIRS[:64], batch_size=16, length=10,
                                        shuffle_seed=None, repeat=False)}


def test_learns_below_unigram_and_writes_metrics(tmp_path):
  config = _config(tmp_path, train_steps=100, log_every=25,
                   checkpoint_every=100, eval_every=50,
                   optimizer=optimizer_lib.AdafactorConfig(warmup_steps=100))
  result = _train(config, dev_datasets=_dev())
  unigram = synthetic.unigram_cross_entropy(PAIRS)
  assert result.dev_ce["xx"] < 0.3 * unigram
  records = metrics_log.read_metrics(tmp_path / "run" / "metrics.jsonl")
  kinds = [r["kind"] for r in records]
  assert kinds == ["start", "train", "train", "eval", "train", "train",
                   "eval", "end"]
  train = [r for r in records if r["kind"] == "train"]
  assert [r["step"] for r in train] == [25, 50, 75, 100]
  # The trained toy translates: wrong sources cost it more than a nat/token.
  evals = [r for r in records if r["kind"] == "eval"]
  assert evals[-1]["source_reliance"]["xx"] > 1.0
  assert train[-1]["train_ce"] < train[0]["train_ce"]
  for key in ("tokens_seen", "step_time_sec", "tokens_per_sec", "devices",
              "learning_rate", "grad_norm", "moe_loss", "batch_tokens"):
    assert key in train[-1], key
  assert train[-1]["router"]["toy/moe"].keys() >= {"load_cv", "entropy"}
  # The toy reports no executed expert compute (MoeLayerStats does).
  assert train[-1]["expert_compute"] == {}
  assert 0 < train[0]["tokens_seen"] < train[-1]["tokens_seen"]
  # CPU seconds per step: positive, and a single-threaded-enough step never
  # uses more CPU than the machine's cores could give it in its wall time.
  for record in train:
    assert 0 < record["step_cpu_sec"] <= (
        record["step_time_sec"] * os.cpu_count() + 0.05)
  # TensorBoard events: train scalars, router histogram, dev CE per language.
  tags = set()
  for path in glob.glob(str(tmp_path / "run" / "*" / "events.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      tags.update(v.tag for v in event.summary.value)
  assert {"train/cross_entropy", "train/learning_rate", "train/grad_norm",
          "train/tokens_per_sec", "router/toy/moe/load_cv",
          "router/toy/moe/load_per_expert", "dev/cross_entropy/xx",
          "dev/cross_entropy"} <= tags


def test_resume_is_bitwise_identical(tmp_path):
  straight = _config(tmp_path, "straight")
  _train(straight)
  halves = _config(tmp_path, "halves", train_steps=4)
  first = _train(halves)
  assert first.step == 4 and first.last_checkpoint.endswith("ckpt-4")
  second = _train(_config(tmp_path, "halves"))  # a fresh model, restored
  assert second.step == 8
  a = _variables(tmp_path / "straight", 8)
  b = _variables(tmp_path / "halves", 8)
  assert a.keys() == b.keys() and len(a) > 10
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)
  # The JSONL holds each step once although the run was split.
  steps = [r["step"] for r in metrics_log.read_metrics(
      tmp_path / "halves" / "metrics.jsonl", "train")]
  assert steps == [2, 4, 6, 8]


def test_resume_without_iterator_state_skips_consumed_batches(tmp_path):
  _train(_config(tmp_path, "straight", checkpoint_input=False))
  _train(_config(tmp_path, "halves", train_steps=4, checkpoint_input=False))
  _train(_config(tmp_path, "halves", checkpoint_input=False))
  a = _variables(tmp_path / "straight", 8)
  b = _variables(tmp_path / "halves", 8)
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_gradient_accumulation_gives_the_same_update(tmp_path):
  # No dropout (seeds differ per micro-batch) and no batch-level MoE loss
  # (a mean of per-micro-batch balancing losses is not the full batch's).
  model_fn = lambda: toy_model.ToyTranslator(
      vocab_size=VOCAB, dropout_rate=0.0, moe_loss_weight=0.0)
  def data(batch_size):
    return synthetic.pairs_dataset(PAIRS, batch_size=batch_size, length=10,
                                   shuffle_seed=None)
  full = _train(_config(tmp_path, "full", train_steps=3),
                dataset=data(8), model_fn=model_fn)
  accum = _train(_config(tmp_path, "accum", train_steps=3,
                         grad_accum_steps=2), dataset=data(4),
                 model_fn=model_fn)
  assert full.step == accum.step == 3
  a = _variables(tmp_path / "full", 3)
  b = _variables(tmp_path / "accum", 3)
  moved = 0
  for name in a:
    np.testing.assert_allclose(a[name], b[name], rtol=2e-5, atol=2e-6,
                               err_msg=name)
    moved += "model/" in name
  assert moved >= 7
  # ... and differs from a run that sees only half the data per step.
  half = _train(_config(tmp_path, "half", train_steps=3), dataset=data(4),
                model_fn=model_fn)
  c = _variables(tmp_path / "half", 3)
  assert any(not np.allclose(a[n], c[n], rtol=1e-3) for n in a)
  del half


def _poisoned_dataset(poison_steps):
  """Batches of 8 pairs; batch i (0-based) is poisoned if i in poison_steps."""
  clean = synthetic.pairs_dataset(PAIRS, batch_size=8, length=10,
                                  shuffle_seed=None)
  def poison(i, batch):
    bad = tf.reduce_any(tf.equal(i, tf.constant(poison_steps, tf.int64)))
    inputs = tf.where(bad, tf.tensor_scatter_nd_update(
        batch["inputs"], [[0, 0]], [VOCAB]), batch["inputs"])
    return {"inputs": inputs, "targets": batch["targets"]}
  return clean.enumerate().map(poison)


def test_nan_step_is_skipped_counted_and_training_continues(tmp_path):
  seen = {}
  def after_step(step):
    seen[step] = [v.numpy().copy() for v in model.trainable_variables]
  def model_fn():
    global model  # pylint: disable=global-variable-undefined
    model = toy_model.ToyTranslator(vocab_size=VOCAB + 1, poison_token=VOCAB)
    return model
  config = _config(tmp_path, train_steps=6)
  result = _train(config, dataset=_poisoned_dataset([2]), model_fn=model_fn,
                  after_step=after_step)
  assert result.step == 6 and result.nonfinite_skipped == 1
  for before, after in zip(seen[2], seen[3]):  # step 3 ran batch 2: skipped
    np.testing.assert_array_equal(before, after)
  assert any(not np.array_equal(a, b) for a, b in zip(seen[3], seen[4]))
  assert all(np.isfinite(v).all() for v in seen[6])
  records = metrics_log.read_metrics(tmp_path / "run" / "metrics.jsonl",
                                     "train")
  assert records[-1]["nonfinite_skipped"] == 1


@pytest.mark.parametrize("bad", [None, "nan", "inf", "overflow"])
def test_finite_and_global_norm_match_the_elementwise_check(bad):
  rng = np.random.default_rng(0)
  grads = [rng.normal(size=s).astype(np.float32) for s in [(3, 4), (5,), ()]]
  if bad == "nan":
    grads[1][2] = np.nan
  elif bad == "inf":
    grads[0][1, 1] = -np.inf
  elif bad == "overflow":  # finite, but the sum of squares overflows
    grads[0][0, 0] = 3e19
  finite, norm = tf.function(step_lib.finite_and_global_norm)(
      [tf.constant(g) for g in grads])
  np.testing.assert_array_equal(finite.numpy(),
                                [np.isfinite(g).all() for g in grads])
  # The same value as tf.linalg.global_norm (the step's metric before).
  np.testing.assert_array_equal(norm.numpy(),
                                tf.linalg.global_norm(grads).numpy())
  if bad is None:
    np.testing.assert_allclose(
        norm.numpy(), np.sqrt(sum((g.astype(np.float64) ** 2).sum()
                                  for g in grads)), rtol=1e-6)


def test_consecutive_nan_steps_stop_with_error_and_keep_checkpoint(tmp_path):
  config = _config(tmp_path, train_steps=20, max_consecutive_nonfinite=3)
  with pytest.raises(train_lib.NonFiniteError,
                     match=r"step 8: 3 consecutive.*loss.*ckpt-4"):
    _train(config, dataset=_poisoned_dataset(list(range(5, 30))))
  manager_dir = tmp_path / "run"
  assert tf.train.latest_checkpoint(str(manager_dir)).endswith("ckpt-4")
  values = _variables(manager_dir, 4)
  assert all(np.isfinite(v).all() for v in values.values()
             if v.dtype.kind == "f")


def test_config_json_round_trip_and_guard(tmp_path):
  from m4moe import config as config_lib
  model_config = config_lib.ModelConfig(d_model=64)
  config = _config(tmp_path, train_steps=2)
  _train(config, model_config=model_config, run_sections={"data": {"x": 1}})
  assert rundir.model_config_from_run(config.model_dir) == model_config
  saved = json.loads((tmp_path / "run" / "config.json").read_text())
  assert saved["train"]["optimizer"]["warmup_steps"] == 20
  assert saved["data"] == {"x": 1}
  with pytest.raises(config_lib.ConfigError, match="--d_model"):
    _train(config, model_config=config_lib.ModelConfig(d_model=32))


def test_bad_train_config_names_the_flag(tmp_path):
  with pytest.raises(train_lib.TrainConfigError, match="--grad_accum_steps"):
    _config(tmp_path, grad_accum_steps=0)


def test_logged_cross_entropy_is_plain_under_label_smoothing():
  from m4moe.training import step as step_lib
  batch = next(iter(synthetic.pairs_dataset(PAIRS, batch_size=8, length=10,
                                            shuffle_seed=None)))
  results = []
  for smoothing in (0.0, 0.2):
    model = toy_model.ToyTranslator(vocab_size=VOCAB)
    variables = list(model.trainable_variables)
    optimizer = optimizer_lib.Adafactor()
    optimizer.build(variables)
    runner = step_lib.StepRunner(
        model=model, optimizer=optimizer, variables=variables,
        strategy=tf.distribute.get_strategy(), label_smoothing=smoothing)
    results.append(runner.train_step([batch], seed=tf.constant([1, 2])))
  plain, smoothed = results
  assert plain.ce_sum == smoothed.ce_sum  # logs show plain CE either way
  mean_ce = plain.ce_sum / plain.target_tokens
  np.testing.assert_allclose(plain.objective, mean_ce + plain.moe_loss,
                             rtol=1e-5)
  # The optimised objective is the smoothed CE (same seeds as the step).
  from m4moe.model import losses
  seed = tf.random.experimental.stateless_fold_in(
      tf.random.experimental.stateless_fold_in(tf.constant([1, 2]), 0), 0)
  out = toy_model.ToyTranslator(vocab_size=VOCAB)(batch, training=True,
                                                 seed=seed)
  total, count = losses.token_cross_entropy(out.logits, batch["targets"],
                                            label_smoothing=0.2)
  np.testing.assert_allclose(smoothed.objective,
                             float(total / count + out.moe_loss), rtol=1e-5)
  assert abs(smoothed.objective - plain.objective) > 1e-3


def test_changed_input_pipeline_gives_a_clear_error_and_a_way_out(tmp_path):
  _train(_config(tmp_path, train_steps=2))
  same = synthetic.pairs_dataset(PAIRS, batch_size=8, length=10,
                                 shuffle_seed=1)
  changed = tf.data.Dataset.zip((same, same)).map(lambda a, b: a)
  with pytest.raises(RuntimeError, match="--nocheckpoint_input"):
    _train(_config(tmp_path, train_steps=4), dataset=changed)
  result = _train(_config(tmp_path, train_steps=4, checkpoint_input=False),
                  dataset=changed)
  assert result.step == 4


def test_early_stopping_stops_after_patience_and_stays_stopped(tmp_path):
  """A rate so high the dev CE cannot improve: the run stops after exactly
  `patience` evaluations past the first, records why, and a repeated command
  neither trains further nor changes the stopping state."""
  config = _config(tmp_path, train_steps=400, eval_every=5, checkpoint_every=5,
                   early_stopping_patience=2, early_stopping_min_delta=100.0)
  result = _train(config, dev_datasets=_dev())
  # Eval at 5 sets the best; 10 and 15 miss it by less than min_delta.
  assert result.stopped_by == "early_stopping"
  assert result.step == 15
  assert not result.preempted
  records = metrics_log.read_metrics(tmp_path / "run" / "metrics.jsonl")
  assert [r["step"] for r in records if r["kind"] == "eval"] == [5, 10, 15]
  end = [r for r in records if r["kind"] == "end"][-1]
  assert (end["reason"], end["stopped_by"]) == ("done", "early_stopping")
  again = _train(config, dev_datasets=_dev())
  assert (again.step, again.stopped_by) == (15, "early_stopping")


def _model_weights(prefix):
  reader = tf.train.load_checkpoint(prefix)
  return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
          if n.startswith("model/") and "OPTIMIZER_SLOT" not in n}


def test_best_checkpoint_is_the_best_dev_evaluation_not_the_last(tmp_path):
  """Early stopping stops `patience` evaluations after the best; best/ keeps
  the weights of that best evaluation, which --checkpoint=best resolves to."""
  config = _config(tmp_path, train_steps=400, eval_every=5, checkpoint_every=5,
                   keep_checkpoints=5, early_stopping_patience=2,
                   early_stopping_min_delta=100.0)
  _train(config, dev_datasets=_dev())
  run = tmp_path / "run"
  records = metrics_log.read_metrics(run / "metrics.jsonl")
  evals = [r for r in records if r["kind"] == "eval"]
  assert [(r["step"], r["new_best"]) for r in evals] == [
      (5, True), (10, False), (15, False)]
  assert sorted(p.name for p in (run / "best").glob("*.index")) == [
      "ckpt-5.index"]
  best = rundir.resolve_checkpoint(run, "best")
  assert best == str(run / "best" / "ckpt-5")
  got, want = _model_weights(best), _model_weights(str(run / "ckpt-5"))
  assert got.keys() == want.keys() and got
  for name in want:
    np.testing.assert_array_equal(got[name], want[name], err_msg=name)
  # Model weights only: no optimiser slots or counters in best/.
  keys = tf.train.load_checkpoint(best).get_variable_to_shape_map()
  assert not [k for k in keys if "OPTIMIZER_SLOT" in k or "step" in k]
  assert rundir.resolve_checkpoint(run, "latest") == str(run / "ckpt-15")
  assert rundir.resolve_checkpoint(run, "10") == str(run / "ckpt-10")
  with pytest.raises(rundir.RunDirError, match=r"step 7 .*ckpt-10, ckpt-15"):
    rundir.resolve_checkpoint(run, "7")
  with pytest.raises(rundir.RunDirError, match="latest, best, averaged or a step"):
    rundir.resolve_checkpoint(run, "newest")
  # A finished run started again evaluates without moving best/.
  _train(config, dev_datasets=_dev())
  assert rundir.resolve_checkpoint(run, "best") == best


def test_early_stopping_on_a_tiny_dev_set_warns_once(tmp_path, caplog):
  config = _config(tmp_path, train_steps=6, eval_every=2, checkpoint_every=2,
                   early_stopping_patience=5)
  with caplog.at_level("WARNING"):
    _train(config, dev_datasets=_dev())
  warnings = [r.getMessage() for r in caplog.records
              if "Early stopping watches a dev set" in r.getMessage()]
  assert len(warnings) == 1, warnings
  assert "xx " in warnings[0] and "--early_stopping_patience" in warnings[0]
  caplog.clear()
  with caplog.at_level("WARNING"):  # no early stopping: no warning
    _train(_config(tmp_path, "plain", train_steps=2, eval_every=2),
           dev_datasets=_dev())
  assert not [r for r in caplog.records
              if "Early stopping watches" in r.getMessage()]


def _empty_dev():
  return synthetic.pairs_dataset(PAIRS[:0], batch_size=16, length=10,
                                 shuffle_seed=None, repeat=False)


def test_an_empty_dev_set_is_left_out_not_scored_zero(tmp_path, caplog):
  config = _config(tmp_path, train_steps=4, eval_every=2, checkpoint_every=2)
  with caplog.at_level("WARNING"):
    _train(config, dev_datasets={**_dev(), "yy": _empty_dev()})
  evals = [r for r in metrics_log.read_metrics(tmp_path / "run" /
                                               "metrics.jsonl")
           if r["kind"] == "eval"]
  assert evals and all(r["empty_dev"] == ["yy"] for r in evals)
  assert all(set(r["dev_ce"]) == {"xx"} for r in evals)
  assert all(r["dev_ce_mean"] == r["dev_ce"]["xx"] > 0 for r in evals)
  warned = [r.getMessage() for r in caplog.records
            if "without target tokens: yy" in r.getMessage()]
  assert len(warned) == 1, warned


def test_only_empty_dev_sets_neither_stop_early_nor_keep_a_best(tmp_path,
                                                                 caplog):
  # Scored as 0.0, the first evaluation was a best nothing could beat and
  # early stopping ended the run after `patience` evaluations.
  config = _config(tmp_path, train_steps=8, eval_every=2, checkpoint_every=2,
                   early_stopping_patience=1)
  with caplog.at_level("WARNING"):
    _train(config, dev_datasets={"yy": _empty_dev()})
  run = tmp_path / "run"
  records = metrics_log.read_metrics(run / "metrics.jsonl")
  assert not [r for r in records if r["kind"] == "eval"]
  assert [r for r in records if r["kind"] == "end"][-1]["step"] == 8
  assert not (run / "best").exists()
  assert any("Every dev set is empty (yy)" in r.getMessage()
             for r in caplog.records)


def test_best_checkpoint_follows_the_lowest_dev_cross_entropy(tmp_path):
  config = _config(tmp_path, train_steps=30, eval_every=3, checkpoint_every=3,
                   keep_checkpoints=20,
                   optimizer=optimizer_lib.AdafactorConfig(warmup_steps=5))
  _train(config, dev_datasets=_dev())
  run = tmp_path / "run"
  evals = [r for r in metrics_log.read_metrics(run / "metrics.jsonl")
           if r["kind"] == "eval"]
  best_step = min(evals, key=lambda r: r["dev_ce_mean"])["step"]
  running = float("inf")
  for r in evals:  # new_best marks each running minimum
    assert r["new_best"] == (r["dev_ce_mean"] < running), r
    running = min(running, r["dev_ce_mean"])
  best = rundir.resolve_checkpoint(run, "best")
  assert best.endswith(f"best/ckpt-{best_step}")
  want = _model_weights(str(run / f"ckpt-{best_step}"))
  for name, value in _model_weights(best).items():
    np.testing.assert_array_equal(value, want[name], err_msg=name)


def test_no_best_checkpoint_without_dev_data_or_with_nokeep_best(tmp_path):
  _train(_config(tmp_path, "no_dev", train_steps=4))
  _train(_config(tmp_path, "off", train_steps=4, eval_every=2, keep_best=False),
         dev_datasets=_dev())
  for name in ("no_dev", "off"):
    assert not (tmp_path / name / "best").exists()
    with pytest.raises(rundir.RunDirError,
                       match="no best-on-dev checkpoint.*--checkpoint=latest"):
      rundir.resolve_checkpoint(tmp_path / name, "best")
    assert rundir.resolve_checkpoint(tmp_path / name, "latest").endswith(
        "ckpt-4")


def test_early_stopping_resumes_where_an_uninterrupted_run_stops(tmp_path):
  """Patience state lives in the checkpoint: stop at 10 + resume == straight."""
  common = dict(eval_every=2, checkpoint_every=2, early_stopping_patience=3,
                early_stopping_min_delta=0.05)
  straight = _train(_config(tmp_path, "a", train_steps=200, **common),
                    dev_datasets=_dev())
  first = _train(_config(tmp_path, "b", train_steps=10, **common),
                 dev_datasets=_dev())
  assert first.stopped_by in ("train_steps", "early_stopping")
  resumed = _train(_config(tmp_path, "b", train_steps=200, **common),
                   dev_datasets=_dev())
  assert (resumed.step, resumed.stopped_by) == (straight.step,
                                                straight.stopped_by)


def test_time_budget_stops_saves_and_evaluates(tmp_path):
  config = _config(tmp_path, train_steps=100000, checkpoint_every=1000,
                   max_train_seconds=3.0)
  result = _train(config, dev_datasets=_dev())
  assert result.stopped_by == "time_budget"
  assert 0 < result.step < 100000
  assert result.last_checkpoint.endswith(f"ckpt-{result.step}")
  assert result.dev_ce is not None
  records = metrics_log.read_metrics(tmp_path / "run" / "metrics.jsonl")
  end = records[-1]
  assert end["kind"] == "end" and end["stopped_by"] == "time_budget"
  assert 3.0 <= end["train_seconds"] < 60.0
  # The clock is checkpointed: the same budget does not train again.
  again = _train(config, dev_datasets=_dev())
  assert again.step == result.step


def test_cpu_budget_counts_the_steps_cpu_seconds_over_resumes(tmp_path):
  config = _config(tmp_path, train_steps=100000, checkpoint_every=1000,
                   max_train_cpu_seconds=2.0)
  result = _train(config)
  assert result.stopped_by == "cpu_budget" and 0 < result.step < 100000
  records = metrics_log.read_metrics(tmp_path / "run" / "metrics.jsonl")
  end = records[-1]
  assert end["stopped_by"] == "cpu_budget"
  assert 2.0 <= end["train_cpu_seconds"] < 2.0 + 5.0
  # The logged step CPU seconds add up to the budget the run spent (the
  # checkpointed counter keeps whole milliseconds per step).
  trains = [r for r in records if r["kind"] == "train"]
  logged = sum(r["step_cpu_sec"] * config.log_every for r in trains)
  assert logged <= end["train_cpu_seconds"] + 1e-3 * result.step
  # The CPU clock is checkpointed: the same budget does not train again.
  again = _train(config)
  assert again.step == result.step


@pytest.mark.parametrize("field,value", [
    ("max_train_seconds", -1.0), ("max_train_cpu_seconds", -2.0),
    ("early_stopping_patience", -1),
    ("early_stopping_min_delta", -0.1)])
def test_bad_stopping_settings_name_the_flag(tmp_path, field, value):
  with pytest.raises(train_lib.TrainConfigError, match=f"--{field}="):
    _config(tmp_path, **{field: value})


def test_early_stopping_needs_dev_evaluations(tmp_path):
  with pytest.raises(train_lib.TrainConfigError, match="--eval_every"):
    _config(tmp_path, early_stopping_patience=2, eval_every=0)


class _SourceBlind(tf.Module):
  """The toy translator with every source token replaced by token 3."""

  def __init__(self):
    super().__init__()
    self.inner = toy_model.ToyTranslator(vocab_size=VOCAB + 1)

  def __call__(self, batch, *, training, seed=None):
    blind = dict(batch, inputs=tf.where(batch["inputs"] > 0, 3, 0))
    return self.inner(blind, training=training, seed=seed)


def test_source_reliance_is_zero_for_a_model_that_ignores_its_source():
  from m4moe.training import step as step_lib  # pylint: disable=g-import-not-at-top
  pairs = [(s, t) for s, t in PAIRS if len(s) == 6][:32]  # equal lengths
  dev = synthetic.pairs_dataset(pairs, batch_size=8, length=10,
                                shuffle_seed=None, repeat=False)
  def gap(model):
    variables = list(model.trainable_variables)
    opt = optimizer_lib.Adafactor(optimizer_lib.AdafactorConfig())
    opt.build(variables)
    runner = step_lib.StepRunner(model=model, optimizer=opt,
                                 variables=variables,
                                 strategy=tf.distribute.get_strategy(),
                                 label_smoothing=0.0)
    ce_sum, tokens, value = runner.evaluate_with_source_reliance(dev)
    plain_sum, plain_tokens = runner.evaluate(dev)
    assert (ce_sum, tokens) == pytest.approx((plain_sum, plain_tokens))
    return value
  assert gap(_SourceBlind()) == pytest.approx(0.0, abs=1e-6)
  assert abs(gap(toy_model.ToyTranslator(vocab_size=VOCAB + 1))) > 1e-4


def test_interval_summary_hand_checked():
  interval = metrics_lib.Interval()
  interval.add(ce_sum=6.0, objective=2.0, target_tokens=3.0,
               source_tokens=5.0, seconds=1.0, cpu_seconds=0.5)
  interval.add(ce_sum=2.0, objective=4.0, target_tokens=1.0,
               source_tokens=3.0, seconds=3.0, cpu_seconds=1.5)
  assert interval.summary() == {
      "train_ce": 2.0, "train_loss": 3.0, "step_time_sec": 2.0,
      "step_cpu_sec": 1.0, "tokens_per_sec": 3.0,
      "target_tokens_per_sec": 1.0}
