"""SentencePiece vocabularies: multilingual source, English target.

Both models use the project's ids: pad=0, eos=1, unk=2, no bos (bos_id=-1).
The source model also holds one user-defined piece per language tag
(``<2de>``, ``<2en>``, ``<2zh_Hant>`` ...), so a tag is always one id.

Training text for the source model is a temperature-balanced sample
(``p_l ∝ n_l^(1/T)``, :mod:`sampling`) of every language's non-English side
plus English, so low-resource scripts get pieces; byte fallback covers any
character outside ``character_coverage``. The target model is trained on the
English side. Normalisation is ``identity``: the corpus is already NFC with
normalised white space, so decode(encode(text)) == text.

Files written to ``output_dir``: ``source.model``/``.vocab``,
``target.model``/``.vocab`` and ``vocab.json`` (the config and languages).
SentencePiece records in a ``.model`` the path prefix it was trained to;
the models are trained in a temporary directory, so the prefix is cut to
its file name: training the same text twice gives the same bytes (the
runs' vocabulary fingerprint and the studies' input manifests compare
bytes). :func:`model_digest` compares models written before that by
what they hold.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import random
import tempfile
from typing import Iterable, Sequence

from absl import logging
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from m4moe import errors
from m4moe import flagutil
from m4moe.data import languages as languages_lib
from m4moe.data import sampling
from m4moe.data import tsv

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
ENGLISH = "en"
MODEL_TYPES = ("unigram", "bpe")


@dataclasses.dataclass(frozen=True, kw_only=True)
class VocabConfig:
  """SentencePiece training settings (each is an ``m4moe-vocab`` flag,
  :mod:`m4moe.flagutil`).

  Attributes:
    source_vocab_size: multilingual source pieces (paper: 64k).
    target_vocab_size: English target pieces (paper: 32k).
    temperature: T of the language-balanced sample for the source model.
    max_sentences: sentences sampled for the source model (target: half).
    character_coverage: fraction of characters covered by pieces; the rest
      use byte fallback.
    model_type: ``unigram`` or ``bpe``.
    seed: sampling seed.
    threads: SentencePiece training threads.
  """

  source_vocab_size: int = 64000
  target_vocab_size: int = 32000
  temperature: float = 5.0
  max_sentences: int = 1_000_000
  character_coverage: float = 0.9995
  model_type: str = dataclasses.field(
      default="unigram", metadata=flagutil.metadata(enum=MODEL_TYPES))
  seed: int = 0
  threads: int = 2

  def __post_init__(self) -> None:
    errors.require(self.model_type in MODEL_TYPES, "model_type",
                   self.model_type, f"choose one of {', '.join(MODEL_TYPES)}")
    for name in ("source_vocab_size", "target_vocab_size"):
      value = getattr(self, name)
      errors.require(value >= 300, name, value, "use at least 300 (256 "
                     "byte-fallback pieces + specials + language tags)")
    errors.require(0.9 <= self.character_coverage <= 1.0,
                   "character_coverage", self.character_coverage,
                   "use a fraction in [0.9, 1]")
    errors.require(self.threads >= 1, "threads", self.threads,
                   "use at least one thread")


@dataclasses.dataclass(frozen=True)
class VocabPaths:
  """The two trained models."""

  source_model: pathlib.Path
  target_model: pathlib.Path


def read_split_pairs(corpus_dir: pathlib.Path, split: str,
                     lang: str) -> list[tuple[str, str]]:
  """(english, x) pairs of ``<corpus_dir>/<split>/<lang>.tsv``.

  Malformed lines (:mod:`tsv`) are skipped with a warning naming the file,
  their count and the first ``file:line``.
  """
  path = corpus_dir / split / f"{lang}.tsv"
  if not path.exists():
    return []
  pairs, scan = tsv.read_pairs(path)
  if scan.bad_lines:
    logging.warning("%s: skipping %d malformed line(s) of %d, e.g. %s", path,
                    len(scan.bad_lines), scan.lines,
                    "; ".join(map(str, scan.examples[:3])))
  return pairs


def corpus_languages(corpus_dir: pathlib.Path, split: str = "train"
                     ) -> list[str]:
  """Languages with a ``<split>/<lang>.tsv`` file, sorted."""
  return sorted(p.stem for p in (corpus_dir / split).glob("*.tsv"))


def _sample(lines: Sequence[str], k: int, rng: random.Random) -> list[str]:
  """k lines: whole passes over ``lines`` plus a random remainder."""
  passes, rest = divmod(k, len(lines))
  return list(lines) * passes + rng.sample(list(lines), rest)


def sample_training_text(corpus_dir: pathlib.Path, *, config: VocabConfig,
                         langs: Sequence[str]) -> tuple[list[str], list[str]]:
  """Temperature-balanced source text and English target text.

  Returns:
    (source sentences, English sentences).
  """
  rng = random.Random(config.seed)
  by_lang = {}
  for lang in langs:
    by_lang[lang] = [x for _, x in read_split_pairs(corpus_dir, "train", lang)]
  _check_sides(corpus_dir, by_lang)
  english = sorted({en for lang in langs
                    for en, _ in read_split_pairs(corpus_dir, "train", lang)})
  by_lang[ENGLISH] = english
  probs = sampling.language_probabilities(
      {lang: len(v) for lang, v in by_lang.items()},
      temperature=config.temperature)
  source = []
  for lang, lines in by_lang.items():
    k = round(config.max_sentences * probs[lang])
    if lines and k:
      source.extend(_sample(lines, k, rng))
  rng.shuffle(source)
  target = _sample(english, min(len(english), config.max_sentences // 2), rng)
  return source, target


def train_sentencepiece(sentences: Iterable[str], *, model_prefix: pathlib.Path,
                        vocab_size: int, user_defined_symbols: Sequence[str],
                        config: VocabConfig) -> pathlib.Path:
  """Trains one SentencePiece model with the project's special ids.

  Returns:
    Path of the ``.model`` file.
  """
  model_prefix.parent.mkdir(parents=True, exist_ok=True)
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences), model_prefix=str(model_prefix),
      vocab_size=vocab_size, model_type=config.model_type,
      character_coverage=config.character_coverage, byte_fallback=True,
      pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
      pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
      user_defined_symbols=list(user_defined_symbols),
      normalization_rule_name="identity", split_digits=True,
      hard_vocab_limit=False, num_threads=config.threads,
      minloglevel=2,
      max_sentence_length=8192, train_extremely_large_corpus=False)
  path = model_prefix.with_suffix(".model")
  path.write_bytes(_canonical_bytes(path))
  return path


def _canonical_bytes(path: pathlib.Path) -> bytes:
  """A ``.model``'s bytes with its recorded training prefix cut to the
  file's stem (serialised deterministically)."""
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(path.read_bytes())
  proto.trainer_spec.model_prefix = path.stem
  return proto.SerializeToString(deterministic=True)


