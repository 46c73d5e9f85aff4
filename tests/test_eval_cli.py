"""m4moe-decode / m4moe-eval on a tiny run directory built in tmp_path."""

import dataclasses
import io
import subprocess
import sys

import numpy as np
import pytest

from m4moe.inference import beam_search as decoding
from m4moe.training import rundir
import report_fixtures as fixtures
from m4moe.eval import textio
from m4moe.eval import translator as translator_lib


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  return fixtures.make_tiny_run(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def translator(run_dir):
  beam = decoding.BeamSearchConfig(beam_size=2, alpha=0.6,
                                   max_decode_length=12)
  t, _ = translator_lib.load_translator(run_dir, beam=beam,
                                        max_input_length=24, batch_size=3)
  return t


def test_translator_order_empty_truncation_and_batch_independence(translator):
  texts = fixtures.sentences(7, seed=3)
  long_text = " ".join(fixtures.WORDS * 2)
  inputs = [texts[0], "", long_text, "   ", *texts[1:]]
  before = translator.stats.truncated
  outputs = translator.translate(inputs, source_lang="de")
  assert len(outputs) == len(inputs)
  assert outputs[1] == "" and outputs[3] == ""
  assert translator.stats.truncated - before == 1
  # Each sentence alone gives the same output as inside sorted batches.
  for text, out in zip(inputs, outputs):
    if text.strip():
      assert translator.translate([text], source_lang="de") == [out]
  ids, cut = translator.encode(long_text, tag=translator.tag_id("en"))
  assert cut and len(ids) == 24 and ids[0] == translator.tag_id("en")
  assert ids[-1] == 1


def test_translator_rejects_unknown_language(translator):
  with pytest.raises(translator_lib.TranslatorError, match="<2xx>"):
    translator.translate(["open file"], source_lang="xx")


def test_find_run_files_errors_name_the_problem(tmp_path, run_dir):
  with pytest.raises(rundir.RunDirError, match="config.json"):
    rundir.find_run_files(tmp_path)
  with pytest.raises(rundir.RunDirError, match="--vocab_dir"):
    rundir.find_run_files(run_dir, vocab_dir=str(tmp_path))
  assert rundir.find_run_files(run_dir, checkpoint="1").checkpoint.endswith(
      "/ckpt-1")
  with pytest.raises(rundir.RunDirError, match="no checkpoint of step 2 "
                     r"\(its checkpoints: ckpt-1\)"):
    rundir.find_run_files(run_dir, checkpoint="2")


def test_decode_cli_checkpoint_best_without_one_is_a_usage_error(run_dir,
                                                                  tmp_path):
  (tmp_path / "in.txt").write_text("open file\n", encoding="utf-8")
  proc = _cli("decode", f"--model_dir={run_dir}", "--checkpoint=best",
              "--source_lang=de", f"--input={tmp_path}/in.txt",
              f"--output={tmp_path}/out.txt")
  stderr = proc.stderr.decode()
  assert proc.returncode != 0
  assert "no best-on-dev checkpoint" in stderr and "ckpt-1" in stderr
  assert "Traceback" not in stderr
  assert not (tmp_path / "out.txt").exists()


def test_read_lines_utf8_and_lang_column():
  lines = textio.read_lines(io.BytesIO(b"de\tHallo\r\n\nfr\tSalut\n"),
                            lang_column=True)
  assert [(l.number, l.lang, l.text) for l in lines] == [
      (1, "de", "Hallo"), (2, None, ""), (3, "fr", "Salut")]
  with pytest.raises(textio.InputError, match=r"in.txt: line 2 is not valid "
                     r"UTF-8 \(byte 0xff"):
    textio.read_lines(io.BytesIO(b"ok\nbad \xff\n"), name="in.txt")
  with pytest.raises(textio.InputError, match="line 1 has no 'lang<TAB>"):
    textio.read_lines(io.BytesIO(b"no column\n"), lang_column=True)
  stream = io.StringIO()
  progress = textio.Progress(4, stream=stream, interval=0)
  progress(2)
  progress(2)
  assert "4/4 sentences" in stream.getvalue()
  assert "sentences/s" in stream.getvalue()


def _cli(name, *args, stdin=b""):
  return subprocess.run([sys.executable, "-m", f"m4moe.cli.{name}", *args],
                        input=stdin, capture_output=True, timeout=180,
                        check=False)


def test_decode_cli_matches_library(run_dir, translator, tmp_path):
  texts = fixtures.sentences(4, seed=4)
  long_text = " ".join(fixtures.WORDS * 2)
  lines = [f"de\t{texts[0]}", "", f"fr\t{long_text}", f"de\t{texts[1]}",
           f"fr\t{texts[2]}"]
  (tmp_path / "in.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
  proc = _cli("decode", f"--model_dir={run_dir}", "--lang_column",
              f"--input={tmp_path}/in.tsv", f"--output={tmp_path}/out.txt",
              "--beam_size=2", "--alpha=0.6", "--max_decode_length=12",
              "--max_input_length=24", "--progress=on")
  stderr = proc.stderr.decode()
  assert proc.returncode == 0, stderr
  got = (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")[:-1]
  expected = translator.translate(
      [texts[0], "", long_text, texts[1], texts[2]], source_lang="de")
  assert got == expected
  assert "1 input line(s) were longer than --max_input_length=24" in stderr
  assert "5/5 sentences" in stderr and "sentences/s" in stderr


@pytest.fixture(scope="module")
def trained_run_dir(tmp_path_factory):
  """A run trained briefly on a copy task, so outputs end with EOS."""
  return fixtures.make_tiny_run(tmp_path_factory.mktemp("trained"),
                                train_steps=40)


def test_decode_length_per_batch_matches_full_search(trained_run_dir):
  """A per-batch limit T changes nothing for outputs that end before T.

  Beam search over the shorter buffer sees a subset of the candidates; the
  full search's best hypothesis, if it ends with EOS before T, is in that
  subset and still wins. Outputs cut at T are counted.
  """
  full_beam = decoding.BeamSearchConfig(beam_size=2, alpha=0.6,
                                        max_decode_length=48)
  full, _ = translator_lib.load_translator(trained_run_dir, beam=full_beam,
                                           max_input_length=24)
  short, _ = translator_lib.load_translator(trained_run_dir, beam=full_beam,
                                            max_input_length=24,
                                            length_ratio=0.5)
  assert full.decode_length(20) == 48
  assert short.decode_length(5) == 32  # ceil(2.5) + 16 = 19 -> 32
  assert short.decode_length(24) == 32  # 12 + 16 = 28 -> 32
  assert short.decode_length(80) == 48  # 56 -> 64, capped at 48
  tag = short.tag_id("en")
  rows = [short.encode(text, tag=tag)[0]
          for text in fixtures.sentences(12, seed=11)]
  compared = cut = 0
  for row in rows:
    limit = short.decode_length(len(row))
    before = short.stats.length_limited
    got = short.search([row])[0]
    want = full.search([row])[0]
    assert got.shape == (limit,)
    ends = [i for i, t in enumerate(want) if t == translator_lib.EOS_ID]
    if ends and ends[0] < limit:
      np.testing.assert_array_equal(got, want[:limit])
      compared += 1
    hit_limit = translator_lib.EOS_ID not in got.tolist()
    cut += hit_limit
    assert short.stats.length_limited - before == int(hit_limit)
  assert compared > 0, "no output ended before the limit: test is vacuous"
  # A limit below the outputs' lengths cuts them, and each cut is counted.
  tiny_beam = dataclasses.replace(full_beam, max_decode_length=2)
  tiny, _ = translator_lib.load_translator(trained_run_dir, beam=tiny_beam,
                                           max_input_length=24,
                                           length_ratio=0.5)
  best = tiny.search(rows)
  assert best.shape == (len(rows), 2)
  no_eos = int(np.sum(~np.any(best == translator_lib.EOS_ID, axis=1)))
  assert no_eos > 0 and tiny.stats.length_limited == no_eos


def test_decode_length_ratio_must_be_positive(run_dir):
  beam = decoding.BeamSearchConfig(beam_size=1, alpha=0.0,
                                   max_decode_length=8)
  with pytest.raises(translator_lib.TranslatorError,
                     match="--decode_length_ratio"):
    translator_lib.load_translator(run_dir, beam=beam, length_ratio=-1.0)
