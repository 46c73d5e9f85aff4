"""Fault injection on inputs: malformed corpus lines, garbage SentencePiece
models. Each fault gives a message naming the file (and line) and a defined
outcome: skipped and counted, or a clean non-zero exit."""

import json
import random
import shutil
import subprocess
import sys

import pytest

from m4moe.data import fixtures
from m4moe.data import pipeline
from m4moe.data import tsv
from m4moe.data import vocab
from m4moe.eval import translator as translator_lib

SIZES = {"de": 60, "fr": 40}
# (line content, expected problem) appended to train/de.tsv after line 60.
BAD_LINES = [
    (b"no tab in this line", "no tab"),
    (b"one\ttwo\tthree\tfour\tfive", "5 tab-separated fields"),
    (b"caf\xe9\tbad latin-1 byte", "invalid UTF-8 (byte 0xe9"),
    (b"", "empty line"),
]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
  root = tmp_path_factory.mktemp("clean")
  corpus_dir = fixtures.write_corpus(root / "corpus", sizes=SIZES, dev=6)
  vocab.train_vocabularies(corpus_dir, root / "vocab", config=vocab.VocabConfig(
      source_vocab_size=400, target_vocab_size=350, max_sentences=2000))
  return corpus_dir, root / "vocab"


@pytest.fixture()
def dirty(clean, tmp_path):
  """A copy of the corpus with malformed lines inside train/de.tsv and one
  in dev/fr.tsv; returns (corpus_dir, vocab_dir, {line number: problem})."""
  corpus_dir, vocab_dir = clean
  dirty_dir = tmp_path / "corpus"
  shutil.copytree(corpus_dir, dirty_dir)
  path = dirty_dir / "train" / "de.tsv"
  good = path.read_bytes().split(b"\n")[:-1]
  lines, expected = [], {}
  for index, line in enumerate(good):
    lines.append(line)
    if index % 15 == 4 and len(expected) < len(BAD_LINES):
      bad, problem = BAD_LINES[len(expected)]
      lines.append(bad)
      expected[len(lines)] = problem
  path.write_bytes(b"\n".join(lines) + b"\n")
  with open(dirty_dir / "dev" / "fr.tsv", "ab") as f:
    f.write(b"dev line without a tab\n")
  return dirty_dir, vocab_dir, expected


def test_scan_names_each_malformed_line(dirty):
  corpus_dir, _, expected = dirty
  scan = tsv.scan_tsv(corpus_dir / "train" / "de.tsv")
  assert scan.lines == SIZES["de"] + len(BAD_LINES)
  assert scan.valid == SIZES["de"]
  assert scan.bad_lines == tuple(sorted(expected))
  for problem, (number, want) in zip(scan.examples, sorted(expected.items())):
    assert problem.line == number and want in problem.message
    assert str(problem).startswith(f"{corpus_dir}/train/de.tsv:{number}: ")
  # \r\n endings are not a problem (the tf.data readers strip the \r).
  assert tsv.line_problem(b"a\tb\r"[:-1]) is None
  assert tsv.line_problem(b"\tonly translation") is None


def test_pipeline_skips_and_counts_malformed_lines(clean, dirty):
  clean_dir, vocab_dir = clean
  dirty_dir, _, expected = dirty
  ref = pipeline.read_tsv_corpus(clean_dir, split="train")
  got = pipeline.read_tsv_corpus(dirty_dir, split="train")
  assert got.sizes == ref.sizes == SIZES
  assert got.skipped == {str(dirty_dir / "train" / "de.tsv"): len(expected)}
  # Exactly the well-formed pairs, in file order.
  assert list(got.datasets["de"].as_numpy_iterator()) == list(
      ref.datasets["de"].as_numpy_iterator())
  # The training stream runs (it used to fail with a TF error naming
  # nothing once the reader reached the first bad line).
  config = pipeline.PipelineConfig(max_length=64, batch_size_tokens=1024,
                                   chunk_size=64, temperature=1.0)
  stats = pipeline.PipelineStats()
  ds = pipeline.training_dataset(
      got.datasets, got.sizes, config=config, stats=stats,
      tokenizers=pipeline.load_tokenizers(vocab_dir))
  for _ in zip(range(4), ds):
    pass
  assert sum(stats.as_dict()["kept"].values()) > SIZES["de"] + SIZES["fr"]
  # The dev reader skips them too.
  dev = pipeline.read_tsv_corpus(dirty_dir, split="dev")
  assert dev.sizes == {"de": 6, "fr": 6}
  assert len(list(dev.datasets["fr"])) == 6


def test_vocab_training_skips_malformed_lines(dirty, caplog):
  corpus_dir, _, expected = dirty
  pairs = vocab.read_split_pairs(corpus_dir, "train", "de")
  assert len(pairs) == SIZES["de"] and all(len(p) == 2 for p in pairs)
  assert f"skipping {len(expected)} malformed line(s)" in caplog.text


def _train(*args):
  return subprocess.run(
      [sys.executable, "-c", "from m4moe.cli.train import run; run()",
       "--config=tiny/dense", "--d_model=32", "--num_heads=2", "--d_kv=16",
       "--d_ff=64", "--num_encoder_layers=1", "--num_decoder_layers=1",
       "--sequence_length=32", "--batch_tokens=256", "--log_every=1",
       "--eval_every=0", "--dev_batch_size=8", "--warmup_steps=10", *args],
      capture_output=True, text=True, timeout=300, check=False)


