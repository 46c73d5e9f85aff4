"""m4moe.training.rundir: the run-directory contract, vocabulary fingerprint and
language pairs, as seen by decode/eval/export."""

import json
import logging
import shutil
import subprocess
import sys

import pytest
import sentencepiece as spm

from m4moe.inference import beam_search as decoding
from m4moe.training import rundir
import report_fixtures as fixtures
from m4moe.eval import translator as translator_lib

BEAM = decoding.BeamSearchConfig(beam_size=1, alpha=0.0, max_decode_length=8)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  return fixtures.make_tiny_run(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def other_vocab(tmp_path_factory, run_dir):
  """A vocabulary of the same sizes as the run's, trained on other text."""
  vocab_dir = tmp_path_factory.mktemp("other_vocab")
  text = fixtures.sentences(400, seed=7)
  tags = [f"<2{l}>" for l in fixtures.LANGUAGES]
  fixtures._train_spm(text + [t.upper() for t in text], vocab_dir / "source",
                      vocab_size=360, tags=tags)
  fixtures._train_spm(text, vocab_dir / "target", vocab_size=320, tags=())
  for name in ("source.model", "target.model"):
    ours = spm.SentencePieceProcessor(
        model_file=str(run_dir.parent / "vocab" / name))
    theirs = spm.SentencePieceProcessor(model_file=str(vocab_dir / name))
    assert ours.get_piece_size() == theirs.get_piece_size()  # same size
    assert (vocab_dir / name).read_bytes() != (
        run_dir.parent / "vocab" / name).read_bytes()
  return vocab_dir


def test_run_record_round_trip(run_dir):
  record = json.loads((run_dir / "config.json").read_text())
  vocab_dir = run_dir.parent / "vocab"
  fingerprint = rundir.VocabFingerprint.of_dir(vocab_dir)
  assert record["vocab"] == fingerprint.to_dict()
  assert rundir.VocabFingerprint.from_dict(record["vocab"]) == fingerprint
  assert fingerprint.source_path == str((vocab_dir / "source.model").resolve())
  assert len(fingerprint.source_sha256) == 64
  assert record["language_pairs"] == [["de", "en"], ["fr", "en"]]
  files = rundir.find_run_files(run_dir)
  assert files.vocab == fingerprint
  assert files.language_pairs == {("de", "en"), ("fr", "en")}
  assert files.source_vocab == vocab_dir / "source.model"
  assert files.checkpoint.endswith("ckpt-1")
  assert rundir.model_config_from_run(run_dir) == files.config
  assert rundir.language_pairs(["fr", "de", "fr"], direction="en_xx") == (
      ("en", "de"), ("en", "fr"))


def test_same_size_wrong_vocab_is_an_error_naming_both_files(
    run_dir, other_vocab):
  with pytest.raises(rundir.VocabMismatchError) as e:
    rundir.find_run_files(run_dir, vocab_dir=str(other_vocab))
  message = str(e.value)
  assert str(other_vocab / "source.model") in message
  assert str((run_dir.parent / "vocab" / "source.model").resolve()) in message
  assert "--vocab_dir=" in message
  # The library entry point refuses too (no model is restored).
  with pytest.raises(rundir.VocabMismatchError):
    translator_lib.load_translator(run_dir, vocab_dir=str(other_vocab),
                                   beam=BEAM)


def test_vocab_replaced_in_place_is_detected(tmp_path, run_dir, other_vocab):
  root = tmp_path / "copy"
  shutil.copytree(run_dir.parent, root)
  record = json.loads((root / "run" / "config.json").read_text())
  record.update(rundir.run_sections(vocab_dir=root / "vocab",
                                    languages=["de", "fr"]))
  record["data"]["vocab_dir"] = str(root / "vocab")
  (root / "run" / "config.json").write_text(json.dumps(record))
  rundir.find_run_files(root / "run")  # the recorded models: fine
  shutil.copy(other_vocab / "target.model", root / "vocab" / "target.model")
  with pytest.raises(rundir.VocabMismatchError,
                     match="target vocabulary .* replaced since training"):
    rundir.find_run_files(root / "run")


def test_old_run_without_record_warns_and_works(tmp_path, caplog):
  old = fixtures.make_tiny_run(tmp_path, record=False)
  with caplog.at_level(logging.WARNING):
    translator, files = translator_lib.load_translator(old, beam=BEAM)
  assert files.vocab is None and files.language_pairs is None
  assert "no vocabulary fingerprint" in caplog.text
  # Any pair with tags is accepted (nothing recorded to check against).
  assert len(translator.translate(["open file"], source_lang="de",
                                  target_lang="fr")) == 1


def test_untrained_language_pairs_are_errors(run_dir):
  translator, _ = translator_lib.load_translator(run_dir, beam=BEAM)
  assert len(translator.translate(["open file"], source_lang="fr")) == 1
  with pytest.raises(translator_lib.TranslatorError,
                     match=r"run was not trained to translate into 'de' "
                     r"\(fr->de requested\): it translates only into en "
                     r"\(trained pairs: de->en, fr->en\)"):
    translator.translate(["open file"], source_lang="fr", target_lang="de")
  # en has a tag in the vocabulary but en->en was never trained.
  with pytest.raises(translator_lib.TranslatorError,
                     match=r"not trained on en->en: source languages into "
                     r"en are de, fr"):
    translator.translate(["open file"], source_lang="en")


@pytest.mark.parametrize("content, match", [
    (None, "config.json not found"),
    ("{not json", r"is not valid JSON: .* at line 1 column 2"),
    ("[1, 2]", "expected a JSON object"),
    ('{"model": {"d_model": "big"}}', "bad model config"),
    ('{"model": {}, "vocab": {"source": 1}}', "malformed \"vocab\""),
])
def test_bad_config_json_names_the_file(tmp_path, run_dir, content, match):
  target = tmp_path / "run"
  shutil.copytree(run_dir, target)
  if content is None:
    (target / "config.json").unlink()
  else:
    if "vocab" in content:
      record = json.loads((run_dir / "config.json").read_text())
      record["vocab"] = {"source": 1}
      content = json.dumps(record)
    (target / "config.json").write_text(content)
  with pytest.raises(rundir.RunDirError, match=match) as e:
    rundir.find_run_files(target)
  assert str(target / "config.json") in str(e.value)


def _cli(name, *args, stdin=b""):
  return subprocess.run([sys.executable, "-m", f"m4moe.cli.{name}", *args],
                        input=stdin, capture_output=True, timeout=180,
                        check=False)


def test_decode_cli_refuses_wrong_vocab_and_untrained_pair(
    run_dir, other_vocab, tmp_path):
  out = tmp_path / "out.txt"
  proc = _cli("decode", f"--model_dir={run_dir}", "--source_lang=de",
              f"--vocab_dir={other_vocab}", f"--output={out}",
              stdin=b"open file\n")
  stderr = proc.stderr.decode()
  assert proc.returncode != 0
  assert str(other_vocab / "source.model") in stderr
  assert "Traceback" not in stderr and not out.exists()
  proc = _cli("decode", f"--model_dir={run_dir}", "--source_lang=de",
              "--target_lang=de", f"--output={out}", stdin=b"open file\n")
  stderr = proc.stderr.decode()
  assert proc.returncode != 0
  assert "not trained to translate into 'de'" in stderr
  assert "Traceback" not in stderr and not out.exists()
  # --lang_column: every line's pair is checked before decoding.
  proc = _cli("decode", f"--model_dir={run_dir}", "--lang_column",
              f"--output={out}", stdin=b"de\topen file\nen\tsave\n")
  stderr = proc.stderr.decode()
  assert proc.returncode != 0 and "not trained on en->en" in stderr
  assert "Traceback" not in stderr and not out.exists()


def test_damaged_checkpoint_is_an_error_naming_it(tmp_path, run_dir):
  target = tmp_path / "run"
  shutil.copytree(run_dir, target)
  data = next(target.glob("ckpt-1.data-*"))
  data.write_bytes(data.read_bytes()[:1000])  # truncated by a full disk
  with pytest.raises(translator_lib.TranslatorError,
                     match=f"{target}/ckpt-1: cannot restore the model .*"
                     "damaged"):
    translator_lib.load_translator(target, beam=BEAM)
  data.unlink()
  with pytest.raises(translator_lib.TranslatorError,
                     match="No such file or directory"):
    translator_lib.load_translator(target, beam=BEAM)