def model_digest(path: pathlib.Path) -> str:
  """sha256 of a ``.model`` with its recorded training prefix cut to the
  file's stem: equal for models that hold the same pieces, normaliser and
  trainer settings, wherever they were trained."""
  return hashlib.sha256(_canonical_bytes(path)).hexdigest()


def train_vocabularies(corpus_dir: pathlib.Path, output_dir: pathlib.Path, *,
                       config: VocabConfig,
                       langs: Sequence[str] = ()) -> VocabPaths:
  """Trains the source and target models on a built corpus.

  Both models are trained into a temporary directory inside ``output_dir``
  and then renamed into place one file at a time: a reader (a trainer
  fingerprinting the models) never sees a half-written file, and a failed
  or killed run leaves the previous models. ``m4moe-vocab`` also holds
  ``output_dir``'s lock, so no second writer interleaves its files.

  Args:
    corpus_dir: a corpus written by ``corpus.build_corpus``.
    output_dir: where the models go.
    config: sizes and sampling.
    langs: languages (default: every ``train/*.tsv``).

  Raises:
    ValueError: no languages, or none of them has training pairs (both
      sides would be empty), naming them.
  """
  langs = list(langs) or corpus_languages(corpus_dir)
  if not langs:
    raise ValueError(f"{corpus_dir}/train has no <lang>.tsv files")
  source, target = sample_training_text(corpus_dir, config=config,
                                        langs=langs)
  tags = [languages_lib.language_tag(l) for l in sorted({*langs, ENGLISH})]
  output_dir.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=output_dir, prefix=".tmp-") as tmp:
    staged = pathlib.Path(tmp)
    train_sentencepiece(
        source, model_prefix=staged / "source",
        vocab_size=config.source_vocab_size, user_defined_symbols=tags,
        config=config)
    train_sentencepiece(
        target, model_prefix=staged / "target",
        vocab_size=config.target_vocab_size, user_defined_symbols=(),
        config=config)
    (staged / "vocab.json").write_text(json.dumps(
        {"config": dataclasses.asdict(config), "languages": langs,
         "source_sentences": len(source), "target_sentences": len(target)},
        indent=1), encoding="utf-8")
    for name in ("source.vocab", "target.vocab", "vocab.json",
                 "source.model", "target.model"):
      os.replace(staged / name, output_dir / name)
  return VocabPaths(output_dir / "source.model", output_dir / "target.model")


