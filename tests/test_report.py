"""m4moe-report on hand-made eval JSONs: averages, ordering, files, figure."""

import dataclasses
import json

import numpy as np
import pytest
from matplotlib import image as mpimg

from m4moe import config as config_lib
from m4moe.cost import model as cost
from m4moe.eval import comparison
from m4moe.eval import report
from m4moe.eval import results
from m4moe.eval import scoring
from m4moe.eval import smoothing
from m4moe.eval import training_logs
from m4moe.training import metrics_log

SIZES = {"de": 1000, "fr": 800, "ru": 500, "zh": 300, "sw": 100, "yo": 50,
         "ga": 20}
BASELINE = {"de": 30, "fr": 28, "ru": 20, "zh": 15, "sw": 8}
MODEL_A = {"de": 32, "fr": 29, "ru": 24, "zh": 20, "sw": 14, "yo": 10}
MODEL_B = {"de": 31, "fr": 30, "ru": 22, "zh": None, "sw": 12, "yo": 9,
           "ga": 5}
BOUNDS = comparison.BucketBounds(high_min=600, low_max=200)


def _result(name, bleus, *, kind="multilingual", metadata=None):
  langs = {}
  for lang, bleu in bleus.items():
    common = dict(language=lang, source_lang=lang, target_lang="en",
                  train_size=SIZES[lang])
    if bleu is None:
      langs[lang] = scoring.LanguageScore(num_segments=0, status="empty",
                                          **common)
    else:
      langs[lang] = scoring.LanguageScore(
          num_segments=10, bleu=float(bleu), chrf=2.0 * bleu + 1.0,
          bleu_signature="BLEU|tok:13a", chrf_signature="chrF2++|nw:2",
          **common)
  return results.EvalResult(model=name, kind=kind, metadata=metadata or {},
                            languages=langs)


def _inputs(tmp_path):
  moe_config = config_lib.load_model_config("tiny/moe")
  model_a = _result("moe", MODEL_A,
                    metadata={"config": moe_config.to_dict()})
  model_b = _result("dense", MODEL_B, metadata={
      "num_params": 123456, "num_experts": 0, "num_layers": 8})
  # Baselines: one file per language, as bilingual training produces.
  baselines = [_result(f"bi-{l}", {l: b}, kind="bilingual")
               for l, b in BASELINE.items()]
  paths = []
  for r in [model_a, model_b, *baselines]:
    path = tmp_path / "in" / f"{r.model}.json"
    results.write_eval_json(r, path)
    paths.append(path)
  return model_a, model_b, baselines, moe_config


def test_comparison_orders_buckets_and_averages(tmp_path):
  model_a, model_b, baselines, _ = _inputs(tmp_path)
  comp = comparison.compare([model_a, model_b], baselines, bounds=BOUNDS)
  assert comp.languages == ("de", "fr", "ru", "zh", "sw", "yo", "ga")
  assert [comp.buckets[l] for l in comp.languages] == [
      "high", "high", "mid", "mid", "low", "low", "low"]
  assert comp.averaged == ("de", "fr", "ru", "sw")
  assert comp.delta["moe"]["sw"] == pytest.approx(6.0)
  assert comp.delta["moe"]["yo"] is None   # no baseline
  assert comp.delta["dense"]["zh"] is None  # empty split
  a = comp.averages["moe"]
  assert a["all"].bleu == pytest.approx((32 + 29 + 24 + 14) / 4)
  assert a["all"].delta == pytest.approx((2 + 1 + 4 + 6) / 4)
  assert (a["high"].delta, a["mid"].delta, a["low"].delta) == (
      pytest.approx(1.5), pytest.approx(4.0), pytest.approx(6.0))
  assert (a["high"].count, a["mid"].count, a["low"].count) == (2, 1, 1)
  b = comp.averages["dense"]["all"]
  assert (b.bleu, b.delta) == (pytest.approx(23.75), pytest.approx(2.25))
  base = comp.averages[comparison.BASELINE_NAME]["all"]
  assert (base.bleu, base.delta) == (pytest.approx(21.5), pytest.approx(0))
  assert comp.excluded["zh"] == ("empty test split in dense",)
  assert comp.excluded["yo"] == ("no bilingual baseline",)
  assert comp.excluded["ga"] == ("not evaluated by moe",
                                 "no bilingual baseline")


