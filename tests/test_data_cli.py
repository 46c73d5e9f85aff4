"""m4moe-build-corpus and m4moe-vocab end to end on local fixtures."""

import json
import subprocess
import sys

from m4moe.data import fixtures
from m4moe.data import vocab


def _run(module, *args):
  return subprocess.run([sys.executable, "-m", module, *args],
                        capture_output=True, text=True, check=False,
                        timeout=120)


def test_build_corpus_then_vocab(tmp_path):
  sentences = fixtures.english_sentences(40, seed=5)
  for locale in ("de", "ru", "ja"):
    fixtures.write_catalog(fixtures.make_catalog(locale, sentences),
                           tmp_path / "src" / locale / "LC_MESSAGES" / "a.po")
  tsv = tmp_path / "extra.tsv"
  tsv.write_text("fr\tSave the current file\tEnregistrer le fichier\n")
  out = tmp_path / "corpus"
  proc = _run("m4moe.cli.build_corpus", "--norecipe",
              f"--sources={tmp_path / 'src'},{tsv}", f"--output_dir={out}",
              "--languages=de,ru,fr", "--split_keys=", "--dev_groups=3",
              "--test_groups=3", "--workers=1")
  assert proc.returncode == 0, proc.stderr
  printed = json.loads(proc.stdout[:proc.stdout.rindex("}") + 1])
  report = json.loads((out / "report.json").read_text())
  assert printed["summary"] == report["summary"]
  assert sorted(report["languages"]) == ["de", "fr", "ru"]
  assert report["counts"]["markup"] == 2
  proc = _run("m4moe.cli.vocab", f"--corpus_dir={out}",
              f"--output_dir={tmp_path / 'vocab'}", "--source_vocab_size=400",
              "--target_vocab_size=300", "--max_sentences=1000")
  assert proc.returncode == 0, proc.stderr
  source = vocab.load(tmp_path / "vocab" / "source.model")
  assert vocab.tag_id(source, "fr") > 2


def test_build_corpus_usage_errors(tmp_path):
  proc = _run("m4moe.cli.build_corpus", "--norecipe",
              f"--output_dir={tmp_path / 'x'}")
  assert proc.returncode != 0
  assert "nothing to build from" in proc.stderr
  proc = _run("m4moe.cli.build_corpus", "--norecipe",
              f"--sources={tmp_path / 'missing'}",
              f"--output_dir={tmp_path / 'x'}")
  assert "does not exist" in proc.stderr
