r"""m4moe-vocab: train the SentencePiece source and target vocabularies.

Example:

  m4moe-vocab --corpus_dir=corpus --output_dir=vocab \
      --source_vocab_size=64000 --target_vocab_size=32000 --temperature=5

Writes ``source.model`` (multilingual, with ``<2xx>`` tags), ``target.model``
(English) and ``vocab.json`` to ``--output_dir``; ids: pad=0, eos=1, unk=2.
Malformed corpus lines (bad UTF-8, no tab, extra fields) are skipped with a
warning naming the file and the first lines. Languages without training
pairs are named in a warning; if none has any, it exits 1 and writes nothing.

One writer per --output_dir: the tool holds an flock on
``<output_dir>/vocab.lock`` while it trains, so a second m4moe-vocab on the
same directory exits 1 naming the first; each file is written to a
temporary directory and renamed into place, so readers never see half a
model and a failed run leaves the previous models.
"""

from __future__ import annotations

import pathlib
import sys
import time

from absl import app
from absl import flags

from m4moe import cli
from m4moe import flagutil
from m4moe import run_lock
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
  output_dir = pathlib.Path(_OUTPUT_DIR.value)
  try:
    output_dir.mkdir(parents=True, exist_ok=True)
    with run_lock.RunLock(output_dir, role=run_lock.VOCAB), \
        cli.exit_on_disk_full(
            tool="m4moe-vocab", action="writing the vocabularies",
            path=output_dir, kept="the previous models there (if any) are "
            "intact: new ones are renamed into place only once both are "
            "trained"):
      paths = vocab.train_vocabularies(corpus_dir, output_dir, config=config,
                                       langs=_LANGUAGES.value)
  except run_lock.RunLockedError as e:
    sys.exit(f"m4moe-vocab: refused, nothing was changed: {e}")
  except ValueError as e:
    sys.exit(f"m4moe-vocab: error: {e}")
  except (OSError, RuntimeError) as e:
    sys.exit(f"m4moe-vocab: error: {e}")
  print(f"source: {paths.source_model}\ntarget: {paths.target_model}\n"
        f"seconds: {time.time() - start:.1f}")


def run():
  flags.mark_flags_as_required(["corpus_dir", "output_dir"])
  cli.run_tool(main, module=__name__)


if __name__ == "__main__":
  run()
