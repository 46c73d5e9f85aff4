"""TensorFlow Datasets access: our corpus as a builder, and TFDS catalog sets.

``M4moeCorpus`` (registered as ``m4moe_corpus``) wraps a corpus written by
``m4moe-build-corpus``. It never touches the network: the corpus directory is
the builder's ``manual_dir``::

  builder = tfds.builder("m4moe_corpus", data_dir=DATA_DIR)
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      manual_dir=CORPUS_DIR, try_download_gcs=False))
  ds = tfds.load("m4moe_corpus", split="train_de", data_dir=DATA_DIR,
                 try_gcs=False, download=False)

(:func:`prepare_corpus` does the first two lines.) Splits are per language,
``<split>_<lang>`` for split in train/dev/test (``train_de``, ``test_zh_Hans``;
combine them with TFDS split arithmetic, ``"train_de+train_fr"``), and every
example also has a ``lang`` feature. Features: ``lang``, ``source`` (the
non-English text), ``target`` (English).

:func:`language_datasets` turns either this builder or a TFDS catalog
translation dataset (``wmt19_translate/de-en``, ...) that is already prepared
in a local ``data_dir`` into the ``(english, x)`` datasets the input
pipeline takes.
"""

from __future__ import annotations

import pathlib
from typing import Sequence

from etils import epath
import tensorflow as tf
import tensorflow_datasets as tfds

from m4moe.data import split as split_lib
from m4moe.data import vocab

NAME = "m4moe_corpus"


def _split_name(split: str, lang: str) -> str:
  return f"{split}_{lang}"


class M4moeCorpus(tfds.core.GeneratorBasedBuilder):
  """The localisation X->English corpus built by ``m4moe-build-corpus``."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "First release."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "Build the corpus with `m4moe-build-corpus --output_dir=DIR` and pass "
      "DIR as manual_dir (nothing is downloaded).")

  # TFDS derives the code path from the module name, which does not match
  # the file layout of the installed ``m4moe.data`` (package_dir mapping).
  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(__file__)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description="X->English pairs from software localisation catalogs.",
        features=tfds.features.FeaturesDict({
            "lang": tfds.features.Text(),
            "source": tfds.features.Text(),
            "target": tfds.features.Text(),
        }),
        supervised_keys=("source", "target"),
        homepage="https://example.invalid/m4moe",
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    root = pathlib.Path(dl_manager.manual_dir)
    generators = {}
    for split in split_lib.SPLITS:
      for lang in vocab.corpus_languages(root, split):
        if not (root / split / f"{lang}.tsv").stat().st_size:
          continue  # TFDS splits cannot be empty
        generators[_split_name(split, lang)] = self._generate_examples(
            root / split / f"{lang}.tsv", lang)
    if not generators:
      raise ValueError(f"{root} has no <split>/<lang>.tsv files: build the "
                       "corpus first (m4moe-build-corpus)")
    return generators

  def _generate_examples(self, path: pathlib.Path, lang: str):
    with open(path, encoding="utf-8") as f:
      for lineno, line in enumerate(f):
        english, _, other = line.rstrip("\n").partition("\t")
        yield f"{lang}-{lineno}", {"lang": lang, "source": other,
                                   "target": english}


def prepare_corpus(corpus_dir: pathlib.Path, data_dir: pathlib.Path
                   ) -> tfds.core.DatasetBuilder:
  """Builds the TFDS version of a corpus offline; returns the builder."""
  builder = M4moeCorpus(data_dir=str(data_dir))
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(
          manual_dir=str(corpus_dir), try_download_gcs=False))
  return builder


def _load(name: str, split: str, data_dir: str | None) -> tf.data.Dataset:
  return tfds.load(name, split=split, data_dir=data_dir, try_gcs=False,
                   download=False, shuffle_files=False)


def language_datasets(name: str, *, langs: Sequence[str], split: str,
                      data_dir: str | None = None
                      ) -> tuple[dict[str, tf.data.Dataset], dict[str, int]]:
  """Per-language ``(english, x)`` datasets from a prepared TFDS dataset.

  Args:
    name: ``m4moe_corpus`` or a catalog translation dataset whose features
      are language codes (``wmt19_translate/de-en`` ...); for the latter,
      ``langs`` holds the non-English feature key and ``name`` may contain
      ``{lang}`` (``"wmt19_translate/{lang}-en"``).
    langs: languages to load.
    split: ``train``/``dev``/``test`` for ``m4moe_corpus``; the catalog
      dataset's own split name otherwise (``train``, ``validation``).
    data_dir: TFDS data directory (nothing is downloaded).

  Returns:
    (lang -> dataset of ``(english, x)`` ``<string>[]``, lang -> size).
  """
  datasets, sizes = {}, {}
  for lang in langs:
    if name == NAME:
      full, split_name = name, _split_name(split, lang)
      ds = _load(full, split_name, data_dir).map(
          lambda ex: (ex["target"], ex["source"]))
    else:
      full, split_name = name.format(lang=lang), split
      ds = _load(full, split, data_dir).map(
          lambda ex, l=lang: (ex["en"], ex[l]))
    datasets[lang] = ds
    sizes[lang] = _num_examples(full, split_name, data_dir, ds)
  return datasets, sizes


def _num_examples(name: str, split: str, data_dir: str | None,
                  ds: tf.data.Dataset) -> int:
  """Split size from the dataset info, else by counting (mock data)."""
  try:
    return tfds.builder(name, data_dir=data_dir).info.splits[split].num_examples
  except KeyError:
    cardinality = int(ds.cardinality())
    if cardinality >= 0:
      return cardinality
    return int(ds.reduce(0, lambda n, _: n + 1))
