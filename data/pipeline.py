"""tf.data input pipeline: temperature-sampled, tokenised, packed batches.

Training stream (:func:`training_dataset`)::

  per language: (english, x) string pairs (malformed TSV lines skipped and
    counted, :func:`read_tsv_corpus`) -> shuffle(seed_l) -> repeat
  -> sample_from_datasets(p_l ∝ n_l^(1/T), seed)           [sampling.py]
  -> batch(chunk) -> py_function: SentencePiece encode, add the tag and
     </s>, drop pairs longer than max_length (counted), pack  [packing.py]
  -> unbatch rows -> batch(B rows) -> model batch dict

Elements: the model's batch dict (:class:`m4moe.model.interfaces.ModelBatch`),
every value ``<int32>[B, L]``: ``inputs``, ``targets``, ``inputs_segment_ids``,
``inputs_positions``, ``targets_segment_ids``, ``targets_positions``.
Sources are ``<2xx> source </s>`` (``xx`` = target language), targets
``target </s>``; 0 is padding.

Determinism: every random op is seeded from ``config.seed`` and every map is
ordered, so the stream is a function of the data and the config. Resume: the
iterator is trackable, ``tf.train.Checkpoint(data=iterator)`` saves and
restores its position (the pipeline sets the external-state policy so the
pure-Python tokeniser does not block saving; the tokeniser is a pure
function of its chunk, so nothing is lost). Tokenisation runs SentencePiece
on whole chunks inside ``tf.py_function``: ~135k tokens/s on the real corpus
on 2 busy cores (``m4moe-bench input_pipeline``), far above what
a CPU training step consumes.

:class:`PipelineStats` counts what the tokeniser saw (per-language pairs
kept, pairs dropped for length, rows, tokens); with prefetching it runs a few
batches ahead of the consumer.
"""

from __future__ import annotations

import collections
import dataclasses
import pathlib
import threading
from typing import Mapping, Sequence

from absl import logging
import numpy as np
import sentencepiece as spm
import tensorflow as tf

from m4moe.data import packing
from m4moe.data import sampling
from m4moe.data import tsv
from m4moe.data import vocab

DIRECTIONS = ("xx_en", "en_xx")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineConfig:
  """Input pipeline settings.

  Attributes:
    max_length: L, tokens per row on each side (and the longest pair kept).
    batch_size_tokens: tokens per batch per side; rows B = this // L.
    temperature: T of language sampling (1 proportional, 5 M4, inf uniform).
    pack: pack several pairs per row (False: one pair per row).
    chunk_size: pairs tokenised and packed together.
    shuffle_buffer: per-language shuffle buffer. It is saved in iterator
      checkpoints (about 50 KB per language at 128), so it is small: the
      corpus builder already shuffles each language's training file.
    direction: ``xx_en`` (X->English, source tag <2en>) or ``en_xx``.
    seed: seed of shuffling and sampling.
    language_features: also emit ``inputs_languages`` /
      ``targets_languages`` <int32>[B, L], every token's routing-language
      index (``--route_by=language``, :mod:`m4moe.moe.task_routing`): the
      position of its pair's (non-English) language in the sorted languages
      given to :func:`training_dataset`.
  """

  max_length: int = 64
  batch_size_tokens: int = 4096
  temperature: float = 5.0
  pack: bool = True
  chunk_size: int = 512
  shuffle_buffer: int = 128
  direction: str = "xx_en"
  seed: int = 0
  language_features: bool = False

  def __post_init__(self):
    if self.max_length < 4:
      raise ValueError(f"--max_length={self.max_length} must be >= 4")
    if self.batch_size_tokens < self.max_length:
      raise ValueError(f"--batch_size_tokens={self.batch_size_tokens} must be "
                       f">= --max_length={self.max_length} (one row)")
    if self.direction not in DIRECTIONS:
      raise ValueError(f"--direction={self.direction!r}: one of {DIRECTIONS}")
    if self.chunk_size < 1 or self.shuffle_buffer < 1:
      raise ValueError("--chunk_size and --shuffle_buffer must be >= 1")

  @property
  def batch_rows(self) -> int:
    """B, rows per batch."""
    return self.batch_size_tokens // self.max_length


class PipelineStats:
  """Thread-safe counters filled by the tokeniser (for logging only)."""

  def __init__(self):
    self._lock = threading.Lock()
    self.kept = collections.Counter()
    self.dropped_too_long = collections.Counter()
    self.rows = 0
    self.tokens = 0

  def add(self, *, kept: Mapping[str, int], dropped: Mapping[str, int],
          rows: int, tokens: int) -> None:
    with self._lock:
      self.kept.update(kept)
      self.dropped_too_long.update(dropped)
      self.rows += rows
      self.tokens += tokens

  def as_dict(self) -> dict:
    with self._lock:
      return {"kept": dict(self.kept), "dropped_too_long":
              dict(self.dropped_too_long), "rows": self.rows,
              "tokens": self.tokens}


