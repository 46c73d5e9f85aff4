"""Smoke tests of m4moe-bench: each sub-benchmark runs at tiny sizes and
prints JSON lines carrying its config and the ratios its comparison is
about (no timing assertions)."""

import io
import json
import math
import sys

import numpy as np
import pytest
import tensorflow as tf

from m4moe import config as config_lib
from m4moe.model import losses
from m4moe.model import numerics
from m4moe.benchmarks import decode
from m4moe.benchmarks import dropout
from m4moe.benchmarks import input_pipeline
from m4moe.benchmarks import loss
from m4moe.benchmarks import moe_layer
from m4moe.benchmarks import peak_rss
from m4moe.benchmarks import timing
from m4moe.benchmarks import train_step
from m4moe.cli import bench


def _finite_positive(record, *keys):
  for key in keys:
    assert math.isfinite(record[key]) and record[key] > 0, (key, record)


def test_interleaved_runs_round_robin_after_warmup():
  calls = []
  times = timing.interleaved({"a": lambda: calls.append("a"),
                              "b": lambda: calls.append("b")},
                             reps=3, warmup=1)
  assert calls == ["a", "b"] * 4
  assert [len(v) for v in times.seconds.values()] == [3, 3]
  with pytest.raises(ValueError, match="--reps"):
    timing.interleaved({"a": lambda: None}, reps=0)


def test_interleaved_reads_the_chosen_clock(monkeypatch):
  ticks = iter(range(0, 100, 5))  # a fake CPU clock: 5 s per reading
  monkeypatch.setitem(timing.CLOCKS, "cpu", lambda: next(ticks))
  times = timing.interleaved({"a": lambda: None, "b": lambda: None}, reps=2,
                             clock="cpu")
  assert times.seconds == {"a": [5, 5], "b": [5, 5]}
  with pytest.raises(ValueError, match="--clock=gpu: use wall or cpu"):
    timing.interleaved({"a": lambda: None}, reps=1, clock="gpu")


def test_emit_prints_one_json_line(capsys):
  timing.emit({"x": 1.23456789, "y": [0.5], "z": "s"})
  out = capsys.readouterr().out
  assert out.count("\n") == 1
  assert json.loads(out) == {"x": 1.23457, "y": [0.5], "z": "s"}


def test_buffer_accounting_einsum_grows_with_s_e_c():
  point = moe_layer.LayerPoint(num_experts=128)
  einsum = moe_layer.buffer_bytes(point, dispatch="einsum")
  index = moe_layer.buffer_bytes(point, dispatch="index")
  g, s, c = 4, 1024, point.capacity
  assert c == 20
  assert einsum["routing_bytes"] >= 4 * 2 * g * s * 128 * c
  assert index["routing_bytes"] < einsum["routing_bytes"] / 5
  assert index["expert_buffer_bytes"] == 2 * 4 * 128 * g * c * 512
  # sorted: exactly the T = G*S*K useful rows, no capacity padding.
  sorted_ = moe_layer.buffer_bytes(point, dispatch="sorted")
  assert sorted_["expert_buffer_bytes"] == 2 * 4 * g * s * 2 * 512
  assert sorted_["total_bytes"] < index["total_bytes"]


def test_moe_layer_tiny(capsys):
  point = moe_layer.LayerPoint(num_experts=4, model_dim=8, hidden_dim=16,
                               num_tokens=32, group_size=16, top_k=1)
  records = list(moe_layer.run_point(
      point, dispatches=("sorted", "index", "einsum"), jits=(False,), reps=1,
      matmul_size=32, clock="cpu"))
  cases = {r["case"]: r for r in records}
  assert set(cases) == {"moe_sorted_nojit", "moe_index_nojit",
                        "moe_einsum_nojit", "dense_nojit"}
  for name in ("moe_sorted_nojit", "moe_index_nojit", "moe_einsum_nojit"):
    _finite_positive(cases[name], "speed_vs_dense", "fraction_of_matmul",
                     "useful_gflops_per_sec", "total_bytes")
    assert cases[name]["num_experts"] == 4 and cases[name]["top_k"] == 1
    assert cases[name]["clock"] == "cpu"
  timing.emit(records[0])
  assert json.loads(capsys.readouterr().out)["benchmark"] == "moe_layer"


