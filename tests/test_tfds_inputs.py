"""One TFDS path: the corpus as m4moe_corpus trains exactly as its TSV files.

The corpus is written as TFDS by the function ``m4moe-build-corpus
--tfds_data_dir`` calls; the TFDS reader of m4moe.data.tfds_corpus must give
the TSV reader's pairs per split (the same multiset, in the same order), so
the trainer's stream and dev sets are the same batches under one seed.
"""

import collections
import socket

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from m4moe.data import fixtures
from m4moe.data import pipeline
from m4moe.data import tfds_corpus
from m4moe.data import vocab
from m4moe.training import inputs

SIZES = {"de": 40, "fr": 25, "zh_Hans": 12}
SPLITS = ("train", "dev", "test")


def _refuse(*args, **kwargs):
  raise AssertionError(f"network access attempted: {args}")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """(corpus dir, TFDS data dir, vocab dir) of a small corpus with a
  malformed training line and an empty test file."""
  root = tmp_path_factory.mktemp("tfds_inputs")
  corpus_dir = fixtures.write_corpus(root / "corpus", sizes=SIZES, dev=3,
                                     test=4)
  with open(corpus_dir / "train" / "fr.tsv", "a", encoding="utf-8") as f:
    f.write("a line without a tab\nsave the file\tenregistrer\n")
  (corpus_dir / "test" / "zh_Hans.tsv").write_text("", encoding="utf-8")
  vocab.train_vocabularies(corpus_dir, root / "vocab", config=vocab.VocabConfig(
      source_vocab_size=400, target_vocab_size=300, max_sentences=500))
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(socket.socket, "connect", _refuse)
    tfds_corpus.write_corpus_dataset(corpus_dir, str(root / "tfds"))
  return corpus_dir, root / "tfds", root / "vocab"


def _decoded(datasets):
  return {lang: [(a.decode(), b.decode()) for a, b in tfds.as_numpy(ds)]
          for lang, ds in datasets.items()}


@pytest.mark.parametrize("split", SPLITS)
def test_tfds_reader_gives_the_tsv_pairs_of_every_split(corpus, split):
  corpus_dir, data_dir, _ = corpus
  tsv = pipeline.read_tsv_corpus(corpus_dir, split=split)
  datasets, sizes = tfds_corpus.read_split(tfds_corpus.NAME, split=split,
                                           data_dir=str(data_dir))
  assert sizes == tsv.sizes
  ours, theirs = _decoded(datasets), _decoded(tsv.datasets)

  def multiset(pairs):
    return collections.Counter((lang, x, english) for lang, rows in
                               pairs.items() for english, x in rows)
  assert multiset(ours) == multiset(theirs)
  assert ours == theirs  # and in file order, where the shuffle starts
  if split == "train":
    assert ("save the file", "enregistrer") in ours["fr"]
    assert sizes["fr"] == SIZES["fr"] + 1  # the malformed line left out
  if split == "test":
    assert sizes["zh_Hans"] == 0 and not ours["zh_Hans"]


def _config(corpus, source: str, **kwargs) -> inputs.DataConfig:
  corpus_dir, data_dir, vocab_dir = corpus
  where = ({"corpus_dir": str(corpus_dir)} if source == "tsv" else
           {"tfds_name": tfds_corpus.NAME, "tfds_data_dir": str(data_dir)})
  return inputs.DataConfig(vocab_dir=str(vocab_dir), sequence_length=32,
                           batch_tokens=256, dev_batch_size=2, seed=3,
                           **where, **kwargs)


@pytest.mark.parametrize("language_features", [False, True])
def test_training_from_tfds_gives_the_tsv_batches(corpus, language_features):
  built = {source: inputs.build_inputs(
      _config(corpus, source), language_features=language_features)
           for source in ("tsv", "tfds")}
  tsv, tfds_inputs = built["tsv"], built["tfds"]
  assert tfds_inputs.languages == tsv.languages == tuple(sorted(SIZES))
  assert tfds_inputs.src_vocab_size == tsv.src_vocab_size
  for a, b in zip(tsv.train.take(4), tfds_inputs.train.take(4)):
    assert sorted(a) == sorted(b)
    for key in a:
      np.testing.assert_array_equal(a[key].numpy(), b[key].numpy(), key)
  assert sorted(tfds_inputs.dev) == sorted(tsv.dev)
  for lang in tsv.dev:
    dev_a, dev_b = list(tsv.dev[lang]), list(tfds_inputs.dev[lang])
    assert len(dev_a) == len(dev_b) == 2  # 3 pairs in batches of 2
    for a, b in zip(dev_a, dev_b):
      for key in a:
        np.testing.assert_array_equal(a[key].numpy(), b[key].numpy(), key)