def _pairs_of_lines(path: pathlib.Path,
                    bad_lines: Sequence[int]) -> tf.data.Dataset:
  """``(english, x)`` of the lines of ``path`` not in ``bad_lines``.

  A file without malformed lines is read with the native CSV reader (as
  before, so iterator checkpoints of existing runs stay valid); otherwise
  lines are enumerated and the malformed ones (1-based numbers from
  :func:`tsv.scan_tsv`) filtered out before splitting on the tab.
  """
  if not bad_lines:
    # A native reader (no traced Python per language: 200 languages would
    # take tens of seconds to trace).
    return tf.data.experimental.CsvDataset(
        str(path), [tf.constant("", tf.string)] * 2, field_delim="\t",
        use_quote_delim=False)
  bad = tf.constant(sorted(i - 1 for i in bad_lines), tf.int64)  # 0-based
  count = len(bad_lines)

  def good(index, line):  # pylint: disable=unused-argument
    pos = tf.searchsorted(bad, tf.reshape(index, [1]))[0]
    hit = tf.gather(bad, tf.minimum(pos, count - 1)) == index
    return tf.logical_not(tf.logical_and(pos < count, hit))

  def split(index, line):  # pylint: disable=unused-argument
    fields = tf.strings.split(line, "\t")
    return fields[0], fields[1]

  return tf.data.TextLineDataset(str(path)).enumerate().filter(good).map(
      split)


@dataclasses.dataclass(frozen=True)
class TsvCorpus:
  """One split of a corpus, as datasets.

  Attributes:
    datasets: lang -> dataset of ``(english, x)`` ``<string>[]`` pairs
      (malformed lines skipped).
    sizes: lang -> number of well-formed pairs.
    scans: lang -> the :class:`tsv.TsvScan` of its file (malformed lines).
  """

  datasets: dict[str, tf.data.Dataset]
  sizes: dict[str, int]
  scans: dict[str, tsv.TsvScan]

  @property
  def skipped(self) -> dict[str, int]:
    """{file: malformed lines skipped} of the files that have any."""
    return tsv.skipped_counts(self.scans)


def read_tsv_corpus(corpus_dir: pathlib.Path, *, split: str = "train",
                    langs: Sequence[str] = ()) -> TsvCorpus:
  """Per-language datasets of a split; malformed lines skipped and counted.

  Every file is scanned once (:func:`tsv.scan_tsv`); a warning names each
  file with malformed lines, their count and the first few ``file:line``.

  Raises:
    ValueError: a requested language has no ``<split>/<lang>.tsv``.
  """
  corpus_dir = pathlib.Path(corpus_dir)
  langs = list(langs) or vocab.corpus_languages(corpus_dir, split)
  datasets, sizes, scans = {}, {}, {}
  for lang in langs:
    path = corpus_dir / split / f"{lang}.tsv"
    if not path.exists():
      raise ValueError(f"{path} does not exist (language {lang!r} has no "
                       f"{split} data)")
    scan = tsv.scan_tsv(path)
    if scan.bad_lines:
      logging.warning("%s: skipping %d malformed line(s) of %d, e.g. %s", path,
                      len(scan.bad_lines), scan.lines,
                      "; ".join(map(str, scan.examples[:3])))
    scans[lang], sizes[lang] = scan, scan.valid
    datasets[lang] = _pairs_of_lines(path, scan.bad_lines)
  return TsvCorpus(datasets=datasets, sizes=sizes, scans=scans)


def tsv_language_datasets(corpus_dir: pathlib.Path, *, split: str = "train",
                          langs: Sequence[str] = ()
                          ) -> tuple[dict[str, tf.data.Dataset],
                                     dict[str, int]]:
  """Per-language datasets of ``(english, x)`` string scalars from a corpus.

  :func:`read_tsv_corpus` without the scans.

  Returns:
    (lang -> dataset, lang -> number of well-formed pairs).

  Raises:
    ValueError: a requested language has no ``<split>/<lang>.tsv``.
  """
  corpus = read_tsv_corpus(corpus_dir, split=split, langs=langs)
  return corpus.datasets, corpus.sizes