def test_moe_layer_fine_grained_top_k():
  # k > 2 is the token-choice topk router (the fine-grained MoE's); the
  # dense baseline is then K*H wide: 8 x 4 = 32 here.
  point = moe_layer.LayerPoint(num_experts=16, model_dim=8, hidden_dim=4,
                               num_tokens=32, group_size=16, top_k=8)
  config = moe_layer.model_config(point, dispatch="sorted")
  assert config.moe.router == "topk" and config.moe.num_selected_experts == 8
  assert point.useful_flops == 12.0 * 32 * 8 * 8 * 4
  records = {r["case"]: r for r in moe_layer.run_point(
      point, dispatches=("sorted",), jits=(False,), reps=1, matmul_size=0,
      clock="cpu")}
  _finite_positive(records["moe_sorted_nojit"], "speed_vs_dense")
  with pytest.raises(ValueError, match="--top_ks=9 with --experts=8"):
    moe_layer.LayerPoint(num_experts=8, top_k=9)


def test_moe_layer_parts_split_the_layer():
  point = moe_layer.LayerPoint(num_experts=4, model_dim=8, hidden_dim=16,
                               num_tokens=32, group_size=16, top_k=2)
  records = {r["case"]: r for r in moe_layer.run_point(
      point, dispatches=("sorted", "index"), jits=(False,), reps=1,
      matmul_size=0, clock="cpu", parts=True)}
  assert set(records) == {
      "moe_sorted_nojit", "moe_index_nojit", "moe_sorted_noexperts_nojit",
      "moe_index_noexperts_nojit", "router_nojit", "dense_nojit"}
  assert set(records["router_nojit"]["share_of_layer"]) == {
      "moe_sorted_nojit", "moe_index_nojit"}
  assert set(records["moe_index_noexperts_nojit"]["share_of_layer"]) == {
      "moe_index_nojit"}
  for name in ("router_nojit", "moe_sorted_noexperts_nojit"):
    for share in records[name]["share_of_layer"].values():
      assert np.isfinite(share) and share > 0
    _finite_positive(records[name], "speed_vs_dense")
    assert "useful_gflops_per_sec" not in records[name]


@pytest.mark.parametrize("dispatch", ["sorted", "index", "einsum"])
def test_pass_through_experts_leave_routing_dispatch_and_combine(dispatch):
  # With identity experts each token's output is its input times the summed
  # combine weights of its dispatched choices: a capacity factor of 0.5
  # drops choices, so some tokens get less than their full weight.
  point = moe_layer.LayerPoint(num_experts=4, model_dim=8, hidden_dim=16,
                               num_tokens=32, group_size=16, top_k=2,
                               capacity_factor=0.5)
  layer = moe_layer.build_layer(point, dispatch=dispatch, experts=False)
  x = tf.random.stateless_normal([2, 16, 8], seed=[3, 4])
  mask = tf.ones([2, 16])
  out = layer(x, padding_mask=mask, training=True,
              seed=tf.constant([1, 2])).outputs
  result = layer.router(x, padding_mask=mask, capacity=point.capacity,
                        training=True, seed=numerics.fold_seed(
                            tf.constant([1, 2]), 0), group_capacity=None)
  kept = result.buffer_position.numpy() >= 0
  weight = (result.combine_weights.numpy() * kept).sum(-1)  # [G, S]
  assert 0 < kept.mean() < 1  # some choices dropped, some dispatched
  np.testing.assert_allclose(out.numpy(), x.numpy() * weight[..., None],
                             rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def one_layer_configs(tmp_path_factory):
  """tiny/moe and tiny/dense flagfiles cut to one layer each (an MoE one)."""
  root = tmp_path_factory.mktemp("configs")
  paths = []
  for name in ("moe", "dense"):
    path = root / f"{name}.flags"
    path.write_text(f"--flagfile={config_lib.resolve_config_path('tiny/' + name)}"
                    "\n--num_encoder_layers=1\n--num_decoder_layers=1\n"
                    "--moe_layer_offset=0\n--d_model=32\n--d_kv=8\n")
    paths.append(str(path))
  return tuple(paths)


@pytest.mark.slow
def test_train_step_tiny(one_layer_configs):
  point = train_step.StepPoint(batch_size=2, length=4, vocab_size=50)
  moe, dense = train_step.run(point, configs=one_layer_configs, reps=1,
                              warmup=1)
  assert (moe["config"], dense["config"]) == one_layer_configs
  _finite_positive(moe, "tokens_per_sec",
                   f"tokens_per_sec_vs_{dense['config']}")
  assert moe["tokens_per_step"] == 16


def test_loss_comparator_computes_the_same_losses():
  # The benchmark's "before" formulation must compute what the trainer
  # computes, or its ratio compares different work.
  logits = tf.random.stateless_normal([2, 3, 17], seed=[1, 2]) * 3.0
  targets = tf.constant([[1, 16, 0], [5, 5, 2]])
  new = losses.per_token_losses(logits, targets, label_smoothing=0.1)
  old = loss.log_softmax_losses(logits, targets, label_smoothing=0.1)
  for got, want in zip(new, old):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5)


