"""Training and dev inputs for ``m4moe-train`` from a corpus, TFDS or synthetic.

Sources (exactly one):

* ``corpus_dir`` + ``vocab_dir``: a corpus built by ``m4moe-build-corpus``
  (``train/dev/<lang>.tsv``) and the SentencePiece models of ``m4moe-vocab``;
  the stream is :func:`m4moe.data.pipeline.training_dataset` (temperature
  sampling, packing, checkpointable iterator). Malformed TSV lines (bad
  UTF-8, no tab, extra fields: :mod:`m4moe.data.tsv`) are skipped and
  counted (:attr:`Inputs.skipped_lines`; ``m4moe-train --check_config``
  lists them as ``file:line: problem``).
* ``tfds_name`` + ``vocab_dir``: TFDS translation datasets (comma-separated,
  e.g. ``wmt19_translate/de-en``), each with a text feature ``en`` and one
  other language feature; loaded offline (``try_gcs=False``) from
  ``tfds_data_dir``.
* ``synthetic``: the reverse-and-permute toy task of
  :mod:`m4moe.training.synthetic` (no files; for smoke tests).

With ``language_features=True`` (a ``--route_by=language`` model) every
batch, train and dev, also has ``inputs_languages`` / ``targets_languages``:
each token's routing-language index, its language's position in
:attr:`Inputs.languages` (:mod:`m4moe.moe.task_routing`).
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from typing import Any, Mapping, TYPE_CHECKING

import tensorflow as tf

from m4moe import errors
from m4moe import flagutil
from m4moe.training import synthetic

if TYPE_CHECKING:
  from m4moe.data import tsv  # pylint: disable=g-bad-import-order


class DataConfigError(errors.ConfigError):
  """A data setting is invalid; the message names the flag and the fix."""


_require = functools.partial(errors.require, error=DataConfigError)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
  """Input settings (each is an ``m4moe-train`` flag, :mod:`m4moe.flagutil`;
  ``synthetic`` is ``--synthetic_data``, ``seed`` the shared ``--seed``).

  Attributes:
    corpus_dir: built corpus directory.
    vocab_dir: directory with source.model / target.model.
    tfds_name: comma-separated TFDS translation dataset names.
    tfds_data_dir: TFDS data directory (offline).
    synthetic: train on the synthetic toy task (no files; smoke runs).
    languages: languages to train on (empty: all of the corpus).
    temperature: T of the language sampling p_l ∝ n_l^(1/T).
    sequence_length: tokens per packed row and side.
    batch_tokens: tokens per (global) batch and side.
    pack: pack several pairs per row.
    dev_split: corpus split for the per-language dev cross-entropy.
    dev_batch_size: sentence pairs per dev batch.
    seed: shuffling / sampling seed.
  """

  corpus_dir: str = ""
  vocab_dir: str = ""
  tfds_name: str = ""
  tfds_data_dir: str = ""
  synthetic: bool = dataclasses.field(
      default=False, metadata=flagutil.metadata(flag="synthetic_data"))
  languages: tuple[str, ...] = ()
  temperature: float = 5.0
  sequence_length: int = 64
  batch_tokens: int = 4096
  pack: bool = True
  dev_split: str = "dev"
  dev_batch_size: int = 64
  seed: int = 0

  def __post_init__(self) -> None:
    chosen = [name for name, on in (("corpus_dir", self.corpus_dir),
                                    ("tfds_name", self.tfds_name),
                                    ("synthetic_data", self.synthetic)) if on]
    if len(chosen) != 1:
      raise DataConfigError(
          f"give exactly one data source: --corpus_dir, --tfds_name or "
          "--synthetic_data (got "
          f"{', '.join('--' + c for c in chosen) or 'none'})")
    if not self.synthetic and not self.vocab_dir:
      raise DataConfigError("--vocab_dir is required with --corpus_dir or "
                            "--tfds_name (run m4moe-vocab first)")
    _require(self.batch_tokens >= self.sequence_length, "batch_tokens",
             self.batch_tokens, f"use at least --sequence_length="
             f"{self.sequence_length} (one row)")
    _require(self.temperature > 0, "temperature", self.temperature,
             "use a positive value (1 proportional, 5 M4)")

  @property
  def batch_rows(self) -> int:
    return self.batch_tokens // self.sequence_length

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Inputs:
  """What the trainer consumes.

  Attributes:
    train: repeating dataset of global model batches.
    dev: {language: finite dataset of dev batches}.
    src_vocab_size, tgt_vocab_size: from the SentencePiece models (None
      for synthetic data: keep the model config's).
    languages: the training languages.
    tsv_scans: line checks of the corpus files read (train and dev); their
      malformed lines are skipped by the pipeline (empty for TFDS and
      synthetic data).
  """
  train: tf.data.Dataset
  dev: Mapping[str, tf.data.Dataset]
  src_vocab_size: int | None
  tgt_vocab_size: int | None
  languages: tuple[str, ...]
  tsv_scans: tuple["tsv.TsvScan", ...] = ()

  @property
  def skipped_lines(self) -> dict[str, int]:
    """{file: malformed lines skipped} of the corpus files that have any."""
    from m4moe.data import tsv  # pylint: disable=g-import-not-at-top
    return tsv.skipped_counts(list(self.tsv_scans))

  def line_problems(self) -> list[str]:
    """``file:line: problem`` of the malformed corpus lines (first few per
    file, then a count of the rest)."""
    return [p for scan in self.tsv_scans for p in scan.describe()]


SYNTHETIC_VOCAB = 64


def _with_language(ds: tf.data.Dataset, index: int) -> tf.data.Dataset:
  """Adds the language features, all ``index``, to unpacked batches."""
  from m4moe.moe import task_routing  # pylint: disable=g-import-not-at-top

  def add(batch):
    features = task_routing.language_features(
        tf.fill(tf.shape(batch["inputs"])[:1], index),
        inputs=batch["inputs"], targets=batch["targets"])
    return {**batch, **features}
  return ds.map(add)


def _synthetic(config: DataConfig, language_features: bool) -> Inputs:
  length = config.sequence_length
  pairs = synthetic.synthetic_pairs(num_pairs=4096, vocab_size=SYNTHETIC_VOCAB,
                                    max_length=min(length - 1, 16),
                                    seed=config.seed)
  train = synthetic.pairs_dataset(pairs[256:], batch_size=config.batch_rows,
                                  length=length, shuffle_seed=config.seed)
  dev = synthetic.pairs_dataset(pairs[:256], batch_size=config.dev_batch_size,
                                length=length, shuffle_seed=None, repeat=False)
  if language_features:  # one language, index 0
    train, dev = _with_language(train, 0), _with_language(dev, 0)
  return Inputs(train=train, dev={"syn": dev}, src_vocab_size=None,
                tgt_vocab_size=None, languages=("syn",))


def _pipeline_config(config: DataConfig, language_features: bool):
  from m4moe.data import pipeline  # pylint: disable=g-import-not-at-top
  return pipeline.PipelineConfig(
      max_length=config.sequence_length, batch_size_tokens=config.batch_tokens,
      temperature=config.temperature, pack=config.pack, seed=config.seed,
      language_features=language_features)


def _language_index(language_features: bool, langs, lang: str) -> int | None:
  return sorted(langs).index(lang) if language_features else None


def _corpus(config: DataConfig, language_features: bool) -> Inputs:
  from m4moe.data import pipeline  # pylint: disable=g-import-not-at-top
  corpus = pathlib.Path(config.corpus_dir)
  vocab_dir = pathlib.Path(config.vocab_dir)
  tokenizers = pipeline.load_tokenizers(vocab_dir)
  train_split = pipeline.read_tsv_corpus(corpus, split="train",
                                         langs=config.languages)
  datasets = train_split.datasets
  train = pipeline.training_dataset(
      datasets, train_split.sizes, tokenizers=tokenizers,
      config=_pipeline_config(config, language_features))
  dev_split = pipeline.read_tsv_corpus(corpus, split=config.dev_split,
                                       langs=tuple(sorted(datasets)))
  dev = {lang: pipeline.evaluation_dataset(
      ds, lang=lang, tokenizers=tokenizers, batch_size=config.dev_batch_size,
      language_index=_language_index(language_features, datasets, lang))
         for lang, ds in dev_split.datasets.items()}
  return Inputs(train=train, dev=dev,
                src_vocab_size=tokenizers.source.get_piece_size(),
                tgt_vocab_size=tokenizers.target.get_piece_size(),
                languages=tuple(sorted(datasets)),
                tsv_scans=(*train_split.scans.values(),
                           *dev_split.scans.values()))


def _tfds_pairs(name: str, split: str, data_dir: str):
  """(lang, dataset of (english, x) string pairs, size) of one TFDS name."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = tfds.builder(name, data_dir=data_dir or None)
  keys = [k for k in builder.info.features.keys() if k != "en"]
  if len(keys) != 1 or "en" not in builder.info.features.keys():
    raise DataConfigError(
        f"--tfds_name={name}: expected a translation dataset with an 'en' "
        f"feature and one other language, got {list(builder.info.features)}")
  lang = keys[0]
  ds = builder.as_dataset(split=split).map(lambda ex: (ex["en"], ex[lang]))
  return lang, ds, builder.info.splits[split].num_examples


def _tfds(config: DataConfig, language_features: bool) -> Inputs:
  from m4moe.data import pipeline  # pylint: disable=g-import-not-at-top
  tokenizers = pipeline.load_tokenizers(pathlib.Path(config.vocab_dir))
  train, sizes, dev = {}, {}, {}
  for name in filter(None, config.tfds_name.split(",")):
    lang, ds, n = _tfds_pairs(name, "train", config.tfds_data_dir)
    if config.languages and lang not in config.languages:
      continue
    train[lang], sizes[lang] = ds, n
    _, dev_ds, _ = _tfds_pairs(name, "validation", config.tfds_data_dir)
    dev[lang] = dev_ds
  dev = {lang: pipeline.evaluation_dataset(
      ds, lang=lang, tokenizers=tokenizers, batch_size=config.dev_batch_size,
      language_index=_language_index(language_features, train, lang))
         for lang, ds in dev.items()}
  stream = pipeline.training_dataset(
      train, sizes, tokenizers=tokenizers,
      config=_pipeline_config(config, language_features))
  return Inputs(train=stream, dev=dev,
                src_vocab_size=tokenizers.source.get_piece_size(),
                tgt_vocab_size=tokenizers.target.get_piece_size(),
                languages=tuple(sorted(train)))


def build_inputs(config: DataConfig, *,
                 language_features: bool = False) -> Inputs:
  """The train stream and dev sets for ``config`` (see module docstring).

  ``language_features``: add the per-token routing-language indices (for a
  ``--route_by=language`` model).
  """
  if config.synthetic:
    return _synthetic(config, language_features)
  if config.corpus_dir:
    return _corpus(config, language_features)
  return _tfds(config, language_features)


def check_data(config: DataConfig) -> list[str]:
  """Problems with the data files (empty list: fine). Reads no examples."""
  problems = []
  if config.synthetic:
    return problems
  for name in ("source.model", "target.model"):
    if not (pathlib.Path(config.vocab_dir) / name).is_file():
      problems.append(f"--vocab_dir={config.vocab_dir}: {name} is missing "
                      "(run m4moe-vocab)")
  if config.corpus_dir:
    train_dir = pathlib.Path(config.corpus_dir) / "train"
    found = {p.stem for p in train_dir.glob("*.tsv")}
    if not found:
      problems.append(f"--corpus_dir={config.corpus_dir}: no train/*.tsv "
                      "(run m4moe-build-corpus)")
    missing = sorted(set(config.languages) - found)
    if found and missing:
      problems.append(f"--languages: {', '.join(missing)} not in "
                      f"{train_dir} (has {len(found)} languages)")
  return problems
