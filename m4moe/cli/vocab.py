r"""m4moe-vocab: train the SentencePiece source and target vocabularies.

Example:

  m4moe-vocab --corpus_dir=/work/corpus --output_dir=/work/vocab \
      --source_vocab_size=64000 --target_vocab_size=32000 --temperature=5

Writes ``source.model`` (multilingual, with ``<2xx>`` tags), ``target.model``
(English) and ``vocab.json`` to ``--output_dir``; ids: pad=0, eos=1, unk=2.
Malformed corpus lines (bad UTF-8, no tab, extra fields) are skipped with a
warning naming the file and the first lines.
"""

from __future__ import annotations

import pathlib
import sys
import time

from absl import app
from absl import flags

from m4moe.data import vocab

_CORPUS_DIR = flags.DEFINE_string("corpus_dir", None,
                                  "A corpus built by m4moe-build-corpus.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where models go.")
_LANGUAGES = flags.DEFINE_list("languages", [],
                               "Languages to include (default: all).")
_SOURCE_SIZE = flags.DEFINE_integer("source_vocab_size", 64000,
                                    "Source (multilingual) pieces.")
_TARGET_SIZE = flags.DEFINE_integer("target_vocab_size", 32000,
                                    "Target (English) pieces.")
_TEMPERATURE = flags.DEFINE_float("temperature", 5.0,
                                  "Language sampling temperature T.")
_MAX_SENTENCES = flags.DEFINE_integer("max_sentences", 1_000_000,
                                      "Sentences sampled for the source.")
_COVERAGE = flags.DEFINE_float("character_coverage", 0.9995,
                               "SentencePiece character coverage.")
_MODEL_TYPE = flags.DEFINE_enum("model_type", "unigram", ["unigram", "bpe"],
                                "SentencePiece model type.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    config = vocab.VocabConfig(
        source_vocab_size=_SOURCE_SIZE.value,
        target_vocab_size=_TARGET_SIZE.value, temperature=_TEMPERATURE.value,
        max_sentences=_MAX_SENTENCES.value,
        character_coverage=_COVERAGE.value, model_type=_MODEL_TYPE.value,
        seed=_SEED.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  corpus_dir = pathlib.Path(_CORPUS_DIR.value)
  if not (corpus_dir / "train").is_dir():
    raise app.UsageError(f"--corpus_dir={corpus_dir}: no train/ directory; "
                         "give a corpus built by m4moe-build-corpus")
  missing = [l for l in _LANGUAGES.value
             if not (corpus_dir / "train" / f"{l}.tsv").is_file()]
  if missing:
    raise app.UsageError(f"--languages: {', '.join(missing)} not in "
                         f"{corpus_dir / 'train'}")
  start = time.time()
  try:
    paths = vocab.train_vocabularies(
        corpus_dir, pathlib.Path(_OUTPUT_DIR.value), config=config,
        langs=_LANGUAGES.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  except (OSError, RuntimeError) as e:
    sys.exit(f"m4moe-vocab: error: {e}")
  print(f"source: {paths.source_model}\ntarget: {paths.target_model}\n"
        f"seconds: {time.time() - start:.1f}")


def run():
  flags.mark_flags_as_required(["corpus_dir", "output_dir"])
  app.run(main)


if __name__ == "__main__":
  run()
