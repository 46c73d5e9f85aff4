"""m4moe-eval end to end on a tiny run directory built in tmp_path."""

import json
import subprocess
import sys

import pytest

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
  assert de["num_segments"] == 5 and de["train_size"] == 1234
  assert "tok:13a" in de["bleu_signature"] and de["status"] == "ok"
  assert fr["status"] == "empty" and fr["train_size"] == 56
  hyps = (tmp_path / "hyp" / "de.hyp").read_text(encoding="utf-8")
  assert len(hyps.split("\n")) == 6  # five lines, each newline-terminated
  assert "fr: EMPTY test split" in proc.stdout.decode()
