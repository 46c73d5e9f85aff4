"""Per-language rate choice of the bilingual baselines on dev CE."""

import hashlib
import json
import subprocess
import sys

import pytest

from m4moe.pipeline import baseline_rates


def _log(path, points):
  path.parent.mkdir(parents=True, exist_ok=True)
  lines = [{"kind": "start", "step": 0}]
  for step, ce in points:
    lines.append({"kind": "train", "step": step, "loss": 9.0})
    lines.append({"kind": "eval", "step": step, "dev_ce": {"x": ce},
                  "dev_ce_mean": ce})
  path.write_text("".join(json.dumps(r) + "\n" for r in lines),
                  encoding="utf-8")


def test_best_dev_ce_is_the_lowest_evaluation_and_its_step(tmp_path):
  _log(tmp_path / "m.jsonl", [(100, 5.0), (200, 4.1), (300, 4.3)])
  assert baseline_rates.best_dev_ce(tmp_path / "m.jsonl") == (4.1, 200)
  _log(tmp_path / "none.jsonl", [])
  with pytest.raises(ValueError, match="none.jsonl has no dev evaluation"):
    baseline_rates.best_dev_ce(tmp_path / "none.jsonl")


@pytest.mark.parametrize("candidate, chosen", [
    ([(100, 4.5), (200, 3.9)], "candidate"),  # lower best: the new rate
    ([(100, 4.0), (200, 4.2)], "reference"),  # equal best: the old rate
    ([(100, 4.6)], "reference")])
def test_choice_is_the_lower_best_dev_ce(tmp_path, candidate, chosen):
  _log(tmp_path / "ref.jsonl", [(100, 4.0), (200, 4.4)])
  _log(tmp_path / "cand.jsonl", candidate)
  choice = baseline_rates.choose(language="kk", reference=tmp_path /
                                 "ref.jsonl", candidate=tmp_path / "cand.jsonl")
  assert choice.chosen == chosen
  assert choice.reference == (4.0, 100)


def _study(tmp_path):
  """A reference results folder and a run directory with the same corpus."""
  reference, run_dir = tmp_path / "v2", tmp_path / "run"
  corpus = run_dir / "corpus" / "dev"
  corpus.mkdir(parents=True)
  (corpus / "kk.tsv").write_text("a\tb\n", encoding="utf-8")
  digest = hashlib.sha256(b"a\tb\n").hexdigest()
  reference.mkdir()
  (reference / "inputs.sha256").write_text(f"{digest}  corpus/dev/kk.tsv\n",
                                           encoding="utf-8")
  for lang, ref, cand in (("kk", 3.2, 3.0), ("si", 3.5, 3.6)):
    _log(reference / "metrics" / f"bilingual_{lang}.jsonl", [(100, ref)])
    _log(run_dir / "models" / f"bilingual_{lang}" / "metrics.jsonl",
         [(100, cand + 0.5), (200, cand)])
  return reference, run_dir


def _cli(reference, run_dir, out):
  return subprocess.run(
      [sys.executable, "-m", "m4moe.pipeline.baseline_rates",
       f"--run_dir={run_dir}", f"--reference={reference}", f"--output={out}",
       "--reference_flags=--learning_rate=0.031623",
       "--candidate_flags=--learning_rate=0.126491"],
      capture_output=True, text=True, check=False)


def test_cli_writes_each_languages_choice_and_its_flags(tmp_path):
  reference, run_dir = _study(tmp_path)
  done = _cli(reference, run_dir, tmp_path / "out")
  assert done.returncode == 0, done.stderr[-2000:]
  out = json.loads((tmp_path / "out" / "baseline_rates.json").read_text(
      encoding="utf-8"))
  by_lang = {c["language"]: c for c in out["languages"]}
  assert by_lang["kk"]["chosen"] == "candidate"
  assert by_lang["kk"]["flags"] == ["--learning_rate=0.126491"]
  assert by_lang["kk"]["candidate_best_step"] == 200
  assert by_lang["si"]["chosen"] == "reference"
  assert by_lang["si"]["candidate_minus_reference"] == pytest.approx(0.1)
  assert out["selected_on"] == "dev"
  table = (tmp_path / "out" / "baseline_rates.md").read_text(encoding="utf-8")
  assert "| kk | 3.200 @ 100 | 3.000 @ 200 | -0.200 | candidate |" in table


def test_cli_refuses_runs_on_another_corpus(tmp_path):
  reference, run_dir = _study(tmp_path)
  (run_dir / "corpus" / "dev" / "kk.tsv").write_text("a\tc\n",
                                                      encoding="utf-8")
  done = _cli(reference, run_dir, tmp_path / "out")
  assert done.returncode != 0
  assert "differ from" in done.stderr and "corpus/dev/kk.tsv" in done.stderr
  assert not (tmp_path / "out").exists()


def test_cli_names_a_missing_run_directory(tmp_path):
  reference, _ = _study(tmp_path)
  done = _cli(reference, tmp_path / "elsewhere", tmp_path / "out")
  assert done.returncode != 0
  assert "elsewhere/corpus does not exist" in done.stderr
