"""Training and dev inputs for ``m4moe-train`` from a corpus, TFDS or synthetic.

Sources (exactly one):

* ``corpus_dir`` + ``vocab_dir``: a corpus built by ``m4moe-build-corpus``
  (``train/dev/<lang>.tsv``) and the SentencePiece models of ``m4moe-vocab``;
  the stream is :func:`m4moe.data.pipeline.training_dataset` (temperature
  sampling, packing, checkpointable iterator). Malformed TSV lines (bad
  UTF-8, no tab, extra fields: :mod:`m4moe.data.tsv`) are skipped and
  counted (:attr:`Inputs.skipped_lines`; ``m4moe-train --check_config``
  lists them as ``file:line: problem``).
* ``tfds_name`` + ``vocab_dir``: TFDS datasets read by the package's one TFDS
  reader, :mod:`m4moe.data.tfds_corpus`: ``m4moe_corpus`` (the corpus as
  ``m4moe-build-corpus --tfds_data_dir`` wrote it; the same examples, in the
  same order, as the TSV files, so the same stream) or catalog translation
  datasets (an ``en`` feature and one other language), loaded offline from
  ``tfds_data_dir``. Train from the ``train`` split, dev from ``dev_split``
  (a catalog dataset's ``validation`` for ``dev``).
* ``synthetic``: the reverse-and-permute toy task of
  :mod:`m4moe.training.synthetic` (no files; for smoke tests).

With ``language_features=True`` (a ``--route_by=language`` model) every
batch, train and dev, also has ``inputs_languages`` / ``targets_languages``:
each token's routing-language index, its language's position in
:attr:`Inputs.languages` (:mod:`m4moe.moe.task_routing`).

Multi-host input (a TPU VM pod, where each host feeds its own cores):
process ``process_index`` of ``process_count`` reads a disjoint shard of
every language's training examples, every ``process_count``-th one from its
index on (before shuffling), and yields ``1/process_count`` of each global
batch's rows; the shards together are every example once. Sampling weights
come from the whole language sizes, so every host mixes languages alike,
but each host draws with its own seed (``seed * process_count +
process_index``), so a global batch is not one language sequence repeated
per host. Each host's stream is deterministic in its index, so its iterator
state (or the count of consumed batches) resumes its own shard.
:func:`shard_for_input_context` takes the index and count from a
``tf.distribute.InputContext``. Dev sets are not sharded.
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
    tfds_name: comma-separated TFDS datasets: m4moe_corpus (written by
      m4moe-build-corpus --tfds_data_dir) and/or catalog translation sets.
    tfds_data_dir: TFDS data directory (offline; a folder or gs:// path).
    synthetic: train on the synthetic toy task (no files; smoke runs).
    languages: languages to train on (empty: all of the corpus).
    temperature: T of the language sampling p_l ∝ n_l^(1/T).
    sequence_length: tokens per packed row and side.
    batch_tokens: tokens per (global) batch and side.
    pack: pack several pairs per row.
    dev_split: corpus split for the per-language dev cross-entropy.
    dev_batch_size: sentence pairs per dev batch.
    seed: shuffling / sampling seed.
    process_index: this host's input shard (0 .. process_count - 1).
    process_count: hosts that each read one shard of the training data.
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
  process_index: int = 0
  process_count: int = 1

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
    _require(self.process_count >= 1, "process_count", self.process_count,
             "use the number of hosts reading input (1 on one machine)")
    _require(0 <= self.process_index < self.process_count, "process_index",
             self.process_index,
             f"use 0 .. {self.process_count - 1} (--process_count="
             f"{self.process_count})")
    _require(self.batch_rows % self.process_count == 0, "batch_tokens",
             self.batch_tokens, f"its {self.batch_rows} rows of "
             f"--sequence_length={self.sequence_length} must split evenly "
             f"over --process_count={self.process_count} hosts")

  @property
  def batch_rows(self) -> int:
    """Rows of a global batch."""
    return self.batch_tokens // self.sequence_length

  @property
  def host_batch_tokens(self) -> int:
    """Tokens per side of this host's part of a global batch."""
    return self.batch_rows // self.process_count * self.sequence_length

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Inputs:
  """What the trainer consumes.

  Attributes:
    train: repeating dataset of model batches: global batches, or this
      host's part of them with ``process_count > 1``.
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
  train_pairs = pairs[256:][config.process_index::config.process_count]
  train = synthetic.pairs_dataset(
      train_pairs, batch_size=config.batch_rows // config.process_count,
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
      max_length=config.sequence_length,
      batch_size_tokens=config.host_batch_tokens,
      temperature=config.temperature, pack=config.pack,
      seed=config.seed * config.process_count + config.process_index,
      language_features=language_features)


def _language_index(language_features: bool, langs, lang: str) -> int | None:
  return sorted(langs).index(lang) if language_features else None


def shard_datasets(datasets: Mapping[str, tf.data.Dataset],
                   sizes: Mapping[str, int], *, index: int, count: int
                   ) -> dict[str, tf.data.Dataset]:
  """Host ``index`` of ``count``'s shard of each language's examples.

  Args:
    datasets: lang -> dataset of ``(english, x)`` ``<string>[]`` pairs.
    sizes: lang -> its number of pairs.
    index, count: this host and the number of hosts.

  Returns:
    lang -> the pairs at positions ``index, index + count, ...`` (the
    datasets themselves for ``count == 1``, so one-host streams and their
    iterator checkpoints stay as they were).

  Raises:
    DataConfigError: a language has fewer pairs than hosts (some host's
      shard would be empty, and sampling from it never ends).
  """
  if count == 1:
    return dict(datasets)
  small = sorted(l for l in datasets if 0 < sizes[l] < count)
  if small:
    raise DataConfigError(
        f"--process_count={count}: {', '.join(small)} ha"
        f"{'s' if len(small) == 1 else 've'} fewer training pairs than "
        "hosts, so a host would have none; leave it out with --languages")
  return {lang: ds.shard(count, index) for lang, ds in datasets.items()}


def shard_for_input_context(config: DataConfig,
                            context: tf.distribute.InputContext
                            ) -> DataConfig:
  """``config`` reading the shard of the input pipeline ``context`` names
  (``strategy.distribute_datasets_from_function`` passes one per host)."""
  return dataclasses.replace(
      config, process_index=context.input_pipeline_id,
      process_count=context.num_input_pipelines)


def _inputs(config: DataConfig, language_features: bool, *, tokenizers,
            train_split, dev_split, scans=()) -> Inputs:
  """The Inputs of per-language ``(datasets, sizes)`` of train and dev."""
  from m4moe.data import pipeline  # pylint: disable=g-import-not-at-top
  datasets, sizes = train_split
  train = pipeline.training_dataset(
      shard_datasets(datasets, sizes, index=config.process_index,
                     count=config.process_count),
      sizes, tokenizers=tokenizers,
      config=_pipeline_config(config, language_features))
  dev = {lang: pipeline.evaluation_dataset(
      ds, lang=lang, tokenizers=tokenizers, batch_size=config.dev_batch_size,
      language_index=_language_index(language_features, datasets, lang))
         for lang, ds in dev_split[0].items()}
  return Inputs(train=train, dev=dev,
                src_vocab_size=tokenizers.source.get_piece_size(),
                tgt_vocab_size=tokenizers.target.get_piece_size(),
                languages=tuple(sorted(datasets)), tsv_scans=tuple(scans))


def _corpus(config: DataConfig, language_features: bool) -> Inputs:
  from m4moe.data import pipeline  # pylint: disable=g-import-not-at-top
  corpus = pathlib.Path(config.corpus_dir)
  tokenizers = pipeline.load_tokenizers(pathlib.Path(config.vocab_dir))
  train_split = pipeline.read_tsv_corpus(corpus, split="train",
                                         langs=config.languages)
  dev_split = pipeline.read_tsv_corpus(
      corpus, split=config.dev_split, langs=tuple(sorted(train_split.datasets)))
  return _inputs(config, language_features, tokenizers=tokenizers,
                 train_split=(train_split.datasets, train_split.sizes),
                 dev_split=(dev_split.datasets, dev_split.sizes),
                 scans=(*train_split.scans.values(),
                        *dev_split.scans.values()))


def _tfds(config: DataConfig, language_features: bool) -> Inputs:
  """Inputs from TFDS (:mod:`m4moe.data.tfds_corpus`, the one reader)."""
  from m4moe.data import pipeline  # pylint: disable=g-import-not-at-top
  from m4moe.data import tfds_corpus  # pylint: disable=g-import-not-at-top
  tokenizers = pipeline.load_tokenizers(pathlib.Path(config.vocab_dir))
  data_dir = config.tfds_data_dir or None
  try:
    train_split = tfds_corpus.read_split(
        config.tfds_name, split="train", langs=config.languages,
        data_dir=data_dir)
    dev_split = tfds_corpus.read_split(
        config.tfds_name, split=config.dev_split,
        langs=tuple(sorted(train_split[0])), data_dir=data_dir)
  except tfds_corpus.TfdsError as e:
    raise DataConfigError(str(e)) from e
  return _inputs(config, language_features, tokenizers=tokenizers,
                 train_split=train_split, dev_split=dev_split)


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
  if config.tfds_name:
    from m4moe.data import tfds_corpus  # pylint: disable=g-import-not-at-top
    problems += tfds_corpus.check_datasets(config.tfds_name,
                                           config.tfds_data_dir or None)
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
