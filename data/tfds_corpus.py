"""TensorFlow Datasets: the package's one reader, and our corpus as a builder.

The reader (:func:`read_split`, :func:`split_pairs`) serves ``m4moe-train``,
``m4moe-eval`` and ``m4moe-decode`` alike, so a TFDS dataset means the same
examples to every tool. ``--tfds_name`` is a comma-separated list of:

* ``m4moe_corpus``: a corpus built by ``m4moe-build-corpus``, written as a
  TFDS dataset by ``m4moe-build-corpus --tfds_data_dir=DIR``
  (:func:`write_corpus_dataset`). Splits are per language,
  ``<split>_<lang>`` for split in train/dev/test/test_ood; features
  ``lang``, ``source`` (the non-English text), ``target`` (English).
  Examples keep the order of the corpus files and malformed lines are left
  out exactly as the TSV reader leaves them out (:mod:`tsv`), so a model
  trains from this dataset on the very stream it gets from the TSV files.
* a TFDS catalog translation dataset (``wmt19_translate/de-en``) with an
  ``en`` text feature and one other language feature, already prepared in
  the data directory; its ``train``/``validation``/``test`` splits serve as
  train/dev/test.

Nothing is downloaded: datasets load with ``try_gcs=False`` and
``download=False`` from ``data_dir`` (a local folder or ``gs://`` path).
The builder takes the corpus directory as ``manual_dir``::

  builder = tfds.builder("m4moe_corpus", data_dir=DATA_DIR)
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      manual_dir=CORPUS_DIR, try_download_gcs=False))
"""

from __future__ import annotations

import json
import pathlib
from typing import Sequence

from absl import logging
from etils import epath
import tensorflow as tf
import tensorflow_datasets as tfds

from m4moe.data import split as split_lib
from m4moe.data import tsv
from m4moe.data import vocab

NAME = "m4moe_corpus"
ENGLISH = "en"
# The catalog datasets' split for each corpus split.
CATALOG_SPLITS = {"train": "train", "dev": "validation", "test": "test"}
# Where the builder records each split's languages (also empty ones, which
# TFDS cannot store as splits) in the dataset's metadata.json.
_LANGUAGES_KEY = "languages"


class TfdsError(ValueError):
  """A TFDS dataset is missing or unsuitable; the message says what to do."""


def _split_name(split: str, lang: str) -> str:
  return f"{split}_{lang}"


class M4moeCorpus(tfds.core.GeneratorBasedBuilder):
  """The localisation X->English corpus built by ``m4moe-build-corpus``."""

  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {
      "1.0.0": "First release.",
      "1.1.0": "Examples in corpus file order; malformed lines skipped as "
               "by the TSV reader; each split's languages in metadata.",
  }
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "Build the corpus with `m4moe-build-corpus --output_dir=DIR "
      "--tfds_data_dir=DATA_DIR`, or pass DIR as manual_dir (nothing is "
      "downloaded).")

  # TFDS derives the code path from the module name, which does not match
  # the file layout of the installed ``m4moe.data`` (package_dir mapping).
  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(__file__)

  def _info(self) -> tfds.core.DatasetInfo:
    # disable_shuffling: the TSV reader's order, which the training stream's
    # seeded shuffle starts from.
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
        disable_shuffling=True,
        metadata=tfds.core.MetadataDict(),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    root = pathlib.Path(dl_manager.manual_dir)
    generators, languages = {}, {}
    for split in split_lib.SPLITS:
      languages[split] = vocab.corpus_languages(root, split)
      for lang in languages[split]:
        pairs, scan = tsv.read_pairs(root / split / f"{lang}.tsv")
        if scan.bad_lines:
          logging.warning("%s: leaving out %d malformed line(s), as training "
                          "from the TSV files does: %s", scan.path,
                          len(scan.bad_lines), "; ".join(scan.describe()[:3]))
        if pairs:  # TFDS splits cannot be empty; metadata keeps the language
          generators[_split_name(split, lang)] = self._generate_examples(
              pairs, lang)
    if not generators:
      raise TfdsError(f"{root} has no <split>/<lang>.tsv files with pairs: "
                      "build the corpus first (m4moe-build-corpus)")
    self.info.metadata[_LANGUAGES_KEY] = languages
    return generators

  def _generate_examples(self, pairs: list[tuple[str, str]], lang: str):
    # Integer keys: with disable_shuffling TFDS writes examples by key.
    for index, (english, other) in enumerate(pairs):
      yield index, {"lang": lang, "source": other, "target": english}


