"""Dev CE curves at equal steps and equal CPU time (m4moe.pipeline.curves)."""

import json
import subprocess
import sys

import pytest

from m4moe.eval import training_logs
from m4moe.pipeline import curves
from m4moe.pipeline import landing
from m4moe.training import metrics_log


def test_steps_to_reach_interpolates_the_first_crossing():
  curve = [(100, 4.0), (200, 3.0), (300, 3.5), (400, 2.0)]
  assert training_logs.steps_to_reach(curve, 3.5) == 150.0
  assert training_logs.steps_to_reach(curve, 4.5) == 100.0
  assert training_logs.steps_to_reach(curve, 2.5) == pytest.approx(
      300 + 100 * 1.0 / 1.5)
  assert training_logs.steps_to_reach(curve, 1.0) is None
  assert training_logs.steps_to_reach([], 3.0) is None


def test_cpu_seconds_add_each_interval_and_refuse_partial_logs():
  records = [{"kind": "start", "step": 0},
             {"kind": "train", "step": 50, "step_cpu_sec": 2.0},
             {"kind": "eval", "step": 50, "dev_ce_mean": 5.0},
             {"kind": "train", "step": 100, "step_cpu_sec": 1.0},
             {"kind": "train", "step": 120, "step_cpu_sec": 0.5}]
  # 50 x 2.0, then 50 x 1.0, then 20 x 0.5.
  assert training_logs.cpu_seconds_at(records) == {50: 100.0, 100: 150.0,
                                                   120: 160.0}
  # A budget stopped the run between log lines: its end step carries the
  # trainer's own total, so evaluations after the last log line have a
  # CPU time too.
  ended = records + [{"kind": "eval", "step": 131, "dev_ce_mean": 4.0},
                     {"kind": "end", "step": 131,
                      "train_cpu_seconds": 166.5}]
  assert training_logs.cpu_seconds_at(ended) == {50: 100.0, 100: 150.0,
                                                 120: 160.0, 131: 166.5}
  del records[1]["step_cpu_sec"]
  assert training_logs.cpu_seconds_at(records) is None


def test_interpolate_inside_and_outside_the_range():
  curve = [(0.0, 4.0), (10.0, 2.0), (20.0, 1.0)]
  assert training_logs.interpolate(curve, 5.0) == 3.0
  assert training_logs.interpolate(curve, 20.0) == 1.0
  assert training_logs.interpolate(curve, 25.0) is None
  assert training_logs.interpolate([(3.0, 1.5)], 3.0) == 1.5