def test_loss_and_loss_step_tiny(one_layer_configs):
  point = loss.LossPoint(batch_size=2, length=3, model_dim=8, vocab_size=50)
  one_pass, old = loss.run_layer(point, reps=1, clock="cpu")
  assert one_pass["clock"] == "cpu"
  assert (one_pass["formulation"], old["formulation"]) == (
      "one_pass", "log_softmax")
  assert one_pass["benchmark"] == "loss" and one_pass["vocab_size"] == 50
  _finite_positive(one_pass, "median_sec", "speedup_vs_log_softmax")
  step_point = train_step.StepPoint(batch_size=2, length=4, vocab_size=50)
  records = list(loss.run_step(step_point, config=one_layer_configs[1],
                               reps=1))
  assert [r["formulation"] for r in records] == ["one_pass", "log_softmax"]
  assert records[0]["config"] == one_layer_configs[1]
  _finite_positive(records[0], "speedup_vs_log_softmax")


def test_the_baseline_step_keeps_its_formulation_after_the_swap(
    one_layer_configs):
  # The replaced step must have traced the baseline (not the trainer's
  # loss), keep it in its graph, and leave the module as it was.
  calls = []

  def counted(*args, **kwargs):
    calls.append(1)
    return loss.log_softmax_losses(*args, **kwargs)

  trainer_loss = losses.per_token_losses
  point = train_step.StepPoint(batch_size=2, length=4, vocab_size=50)
  current, replaced = train_step.step_with_and_without(
      one_layer_configs[1], point=point, module=losses,
      attribute="per_token_losses", replacement=counted)
  assert losses.per_token_losses is trainer_loss
  traced = len(calls)
  assert traced >= 1
  replaced()
  current()
  assert len(calls) == traced  # the graph runs; no Python call, no retrace
  with pytest.raises(AttributeError):
    train_step.step_with_and_without(
        one_layer_configs[1], point=point, module=losses,
        attribute="no_such_loss", replacement=counted)


def _tiny_recipe(configs):
  from m4moe.pipeline import recipes  # pylint: disable=g-import-not-at-top
  models = tuple(recipes.ModelRun(name=name, config=config, train_steps=1,
                                  extra_flags=flags)
                 for name, config, flags in (
                     ("dense", configs[1], ("--dropout_rate=0.1",)),
                     ("moe", configs[0], ("--num_experts=4",))))
  return recipes.Recipe(name="tiny", description="", models=models,
                        use_packaged_corpus_recipe=False,
                        source_vocab_size=60, target_vocab_size=50,
                        batch_tokens=16, sequence_length=8,
                        eval_max_sentences=1, beam_size=1)


def test_packed_batch_has_the_packers_layout():
  batch = train_step.packed_batch(rows=5, length=30, source_vocab_size=60,
                                  target_vocab_size=50)
  for side, vocab in (("inputs", 60), ("targets", 50)):
    ids = batch[side].numpy()
    segments = batch[f"{side}_segment_ids"].numpy()
    positions = batch[f"{side}_positions"].numpy()
    assert ids.shape == segments.shape == positions.shape == (5, 30)
    np.testing.assert_array_equal(ids == 0, segments == 0)
    assert ids.max() < vocab and ids[ids > 0].min() >= 3
    for row_ids, row_segments, row_positions in zip(ids, segments, positions):
      real = row_segments[row_segments > 0]
      assert (row_segments[len(real):] == 0).all()  # padding at the end
      assert real[0] == 1 and set(np.diff(real)) <= {0, 1}
      for segment in set(real):
        here = row_positions[row_segments == segment]
        np.testing.assert_array_equal(here, np.arange(len(here)))
        assert 4 <= len(here) <= 24


