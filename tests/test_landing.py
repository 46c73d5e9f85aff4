"""m4moe.pipeline.landing: landed runs survive a lost run directory."""

import hashlib
import json
import subprocess
import sys

from m4moe.pipeline import curves
from m4moe.pipeline import landing
from m4moe.pipeline import screening
import test_screening


def _finished(run_dir, run, curve, bleu):
  test_screening._run(run_dir, run, curve, bleu=bleu)  # pylint: disable=protected-access


def test_land_copies_finished_scored_runs_and_skips_the_rest(tmp_path):
  run_dir, out = tmp_path / "run", tmp_path / "landed"
  _finished(run_dir, "a_s1", [(10, 3.2), (20, 3.0)], {"de": 10.0})
  # b: trained, no dev eval yet; c: still training (no stage record).
  _finished(run_dir, "b_s1", [(10, 3.1)], {"de": 9.0})
  (run_dir / "eval_dev" / "b_s1.json").unlink()
  test_screening._run(run_dir, "c_s1", [(10, 3.3)])  # pylint: disable=protected-access
  landed, skipped = landing.land(run_dir, out)
  assert landed == ["a_s1"]
  assert skipped == ["b_s1 (no dev eval yet)",
                     "c_s1 (training not finished)"]
  assert sorted(p.name for p in (out / "a_s1").iterdir()) == [
      "eval_dev.json", "inputs.sha256", "metrics.jsonl", "train_stage.json"]
  # No corpus here: an empty manifest; with one, sha256sum lines.
  assert (out / "a_s1" / "inputs.sha256").read_text() == ""
  (run_dir / "corpus" / "train").mkdir(parents=True)
  (run_dir / "corpus" / "train" / "de.tsv").write_bytes(b"a\tb\n")
  (run_dir / "vocab").mkdir()
  (run_dir / "vocab" / "source.vocab").write_bytes(b"x")
  # Records of the builds, not inputs: left out of the manifest.
  (run_dir / "corpus" / "report.json").write_text('{"seconds": 1}')
  (run_dir / "vocab" / "vocab.lock").write_text('{"pid": 1}')
  landing.land(run_dir, out)
  assert (out / "a_s1" / "inputs.sha256").read_text() == (
      f"{hashlib.sha256(b'a' + bytes([9]) + b'b' + bytes([10])).hexdigest()}"
      "  corpus/train/de.tsv\n"
      f"{hashlib.sha256(b'x').hexdigest()}  vocab/source.vocab\n")
  assert ((out / "a_s1" / "metrics.jsonl").read_bytes() ==
          (run_dir / "models" / "a_s1" / "metrics.jsonl").read_bytes())
  assert not (out / "b_s1").exists() and not (out / "c_s1").exists()
  assert not list(out.rglob("*.landing"))
  # --runs patterns select.
  assert landing.land(run_dir, tmp_path / "none", patterns=["z*"]) == ([], [])


def test_run_files_prefer_the_run_directory_and_fall_back_to_landed(tmp_path):
  old, new, out = tmp_path / "old", tmp_path / "new", tmp_path / "landed"
  _finished(old, "a_s1", [(10, 3.2), (20, 3.0)], {"de": 10.0})
  _finished(old, "b_s1", [(10, 4.0)], {"de": 1.0})
  landing.land(old, out)
  # The new machine trains b again (a better curve) and never had a.
  _finished(new, "b_s1", [(10, 3.5)], {"de": 2.0})
  files = landing.RunFiles(run_dir=new, landed=out)
  assert files.metrics("a_s1") == out / "a_s1" / "metrics.jsonl"
  assert files.metrics("b_s1") == new / "models" / "b_s1" / "metrics.jsonl"
  assert curves.read_curve(files, "a_s1").points == ((10, 3.2), (20, 3.0))
  assert curves.read_curve(files, "b_s1").points == ((10, 3.5),)
  # Without the landed folder the lost run is simply not there.
  bare = landing.RunFiles(run_dir=new)
  assert not bare.metrics("a_s1").is_file()
  assert not bare.train_record("a_s1").is_file()