def _check_sides(corpus_dir: pathlib.Path,
                 by_lang: dict[str, list[str]]) -> None:
  """Refuses a vocabulary trained on nothing; warns of empty languages.

  ``by_lang``: each language's training sentences (not English).
  """
  empty = sorted(l for l, lines in by_lang.items() if not lines)
  if len(empty) == len(by_lang):
    raise ValueError(
        f"no training pairs in {corpus_dir}/train for any of the languages "
        f"{', '.join(sorted(by_lang))}: both vocabulary sides would be "
        "trained on nothing. Rebuild the corpus with m4moe-build-corpus "
        "(its report.json says what was dropped) or choose --languages that "
        "have training pairs")
  if empty:
    logging.warning(
        "%s/train has no pairs for %s: the source vocabulary gets their "
        "language tags but none of their text", corpus_dir, ", ".join(empty))


def load(path: pathlib.Path | str) -> spm.SentencePieceProcessor:
  """Loads a model and checks the project's special ids.

  Raises:
    ValueError: the file is missing or not a SentencePiece model (naming
      it), or the model does not use pad=0, eos=1, unk=2, bos=-1.
  """
  if not pathlib.Path(path).is_file():
    raise ValueError(f"{path}: SentencePiece model not found (a file written "
                     "by m4moe-vocab, e.g. <--output_dir>/source.model)")
  try:
    sp = spm.SentencePieceProcessor(model_file=str(path))
  except (RuntimeError, OSError) as e:
    raise ValueError(f"{path}: not a SentencePiece model ({e}); the file is "
                     "damaged or of another kind: retrain it with m4moe-vocab "
                     "or point at the right directory") from e
  ids = (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id())
  if ids != (PAD_ID, EOS_ID, UNK_ID, -1):
    raise ValueError(f"{path}: special ids (pad, eos, unk, bos) are {ids}, "
                     "expected (0, 1, 2, -1); retrain with m4moe-vocab")
  return sp


def tag_id(sp: spm.SentencePieceProcessor, lang: str) -> int:
  """Id of the ``<2lang>`` piece.

  Raises:
    ValueError: the model has no such tag (it is not a single piece).
  """
  piece = languages_lib.language_tag(lang)
  pid = sp.piece_to_id(piece)
  if pid == sp.unk_id() or sp.id_to_piece(pid) != piece:
    raise ValueError(f"the source vocabulary has no tag {piece}; retrain it "
                     "with this language")
  return pid
