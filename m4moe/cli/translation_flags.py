"""absl flags shared by m4moe-decode, m4moe-eval and m4moe-export.

Importing this module defines the flags; :func:`load_translator_from_flags`
builds a :class:`m4moe.eval.translator.Translator` from them.
:func:`define_tfds_flags` adds ``--tfds_name``/``--tfds_data_dir`` to the
tools that read text from TFDS (eval, decode), with the meaning they have
for ``m4moe-train``, so one dataset name means the same examples to all.
"""

from __future__ import annotations

from typing import Iterable

from absl import app
from absl import flags

from m4moe.inference import beam_search as decoding
from m4moe.training import rundir
from m4moe.eval import translator as translator_lib

MODEL_DIR = flags.DEFINE_string(
    "model_dir", None, "Run directory written by m4moe-train (config.json + "
    "checkpoints).")
CHECKPOINT = flags.DEFINE_string(
    "checkpoint", "latest", "Which checkpoint of --model_dir: latest, best "
    "(the weights of the best dev evaluation, which m4moe-train keeps in "
    "<model_dir>/best/), averaged (the mean of the last checkpoints, written "
    "by m4moe-average to <model_dir>/averaged/) or a step number N (ckpt-N).")
VOCAB_DIR = flags.DEFINE_string(
    "vocab_dir", None, "Directory with source.model/target.model (default: "
    "where the run's config.json recorded them, else <model_dir>/vocab). "
    "They must be the models the run was trained with (sha256 recorded).")
ENGLISH = "en"
BEAM_SIZE = flags.DEFINE_integer("beam_size", 4, "Beams; 1 with --alpha=0 "
                                 "is greedy decoding.")
ALPHA = flags.DEFINE_float("alpha", 0.6, "GNMT length-penalty exponent.")
MAX_DECODE_LENGTH = flags.DEFINE_integer(
    "max_decode_length", None, "Most target tokens (default: the model's "
    "max_length); --decode_length_ratio may lower it per batch.")
DECODE_LENGTH_RATIO = flags.DEFINE_float(
    "decode_length_ratio", 2.0, "Each batch decodes at most round_up(ratio * "
    "longest source + 16, 16) target tokens (capped by --max_decode_length); "
    "beam search costs grow with this limit. Outputs that hit it are counted "
    "and reported. 0 = always decode --max_decode_length tokens. "
    "m4moe-export ignores it (its graph has one fixed limit).")
MAX_INPUT_LENGTH = flags.DEFINE_integer(
    "max_input_length", None, "Longer inputs are truncated to this many "
    "source ids, with a counted warning (default: the model's max_length).")
BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Sentences per batch.")
TARGET_LANG = flags.DEFINE_string(
    "target_lang", "en", "Target language (its <2xx> tag starts the source); "
    "the run must have been trained on source->target.")


def load_translator_from_flags(
    *, per_batch_length: bool = True
    ) -> tuple[translator_lib.Translator, rundir.RunFiles]:
  """Restores the run named by --model_dir with the decoding flags.

  Args:
    per_batch_length: apply --decode_length_ratio (False for export, whose
      graph decodes one fixed --max_decode_length).

  Raises:
    app.UsageError: a flag or file is wrong (the message says which).
  """
  if not MODEL_DIR.value:
    raise app.UsageError("--model_dir is required")
  ratio = DECODE_LENGTH_RATIO.value if per_batch_length else 0.0
  try:
    files = rundir.find_run_files(MODEL_DIR.value, vocab_dir=VOCAB_DIR.value,
                                  checkpoint=CHECKPOINT.value)
    max_length = files.config.max_length
    beam = decoding.BeamSearchConfig(
        beam_size=BEAM_SIZE.value, alpha=ALPHA.value,
        max_decode_length=MAX_DECODE_LENGTH.value or max_length)
    return translator_lib.load_translator(
        MODEL_DIR.value, vocab_dir=VOCAB_DIR.value, beam=beam,
        max_input_length=MAX_INPUT_LENGTH.value, batch_size=BATCH_SIZE.value,
        length_ratio=ratio or None, checkpoint=CHECKPOINT.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from e


def check_language_pairs(translator: translator_lib.Translator,
                         pairs: Iterable[tuple[str, str]]) -> None:
  """Checks every (source, target) request before any decoding.

  Raises:
    app.UsageError: naming the untrained pair or the language without a tag.
  """
  try:
    for source_lang, target_lang in sorted(set(pairs)):
      translator.tag_id(source_lang)
      translator.tag_id(target_lang)
      translator.check_language_pair(source_lang=source_lang,
                                     target_lang=target_lang)
  except translator_lib.TranslatorError as e:
    raise app.UsageError(str(e)) from e


def define_tfds_flags() -> tuple[flags.FlagHolder, flags.FlagHolder]:
  """Defines ``--tfds_name`` and ``--tfds_data_dir``; their holders."""
  name = flags.DEFINE_string(
      "tfds_name", None, "Read the text from TFDS instead: m4moe_corpus (as "
      "m4moe-build-corpus --tfds_data_dir wrote it) or a catalog "
      "translation dataset with an 'en' feature and one other language "
      "(e.g. wmt19_translate/de-en; its validation split serves as dev); "
      "comma-separated for several. Offline (m4moe.data.tfds_corpus).")
  data_dir = flags.DEFINE_string(
      "tfds_data_dir", None, "TFDS data directory of --tfds_name (a folder "
      "or gs:// path; nothing is downloaded).")
  return name, data_dir