def test_default_buckets_are_terciles_and_unknown_sizes_go_last():
  sizes = [1000, 800, 500, 300, 100, 50, 20]
  bounds = comparison.tercile_bounds(sizes)
  assert (bounds.high_min, bounds.low_max) == (500, 100)
  assert [bounds.bucket(s) for s in sizes] == [
      "high", "high", "high", "mid", "mid", "low", "low"]
  assert comparison.order_languages({"a": None, "b": 5, "c": 9, "d": 5}) == (
      "c", "b", "d", "a")
  with pytest.raises(ValueError, match="bucket_bounds"):
    comparison.BucketBounds(high_min=10, low_max=20)


def test_lowess_reproduces_lines_and_smooths_noise():
  x = np.arange(30.0)
  np.testing.assert_allclose(smoothing.lowess(x, 3 - 0.5 * x), 3 - 0.5 * x,
                             atol=1e-9)
  noisy = np.sin(x / 5) + np.where(x % 2 == 0, 0.5, -0.5)
  trend = smoothing.lowess(x, noisy, frac=0.3)
  assert np.abs(trend - np.sin(x / 5)).mean() < 0.25
  assert np.abs(noisy - np.sin(x / 5)).mean() == pytest.approx(0.5)


def _write_log(path):
  lines = [json.dumps({"kind": "start", "step": 0, "time": 1000.0,
                       "devices": 2})]
  for i, ce in enumerate([5.0, 4.0, 3.0, 2.5, 2.0], start=1):
    record = {
        "kind": "train", "step": 10 * i, "time": 1000.0 + 5 * i,
        "tokens_seen": 1000 * i, "train_ce": ce, "step_time_sec": 0.5,
        "batch_tokens": 100, "devices": 2}
    if i >= 2:  # the first record has no router statistics
      record["router"] = {
          "encoder/layer_1/moe": {"load_cv": 0.1 * i, "dropped_first": 0.0,
                                  "dropped_second": 0.02 * i,
                                  "aux_loss": 1.5},
          "decoder/layer_1/moe": {"load_cv": 0.3 * i, "dropped_first": 0.1,
                                  "dropped_second": 0.04 * i,
                                  "aux_loss": 1.1}}
    lines.append(json.dumps(record))
    lines.append(json.dumps({"kind": "eval", "step": 10 * i,
                             "dev_ce_mean": ce}))
  lines.insert(3, "{truncated by a crash")
  path.write_text("\n".join(lines) + "\n")


def test_training_log_tables(tmp_path):
  path = tmp_path / "metrics.jsonl"
  _write_log(path)
  records = metrics_log.read_metrics(path)
  costs = training_logs.training_cost(records)
  assert costs.devices == 2 and costs.batch_tokens == 100
  assert costs.steps_per_sec == pytest.approx(2.0)
  assert costs.wall_hours == pytest.approx(25 / 3600)
  assert costs.device_hours == pytest.approx(50 / 3600)
  assert (costs.steps, costs.tokens) == (50, 5000)
  assert training_logs.tokens_to_reach(records, [4.0, 3.0, 1.0]) == {
      4.0: 2000, 3.0: 3000, 1.0: None}
  # Tolerant: no step_time_sec -> step/time deltas; "tokens" field.
  bare = [{"step": 0, "time": 0.0}, {"step": 8, "time": 2.0, "tokens": 7,
                                     "train_ce": 0.1},
          {"step": 9, "time": 3.0}, {"step": 12, "time": 4.0}]
  # Median of the interval rates 4, 1, 3 steps/s.
  assert training_logs.training_cost(bare).steps_per_sec == pytest.approx(3)
  # The first (compiling) interval does not drag the rate down.
  slow_start = [{"step": 10, "step_time_sec": 5.0}, {"step": 20,
                "step_time_sec": 0.5}, {"step": 30, "step_time_sec": 0.5}]
  assert training_logs.training_cost(slow_start).steps_per_sec == (
      pytest.approx(2.0))
  # CPU seconds per step: the median of the intervals that logged one.
  assert training_logs.training_cost(slow_start).cpu_sec_per_step is None
  cpu = [{"step": 10, "step_cpu_sec": 4.0}, {"step": 20},
         {"step": 30, "step_cpu_sec": 0.7}, {"step": 40, "step_cpu_sec": 0.9},
         {"kind": "eval", "step": 40, "step_cpu_sec": 99.0}]
  assert training_logs.training_cost(cpu).cpu_sec_per_step == (
      pytest.approx(0.9))
  assert training_logs.tokens_to_reach(bare, [0.5]) == {0.5: 7}