def test_check_config_reports_file_and_line(dirty, tmp_path):
  corpus_dir, vocab_dir, expected = dirty
  proc = _train(f"--corpus_dir={corpus_dir}", f"--vocab_dir={vocab_dir}",
                f"--model_dir={tmp_path}/run", "--check_config")
  assert proc.returncode == 2, proc.stderr[-2000:]
  for number, problem in expected.items():
    assert f"{corpus_dir}/train/de.tsv:{number}: {problem}" in proc.stderr
  assert f"{corpus_dir}/dev/fr.tsv:7: no tab" in proc.stderr
  assert "5 malformed corpus line(s) in 2 file(s)" in proc.stderr
  assert "Traceback" not in proc.stderr
  assert not (tmp_path / "run").exists()


def test_training_skips_counts_and_records(dirty, tmp_path):
  corpus_dir, vocab_dir, expected = dirty
  run = tmp_path / "run"
  proc = _train(f"--corpus_dir={corpus_dir}", f"--vocab_dir={vocab_dir}",
                f"--model_dir={run}", "--train_steps=2")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "skipping 5 malformed corpus line(s)" in proc.stderr
  record = json.loads((run / "config.json").read_text())
  assert record["skipped_lines"] == {
      str(corpus_dir / "train" / "de.tsv"): len(expected),
      str(corpus_dir / "dev" / "fr.tsv"): 1}
  assert record["language_pairs"] == [["de", "en"], ["fr", "en"]]
  assert record["vocab"]["source"]["path"] == str(
      (vocab_dir / "source.model").resolve())
  # Resuming with another vocabulary is refused before any step.
  other = tmp_path / "other_vocab"
  shutil.copytree(vocab_dir, other)
  shutil.copy(vocab_dir / "source.model", other / "target.model")
  proc = _train(f"--corpus_dir={corpus_dir}", f"--vocab_dir={other}",
                f"--model_dir={run}", "--train_steps=3")
  assert proc.returncode == 2
  assert f"{other}/target.model is not the target vocabulary" in proc.stderr
  assert "Traceback" not in proc.stderr


GARBAGE = b"\x00\x01 this is not a SentencePiece model \xff" * 10


def test_garbage_sentencepiece_model_names_the_file(clean, tmp_path):
  corpus_dir, vocab_dir = clean
  bad_vocab = tmp_path / "vocab"
  shutil.copytree(vocab_dir, bad_vocab)
  (bad_vocab / "source.model").write_bytes(GARBAGE)
  with pytest.raises(ValueError, match=f"{bad_vocab}/source.model: not a "
                     "SentencePiece model"):
    vocab.load(bad_vocab / "source.model")
  with pytest.raises(ValueError, match="SentencePiece model not found"):
    vocab.load(bad_vocab / "missing.model")
  with pytest.raises(translator_lib.TranslatorError,
                     match=f"{bad_vocab}/source.model: not a SentencePiece"):
    translator_lib.load_sentencepiece(bad_vocab / "source.model",
                                      vocab_size=1000)
  proc = _train(f"--corpus_dir={corpus_dir}", f"--vocab_dir={bad_vocab}",
                f"--model_dir={tmp_path}/run", "--check_config")
  assert proc.returncode == 2
  assert f"{bad_vocab}/source.model: not a SentencePiece model" in proc.stderr
  assert "Traceback" not in proc.stderr


def test_tsv_dataset_filter_handles_many_bad_lines(tmp_path):
  """Every other line malformed, and the first and last: all filtered."""
  path = tmp_path / "x.tsv"
  lines = []
  for i in range(41):
    lines.append(f"bad {i}" if i % 2 == 0 else f"en {i}\tx {i}")
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  scan = tsv.scan_tsv(path)
  assert scan.bad_lines == tuple(range(1, 42, 2))
  assert len(scan.examples) == tsv.MAX_EXAMPLES
  assert scan.describe()[-1] == f"{path}: 1 more malformed line(s)"
  got = list(pipeline._pairs_of_lines(path, scan.bad_lines))
  assert [(a.numpy().decode(), b.numpy().decode()) for a, b in got] == [
      (f"en {i}", f"x {i}") for i in range(1, 41, 2)]


def test_block_scan_equals_line_by_line_check(tmp_path):
  """The fast block check finds exactly the lines line_problem rejects,
  whatever the block boundaries (random files of good and bad lines)."""
  rng = random.Random(1)
  pieces = [b"a\tb", b"no tab", b"x\ty\tz", b"", b"caf\xe9\tz", b"\tq",
            b"r\ts\r", "ü\tö".encode(), b"\t\t", b"\xe2\x82\tsplit char"]
  path = tmp_path / "r.tsv"
  for _ in range(200):
    lines = [rng.choice(pieces) for _ in range(rng.randint(0, 30))]
    data = b"\n".join(lines) + (b"\n" if rng.random() < 0.7 else b"")
    path.write_bytes(data)
    raws = data.split(b"\n")
    if raws[-1] == b"":
      raws.pop()
    want = [i for i, raw in enumerate(raws, start=1)
            if tsv.line_problem(raw.removesuffix(b"\r")) is not None]
    for block_size in (1, 5, 64, 1 << 20):
      scan = tsv.scan_tsv(path, block_size=block_size)
      assert scan.lines == len(raws)
      assert list(scan.bad_lines) == want, (block_size, data)
    pairs, scan = tsv.read_pairs(path)
    assert list(scan.bad_lines) == want
    assert len(pairs) == len(raws) - len(want)
