"""TFDS access: the corpus builder offline, catalog datasets via mock data."""

import socket

import pytest
import tensorflow_datasets as tfds

from m4moe.data import fixtures
from m4moe.data import pipeline
from m4moe.data import tfds_corpus
from m4moe.data import vocab

SIZES = {"de": 30, "zh_Hans": 12}


@pytest.fixture
def no_network(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError(f"network access attempted: {args}")
  monkeypatch.setattr(socket.socket, "connect", refuse)
  monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  root = tmp_path_factory.mktemp("tfds")
  corpus_dir = fixtures.write_corpus(root / "corpus", sizes=SIZES, dev=3,
                                     test=4)
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(socket.socket, "connect", _refuse)
    tfds_corpus.prepare_corpus(corpus_dir, root / "tfds")
  return corpus_dir, root / "tfds"


def _refuse(*args, **kwargs):
  raise AssertionError(f"network access attempted: {args}")


def test_builder_splits_and_features_match_the_corpus(prepared, no_network):
  corpus_dir, data_dir = prepared
  builder = tfds.builder(tfds_corpus.NAME, data_dir=str(data_dir))
  splits = builder.info.splits
  assert splits["train_de"].num_examples == 30
  assert splits["test_zh_Hans"].num_examples == 4
  ds = tfds.load(tfds_corpus.NAME, split="dev_de", data_dir=str(data_dir),
                 try_gcs=False, download=False, shuffle_files=False)
  examples = sorted((ex["target"].decode(), ex["source"].decode())
                    for ex in tfds.as_numpy(ds))
  assert examples == sorted(vocab.read_split_pairs(corpus_dir, "dev", "de"))
  both = tfds.load(tfds_corpus.NAME, split="dev_de+dev_zh_Hans",
                   data_dir=str(data_dir), try_gcs=False, download=False)
  langs = sorted(ex["lang"].decode() for ex in tfds.as_numpy(both))
  assert langs == ["de"] * 3 + ["zh_Hans"] * 3


def test_read_split_feeds_the_pipeline(prepared, no_network, tmp_path):
  corpus_dir, data_dir = prepared
  datasets, sizes = tfds_corpus.read_split(
      tfds_corpus.NAME, langs=list(SIZES), split="train",
      data_dir=str(data_dir))
  assert sizes == SIZES
  vocab.train_vocabularies(corpus_dir, tmp_path, config=vocab.VocabConfig(
      source_vocab_size=400, target_vocab_size=300, max_sentences=500))
  config = pipeline.PipelineConfig(max_length=128, batch_size_tokens=256,
                                   chunk_size=16, shuffle_buffer=4)
  ds = pipeline.training_dataset(
      datasets, sizes, config=config,
      tokenizers=pipeline.load_tokenizers(tmp_path))
  batch = next(iter(ds))
  assert batch["inputs"].shape == (2, 128)
  assert int(batch["targets_segment_ids"].numpy().max()) >= 1


def test_catalog_translation_dataset_with_mock_data(no_network):
  with tfds.testing.mock_data(num_examples=6):
    datasets, sizes = tfds_corpus.read_split(
        "wmt19_translate/de-en", langs=["de"], split="train")
    pairs = list(tfds.as_numpy(datasets["de"]))
  assert sizes == {"de": 6} and len(pairs) == 6
  assert all(isinstance(en, bytes) and isinstance(x, bytes)
             for en, x in pairs)
