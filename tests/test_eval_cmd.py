"""m4moe-eval end to end on a tiny run directory built in tmp_path."""

import json
import shutil
import subprocess
import sys

import pytest

from m4moe.eval import results
from m4moe.eval import seeds

import report_fixtures as fixtures


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  return fixtures.make_tiny_run(tmp_path_factory.mktemp("tiny"))


def _cli(name, *args):
  return subprocess.run([sys.executable, "-m", f"m4moe.cli.{name}", *args],
                        capture_output=True, timeout=180, check=False)


def test_eval_cli_writes_scored_json(run_dir, tmp_path):
  corpus = tmp_path / "corpus"
  (corpus / "test").mkdir(parents=True)
  (corpus / "train").mkdir()
  texts = fixtures.sentences(5, seed=6)
  (corpus / "test" / "de.tsv").write_text(
      "".join(f"{t}\t{t.upper()}\n" for t in texts), encoding="utf-8")
  (corpus / "test" / "fr.tsv").write_text("", encoding="utf-8")
  (corpus / "report.json").write_text(json.dumps(
      {"languages": {"de": {"train": 1234}, "fr": {"train": 56}}}))
  out = tmp_path / "eval.json"
  proc = _cli("eval", f"--model_dir={run_dir}", f"--corpus_dir={corpus}",
              f"--output={out}", "--beam_size=1", "--alpha=0",
              "--max_decode_length=10", f"--hypotheses_dir={tmp_path}/hyp",
              "--model_name=tiny")
  assert proc.returncode == 0, proc.stderr.decode()
  data = json.loads(out.read_text())
  de, fr = data["languages"]["de"], data["languages"]["fr"]
  assert data["model"] == "tiny" and data["metadata"]["beam_size"] == 1
  assert "seed" not in data["metadata"]  # its config.json records none
  assert de["num_segments"] == 5 and de["train_size"] == 1234
  assert "tok:13a" in de["bleu_signature"] and de["status"] == "ok"
  assert fr["status"] == "empty" and fr["train_size"] == 56
  hyps = (tmp_path / "hyp" / "de.hyp").read_text(encoding="utf-8")
  assert len(hyps.split("\n")) == 6  # five lines, each newline-terminated
  assert "fr: EMPTY test split" in proc.stdout.decode()


def test_eval_json_records_the_training_seed(run_dir, tmp_path):
  # A landed eval JSON is read away from its run directory: the seed that
  # tells a model's runs apart must be in the JSON itself.
  run = tmp_path / "run"
  shutil.copytree(run_dir, run)
  config = json.loads((run / "config.json").read_text())
  (run / "config.json").write_text(json.dumps({**config,
                                               "train": {"seed": 3}}))
  corpus = tmp_path / "corpus"
  (corpus / "test").mkdir(parents=True)
  (corpus / "test" / "de.tsv").write_text("Hallo\tHello\n", encoding="utf-8")
  out = tmp_path / "eval.json"
  proc = _cli("eval", f"--model_dir={run}", f"--corpus_dir={corpus}",
              f"--output={out}", "--beam_size=1", "--max_decode_length=4")
  assert proc.returncode == 0, proc.stderr.decode()
  shutil.rmtree(run)
  result = results.read_eval_json(out)
  assert result.metadata["seed"] == 3
  assert seeds.seed_of(result) == 3