def test_the_screening_tool_keeps_landed_candidates(tmp_path):
  recipe = tmp_path / "screen.toml"
  recipe.write_text(test_screening._RECIPE)  # pylint: disable=protected-access
  old, new, out = tmp_path / "old", tmp_path / "new", tmp_path / "landed"
  _finished(old, "a_s1", [(10, 3.2), (20, 3.0)], {"de": 10.0})
  landing.land(old, out)
  _finished(new, "b_s1", [(10, 3.3), (20, 2.9)], {"de": 12.0})
  proc = subprocess.run(
      [sys.executable, "-m", "m4moe.pipeline.screening", f"--recipe={recipe}",
       f"--run_dir={new}", f"--landed={out}",
       f"--output={tmp_path / 'table'}"],
      capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr
  rows = {r["name"]: r for r in json.loads(
      (tmp_path / "table" / "screening.json").read_text())["candidates"]}
  assert rows["a"]["status"] == "scored" and rows["a"]["best_dev_ce"] == 3.0
  assert rows["b"]["status"] == "scored" and rows["b"]["best_dev_ce"] == 2.9
  assert rows["c"]["status"] == "not started"


def test_the_tool_lands_and_reports_what_it_skipped(tmp_path):
  run_dir = tmp_path / "run"
  _finished(run_dir, "a_s1", [(10, 3.2)], {"de": 10.0})
  test_screening._run(run_dir, "c_s1", [(10, 3.3)])  # pylint: disable=protected-access
  proc = subprocess.run(
      [sys.executable, "-m", "m4moe.pipeline.landing", f"--run_dir={run_dir}",
       f"--output={tmp_path / 'out'}"],
      capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr
  assert "1 run(s) copied" in proc.stdout
  assert "c_s1 (training not finished)" in proc.stdout
  missing = subprocess.run(
      [sys.executable, "-m", "m4moe.pipeline.landing",
       f"--run_dir={tmp_path / 'nowhere'}", f"--output={tmp_path / 'o2'}"],
      capture_output=True, text=True, timeout=120, check=False)
  assert missing.returncode != 0 and "holds no models/" in missing.stderr
  assert not (tmp_path / "o2").exists()


def _record(path, stage, *args):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps({"stage": stage, "command": [
      "python3", "-m", "m4moe.cli.x", *args], "seconds": 1.0}))


def _tested_run_dir(run_dir, runs_and_splits):
  """A run directory with a corpus and vocabulary, a corpus record, a
  report, and for each run its training log and the given test evals."""
  (run_dir / "corpus" / "test").mkdir(parents=True)
  (run_dir / "corpus" / "test" / "pt.tsv").write_text("o\tx\n")
  (run_dir / "vocab").mkdir()
  (run_dir / "vocab" / "source.vocab").write_text("spm")
  _record(run_dir / "stages" / "corpus.json", "corpus",
          f"--output_dir={run_dir}/corpus")
  (run_dir / "report").mkdir()
  (run_dir / "report" / "report.md").write_text("# report\n")
  (run_dir / "report" / "report.lock").write_text('{"pid": 1}')
  for run, splits in runs_and_splits.items():
    (run_dir / "models" / run).mkdir(parents=True)
    (run_dir / "models" / run / "metrics.jsonl").write_text(
        json.dumps({"kind": "end", "reason": "done"}) + "\n")
    (run_dir / "models" / run / "ckpt-1.index").write_text("weights")
    _record(run_dir / "stages" / f"train_{run}.json", f"train_{run}",
            f"--model_dir={run_dir}/models/{run}")
    for split in splits:
      (run_dir / split / run).mkdir(parents=True)
      (run_dir / split / run / "pt.hyp").write_text(f"{run} {split}\n")
      (run_dir / split / f"{run}.json").write_text(json.dumps(
          {"metadata": {"hypotheses_dir": f"{run_dir}/{split}/{run}"},
           "languages": {"pt": {"num_segments": 1}}}))
      _record(run_dir / "stages" / f"{split}_{run}.json", f"{split}_{run}",
              f"--output={run_dir}/{split}/{run}.json")


def test_tested_runs_land_in_the_layout_restore_reads_back(tmp_path):
  from m4moe.pipeline import restore  # pylint: disable=import-outside-toplevel
  old, out = tmp_path / "old", tmp_path / "confirm"
  _tested_run_dir(old, {"a_s1": ("eval", "eval_ood"), "b_s1": ("eval",),
                        "c_s1": ()})
  landed, skipped = landing.land_tested(old, out)
  assert landed == ["a_s1"]
  assert skipped == ["b_s1 (no eval_ood record yet)",
                     "c_s1 (no eval or eval_ood record yet)"]
  assert (out / "eval_ood" / "a_s1" / "pt.hyp").read_text() == "a_s1 eval_ood\n"
  assert (out / "report" / "report.md").read_text() == "# report\n"
  assert not (out / "report" / "report.lock").exists()
  assert not (out / "metrics" / "b_s1.jsonl").exists()
  assert not list(out.rglob("ckpt*")) and not list(out.rglob("*.landing"))
  # A new machine: same corpus bytes, nothing trained; restore puts a back.
  new = tmp_path / "new"
  for name in ("corpus/test/pt.tsv", "vocab/source.vocab"):
    (new / name).parent.mkdir(parents=True, exist_ok=True)
    (new / name).write_bytes((old / name).read_bytes())
  assert restore.check_inputs(out, new) == []
  assert restore.restore(out, new) == ["a_s1"]
  evaluation = json.loads((new / "eval_ood" / "a_s1.json").read_text())
  assert evaluation["metadata"]["hypotheses_dir"] == f"{new}/eval_ood/a_s1"
  assert (new / "stages" / "eval_a_s1.json").is_file()
  # The analysis tools read the landed log and record of either layout.
  files = landing.RunFiles(run_dir=tmp_path / "elsewhere", landed=out)
  assert files.metrics("a_s1") == out / "metrics" / "a_s1.jsonl"
  assert files.train_record("a_s1").is_file()
  assert not files.eval_dev("a_s1").exists()
  assert files.metrics("b_s1") == (
      tmp_path / "elsewhere" / "models" / "b_s1" / "metrics.jsonl")
  # Runs on other corpus bytes are refused, and nothing is copied.
  (old / "vocab" / "source.vocab").write_text("another vocabulary")
  _record(old / "stages" / "eval_ood_b_s1.json", "eval_ood_b_s1")
  try:
    landing.land_tested(old, out)
    raise AssertionError("other inputs were landed")
  except ValueError as e:
    assert "differ from" in str(e) and "another --output" in str(e)
  assert not (out / "metrics" / "b_s1.jsonl").exists()


def test_a_second_run_directory_on_the_same_bytes_adds_runs(tmp_path):
  # A seed trained in a run directory of its own, on a corpus built again
  # with the same bytes, lands beside the first directory's runs; the
  # corpus record stays the first directory's.
  first, second, out = tmp_path / "first", tmp_path / "second", tmp_path / "o"
  _tested_run_dir(first, {"a_s1": ("eval", "eval_ood")})
  _tested_run_dir(second, {"a_s2": ("eval", "eval_ood")})
  assert landing.land_tested(first, out)[0] == ["a_s1"]
  record = (out / "stages" / "corpus.json").read_text()
  assert f"{first}/corpus" in record
  assert landing.land_tested(second, out)[0] == ["a_s2"]
  assert (out / "stages" / "corpus.json").read_text() == record
  assert (out / "metrics" / "a_s1.jsonl").is_file()
  assert (out / "eval" / "a_s2" / "pt.hyp").read_text() == "a_s2 eval\n"


def test_the_tool_lands_tested_runs_and_names_a_missing_corpus_record(
    tmp_path):
  run_dir = tmp_path / "run"
  _tested_run_dir(run_dir, {"a_s1": ("eval", "eval_ood")})
  proc = subprocess.run(
      [sys.executable, "-m", "m4moe.pipeline.landing", "--tested",
       f"--run_dir={run_dir}", f"--output={tmp_path / 'out'}"],
      capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr
  assert "1 run(s) copied" in proc.stdout and "a_s1" in proc.stdout
  (run_dir / "stages" / "corpus.json").unlink()
  proc = subprocess.run(
      [sys.executable, "-m", "m4moe.pipeline.landing", "--tested",
       f"--run_dir={run_dir}", f"--output={tmp_path / 'o2'}"],
      capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode != 0
  assert "corpus.json does not exist" in proc.stderr
  assert not (tmp_path / "o2").exists()


def test_the_two_layouts_are_not_mixed_and_nothing_ready_writes_nothing(
    tmp_path):
  tested, dev = tmp_path / "tested", tmp_path / "dev"
  _tested_run_dir(tested, {"a_s1": ("eval", "eval_ood"), "b_s1": ()})
  _finished(dev, "d_s1", [(10, 3.2)], {"de": 10.0})
  landing.land(dev, tmp_path / "runs")
  landing.land_tested(tested, tmp_path / "confirm")
  for call, out in ((landing.land_tested, "runs"), (landing.land, "confirm")):
    before = sorted(p.name for p in (tmp_path / out).rglob("*"))
    source = tested if call is landing.land_tested else dev
    try:
      call(source, tmp_path / out)
      raise AssertionError(f"{call.__name__} mixed layouts in {out}")
    except ValueError as e:
      assert "another --output" in str(e)
    assert sorted(p.name for p in (tmp_path / out).rglob("*")) == before
  # No run with its test evals: the output is not created.
  assert landing.land_tested(tested, tmp_path / "none",
                             patterns=["b_*"]) == (
                                 [], ["b_s1 (no eval or eval_ood record yet)"])
  assert not (tmp_path / "none").exists()