def test_recipe_models_add_flags_and_name_the_unknown(one_layer_configs):
  recipe = _tiny_recipe(one_layer_configs)
  models = train_step.recipe_models(recipe, ["dense", "moe+--dispatch=index"])
  assert models == {
      "dense": (one_layer_configs[1], ("--dropout_rate=0.1",)),
      "moe+--dispatch=index": (one_layer_configs[0], (
          "--num_experts=4", "--dispatch=index"))}
  with pytest.raises(ValueError, match="tiny has no model 'big'; use any "
                     "of dense,moe"):
    train_step.recipe_models(recipe, ["big"])


def test_recipe_models_leave_out_budgets_and_load_as_model_configs():
  # A recipe that selects at equal CPU time gives each model a budget
  # flag, which is m4moe-train's and not a model flag: the step keeps
  # every other flag and its config loads.
  from m4moe import config as config_lib  # pylint: disable=g-import-not-at-top
  from m4moe.pipeline import recipes  # pylint: disable=g-import-not-at-top
  recipe = recipes.load_recipe("study4_screen")
  names = [model.name for model in recipe.models]
  models = train_step.recipe_models(recipe, names)
  for model in recipe.models:
    config, flags = models[model.name]
    assert flags == tuple(f for f in model.extra_flags
                          if not f.startswith("--max_train_cpu_seconds="))
    assert len(flags) == len(model.extra_flags) - 1
    loaded = config_lib.load_model_config(
        config, flags, src_vocab_size=16000, tgt_vocab_size=8000)
    assert loaded.num_encoder_layers == 2


@pytest.mark.slow
def test_recipe_step_tiny(one_layer_configs):
  recipe = _tiny_recipe(one_layer_configs)
  dense, moe = train_step.run_recipe(recipe, specs=["dense", "moe"], reps=1,
                                     warmup=1, clock="cpu")
  assert (dense["model"], moe["model"]) == ("dense", "moe")
  assert "speed_vs_dense" not in dense
  _finite_positive(moe, "median_sec", "speed_vs_dense")
  assert (moe["batch_size"], moe["sequence_length"]) == (2, 8)
  assert moe["extra_flags"] == ["--num_experts=4"]


def test_decode_tiny(one_layer_configs):
  point = decode.DecodePoint(batch_size=2, beam_size=2, max_decode_length=3,
                             source_length=4, vocab_size=50)
  (record,) = decode.run(point, configs=one_layer_configs[:1], reps=1)
  _finite_positive(record, "cached_speedup", "cached_sentences_per_sec")
  assert record["identical_hypotheses"] is True


def test_cli_rejects_unknown_benchmark():
  with pytest.raises(bench.app.UsageError, match="moe_layer"):
    bench.main(["m4moe-bench", "nope"])


def test_decode_config_variants_set_the_dispatch():
  point = decode.DecodePoint(batch_size=1, beam_size=1, max_decode_length=2,
                             vocab_size=50)
  with pytest.raises(ValueError, match=r"unknown variant .fast.; use \+einsum"):
    decode.searches("tiny/moe+fast", point)


def test_cli_rejects_unknown_dispatch():
  flag_values = bench.flags.FLAGS
  flag_values(["m4moe-bench", "--dispatches=fast,index"])
  try:
    with pytest.raises(bench.app.UsageError, match="unknown fast"):
      bench.main(["m4moe-bench", "moe_layer"])
  finally:
    flag_values["dispatches"].unparse()


def test_cli_rejects_a_k_above_the_experts():
  flag_values = bench.flags.FLAGS
  flag_values(["m4moe-bench", "--experts=4", "--top_ks=5"])
  try:
    with pytest.raises(bench.app.UsageError,
                       match="--top_ks=5 with --experts=4"):
      bench.main(["m4moe-bench", "moe_layer"])
  finally:
    flag_values["experts"].unparse()
    flag_values["top_ks"].unparse()