def test_router_trajectory_averages_layers_and_samples_points(tmp_path):
  path = tmp_path / "metrics.jsonl"
  _write_log(path)
  points = training_logs.router_trajectory(metrics_log.read_metrics(path))
  assert [p.step for p in points] == [20, 30, 40, 50]
  last = points[-1]  # i = 5: load CV 0.5 and 1.5, dropped 2nd 0.1 and 0.2
  assert last.layers == 2
  assert last.load_cv_mean == pytest.approx(1.0)
  assert last.load_cv_max == pytest.approx(1.5)
  assert last.dropped_first == pytest.approx(0.05)
  assert last.dropped_second == pytest.approx(0.15)
  assert last.aux_loss == pytest.approx(1.3)
  sampled = training_logs.sample_points(points, count=3)
  assert [p.step for p in sampled] == [20, 40, 50]  # indices 0, 1.5->2, 3
  assert training_logs.sample_points(points, count=9) == points


def test_write_report_files_figure_and_tables(tmp_path):
  model_a, model_b, baselines, moe_config = _inputs(tmp_path)
  log = tmp_path / "moe_metrics.jsonl"
  _write_log(log)
  files = report.write_report(
      tmp_path / "out", models=[model_a, model_b], baselines=baselines,
      bounds=BOUNDS, training_log_paths={"moe": str(log)},
      ce_thresholds=(4.0, 3.0, 1.0))
  for path in (files.markdown, files.html, files.png, files.summary):
    assert path.is_file() and path.stat().st_size > 0
  pixels = mpimg.imread(str(files.png))
  assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
  # The figure: one trendline per model, in the axes, plus the zero line.
  fig = files.figure
  ax = fig.figure.axes[0]
  assert set(fig.trendlines) == {"moe", "dense"}
  for model, line in fig.trendlines.items():
    assert line in ax.get_lines()
    assert line.get_label() == f"{model} trend"
  assert fig.zero_line in ax.get_lines()
  assert set(fig.zero_line.get_ydata()) == {0}
  assert fig.plotted["moe"] == ("de", "fr", "ru", "zh", "sw")
  np.testing.assert_allclose(fig.trendlines["moe"].get_xdata(), [0, 1, 2, 3, 4])
  assert [t.get_text() for t in ax.get_xticklabels()] == list(
      files.comparison.languages)
  md = files.markdown.read_text()
  assert "LOWESS" in md and "high: train pairs >= 600" in md
  assert "- yo: no bilingual baseline" in md
  assert "- zh: empty test split in dense" in md
  assert "- ga: not evaluated by moe; no bilingual baseline" in md
  # Table-1 row: params from m4moe.cost.model for the config, metadata otherwise.
  params = f"{cost.num_params(moe_config):,}"
  assert (f"| moe | {params} | 8 | 8 | {cost.num_experts_total(moe_config)}"
          f" | 24.8 | +3.2 |") in md
  assert "| dense | 123,456 | dense | 8 | – | 23.8 | +2.2 | metadata |" in md
  assert "| moe | 2 | 2 | – | 100 |" in md       # Table 3 style
  assert "| moe | 2,000 | 3,000 | – |" in md       # Table 2 style
  # Router statistics over training: figure and sampled table rows.
  assert (tmp_path / "out" / report.ROUTER_FIGURE_FILE).is_file()
  assert "| moe | 50 | 2 | 1.000 | 1.500 | 5.0% | 15.0% | 1.300 |" in md
  assert "| moe | 20 | 2 | 0.400 | 0.600 | 5.0% | 6.0% | 1.300 |" in md
  html_text = files.html.read_text()
  assert "data:image/png;base64," in html_text
  assert 'src="delta_bleu.png"' not in html_text
  summary = json.loads(files.summary.read_text())
  assert summary["averaged"] == ["de", "fr", "ru", "sw"]
  # No baseline has a training log: no dev cross-entropy section.
  assert "Dev cross-entropy" not in md and summary["dev_ce"] is None


def test_report_rejects_unknown_training_log_model(tmp_path):
  model_a, model_b, baselines, _ = _inputs(tmp_path)
  with pytest.raises(ValueError, match="unknown models"):
    report.write_report(tmp_path / "o", models=[model_a],
                        training_log_paths={"nope": str(tmp_path)})


