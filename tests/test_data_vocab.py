"""SentencePiece vocabularies: special ids, tags, round trip, balanced text."""

import collections
import math

import pytest
import sentencepiece as spm

from m4moe.data import fixtures
from m4moe.data import sampling
from m4moe.data import vocab

SIZES = {"de": 300, "ru": 200, "ja": 100, "zh_Hans": 50, "fr": 20}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  root = tmp_path_factory.mktemp("vocab")
  corpus_dir = fixtures.write_corpus(root / "corpus", sizes=SIZES)
  config = vocab.VocabConfig(source_vocab_size=400, target_vocab_size=300,
                             max_sentences=2000)
  paths = vocab.train_vocabularies(corpus_dir, root / "vocab", config=config)
  return corpus_dir, paths, config


def test_special_ids_and_single_piece_tags(trained):
  _, paths, _ = trained
  for path in (paths.source_model, paths.target_model):
    sp = vocab.load(path)
    assert [sp.id_to_piece(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]
    assert sp.bos_id() == -1
  sp = vocab.load(paths.source_model)
  ids = {vocab.tag_id(sp, lang) for lang in [*SIZES, "en"]}
  assert len(ids) == len(SIZES) + 1 and min(ids) > 2
  with pytest.raises(ValueError, match="no tag <2xx>"):
    vocab.tag_id(sp, "xx")


def test_lossless_round_trip_on_held_out_text_of_every_language(trained):
  corpus_dir, paths, _ = trained
  source = vocab.load(paths.source_model)
  target = vocab.load(paths.target_model)
  for lang in SIZES:
    pairs = vocab.read_split_pairs(corpus_dir, "test", lang)
    assert pairs
    for english, x in pairs:
      assert source.decode(source.encode(x)) == x
      assert target.decode(target.encode(english)) == english
  # Characters never seen in training go through byte fallback, not <unk>.
  unseen = "Ωmega ℵ 你好 ☃"
  assert vocab.UNK_ID not in source.encode(unseen)
  assert source.decode(source.encode(unseen)) == unseen


def test_training_text_is_temperature_balanced(trained):
  corpus_dir, _, config = trained
  source, target = vocab.sample_training_text(corpus_dir, config=config,
                                              langs=list(SIZES))
  assert abs(len(source) - config.max_sentences) <= len(SIZES) + 1
  english = {en for lang in SIZES
             for en, _ in vocab.read_split_pairs(corpus_dir, "train", lang)}
  sizes = {lang: n for lang, n in SIZES.items()}
  sizes["en"] = len(english)
  probs = sampling.language_probabilities(sizes, temperature=5.0)
  # Fake translations carry a script or a "(lang)" marker: count them.
  marker = collections.Counter()
  for line in source:
    if line.endswith("(de)"):
      marker["de"] += 1
    elif line.endswith("(fr)"):
      marker["fr"] += 1
  for lang in ("de", "fr"):
    assert marker[lang] == round(config.max_sentences * probs[lang])
  assert set(target) <= english


def test_temperature_formula():
  sizes = {"a": 1000, "b": 10}
  assert sampling.language_probabilities(sizes, temperature=1.0)["a"] == (
      pytest.approx(1000 / 1010))
  p5 = sampling.language_probabilities(sizes, temperature=5.0)
  assert p5["a"] / p5["b"] == pytest.approx(100 ** 0.2)
  assert sampling.language_probabilities(sizes, temperature=math.inf) == {
      "a": 0.5, "b": 0.5}
  with pytest.raises(ValueError, match="temperature"):
    sampling.language_probabilities(sizes, temperature=0)


def test_load_rejects_models_with_other_special_ids(tmp_path):
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(fixtures.english_sentences(200)),
      model_prefix=str(tmp_path / "m"), vocab_size=60, minloglevel=2)
  with pytest.raises(ValueError, match=r"expected \(0, 1, 2, -1\)"):
    vocab.load(tmp_path / "m.model")


def test_training_the_same_text_twice_gives_the_same_bytes(trained, tmp_path):
  corpus_dir, paths, config = trained
  again = vocab.train_vocabularies(corpus_dir, tmp_path / "elsewhere",
                                   config=config)
  for first, second in ((paths.source_model, again.source_model),
                        (paths.target_model, again.target_model)):
    assert first.read_bytes() == second.read_bytes()
    assert vocab.model_digest(first) == vocab.model_digest(second)
  # The recorded prefix is the file name, not the temporary directory.
  proto = vocab.sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(paths.source_model.read_bytes())
  assert proto.trainer_spec.model_prefix == "source"


def test_model_digest_ignores_only_the_recorded_training_prefix(
    trained, tmp_path):
  _, paths, _ = trained
  proto = vocab.sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(paths.target_model.read_bytes())
  proto.trainer_spec.model_prefix = "/tmp/.tmp-abc123/target"
  moved = tmp_path / "target.model"
  moved.write_bytes(proto.SerializeToString())
  assert moved.read_bytes() != paths.target_model.read_bytes()
  assert vocab.model_digest(moved) == vocab.model_digest(paths.target_model)
  # Another piece is another model.
  proto.pieces[5].piece = proto.pieces[5].piece + "x"
  moved.write_bytes(proto.SerializeToString())
  assert vocab.model_digest(moved) != vocab.model_digest(paths.target_model)