@pytest.mark.parametrize("flag, value", [("top_ks", "abc"), ("experts", "8,x"),
                                         ("experts", "0")])
def test_cli_names_the_list_flag_that_is_not_positive_integers(flag, value):
  # (--sharding_devices: tests/test_bench_sharding.py)
  flag_values = bench.flags.FLAGS
  flag_values(["m4moe-bench", f"--{flag}={value}"])
  try:
    with pytest.raises(bench.app.UsageError,
                       match=f"--{flag}={value}: give positive integers"):
      bench.main(["m4moe-bench", "moe_layer"])
  finally:
    flag_values[flag].unparse()


def test_cli_rejects_parts_outside_moe_layer():
  flag_values = bench.flags.FLAGS
  flag_values(["m4moe-bench", "--parts"])
  try:
    with pytest.raises(bench.app.UsageError, match="--parts splits the "
                       "moe_layer benchmark only, not train_step"):
      bench.main(["m4moe-bench", "train_step"])
  finally:
    flag_values["parts"].unparse()


def test_cli_rejects_cpu_clock_outside_the_clocked_benchmarks_and_zero_reps():
  flag_values = bench.flags.FLAGS
  flag_values(["m4moe-bench", "--clock=cpu"])
  try:
    with pytest.raises(bench.app.UsageError, match="--clock=cpu times "
                       "moe_layer, loss, loss_step, dropout_step, "
                       "recipe_step only; "
                       "train_step times wall-clock"):
      bench.main(["m4moe-bench", "train_step"])
  finally:
    flag_values["clock"].unparse()
  with pytest.raises(bench.flags.IllegalFlagValueError):
    flag_values["reps"].parse("0")


def test_pipeline_measure_counts_tokens_and_packed_examples():
  # Row 1 packs 2 pairs, row 2 three; 0 is padding.
  batch = {"inputs_segment_ids": tf.constant([[1, 2, 2, 0], [1, 1, 2, 3]]),
           "targets_segment_ids": tf.constant([[1, 1, 2, 0], [1, 2, 3, 3]])}
  dataset = tf.data.Dataset.from_tensors(batch).repeat()
  rates = input_pipeline.measure(dataset, num_batches=3, warmup=2)
  seconds = rates["seconds"]
  assert rates["batches_per_s"] * seconds == pytest.approx(3)
  assert rates["tokens_per_s"] * seconds == pytest.approx(3 * (7 + 7))
  assert rates["examples_per_s"] * seconds == pytest.approx(3 * (2 + 3))
  finite = tf.data.Dataset.from_tensors(batch).repeat(4)
  with pytest.raises(StopIteration):
    input_pipeline.measure(finite, num_batches=3, warmup=2)


def test_cli_uses_the_shared_flag_names():
  names = set(bench.flags.FLAGS)
  assert {"sequence_length", "batch_tokens", "vocab_size"} <= names
  assert not {"length", "batch_size_tokens", "seq_len"} & names


def test_dropout_comparator_is_the_stateless_dropout_formulation():
  # The "before" case must be the masks the trainer drew before (those of
  # tf.nn.experimental.stateless_dropout), or its ratio compares other work.
  x = tf.random.stateless_normal([4, 5, 7], seed=[1, 2])
  seed = tf.constant([3, 4], tf.int32)
  np.testing.assert_array_equal(
      dropout.uniform_dropout(x, rate=0.1, training=True, seed=seed).numpy(),
      tf.nn.experimental.stateless_dropout(x, rate=0.1, seed=seed).numpy())
  assert dropout.uniform_dropout(x, rate=0.1, training=False,
                                 seed=None) is x


def test_dropout_step_tiny(one_layer_configs):
  step_point = train_step.StepPoint(batch_size=2, length=4, vocab_size=50)
  records = list(dropout.run_step(step_point, config=one_layer_configs[1],
                                  reps=1))
  assert [r["formulation"] for r in records] == ["16_bit", "float_uniform"]
  assert records[0]["benchmark"] == "dropout_step"
  assert records[0]["config"] == one_layer_configs[1]
  _finite_positive(records[0], "speedup_vs_float_uniform", "median_sec")


