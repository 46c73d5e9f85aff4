"""The JSON files that results/ keeps hold no absolute paths.

A stage record, an eval JSON, a report summary or a training log copied
into results/ is read on other machines: an absolute path there names a
directory of the machine the run happened on. Each tool below is run with
absolute paths (tmp_path is absolute) and its JSON is searched for them.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from m4moe import jsonfile
from m4moe.benchmarks import peak_rss
from m4moe.benchmarks.peer import select
from m4moe.benchmarks.peer import selection
from m4moe.cli import run as run_cli
from m4moe.eval import report
from m4moe.eval import results
from m4moe.eval import scoring
from m4moe.pipeline import plan

import report_fixtures as fixtures

# An absolute path inside a string: at its start or after a separator.
_ABSOLUTE = re.compile(
    r"(?:^|[\s=:,;'\"(\[])(/[^\s/'\",;:)\]][^\s'\",;:)\]]*)")


def absolute_paths(value) -> list[str]:
  """Every absolute path in the strings (and keys) of a JSON value."""
  if isinstance(value, str):
    return _ABSOLUTE.findall(value)
  if isinstance(value, list):
    return [p for item in value for p in absolute_paths(item)]
  if isinstance(value, dict):
    return [p for key, item in value.items()
            for p in absolute_paths(key) + absolute_paths(item)]
  return []


def test_the_search_finds_absolute_paths_and_nothing_else():
  assert absolute_paths({"a": ["--model_dir=/x/y", "python3"],
                         "b": "ckpt at /tmp/r: bad", "/k": 1}) == [
                             "/x/y", "/tmp/r", "/k"]
  assert absolute_paths({"a": "models/moe", "b": "1/8 of 3", "c": 0.5,
                         "d": "../corpus", "e": "https://x.org/a"}) == []


def test_relative_command_keeps_relative_arguments(tmp_path):
  command = [sys.executable, "-m", "m4moe.cli.train",
             f"--model_dir={tmp_path}/models/moe", "--steps=3",
             str(tmp_path / "corpus"), "--corpus_dir=corpus"]
  got = jsonfile.relative_command(command, start=tmp_path)
  assert got == ["python3", "-m", "m4moe.cli.train",
                 "--model_dir=models/moe", "--steps=3", "corpus",
                 "--corpus_dir=corpus"]
  assert jsonfile.relative_command(got, start=tmp_path) == got
  # A command that is not run by Python keeps its program.
  assert jsonfile.relative_command(["m4moe-train", f"--x={tmp_path}/a"],
                                   start=tmp_path) == ["m4moe-train", "--x=a"]


def test_relative_command_rewrites_every_path_of_a_list_flag(tmp_path):
  # m4moe-run's report stage passes several eval JSONs in one flag.
  command = ["python3", "-m", "m4moe.cli.report",
             f"--baselines={tmp_path}/eval/a.json,{tmp_path}/eval/b.json",
             f"--training_logs=moe={tmp_path}/models/moe/metrics.jsonl",
             "--title=MoE, dense: a=b"]
  got = jsonfile.relative_command(command, start=tmp_path)
  assert got[3:] == ["--baselines=eval/a.json,eval/b.json",
                     "--training_logs=moe=models/moe/metrics.jsonl",
                     "--title=MoE, dense: a=b"]


def test_relative_paths_in_rewrites_paths_inside_messages(tmp_path):
  report = {"where": f"{tmp_path}/src/a.po:3",
            "reason": f"CatalogError: {tmp_path}/src/a.po: cannot parse",
            "n": 1.5, "share": "1/8", "url": "https://deb.debian.org/x",
            f"{tmp_path}/k": [f"--x={tmp_path}/out/b"]}
  got = jsonfile.relative_paths_in(report, start=tmp_path / "out")
  assert got == {"where": "../src/a.po:3",
                 "reason": "CatalogError: ../src/a.po: cannot parse",
                 "n": 1.5, "share": "1/8", "url": "https://deb.debian.org/x",
                 "../k": ["--x=b"]}
  assert absolute_paths(got) == []


def test_a_stage_record_holds_paths_relative_to_the_run_dir(tmp_path):
  stage = plan.Stage(name="train_moe", description="", tool="train",
                     args=(f"--model_dir={tmp_path / 'models' / 'moe'}",
                           f"--cache_dir={tmp_path.parent / 'cache'}"))
  marker = tmp_path / "stages" / "train_moe.json"
  run_cli._write_marker(marker, stage, 1.0)  # pylint: disable=protected-access
  record = json.loads(marker.read_text())
  assert absolute_paths(record) == []
  assert record["command"][0] == "python3"
  assert record["command"][3:] == ["--model_dir=models/moe",
                                   "--cache_dir=../cache"]
  # The same stage is not taken for a changed one on the next run.
  changed = run_cli._first_changed  # pylint: disable=protected-access
  assert changed([stage], tmp_path) is None


def test_peak_rss_record_names_no_interpreter_path():
  record = peak_rss.measure([sys.executable, "-c", "print('x')"],
                            interval=0.05)
  assert absolute_paths(record) == []
  assert record["command"][:2] == ["python3", "-c"]


def test_peer_selection_manifest_names_its_corpus_relatively(
    tmp_path, monkeypatch):
  monkeypatch.setattr(selection, "write_selection_corpus",
                      lambda **kwargs: {"language": "de", "permille": 10})
  run_dir = tmp_path / "runs" / "select"
  manifest = select.prepare_data(corpus_dir=tmp_path / "corpus",
                                 run_dir=run_dir, language="de", permille=10)
  written = json.loads((run_dir / "data" / "manifest.json").read_text())
  assert absolute_paths(written) == []
  assert manifest["source_corpus"] == os.path.join("..", "..", "..",
                                                   "corpus")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  return fixtures.make_tiny_run(tmp_path_factory.mktemp("tiny"))


def test_eval_json_paths_are_relative_and_read_back(run_dir, tmp_path):
  corpus = tmp_path / "corpus"
  (corpus / "test").mkdir(parents=True)
  (corpus / "test" / "de.tsv").write_text("Hallo\tHello\n", encoding="utf-8")
  out = tmp_path / "eval" / "tiny.json"
  proc = subprocess.run(
      [sys.executable, "-m", "m4moe.cli.eval", f"--model_dir={run_dir}",
       f"--corpus_dir={corpus}", f"--output={out}", "--beam_size=1",
       "--max_decode_length=4", f"--hypotheses_dir={tmp_path}/eval/tiny"],
      capture_output=True, timeout=180, check=False)
  assert proc.returncode == 0, proc.stderr.decode()
  data = json.loads(out.read_text())
  assert absolute_paths(data) == []
  meta = data["metadata"]
  assert meta["hypotheses_dir"] == "tiny"
  assert meta["corpus_dir"] == "../corpus"
  # Read back, the paths are the files again (joined to the JSON's dir).
  result = results.read_eval_json(out)
  assert pathlib.Path(result.metadata["hypotheses_dir"]).samefile(
      tmp_path / "eval" / "tiny")
  assert pathlib.Path(result.metadata["model_dir"]).samefile(run_dir)


def test_report_summary_names_hypotheses_relative_to_itself(tmp_path):
  corpus = tmp_path / "corpus"
  (corpus / "test").mkdir(parents=True)
  (corpus / "test" / "de.tsv").write_text(
      "Open the file\tDatei öffnen\nSave all\tAlles speichern\n",
      encoding="utf-8")
  hyps = ["Open file", "Save all"]
  hyp_dir = tmp_path / "evals" / "moe"
  hyp_dir.mkdir(parents=True)
  (hyp_dir / "de.hyp").write_text("".join(h + "\n" for h in hyps),
                                  encoding="utf-8")
  score = scoring.score_language(hyps, ["Open the file", "Save all"],
                                 source_lang="de", target_lang="en",
                                 train_size=10)
  path = tmp_path / "evals" / "moe.json"
  results.write_eval_json(results.EvalResult(
      model="moe", metadata={"hypotheses_dir": str(hyp_dir)},
      languages={"de": score}), path)
  files = report.write_report(
      tmp_path / "out", models=[results.read_eval_json(path)],
      baselines=[], model_paths=[path], baseline_paths=[],
      corpus_dir=corpus, bootstrap_samples=0)
  summary = json.loads(files.summary.read_text(encoding="utf-8"))
  assert absolute_paths(summary) == []
  assert summary["hypotheses"]["moe"]["dir"] == os.path.join(
      "..", "evals", "moe")
  # A run without hypotheses: the message names the places searched.
  gone = tmp_path / "evals2" / "gone.json"
  results.write_eval_json(results.EvalResult(
      model="gone", metadata={"hypotheses_dir": str(tmp_path / "nowhere")},
      languages={"de": score}), gone)
  files = report.write_report(
      tmp_path / "out2", models=[results.read_eval_json(gone)],
      baselines=[], model_paths=[gone], baseline_paths=[],
      corpus_dir=corpus, bootstrap_samples=0)
  summary = json.loads(files.summary.read_text(encoding="utf-8"))
  assert "does not exist" in summary["hypotheses"]["gone"]["missing"]
  assert absolute_paths(summary) == []


def test_committed_results_json_hold_no_absolute_paths():
  root = pathlib.Path(__file__).resolve().parent.parent / "results"
  if not root.is_dir():
    pytest.skip("no results/ beside the tests (installed package)")
  found = []
  for path in sorted(root.rglob("*.json")) + sorted(root.rglob("*.jsonl")):
    text = path.read_text(encoding="utf-8")
    values = ([json.loads(line) for line in text.splitlines() if line.strip()]
              if path.suffix == ".jsonl" else [json.loads(text)])
    for value in values:
      found += [f"{path.relative_to(root)}: {p}"
                for p in absolute_paths(value)]
  assert not found, ("absolute paths in committed JSON (write them "
                     "relative to the run directory or the JSON's "
                     "directory): " + "; ".join(found[:10]))