def prepare_corpus(corpus_dir: pathlib.Path, data_dir: pathlib.Path | str
                   ) -> tfds.core.DatasetBuilder:
  """Builds the TFDS version of a corpus offline; returns the builder.

  An existing build of this version in ``data_dir`` is kept as it is (TFDS
  reuses it); :func:`write_corpus_dataset` replaces it.
  """
  builder = M4moeCorpus(data_dir=str(data_dir))
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(
          manual_dir=str(corpus_dir), try_download_gcs=False))
  return builder


def write_corpus_dataset(corpus_dir: pathlib.Path, data_dir: str
                         ) -> tfds.core.DatasetBuilder:
  """Writes ``corpus_dir`` as ``<data_dir>/m4moe_corpus/<version>``.

  The dataset is built beside its place and then moved there, so a reader
  never sees half a build (between the two renames, for an instant, none).
  An old build is replaced only if it is an ``m4moe_corpus`` dataset (its
  ``dataset_info.json`` says so). Folders this function leaves when it is
  killed (``.m4moe_corpus.incoming``, ``.<version>.replaced``) are its own
  and removed by the next call.

  Raises:
    TfdsError: the place holds something else, or the corpus has no pairs.
  """
  root = epath.Path(data_dir)
  final = root / NAME / str(M4moeCorpus.VERSION)
  _check_replaceable(final)
  staging = root / f".{NAME}.incoming"
  old = final.parent / f".{final.name}.replaced"
  for leftover in (staging, old):  # of an interrupted write of this function
    if leftover.exists():
      leftover.rmtree()
  try:
    prepare_corpus(corpus_dir, str(staging))
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
      final.rename(old)
    (staging / NAME / final.name).rename(final)
    if old.exists():
      old.rmtree()
  finally:
    if staging.exists():
      staging.rmtree()
  return tfds.builder(NAME, data_dir=str(root))


def _check_replaceable(path: epath.Path) -> None:
  """Refuses to replace ``path`` unless it is an ``m4moe_corpus`` build."""
  if not path.exists():
    return
  info = path / "dataset_info.json"
  try:
    name = json.loads(info.read_text()).get("name")
  except (OSError, ValueError):
    name = None
  if name != NAME:
    raise TfdsError(f"{path} exists but is not an {NAME} dataset ({info} "
                    "missing or naming another dataset); move it away or "
                    "choose another --tfds_data_dir")


def _names(tfds_name: str) -> list[str]:
  names = [n.strip() for n in tfds_name.split(",") if n.strip()]
  if not names:
    raise TfdsError("--tfds_name is empty: give m4moe_corpus or a TFDS "
                    "translation dataset such as wmt19_translate/de-en")
  return names


def _builder(name: str, data_dir: str | None) -> tfds.core.DatasetBuilder:
  """The prepared builder of ``name`` in ``data_dir``.

  Raises:
    TfdsError: unknown, or not prepared there (says how to prepare it).
  """
  where = f"--tfds_data_dir={data_dir}" if data_dir else "the TFDS data dir"
  try:
    builder = tfds.builder(name, data_dir=data_dir or None, try_gcs=False)
  except (tfds.core.registered.DatasetNotFoundError, ValueError) as e:
    raise TfdsError(f"--tfds_name={name}: not a known TFDS dataset ({e})"
                    ) from e
  if not _is_prepared(builder):
    fix = (f"run m4moe-build-corpus --tfds_data_dir={data_dir or 'DIR'} "
           "(it writes the corpus there)" if name == NAME else
           "prepare it there with TFDS first (nothing is downloaded here)")
    raise TfdsError(f"--tfds_name={name}: version {builder.version} is not "
                    f"prepared in {where}; {fix}")
  return builder


def _is_prepared(builder: tfds.core.DatasetBuilder) -> bool:
  # tfds.testing.mock_data serves examples of unprepared datasets.
  mocked = type(builder).as_dataset.__module__.startswith(
      "tensorflow_datasets.testing")
  return mocked or builder.is_prepared()


def _catalog_language(name: str, builder) -> str:
  keys = list(builder.info.features.keys())
  others = [k for k in keys if k != ENGLISH]
  if ENGLISH not in keys or len(others) != 1:
    raise TfdsError(f"--tfds_name={name}: expected a translation dataset "
                    f"with an '{ENGLISH}' feature and one other language, "
                    f"got features {keys}")
  return others[0]


def _corpus_languages(builder, split: str) -> list[str]:
  recorded = builder.info.metadata or {}
  if _LANGUAGES_KEY not in recorded:
    raise TfdsError(f"{builder.data_dir}: no per-split language list; "
                    "rewrite it with m4moe-build-corpus --tfds_data_dir")
  return list(recorded[_LANGUAGES_KEY].get(split, ()))