@dataclasses.dataclass(frozen=True)
class Tokenizers:
  """The SentencePiece models and tag/eos conventions of a direction."""

  source: spm.SentencePieceProcessor
  target: spm.SentencePieceProcessor
  direction: str = "xx_en"

  def encode_pairs(self, langs: Sequence[str], english: Sequence[str],
                   other: Sequence[str]) -> tuple[list[list[int]],
                                                  list[list[int]]]:
    """Source ids ``<2tgt> ... </s>`` and target ids ``... </s>``."""
    if self.direction == "xx_en":
      sources, targets = other, english
      tags = [vocab.tag_id(self.source, "en")] * len(langs)
    else:
      sources, targets = english, other
      tags = [vocab.tag_id(self.source, lang) for lang in langs]
    src = self.source.encode(list(sources))
    tgt = self.target.encode(list(targets))
    eos = vocab.EOS_ID
    return ([[tag, *ids, eos] for tag, ids in zip(tags, src)],
            [[*ids, eos] for ids in tgt])


def _chunk_packer(tokenizers: Tokenizers, lang_names: Sequence[str],
                  config: PipelineConfig, stats: PipelineStats,
                  routing_index: Mapping[str, int] | None = None):
  """The numpy function run by ``tf.py_function`` on each chunk."""

  def pack(lang_ids, english, other):
    langs = [lang_names[i] for i in lang_ids.numpy()]
    english = [s.decode("utf-8") for s in english.numpy()]
    other = [s.decode("utf-8") for s in other.numpy()]
    sources, targets = tokenizers.encode_pairs(langs, english, other)
    keep = [max(len(s), len(t)) <= config.max_length
            for s, t in zip(sources, targets)]
    kept = collections.Counter(l for l, k in zip(langs, keep) if k)
    dropped = collections.Counter(l for l, k in zip(langs, keep) if not k)
    sources = [s for s, k in zip(sources, keep) if k]
    targets = [t for t, k in zip(targets, keep) if k]
    languages = None
    if routing_index is not None:
      languages = [routing_index[l] for l, k in zip(langs, keep) if k]
    rows = packing.pack_pairs(sources, targets, length=config.max_length,
                              pack=config.pack, languages=languages)
    stats.add(kept=kept, dropped=dropped, rows=len(rows["inputs"]),
              tokens=sum(map(len, sources)) + sum(map(len, targets)))
    return [rows[k] for k in _features(config)]

  return pack


def _features(config: PipelineConfig) -> tuple[str, ...]:
  """The keys of a training batch (packing features, language ids)."""
  return packing.FEATURES + (
      packing.LANGUAGE_FEATURES if config.language_features else ())


def training_dataset(datasets: Mapping[str, tf.data.Dataset],
                     sizes: Mapping[str, int], *, tokenizers: Tokenizers,
                     config: PipelineConfig,
                     stats: PipelineStats | None = None) -> tf.data.Dataset:
  """The infinite, packed, temperature-sampled training stream.

  Args:
    datasets: lang -> dataset of ``(english, x)`` ``<string>[]`` pairs.
    sizes: lang -> n_l for the sampling weights.
    tokenizers: SentencePiece models.
    config: pipeline settings.
    stats: filled with tokeniser counts when given.

  Returns:
    Dataset of dicts of ``<int32>[B, L]`` (module docstring).
  """
  if tokenizers.direction != config.direction:
    raise ValueError(f"tokenizers are for {tokenizers.direction}, config "
                     f"--direction={config.direction}")
  langs = sorted(l for l in datasets if sizes[l] > 0)  # empty: never sampled
  if not langs:
    raise ValueError(f"no training pairs in any language: {dict(sizes)}")
  probs = sampling.language_probabilities({l: sizes[l] for l in langs},
                                          temperature=config.temperature)
  streams = []
  for index, lang in enumerate(langs):
    ds = datasets[lang].shuffle(config.shuffle_buffer,
                                seed=config.seed * 1009 + index,
                                reshuffle_each_iteration=True).repeat()
    lang_id = tf.data.Dataset.from_tensors(tf.constant(index, tf.int32))
    streams.append(tf.data.Dataset.zip((lang_id.repeat(), ds)))
  mixed = tf.data.Dataset.sample_from_datasets(
      streams, weights=[probs[l] for l in langs], seed=config.seed)
  mixed = mixed.map(lambda lang_id, pair: (lang_id, pair[0], pair[1]))
  routing_index = None
  if config.language_features:
    routing_index = {l: i for i, l in enumerate(sorted(datasets))}
  pack = _chunk_packer(tokenizers, langs, config, stats or PipelineStats(),
                       routing_index)
  length = config.max_length
  features = _features(config)

  def tokenize_and_pack(lang_ids, english, other):
    arrays = tf.py_function(pack, [lang_ids, english, other],
                            [tf.int32] * len(features))
    for array in arrays:
      array.set_shape([None, length])
    return tuple(arrays)

  ds = mixed.batch(config.chunk_size).map(
      tokenize_and_pack, num_parallel_calls=2, deterministic=True)
  ds = ds.unbatch().batch(config.batch_rows, drop_remainder=True)
  ds = ds.map(lambda *a: dict(zip(features, a)))
  return ds.prefetch(2).with_options(_options())