def test_a_different_seed_changes_the_stream(corpus):
  # The equality above would hold trivially if the seed did nothing.
  first = next(iter(inputs.build_inputs(_config(corpus, "tfds")).train))
  other = next(iter(inputs.build_inputs(
      inputs.DataConfig(**{**_config(corpus, "tfds").to_dict(),
                           "seed": 4})).train))
  assert not np.array_equal(first["inputs"], other["inputs"])


def test_languages_select_and_unknown_ones_are_named(corpus):
  built = inputs.build_inputs(_config(corpus, "tfds", languages=("fr",)))
  assert built.languages == ("fr",) and list(built.dev) == ["fr"]
  with pytest.raises(inputs.DataConfigError, match="no train split for ja"):
    inputs.build_inputs(_config(corpus, "tfds", languages=("fr", "ja")))


def test_check_data_names_a_missing_tfds_build(corpus, tmp_path):
  config = _config(corpus, "tfds")
  assert not inputs.check_data(config)
  empty = inputs.DataConfig(**{**config.to_dict(),
                               "tfds_data_dir": str(tmp_path)})
  [problem] = inputs.check_data(empty)
  assert "not prepared" in problem
  assert f"m4moe-build-corpus --tfds_data_dir={tmp_path}" in problem


def test_catalog_translation_dataset_keeps_working(corpus):
  _, _, vocab_dir = corpus
  config = inputs.DataConfig(
      vocab_dir=str(vocab_dir), tfds_name="wmt19_translate/de-en",
      sequence_length=32, batch_tokens=256, dev_batch_size=2)
  with tfds.testing.mock_data(num_examples=8):
    built = inputs.build_inputs(config)
    batch = next(iter(built.train))
    dev = list(built.dev["de"])
    assert tfds_corpus.check_datasets("wmt19_translate/de-en", None) == []
  assert built.languages == ("de",)
  assert batch["inputs"].shape == (8, 32)
  assert sum(int(b["inputs"].shape[0]) for b in dev) == 8


def test_a_dataset_without_en_is_refused(corpus):
  _, _, vocab_dir = corpus
  config = inputs.DataConfig(vocab_dir=str(vocab_dir), tfds_name="mnist")
  with tfds.testing.mock_data(num_examples=2):
    with pytest.raises(inputs.DataConfigError, match="an 'en' feature"):
      inputs.build_inputs(config)


def test_rewriting_replaces_only_an_m4moe_corpus_build(corpus, tmp_path):
  corpus_dir, _, _ = corpus
  data_dir = tmp_path / "tfds"
  tfds_corpus.write_corpus_dataset(corpus_dir, str(data_dir))
  (corpus_dir / "dev" / "de.tsv").rename(tmp_path / "de.tsv")
  try:
    tfds_corpus.write_corpus_dataset(corpus_dir, str(data_dir))
  finally:
    (tmp_path / "de.tsv").rename(corpus_dir / "dev" / "de.tsv")
  _, sizes = tfds_corpus.read_split(tfds_corpus.NAME, split="dev",
                                    data_dir=str(data_dir))
  assert sorted(sizes) == ["fr", "zh_Hans"]  # the new build, whole
  assert sorted(p.name for p in data_dir.iterdir()) == [tfds_corpus.NAME]
  foreign = tmp_path / "other" / tfds_corpus.NAME / "1.1.0"
  foreign.mkdir(parents=True)
  (foreign / "mine.txt").write_text("keep me")
  with pytest.raises(tfds_corpus.TfdsError, match="not an m4moe_corpus"):
    tfds_corpus.write_corpus_dataset(corpus_dir, str(tmp_path / "other"))
  assert (foreign / "mine.txt").read_text() == "keep me"


def test_eval_sets_from_tfds_are_the_test_files(corpus):
  corpus_dir, data_dir, _ = corpus
  pairs = tfds_corpus.split_pairs(tfds_corpus.NAME, split="test",
                                  data_dir=str(data_dir))
  assert pairs["de"] == vocab.read_split_pairs(corpus_dir, "test", "de")
  assert tf.io.gfile.exists(str(data_dir / tfds_corpus.NAME / "1.1.0"))