_ALLOCATE = ("import sys, time\n"
             "print('start', flush=True)\n"
             "block = bytearray(200 * 2**20)  # zero-filled: every page touched\n"
             "print('allocated', flush=True)\n"
             "time.sleep(1.0)\n"
             "del block\n"
             "print('freed', flush=True)\n"
             "sys.exit(int(sys.argv[1]))\n")


def test_peak_rss_finds_the_peak_and_its_phase():
  echoed = io.StringIO()
  record = peak_rss.measure([sys.executable, "-c", _ALLOCATE, "0"],
                            interval=0.05, echo=echoed)
  assert record["returncode"] == 0
  # The kernel's peak and the largest sample both hold the 200 MiB block,
  # and the last line printed before the largest sample names its phase.
  assert record["max_rss_kb"] >= 200 * 1024
  assert 200 * 1024 <= record["peak_sampled_rss_kb"] <= record["max_rss_kb"]
  assert record["peak_line"] == "allocated"
  lines = echoed.getvalue().splitlines()
  assert [line.split("] ", 1)[1] for line in lines] == [
      "start", "allocated", "freed"]
  assert all(line.startswith("[") and "rss=" in line for line in lines)


def test_peak_rss_time_is_the_end_of_the_plateau():
  # Hand-checked: the largest is 1000 KiB; 995 (within 1%) at 0.3 s is the
  # plateau's last sample, 980 at 0.4 s is below it.
  samples = [peak_rss.RssSample(0.0, 100), peak_rss.RssSample(0.1, 1000),
             peak_rss.RssSample(0.2, 990), peak_rss.RssSample(0.3, 995),
             peak_rss.RssSample(0.4, 980), peak_rss.RssSample(0.5, 10)]
  assert peak_rss._plateau_end(samples) == peak_rss.RssSample(0.3, 1000)
  assert peak_rss._plateau_end([]) == peak_rss.RssSample(0.0, 0)


def test_peak_rss_reports_failures():
  record = peak_rss.measure([sys.executable, "-c", _ALLOCATE, "3"],
                            interval=0.05)
  assert record["returncode"] == 3 and record["max_rss_kb"] >= 200 * 1024
  with pytest.raises(ValueError, match="no command given"):
    peak_rss.measure([])
  with pytest.raises(ValueError, match="interval=0 must be > 0"):
    peak_rss.measure(["true"], interval=0)


def test_cli_peak_rss(capsys):
  bench.flags.FLAGS(["m4moe-bench"])  # main reads parsed flags, as under app.run
  with pytest.raises(SystemExit) as exit_info:
    bench.main(["m4moe-bench", "peak_rss", sys.executable, "-c", _ALLOCATE,
                "2"])
  assert exit_info.value.code == 1
  captured = capsys.readouterr()
  record = json.loads(captured.out)  # the JSON line comes before the exit
  assert record["benchmark"] == "peak_rss" and record["returncode"] == 2
  assert "allocated" in captured.err
  assert "measured command exited with 2" in captured.err
  with pytest.raises(bench.app.UsageError, match="needs the command"):
    bench.main(["m4moe-bench", "peak_rss"])
  with pytest.raises(bench.app.UsageError, match="cannot run '/nonexistent"):
    bench.main(["m4moe-bench", "peak_rss", "/nonexistent/m4moe-x"])
  with pytest.raises(bench.app.UsageError, match="usage"):
    bench.main(["m4moe-bench", "train_step", "extra"])


def test_recipe_step_names_its_own_flag_for_an_unknown_recipe():
  flag_values = bench.flags.FLAGS
  flag_values(["m4moe-bench", "--step_recipe=nope"])
  try:
    with pytest.raises(bench.app.UsageError,
                       match=r"^--step_recipe=nope: no such recipe"):
      bench.main(["m4moe-bench", "recipe_step"])
  finally:
    flag_values["step_recipe"].unparse()


def test_recipe_step_default_models_are_in_the_default_recipe():
  # The recipe's model names change as the study moves on; the default
  # command must keep naming models it has.
  from m4moe.pipeline import recipes  # pylint: disable=g-import-not-at-top
  recipe = recipes.load_recipe(bench.flags.FLAGS["step_recipe"].default)
  models = train_step.recipe_models(
      recipe, bench.flags.FLAGS["recipe_models"].default)
  assert list(models) == ["dense", "moe_E64k8_every", "moe_E32_every_lr4x"]