def _options() -> tf.data.Options:
  options = tf.data.Options()
  options.deterministic = True
  options.experimental_external_state_policy = (
      tf.data.experimental.ExternalStatePolicy.IGNORE)
  return options


def evaluation_dataset(pairs: tf.data.Dataset, *, lang: str,
                       tokenizers: Tokenizers, batch_size: int,
                       language_index: int | None = None) -> tf.data.Dataset:
  """Unpacked, padded batches of one language's dev/test pairs, in order.

  Args:
    pairs: dataset of ``(english, x)`` ``<string>[]`` pairs.
    lang: the language of ``pairs``.
    tokenizers: SentencePiece models (direction decides source/target).
    batch_size: pairs per batch (the last batch may be smaller).
    language_index: ``lang``'s routing-language index; if given, the
      batches also have ``inputs_languages`` / ``targets_languages`` filled
      with it (``--route_by=language``).

  Returns:
    Dataset of dicts: ``inputs`` ``<int32>[b, Ls]``, ``targets``
    ``<int32>[b, Lt]`` (0-padded to the batch's longest), ``source_text``
    and ``target_text`` ``<string>[b]``, ``lang`` ``<string>[b]`` (and the
    language features).
  """

  def encode(english, other):
    n = len(english.numpy())
    sources, targets = tokenizers.encode_pairs(
        [lang] * n, [s.decode("utf-8") for s in english.numpy()],
        [s.decode("utf-8") for s in other.numpy()])
    return _pad(sources), _pad(targets)

  def to_batch(english, other):
    inputs, targets = tf.py_function(encode, [english, other],
                                     [tf.int32, tf.int32])
    inputs.set_shape([None, None])
    targets.set_shape([None, None])
    src_text, tgt_text = ((other, english) if tokenizers.direction == "xx_en"
                          else (english, other))
    batch = {"inputs": inputs, "targets": targets, "source_text": src_text,
             "target_text": tgt_text,
             "lang": tf.fill(tf.shape(english), lang)}
    if language_index is not None:
      for key, ids in zip(packing.LANGUAGE_FEATURES, (inputs, targets)):
        batch[key] = tf.fill(tf.shape(ids), tf.constant(language_index,
                                                        tf.int32))
    return batch

  return pairs.batch(batch_size).map(to_batch).with_options(_options())


def _pad(seqs: Sequence[Sequence[int]]) -> np.ndarray:
  out = np.zeros((len(seqs), max(map(len, seqs), default=0)), np.int32)
  for row, ids in enumerate(seqs):
    out[row, :len(ids)] = ids
  return out


def load_tokenizers(vocab_dir: pathlib.Path, *,
                    direction: str = "xx_en") -> Tokenizers:
  """Loads ``source.model``/``target.model`` written by ``m4moe-vocab``."""
  return Tokenizers(vocab.load(vocab_dir / "source.model"),
                    vocab.load(vocab_dir / "target.model"), direction)


def corpus_training_dataset(corpus_dir: pathlib.Path, vocab_dir: pathlib.Path,
                            *, config: PipelineConfig,
                            langs: Sequence[str] = (),
                            stats: PipelineStats | None = None
                            ) -> tf.data.Dataset:
  """:func:`training_dataset` over a built corpus and ``m4moe-vocab`` models."""
  datasets, sizes = tsv_language_datasets(corpus_dir, split="train",
                                          langs=langs)
  return training_dataset(
      datasets, sizes, config=config, stats=stats,
      tokenizers=load_tokenizers(vocab_dir, direction=config.direction))


def corpus_evaluation_datasets(corpus_dir: pathlib.Path,
                               vocab_dir: pathlib.Path, *, split: str = "dev",
                               langs: Sequence[str] = (),
                               direction: str = "xx_en",
                               batch_size: int = 64
                               ) -> dict[str, tf.data.Dataset]:
  """lang -> :func:`evaluation_dataset` of a corpus's dev or test split."""
  datasets, _ = tsv_language_datasets(corpus_dir, split=split, langs=langs)
  tokenizers = load_tokenizers(vocab_dir, direction=direction)
  return {lang: evaluation_dataset(ds, lang=lang, tokenizers=tokenizers,
                                   batch_size=batch_size)
          for lang, ds in datasets.items()}