def _catalog_split(name: str, split: str) -> str:
  if split not in CATALOG_SPLITS:
    raise TfdsError(f"--tfds_name={name}: a catalog dataset has no "
                    f"'{split}' split (it has {', '.join(CATALOG_SPLITS)}, "
                    f"read as {', '.join(CATALOG_SPLITS.values())})")
  return CATALOG_SPLITS[split]


def _sources(tfds_name: str, split: str, data_dir: str | None
             ) -> dict[str, tuple[tfds.core.DatasetBuilder, str | None]]:
  """lang -> (builder, TFDS split name or None for an empty split)."""
  found, owner = {}, {}
  for name in _names(tfds_name):
    builder = _builder(name, data_dir)
    if name == NAME:
      available = {lang: _split_name(split, lang)
                   for lang in _corpus_languages(builder, split)}
      available = {lang: (s if s in builder.info.splits else None)
                   for lang, s in available.items()}
    else:
      available = {_catalog_language(name, builder):
                   _catalog_split(name, split)}
    for lang, split_name in available.items():
      if lang in found:
        raise TfdsError(f"--tfds_name: language {lang} is in both "
                        f"{owner[lang]} and {name}; give one of them")
      found[lang], owner[lang] = (builder, split_name), name
  return found


def _select(found: dict, langs: Sequence[str], *, tfds_name: str,
            split: str) -> list[str]:
  missing = [lang for lang in langs if lang not in found]
  if missing:
    raise TfdsError(f"--tfds_name={tfds_name} has no {split} split for "
                    f"{', '.join(missing)} (it has "
                    f"{', '.join(sorted(found)) or 'none'})")
  return list(langs) or sorted(found)


def _size(builder, split_name: str, ds: tf.data.Dataset) -> int:
  """Split size from the dataset info, else by counting (mock data)."""
  try:
    return builder.info.splits[split_name].num_examples
  except KeyError:
    cardinality = int(ds.cardinality())
    if cardinality >= 0:
      return cardinality
    return int(ds.reduce(0, lambda n, _: n + 1))


def _pairs(builder, split_name: str, lang: str) -> tf.data.Dataset:
  ds = builder.as_dataset(split=split_name, shuffle_files=False)
  if builder.name == NAME:
    return ds.map(lambda ex: (ex["target"], ex["source"]))
  return ds.map(lambda ex: (ex[ENGLISH], ex[lang]))


def read_split(tfds_name: str, *, split: str, langs: Sequence[str] = (),
               data_dir: str | None = None
               ) -> tuple[dict[str, tf.data.Dataset], dict[str, int]]:
  """Per-language ``(english, x)`` datasets of one split, in file order.

  Args:
    tfds_name: comma-separated dataset names (module docstring).
    split: ``train``, ``dev``, ``test`` (``test_ood`` for m4moe_corpus).
    langs: languages to read; each must have the split (default: all).
    data_dir: TFDS data directory (nothing is downloaded).

  Returns:
    (lang -> dataset of ``(english, x)`` ``<string>[]`` pairs,
    lang -> number of pairs). A language whose split is empty gets an
    empty dataset and size 0, as an empty TSV file does.

  Raises:
    TfdsError: a dataset is missing or unsuitable, or a language lacks
      the split.
  """
  found = _sources(tfds_name, split, data_dir)
  datasets, sizes = {}, {}
  for lang in _select(found, langs, tfds_name=tfds_name, split=split):
    builder, split_name = found[lang]
    if split_name is None:
      empty = tf.constant([], tf.string)
      datasets[lang] = tf.data.Dataset.from_tensor_slices((empty, empty))
      sizes[lang] = 0
      continue
    datasets[lang] = _pairs(builder, split_name, lang)
    sizes[lang] = _size(builder, split_name, datasets[lang])
  return datasets, sizes


def split_sizes(tfds_name: str, *, split: str,
                data_dir: str | None = None) -> dict[str, int]:
  """lang -> pairs in ``split`` (reads no examples of prepared datasets)."""
  return read_split(tfds_name, split=split, data_dir=data_dir)[1]


def split_pairs(tfds_name: str, *, split: str, langs: Sequence[str] = (),
                data_dir: str | None = None
                ) -> dict[str, list[tuple[str, str]]]:
  """lang -> the ``(english, x)`` pairs of ``split`` as Python strings."""
  datasets, _ = read_split(tfds_name, split=split, langs=langs,
                           data_dir=data_dir)
  return {lang: [(english.decode("utf-8"), other.decode("utf-8"))
                 for english, other in tfds.as_numpy(ds)]
          for lang, ds in datasets.items()}


def check_datasets(tfds_name: str, data_dir: str | None) -> list[str]:
  """Problems of ``--tfds_name`` in ``data_dir`` (empty: readable)."""
  try:
    _sources(tfds_name, "train", data_dir)
  except TfdsError as e:
    return [str(e)]
  return []