def _write_run(run_dir, run, *, cpu_per_step, ces):
  model = run_dir / "models" / run
  model.mkdir(parents=True)
  records = []
  for i, ce in enumerate(ces, 1):
    records.append({"kind": "train", "step": 100 * i,
                    "step_cpu_sec": cpu_per_step})
    records.append({"kind": "eval", "step": 100 * i, "dev_ce_mean": ce})
  (model / "metrics.jsonl").write_text(
      "".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def test_gaps_at_equal_steps_and_at_equal_cpu(tmp_path):
  # The dense run costs 1 CPU s/step, the sparse one 2; the sparse run is
  # 0.5 nats ahead at equal steps but behind at equal CPU time.
  _write_run(tmp_path, "dense", cpu_per_step=1.0, ces=[4.0, 3.0, 2.5, 2.0])
  _write_run(tmp_path, "moe", cpu_per_step=2.0, ces=[3.5, 2.5, 2.0, 1.5])
  dense = curves.read_curve(landing.RunFiles(run_dir=tmp_path), "dense")
  moe = curves.read_curve(landing.RunFiles(run_dir=tmp_path), "moe")
  assert moe.cpu_seconds == (200.0, 400.0, 600.0, 800.0)
  out = curves.compare([dense, moe], dense)
  rows = out["runs"]["moe"]
  assert [r["gap_equal_steps"] for r in rows] == [-0.5, -0.5, -0.5, -0.5]
  # At 200 CPU s the dense run is at step 200 (3.0); at 400 at step 400
  # (2.0); past 400 CPU s the dense run has no evaluation.
  assert [r["gap_equal_cpu"] for r in rows] == [0.5, 0.5, None, None]
  table = curves.markdown(out)
  assert "| 200 | 400 | 2.500 | -0.500 | +0.500 |" in table
  assert "Without CPU times" not in table
  # A run logged before CPU times were measured is named, not guessed.
  bare = curves.Curve(run="old", points=((100, 3.9),), cpu_seconds=None)
  table = curves.markdown(curves.compare([dense, moe, bare], dense))
  assert "Without CPU times (logged before" in table and ": old." in table
  assert "| 100 | - | 3.900 | -0.100 | - |" in table


def test_gap_at_equal_measured_cost_reads_the_reference_at_scaled_steps(
    tmp_path):
  _write_run(tmp_path, "dense", cpu_per_step=1.0, ces=[4.0, 3.0, 2.5, 2.0])
  _write_run(tmp_path, "moe", cpu_per_step=1.0, ces=[3.5, 2.8, 2.2, 1.9])
  files = landing.RunFiles(run_dir=tmp_path)
  dense, moe = (curves.read_curve(files, r) for r in ("dense", "moe"))
  out = curves.compare([dense, moe], dense, {"moe": 1.5})
  rows = out["runs"]["moe"]
  # MoE step 100 costs 150 dense steps: dense there is 3.5 (midway 4.0 to
  # 3.0); step 200 -> 300 (2.5); step 300 -> 450 (outside the range).
  assert [r["gap_equal_cost"] for r in rows] == pytest.approx(
      [0.0, 0.3, None, None])
  assert [r["gap_equal_steps"] for r in rows] == pytest.approx(
      [-0.5, -0.2, -0.3, -0.1])
  assert out["runs"]["dense"][0]["gap_equal_cost"] is None
  table = curves.markdown(out)
  assert "| 200 | 200 | 2.800 | -0.200 | -0.200 | +0.300 |" in table
  assert "(moe 1.5x)" in table and "--step_costs=moe=1.5" in table
  assert "gap at equal measured cost" not in curves.markdown(
      curves.compare([dense, moe], dense))
  assert curves.parse_step_costs(["moe=1.21"], ["dense", "moe"]) == {
      "moe": 1.21}
  for bad, message in [("moe=0", "positive RATIO"), ("moe", "RUN=RATIO"),
                       ("moe=x", "positive RATIO"), ("b=2", "not one of")]:
    with pytest.raises(ValueError, match=message):
      curves.parse_step_costs([bad], ["dense", "moe"])


def test_the_tool_writes_the_table_and_refuses_a_missing_reference(tmp_path):
  _write_run(tmp_path, "a", cpu_per_step=1.0, ces=[4.0, 3.0])
  _write_run(tmp_path, "b", cpu_per_step=1.5, ces=[3.8, 2.9])
  base = [sys.executable, "-m", "m4moe.pipeline.curves",
          f"--run_dir={tmp_path}", f"--output={tmp_path / 'out'}"]
  bad = subprocess.run(base + ["--runs=a,b", "--reference=c"],
                       capture_output=True, text=True, check=False)
  assert bad.returncode != 0 and "--reference=c is not one of" in bad.stderr
  missing = subprocess.run(base + ["--runs=a,zz", "--reference=a"],
                           capture_output=True, text=True, check=False)
  assert missing.returncode != 0 and "models/zz/metrics.jsonl" in (
      missing.stderr)
  assert not (tmp_path / "out").exists()
  done = subprocess.run(base + ["--runs=a,b", "--reference=a"],
                        capture_output=True, text=True, check=True)
  assert "## b" in done.stdout
  assert (tmp_path / "out" / "curves.png").stat().st_size > 1000
  saved = json.loads((tmp_path / "out" / "curves.json").read_text())
  assert saved["reference"] == "a" and len(saved["runs"]["b"]) == 2


def test_an_upcycled_run_continues_its_source_in_steps_and_cpu(tmp_path):
  _write_run(tmp_path, "dense_h", cpu_per_step=1.0, ces=[4.0, 3.5, 3.2])
  _write_run(tmp_path, "up", cpu_per_step=2.0, ces=[3.3, 3.0])
  log = tmp_path / "models" / "up" / "metrics.jsonl"
  start = {"kind": "start", "step": 0, "warm_start": {
      "kind": "upcycled", "init_from_dense": "/elsewhere/models/dense_h",
      "dense_step": 200, "optimizer_iterations": 200}}
  log.write_text(json.dumps(start) + "\n" + log.read_text())
  records = metrics_log.read_metrics(log)
  assert training_logs.upcycled_from(records) == ("dense_h", 200)
  curve = curves.read_curve(landing.RunFiles(run_dir=tmp_path), "up")
  # The source's evaluations up to its step 200, then the upcycled run's
  # 100 and 200 steps as steps 300 and 400.
  assert curve.points == ((100, 4.0), (200, 3.5), (300, 3.3), (400, 3.0))
  assert curve.cpu_seconds == (100.0, 200.0, 400.0, 600.0)
  assert training_logs.upcycled_from(
      metrics_log.read_metrics(tmp_path / "models" / "dense_h" /
                                 "metrics.jsonl")) is None
