r"""m4moe-vocab: train the SentencePiece source and target vocabularies.

Example:

  m4moe-vocab --corpus_dir=/work/corpus --output_dir=/work/vocab \
      --source_vocab_size=64000 --target_vocab_size=32000 --temperature=5

Writes ``source.model`` (multilingual, with ``<2xx>`` tags), ``target.model``
(English) and ``vocab.json`` to ``--output_dir``; ids: pad=0, eos=1, unk=2.
"""

from __future__ import annotations

import pathlib
import time

from absl import app
from absl import flags

from m4moe import flagutil
from m4moe.data import vocab

_CORPUS_DIR = flags.DEFINE_string("corpus_dir", None,
                                  "A corpus built by m4moe-build-corpus.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where models go.")
_LANGUAGES = flags.DEFINE_list("languages", [],
                               "Languages to include (default: all).")
# One flag per VocabConfig field, with its defaults (m4moe.flagutil).
flagutil.define_flags(vocab.VocabConfig)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    config = flagutil.from_flags(vocab.VocabConfig, flags.FLAGS)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  start = time.time()
  paths = vocab.train_vocabularies(
      pathlib.Path(_CORPUS_DIR.value), pathlib.Path(_OUTPUT_DIR.value),
      config=config, langs=_LANGUAGES.value)
  print(f"source: {paths.source_model}\ntarget: {paths.target_model}\n"
        f"seconds: {time.time() - start:.1f}")


def run():
  flags.mark_flags_as_required(["corpus_dir", "output_dir"])
  app.run(main)


if __name__ == "__main__":
  run()
