"""An empty result is an error, and a directory another process is writing is
refused: the corpus build, vocabularies, eval, report, routing analysis and
averaging, each given an input that yields nothing (no model is trained)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from m4moe.data import corpus
from m4moe.data import fixtures
from m4moe.eval import results
from m4moe.eval import scoring
from m4moe.training import averaging
from m4moe import run_lock


def _cli(tool: str, *args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", f"m4moe.cli.{tool}", *args],
                        capture_output=True, text=True, timeout=600,
                        check=False)


def _french_sources(root: pathlib.Path, n: int = 40) -> pathlib.Path:
  sentences = fixtures.english_sentences(n, seed=3, max_words=10)
  fixtures.write_catalog(fixtures.make_catalog("fr", sentences),
                         root / "fr" / "LC_MESSAGES" / "demo.po")
  return root


def _build_cli(tmp_path, out, *langs):
  return _cli("build_corpus", "--norecipe",
              f"--sources={_french_sources(tmp_path / 'src')}",
              f"--languages={','.join(langs)}", f"--output_dir={out}",
              "--split_keys=", "--dev_groups=2", "--test_groups=2",
              "--workers=1")


def test_build_with_no_requested_language_fails_and_replaces_nothing(
    tmp_path):
  out = tmp_path / "corpus"
  first = _build_cli(tmp_path, out, "fr")
  assert first.returncode == 0, first.stderr[-2000:]
  before = (out / "train" / "fr.tsv").read_bytes()
  empty = _build_cli(tmp_path, out, "de", "ru")
  assert empty.returncode == 1
  err = empty.stderr
  assert "no requested language has pairs (de: no pairs in the sources; " \
         "ru: no pairs in the sources)" in err
  # The languages the sources do have, with their counts.
  assert "the sources have: fr (" in err
  assert "Nothing was replaced" in err
  assert "Traceback" not in err
  assert (out / "train" / "fr.tsv").read_bytes() == before
  assert not (out / "train" / "de.tsv").exists()
  failed = json.loads(corpus.failed_report_path(out).read_text())
  coverage = failed["language_coverage"]
  assert coverage["requested"] == ["de", "ru"]
  assert sorted(coverage["empty"]) == ["de", "ru"]
  assert list(coverage["sources_also_have"]) == ["fr"]
  assert coverage["sources_also_have"]["fr"]["catalogs_not_parsed"] == 1


def test_build_warns_of_each_empty_requested_language(tmp_path):
  out = tmp_path / "corpus"
  built = _build_cli(tmp_path, out, "fr", "de")
  assert built.returncode == 0, built.stderr[-2000:]
  assert "requested language de has no pairs: no pairs in the sources" in (
      built.stderr)
  coverage = json.loads((out / "report.json").read_text())[
      "language_coverage"]
  assert coverage["empty"] == {"de": "no pairs in the sources"}
  assert coverage["built"] == ["fr"]
  assert coverage["warnings"] == [
      "requested language de has no pairs: no pairs in the sources"]
  assert (out / "train" / "fr.tsv").stat().st_size > 0


def test_a_second_corpus_build_of_one_directory_is_refused(tmp_path):
  out = tmp_path / "corpus"
  config = corpus.BuildConfig(
      output_dir=out, cache_dir=tmp_path / "cache",
      sources=(_french_sources(tmp_path / "src"),), workers=1)
  # A killed build's temporary: the running build's must not be deleted.
  running = tmp_path / ".corpus.tmp-running"
  running.mkdir()
  (running / corpus.MARKER).write_text("{}")
  with run_lock.RunLock(tmp_path, role=run_lock.CORPUS,
                        filename=".corpus.lock", subject=out):
    with pytest.raises(run_lock.RunLockedError,
                       match=f"is in use by pid {os.getpid()}"):
      corpus.build_corpus(config)
  assert running.is_dir() and not out.exists()
  corpus.build_corpus(config)  # the lock is free again
  assert (out / "train" / "fr.tsv").is_file()


def _corpus_tree(root: pathlib.Path, split: str, lines: dict[str, str]):
  for name in ("train", "dev", "test", "test_ood"):
    (root / name).mkdir(parents=True, exist_ok=True)
  for lang, text in lines.items():
    (root / split / f"{lang}.tsv").write_text(text, encoding="utf-8")
  return root


def test_vocab_on_an_empty_side_fails_and_writes_nothing(tmp_path):
  corpus_dir = _corpus_tree(tmp_path / "c", "train", {"de": "", "fr": ""})
  out = tmp_path / "vocab"
  result = _cli("vocab", f"--corpus_dir={corpus_dir}", f"--output_dir={out}",
                "--source_vocab_size=300", "--target_vocab_size=300")
  assert result.returncode == 1
  assert "no training pairs in" in result.stderr
  assert "for any of the languages de, fr" in result.stderr
  assert "Traceback" not in result.stderr
  assert not list(out.glob("*.model"))


def test_vocab_refuses_an_output_dir_another_vocab_is_writing(tmp_path):
  corpus_dir = _corpus_tree(tmp_path / "c", "train",
                            {"de": "a b c\tx y z\n"})
  out = tmp_path / "vocab"
  out.mkdir()
  with run_lock.RunLock(out, role=run_lock.VOCAB):
    result = _cli("vocab", f"--corpus_dir={corpus_dir}",
                  f"--output_dir={out}")
  assert result.returncode == 1
  assert f"is in use by pid {os.getpid()}" in result.stderr
  assert "only one m4moe-vocab may write an --output_dir" in result.stderr
  assert not list(out.glob("*.model"))


def test_eval_with_no_sentences_fails_before_loading_a_model(tmp_path):
  corpus_dir = _corpus_tree(tmp_path / "c", "test", {"de": "", "fr": ""})
  output = tmp_path / "eval.json"
  result = _cli("eval", f"--corpus_dir={corpus_dir}", f"--output={output}",
                f"--model_dir={tmp_path / 'no_model'}")
  assert result.returncode == 1
  assert f"{corpus_dir}/test has no sentences for de, fr" in result.stderr
  assert "nothing was written" in result.stderr
  assert not output.exists()


def _empty_eval(path: pathlib.Path) -> pathlib.Path:
  score = scoring.LanguageScore(language="de", source_lang="de",
                                target_lang="en", num_segments=0,
                                status="empty", train_size=100)
  results.write_eval_json(results.EvalResult(
      model="moe", kind="multilingual", metadata={},
      languages={"de": score}), path)
  return path


def test_report_over_zero_averaged_languages_fails_and_writes_nothing(
    tmp_path):
  out = tmp_path / "report"
  result = _cli("report", f"--models={_empty_eval(tmp_path / 'moe.json')}",
                f"--output_dir={out}")
  assert result.returncode == 1
  assert "no language can be averaged" in result.stderr
  assert "de: " in result.stderr  # each language's reason
  assert "BLEU None" not in result.stdout
  assert not (out / "report.md").exists()
  assert not (out / "summary.json").exists()


def test_report_refuses_an_output_dir_another_report_is_writing(tmp_path):
  out = tmp_path / "report"
  out.mkdir()
  with run_lock.RunLock(out, role=run_lock.REPORT):
    result = _cli("report",
                  f"--models={_empty_eval(tmp_path / 'moe.json')}",
                  f"--output_dir={out}")
  assert result.returncode == 1
  assert f"is in use by pid {os.getpid()}" in result.stderr
  assert "only one m4moe-report may write an --output_dir" in result.stderr


def test_routing_analysis_over_a_split_without_pairs_fails(tmp_path):
  corpus_dir = _corpus_tree(tmp_path / "c", "dev", {"de": "\n", "fr": ""})
  out = tmp_path / "routing"
  result = _cli("analyze_routing", f"--corpus_dir={corpus_dir}",
                f"--model_dir={tmp_path / 'no_model'}", f"--output_dir={out}")
  assert result.returncode == 1
  assert f"{corpus_dir}/dev/ has no pairs for de, fr" in result.stderr
  assert "nothing was written" in result.stderr
  assert not out.exists()


@pytest.mark.parametrize("kept,last,steps,match", [
    ((), 5, (), "it has no ckpt-<step> checkpoints, and averaging needs at "
     "least 2"),
    ((100, 200, 300), 0, (), "averaging needs at least 2 checkpoints, got 0"),
    ((100, 200), 5, (), "cannot average the last 5 checkpoints"),
])
def test_averaging_zero_checkpoints_is_an_error(kept, last, steps, match):
  with pytest.raises(averaging.AveragingError, match=match):
    averaging.choose_steps(kept, last=last, steps=steps, model_dir="run")


def test_a_truncated_corpus_report_is_named_not_a_traceback(tmp_path):
  corpus_dir = _corpus_tree(tmp_path / "c", "test", {"de": "a b c\tx y z\n"})
  text = json.dumps({"languages": {"de": {"train": 5, "dev": 1, "test": 1}},
                     "summary": {"pairs": 7}, "padding": "x" * 200})
  (corpus_dir / "report.json").write_text(text[:100])
  result = _cli("eval", f"--corpus_dir={corpus_dir}",
                f"--output={tmp_path / 'eval.json'}",
                f"--model_dir={tmp_path / 'no_model'}")
  assert result.returncode == 1
  assert "Traceback" not in result.stderr
  assert (f"{corpus_dir / 'report.json'}: the corpus build report ends "
          "early at line 1 column 94 (100 bytes: truncated") in result.stderr
  assert "rebuild the corpus with m4moe-build-corpus" in result.stderr