def test_a_baselines_log_can_be_given_by_its_model_name(tmp_path):
  # bi-sw's model directory has no log (a landed baseline on another
  # machine): naming it reads its dev CE from the given copy.
  models, baselines = _dev_ce_inputs(tmp_path)
  _write_dev_log(tmp_path / "landed", {"sw": 5.0})
  files = report.write_report(
      tmp_path / "out", models=models, baselines=baselines, bounds=BOUNDS,
      training_log_paths={"bi-sw": str(tmp_path / "landed/metrics.jsonl")})
  summary = json.loads(files.summary.read_text())["dev_ce"]
  assert summary["baseline"]["sw"] == 5.0
  assert summary["averaged"] == ["de", "fr", "ru", "zh", "sw"]
  assert summary["models"]["moe"]["delta"]["sw"] == 1.0
  assert summary["models"]["dense"]["delta"]["sw"] == 0.5


def test_a_log_name_that_several_baselines_share_is_refused(tmp_path):
  models, baselines = _dev_ce_inputs(tmp_path)
  same = [dataclasses.replace(b, model="bi") for b in baselines]
  with pytest.raises(ValueError, match="several baselines share"):
    report.write_report(tmp_path / "o", models=models, baselines=same,
                        training_log_paths={"bi": str(tmp_path)})
  assert not (tmp_path / "o").exists()


