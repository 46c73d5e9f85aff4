r"""m4moe-decode: translate text with a trained run, one sentence per line.

Examples:

  m4moe-decode --model_dir=runs/moe --source_lang=de < in.de > out.en
  m4moe-decode --model_dir=runs/moe --lang_column --input=mixed.tsv \
      --output=out.en --beam_size=4 --alpha=0.6
  m4moe-decode --model_dir=runs/moe --tfds_name=m4moe_corpus \
      --tfds_data_dir=tfds --tfds_split=test --source_lang=de --output=out.en

With --tfds_name the input is the --source_lang side of one language's
--tfds_split examples, in dataset order, read by m4moe.data.tfds_corpus as
m4moe-train and m4moe-eval read it (with --source_lang=en, the English side
of --target_lang's examples).

With --lang_column every line is ``lang<TAB>sentence``. Output lines are in
input order; empty input lines give empty output lines; inputs longer than
--max_input_length source ids are truncated (the count is reported);
invalid UTF-8 stops with an error naming the line; a language pair the
run was not trained on, a vocabulary other than the run's, or an --output
that cannot be written stop with an error before anything is decoded. The
output file is written atomically (temporary file + rename). A progress
bar with sentences/s goes to stderr (--progress=auto: when stderr is a
terminal or the input has at least 1000 lines).
"""

from __future__ import annotations

import collections
import contextlib
import sys

from absl import app
from absl import flags
from absl import logging

from m4moe import cli
from m4moe.cli import translation_flags
from m4moe.eval import textio
from m4moe.eval import translator as translator_lib

_INPUT = flags.DEFINE_string("input", "-", "Input file; '-' = stdin.")
_OUTPUT = flags.DEFINE_string("output", "-", "Output file; '-' = stdout.")
_SOURCE_LANG = flags.DEFINE_string(
    "source_lang", None, "Source language of every line (or --lang_column).")
_LANG_COLUMN = flags.DEFINE_bool(
    "lang_column", False, "Lines are 'lang<TAB>sentence'.")
_TFDS_NAME, _TFDS_DATA_DIR = translation_flags.define_tfds_flags()
_TFDS_SPLIT = flags.DEFINE_enum(
    "tfds_split", "test", ["train", "dev", "test", "test_ood"], "With "
    "--tfds_name: the split whose sentences are translated (a catalog "
    "dataset's validation split is dev).")
_PROGRESS = flags.DEFINE_enum("progress", "auto", ["auto", "on", "off"],
                              "Progress bar on stderr.")

PROGRESS_MIN_LINES = 1000


def _read_tfds() -> list[textio.InputLine]:
  """The source sentences of --tfds_split (see the module docstring).

  Raises:
    app.UsageError: no single source language, or an unreadable dataset.
  """
  from m4moe.data import tfds_corpus  # pylint: disable=g-import-not-at-top
  if _LANG_COLUMN.value or _INPUT.value != "-" or not _SOURCE_LANG.value:
    raise app.UsageError("--tfds_name reads one language's sentences: give "
                         "--source_lang, and neither --input nor "
                         "--lang_column")
  source = _SOURCE_LANG.value
  english = source == translation_flags.ENGLISH
  lang = translation_flags.TARGET_LANG.value if english else source
  try:
    pairs = tfds_corpus.split_pairs(
        _TFDS_NAME.value, split=_TFDS_SPLIT.value, langs=[lang],
        data_dir=_TFDS_DATA_DIR.value)[lang]
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  return [textio.InputLine(number, source, en if english else other)
          for number, (en, other) in enumerate(pairs, start=1)]


def _read_input() -> list[textio.InputLine]:
  if _TFDS_NAME.value:
    return _read_tfds()
  name = "<stdin>" if _INPUT.value == "-" else _INPUT.value
  with contextlib.ExitStack() as stack:
    stream = (sys.stdin.buffer if _INPUT.value == "-"
              else stack.enter_context(open(_INPUT.value, "rb")))
    return textio.read_lines(stream, name=name, lang_column=_LANG_COLUMN.value)


def translate_lines(translator: translator_lib.Translator,
                    lines: list[textio.InputLine], *, default_lang: str | None,
                    target_lang: str, progress: textio.Progress) -> list[str]:
  """Translations of ``lines`` in input order (grouped by language inside)."""
  by_lang = collections.defaultdict(list)
  for index, line in enumerate(lines):
    by_lang[line.lang or default_lang].append(index)
  outputs = [""] * len(lines)
  for lang, indices in by_lang.items():
    texts = [lines[i].text for i in indices]
    if lang is None:  # empty lines in --lang_column mode
      progress(len(indices))
      continue
    for i, out in zip(indices, translator.translate(
        texts, source_lang=lang, target_lang=target_lang,
        progress=progress)):
      outputs[i] = out
  return outputs


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not (_LANG_COLUMN.value or _SOURCE_LANG.value or _TFDS_NAME.value):
    raise app.UsageError("give --source_lang or --lang_column")
  if _OUTPUT.value != "-":
    try:
      textio.check_output_file(_OUTPUT.value, flag="--output")
    except textio.OutputError as e:
      raise app.UsageError(str(e)) from e
  try:
    lines = _read_input()
  except (textio.InputError, OSError) as e:
    sys.exit(f"m4moe-decode: error: {e}")
  translator, files = translation_flags.load_translator_from_flags()
  logging.info("Restored %s", files.checkpoint)
  target_lang = translation_flags.TARGET_LANG.value
  translation_flags.check_language_pairs(
      translator, {(line.lang or _SOURCE_LANG.value, target_lang)
                   for line in lines
                   if (line.lang or _SOURCE_LANG.value) and line.text.strip()})
  enabled = {"on": True, "off": False}.get(
      _PROGRESS.value, sys.stderr.isatty() or len(lines) >= PROGRESS_MIN_LINES)
  progress = textio.Progress(len(lines), enabled=enabled)
  try:
    outputs = translate_lines(
        translator, lines, default_lang=_SOURCE_LANG.value,
        target_lang=target_lang, progress=progress)
  except translator_lib.TranslatorError as e:
    sys.exit(f"m4moe-decode: error: {e}")
  progress.close()
  text = "".join(o + "\n" for o in outputs)
  if _OUTPUT.value == "-":
    sys.stdout.write(text)
    sys.stdout.flush()
  else:
    try:
      textio.write_text_atomic(_OUTPUT.value, text)
    except OSError as e:
      sys.exit(f"m4moe-decode: error: cannot write --output={_OUTPUT.value} "
               f"({e}); nothing was written there")
  stats = translator.stats
  if stats.truncated:
    logging.warning("%d input line(s) were longer than --max_input_length=%d "
                    "source ids and were truncated", stats.truncated,
                    translator.max_input_length)
  if stats.length_limited:
    logging.warning("%d output(s) reached the decode-length limit without "
                    "EOS (raise --decode_length_ratio or --max_decode_length)",
                    stats.length_limited)
  print(f"m4moe-decode: {len(lines)} lines ({stats.empty} empty, "
        f"{stats.truncated} truncated, {stats.length_limited} cut at the "
        f"decode-length limit) in {stats.seconds:.1f} s, "
        f"{len(lines) / max(stats.seconds, 1e-9):.1f} sentences/s",
        file=sys.stderr)


def run():
  cli.run_tool(main, module=__name__)


if __name__ == "__main__":
  run()