def test_report_cli(tmp_path):
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  _inputs(tmp_path)
  out = tmp_path / "cli"
  proc = subprocess.run(
      [sys.executable, "-m", "m4moe.cli.report",
       f"--models={tmp_path}/in/moe.json,{tmp_path}/in/dense.json",
       f"--baselines={tmp_path}/in/bi-*.json", f"--output_dir={out}",
       "--bucket_bounds=600,200"], capture_output=True, text=True,
      timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr
  assert "Averaged over 4 of 7 languages" in proc.stdout
  assert "moe: all: BLEU 24.75 ΔBLEU 3.25 (n=4)" in proc.stdout
  assert (out / "report.html").is_file() and (out / "delta_bleu.png").is_file()
  bad = subprocess.run(
      [sys.executable, "-m", "m4moe.cli.report", f"--models={tmp_path}/x.json",
       f"--output_dir={out}"], capture_output=True, text=True, timeout=120,
      check=False)
  assert bad.returncode != 0 and "matches no file" in bad.stderr


def test_report_without_baselines_says_so(tmp_path):
  model_a, _, _, _ = _inputs(tmp_path)
  files = report.write_report(tmp_path / "nb", models=[model_a])
  md = files.markdown.read_text()
  assert "No bilingual baseline eval JSONs were given" in md
  assert files.comparison.averages["moe"]["all"].delta is None
  assert files.comparison.averages["moe"]["all"].bleu == pytest.approx(
      sum(MODEL_A.values()) / len(MODEL_A))


def test_chrf_metric_compares_chrf_everywhere(tmp_path):
  model_a, model_b, baselines, _ = _inputs(tmp_path)
  comp = comparison.compare([model_a, model_b], baselines, bounds=BOUNDS,
                            metric="chrf")
  assert comp.metric_name == "chrF++"
  # chrF++ = 2 * BLEU + 1 in these inputs, so every delta doubles.
  assert comp.bleu["moe"]["de"] == pytest.approx(65.0)
  assert comp.delta["moe"]["de"] == pytest.approx(4.0)
  assert comp.delta["moe"]["sw"] == pytest.approx(12.0)
  files = report.write_report(tmp_path / "chrf", models=[model_a, model_b],
                              baselines=baselines, bounds=BOUNDS,
                              metric="chrf")
  md = files.markdown.read_text()
  assert "ΔchrF++ vs bilingual baselines (Figure 6 style)" in md
  assert "| language | train pairs | bucket | baseline chrF++ |" in md
  assert "ΔBLEU" not in md
  assert files.figure.figure.axes[0].get_ylabel() == (
      "ΔchrF++ vs bilingual baseline")
  with pytest.raises(ValueError, match="--metric='ter'"):
    comparison.compare([model_a], baselines, metric="ter")


# Dev cross-entropy (last dev evaluation of each run), multiples of 1/4 so
# every mean below is exact. Baseline bi-sw has no log; yo, ga have no
# baseline; dense has no ga.
BASELINE_CE = {"de": 3.0, "fr": 3.5, "ru": 4.0, "zh": 4.5}
MOE_CE = {"de": 2.5, "fr": 3.0, "ru": 3.5, "zh": 5.0, "sw": 4.0, "yo": 4.0,
          "ga": 6.0}
DENSE_CE = {"de": 3.25, "fr": 3.25, "ru": 3.0, "zh": 4.0, "sw": 4.5,
            "yo": 4.5}


def _write_dev_log(model_dir, dev_ce):
  """A metrics.jsonl whose last eval record has ``dev_ce``."""
  model_dir.mkdir(parents=True)
  records = [
      {"kind": "eval", "step": 10, "dev_ce": {l: 9.0 for l in dev_ce}},
      {"kind": "train", "step": 20, "train_ce": 1.0},
      {"kind": "eval", "step": 20, "dev_ce": dev_ce, "dev_ce_mean": 1.0}]
  (model_dir / "metrics.jsonl").write_text(
      "\n".join(json.dumps(r) for r in records) + "\n")
  return {"model_dir": str(model_dir)}


def _dev_ce_inputs(tmp_path):
  models = [_result("moe", MODEL_A,
                    metadata=_write_dev_log(tmp_path / "moe", MOE_CE)),
            _result("dense", MODEL_B,
                    metadata=_write_dev_log(tmp_path / "dense", DENSE_CE)),
            _result("nolog", MODEL_A)]
  baselines = []
  for lang, bleu in BASELINE.items():
    metadata = ({"model_dir": str(tmp_path / f"bi-{lang}")}
                if lang not in BASELINE_CE else
                _write_dev_log(tmp_path / f"bi-{lang}",
                               {lang: BASELINE_CE[lang]}))
    baselines.append(_result(f"bi-{lang}", {lang: bleu}, kind="bilingual",
                             metadata=metadata))
  return models, baselines


def test_final_dev_ce_takes_the_last_eval_record_with_dev_ce():
  records = [{"kind": "eval", "step": 1, "dev_ce": {"de": 5.0}},
             {"kind": "eval", "step": 2, "dev_ce": {"de": 4.0, "fr": "x"}},
             {"kind": "train", "step": 3, "dev_ce": {"de": 1.0}},
             {"kind": "eval", "step": 3, "dev_ce_mean": 2.0}]
  assert training_logs.final_dev_ce(records) == {"de": 4.0}
  assert training_logs.final_dev_ce(records[2:]) == {}
  assert training_logs.final_dev_ce([]) == {}


def test_report_dev_ce_vs_baselines(tmp_path):
  models, baselines = _dev_ce_inputs(tmp_path)
  files = report.write_report(tmp_path / "out", models=models,
                              baselines=baselines, bounds=BOUNDS)
  summary = json.loads(files.summary.read_text())["dev_ce"]
  assert summary["averaged"] == ["de", "fr", "ru", "zh"]
  assert summary["baseline"] == {**BASELINE_CE, "sw": None, "yo": None,
                                 "ga": None}
  moe, dense = summary["models"]["moe"], summary["models"]["dense"]
  assert moe["ce"] == MOE_CE
  assert moe["delta"] == {"de": 0.5, "fr": 0.5, "ru": 0.5, "zh": -0.5,
                          "sw": None, "yo": None, "ga": None}
  assert dense["delta"]["de"] == -0.25 and dense["ce"]["ga"] is None
  assert moe["buckets"] == {
      "all": {"ce": 3.5, "delta": 0.25, "count": 4, "wins": 3},
      "high": {"ce": 2.75, "delta": 0.5, "count": 2, "wins": 2},
      "mid": {"ce": 4.25, "delta": 0.0, "count": 2, "wins": 1},
      "low": {"ce": None, "delta": None, "count": 0, "wins": 0}}
  assert dense["buckets"]["all"] == {"ce": 3.375, "delta": 0.375,
                                     "count": 4, "wins": 3}
  assert dense["buckets"]["mid"] == {"ce": 3.5, "delta": 0.75, "count": 2,
                                     "wins": 2}
  assert summary["baseline_buckets"]["all"] == {
      "ce": 3.75, "delta": None, "count": 4, "wins": None}
  assert "nolog" not in summary["models"]
  md = files.markdown.read_text()
  assert (md.index("## Per-language BLEU")
          < md.index("## Dev cross-entropy vs bilingual baselines")
          < md.index("## Training cost"))
  assert "ΔCE = baseline dev CE − model dev CE" in md
  assert ("| moe | 3.50 | +0.25 | 4 | 3 | 2.75 | +0.50 | 2 | 2 | 4.25 | "
          "+0.00 | 2 | 1 | – | – | 0 | 0 |") in md
  assert ("| dense | 3.38 | +0.38 | 4 | 3 | 3.25 | +0.00 | 2 | 1 | 3.50 | "
          "+0.75 | 2 | 2 | – | – | 0 | 0 |") in md
  assert ("| bilingual baselines | 3.75 | – | 4 | – | 3.25 | – | 2 | – | "
          "4.25 | – | 2 | – | – | – | 0 | – |") in md
  assert ("| language | bucket | baseline dev CE | moe dev CE | moe ΔCE | "
          "dense dev CE | dense ΔCE | in averages |") in md
  assert "| de | high | 3.00 | 2.50 | +0.50 | 3.25 | -0.25 | yes |" in md
  assert "| zh | mid | 4.50 | 5.00 | -0.50 | 4.00 | +0.50 | yes |" in md
  assert "| sw | low | – | 4.00 | – | 4.50 | – | no |" in md
  assert "| ga | low | – | 6.00 | – | – | – | no |" in md
  # Gaps are listed, never dropped.
  assert ("- model nolog: no training log (--training_logs or "
          "metadata.model_dir/metrics.jsonl)") in md
  assert ("- sw: baseline bi-sw has no training log "
          "(metadata.model_dir/metrics.jsonl)") in md
  assert "- yo: no bilingual baseline" in md
  assert ("- ga: no bilingual baseline; not in dense's last dev evaluation"
          in md)


def test_report_dev_ce_rejects_two_baselines_for_one_language(tmp_path):
  models, baselines = _dev_ce_inputs(tmp_path)
  extra = _result("bi-de-2", {"de": 1.0}, kind="bilingual")
  with pytest.raises(ValueError, match="bi-de and bi-de-2 both cover de"):
    report.write_report(tmp_path / "dup", models=models,
                        baselines=[*baselines, extra], bounds=BOUNDS)


def test_dev_ce_and_stopping_come_from_the_scored_checkpoint(tmp_path):
  """A baseline early-stopped two evaluations after its best and scored at
  best/ckpt-200: its dev CE is that of step 200, and the report says how it
  was sized and which checkpoint was scored."""
  records = [
      {"kind": "start", "step": 0},
      {"kind": "eval", "step": 200, "dev_ce": {"de": 3.0},
       "dev_ce_mean": 3.0, "new_best": True},
      {"kind": "train", "step": 300, "train_ce": 2.0},
      {"kind": "eval", "step": 400, "dev_ce": {"de": 3.2},
       "dev_ce_mean": 3.2, "new_best": False},
      {"kind": "eval", "step": 600, "dev_ce": {"de": 3.4},
       "dev_ce_mean": 3.4, "new_best": False},
      {"kind": "end", "step": 600, "stopped_by": "early_stopping"}]
  assert training_logs.checkpoint_step("/r/bi/best/ckpt-200") == 200
  assert training_logs.checkpoint_step("/r/bi/ckpt-600") == 600
  assert training_logs.checkpoint_step("/r/bi/model") is None
  assert training_logs.checkpoint_step(None) is None
  assert training_logs.final_dev_ce(records, step=200) == {"de": 3.0}
  assert training_logs.final_dev_ce(records, step=500) == {"de": 3.4}
  assert training_logs.final_dev_ce(records) == {"de": 3.4}
  assert training_logs.stopping(records) == training_logs.Stopping(
      steps=600, stopped_by="early_stopping", evaluations=3, best_step=200)
  assert training_logs.stopping([]) == training_logs.Stopping(
      steps=None, stopped_by=None, evaluations=0, best_step=None)
  bi_dir = tmp_path / "bi-de"
  bi_dir.mkdir()
  (bi_dir / "metrics.jsonl").write_text(
      "\n".join(json.dumps(r) for r in records) + "\n")
  moe = _result("moe", {"de": 32}, metadata=_write_dev_log(
      tmp_path / "moe", {"de": 2.5}))
  moe.metadata["checkpoint"] = str(tmp_path / "moe" / "ckpt-20")
  baseline = _result("bi-de", {"de": 30}, kind="bilingual", metadata={
      "model_dir": str(bi_dir), "checkpoint": str(bi_dir / "best/ckpt-200")})
  files = report.write_report(tmp_path / "out", models=[moe],
                              baselines=[baseline], bounds=BOUNDS)
  summary = json.loads(files.summary.read_text())["dev_ce"]
  assert summary["baseline"] == {"de": 3.0}
  assert summary["models"]["moe"]["delta"]["de"] == 0.5
  md = files.markdown.read_text()
  assert ("## How each model was trained and which checkpoint was scored"
          in md)
  assert "| moe | de | 20 | – | 1 | 20 | 20 |" in md  # one eval has a mean
  assert "| bi-de | de | 600 | early_stopping | 3 | 200 | 200 (best dev) |" in md
