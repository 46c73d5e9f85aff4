r"""m4moe-eval: decode a corpus's test split and score it per language.

Example:

  m4moe-eval --model_dir=runs/moe --corpus_dir=corpus \
      --output=runs/evals/moe.json --languages=de,fr,ja --beam_size=4
  m4moe-eval --model_dir=runs/moe --tfds_name=m4moe_corpus \
      --tfds_data_dir=tfds --output=runs/evals/moe.json

The test sets come from a built corpus (--corpus_dir) or from TFDS
(--tfds_name, read by m4moe.data.tfds_corpus as m4moe-train reads it:
m4moe_corpus's test_<lang> splits, a catalog dataset's test split).

Writes one eval JSON (schema in m4moe.eval.results): per-language BLEU and
chrF++ with sacrebleu signatures (BLEU tokenizer chosen by the target
language: 13a, zh, ja-mecab, ko-mecab), segments, training size from the
corpus build report, and the model's config and decoding settings. With
--hypotheses_dir the decoded lines are kept as <dir>/<lang>.hyp. The paths
in its metadata (model_dir, checkpoint, corpus_dir, hypotheses_dir) are
relative to the JSON's own directory, so a copy of the JSON with its
hypotheses beside it (results/) still finds them on another machine.

Before decoding it checks that --output and --hypotheses_dir can be
written, that the vocabulary is the run's (recorded sha256) and that the
run was trained on every test set's language pair; files are written
atomically (temporary file + rename). A language with no test sentences is
a warning naming it (recorded as empty in the JSON); when no language has
any, it exits 1 before loading the model and writes nothing.
"""

from __future__ import annotations

import dataclasses

import pathlib
import sys
from typing import Sequence

from absl import app
from absl import flags

from m4moe import cli
from m4moe import jsonfile
from m4moe.training import rundir
from m4moe.cli import translation_flags
from m4moe.eval import evaluate as evaluate_lib
from m4moe.eval import results
from m4moe.eval import scoring
from m4moe.eval import seeds as seeds_lib
from m4moe.eval import testsets as testsets_lib
from m4moe.eval import textio
from m4moe.eval import translator as translator_lib

_CORPUS_DIR = flags.DEFINE_string("corpus_dir", None,
                                  "Corpus built by m4moe-build-corpus.")
_TFDS_NAME, _TFDS_DATA_DIR = translation_flags.define_tfds_flags()
_SPLIT = flags.DEFINE_enum(
    "split", "test", ["test", "test_ood", "dev"], "Split to score: the "
    "in-domain test, the out-of-domain test (held-out source packages; "
    "m4moe-build-corpus --ood_packages) or dev.")
_LANGUAGES = flags.DEFINE_list("languages", [],
                               "Languages (default: every file of --split).")
_DIRECTION = flags.DEFINE_enum("direction", "xx_en", ["xx_en", "en_xx"],
                               "Translation direction.")
_OUTPUT = flags.DEFINE_string("output", None, "Eval JSON to write.")
_MODEL_NAME = flags.DEFINE_string("model_name", None,
                                  "Name in reports (default: model_dir name).")
_KIND = flags.DEFINE_enum("kind", "multilingual", ["multilingual",
                                                   "bilingual"],
                          "bilingual for a one-language-pair baseline.")
_MAX_SENTENCES = flags.DEFINE_integer(
    "max_sentences", 0, "Score only the first N sentences per language "
    "(0 = all); recorded in the JSON.")
_HYPOTHESES_DIR = flags.DEFINE_string("hypotheses_dir", None,
                                      "Also write <lang>.hyp files here.")


def _here(path: str | pathlib.Path | None) -> str | None:
  """``path`` relative to --output's directory (None stays None)."""
  if path is None:
    return None
  return jsonfile.relative_path(
      path, start=pathlib.Path(_OUTPUT.value).parent)


def _metadata(files: rundir.RunFiles,
              translator: translator_lib.Translator) -> dict:
  config = files.config
  meta = {
      "model_dir": _here(files.model_dir),
      "checkpoint": _here(files.checkpoint),
      "config": config.to_dict(), "num_experts": config.moe.num_experts,
      "num_layers": config.num_layers, "beam_size": translator.beam.beam_size,
      "alpha": translator.beam.alpha,
      "max_decode_length": translator.beam.max_decode_length,
      "decode_length_ratio": translator.length_ratio,
      "corpus_dir": _here(_CORPUS_DIR.value), "tfds_name": _TFDS_NAME.value,
      "tfds_data_dir": (_TFDS_DATA_DIR.value
                        if "://" in (_TFDS_DATA_DIR.value or "")
                        else _here(_TFDS_DATA_DIR.value)),
      "split": _SPLIT.value,
      "direction": _DIRECTION.value, "max_sentences": _MAX_SENTENCES.value,
  }
  # The training seed travels with the JSON, so that a report on landed
  # files tells seeds apart without the run directory.
  seed = seeds_lib.config_seed(files.run_config)
  if seed is not None:
    meta["seed"] = seed
  try:
    from m4moe.cost import model as cost  # pylint: disable=g-import-not-at-top
    meta["num_params"] = cost.num_params(config)
    meta["num_experts_total"] = cost.num_experts_total(config)
  except ImportError:
    pass
  return meta


def _limit(sets: list[testsets_lib.TestSet]) -> list[testsets_lib.TestSet]:
  n = _MAX_SENTENCES.value
  if n <= 0:
    return sets
  return [testsets_lib.TestSet(
      language=t.language, source_lang=t.source_lang,
      target_lang=t.target_lang, sources=t.sources[:n],
      references=t.references[:n], path=t.path) for t in sets]


def _check_not_empty(sets: list[testsets_lib.TestSet]) -> None:
  """Exits 1 when no language has a sentence to decode; warns of each
  empty one otherwise (it is kept in the JSON with status "empty")."""
  empty = [t.language for t in sets if not t.sources]
  where = _source_name()
  if len(empty) == len(sets):
    sys.exit(f"m4moe-eval: error: {where} has no sentences for "
             f"{', '.join(empty) or 'any language'}: nothing to decode, and "
             "nothing was written. Rebuild the corpus (its report.json "
             "lists each language's split sizes) or choose --languages or "
             "--split with sentences")
  for lang in empty:
    place = (f"{where}/{lang}.tsv" if not _TFDS_NAME.value
             else f"{where}, {lang},")
    print(f"m4moe-eval: warning: {place} has no sentences; {lang} "
          "is recorded as empty (no score) and left out of report averages",
          file=sys.stderr, flush=True)


def _source_name() -> str:
  if _TFDS_NAME.value:
    return f"--tfds_name={_TFDS_NAME.value} split {_SPLIT.value}"
  return f"{_CORPUS_DIR.value}/{_SPLIT.value}"


def _tfds_testsets() -> list[testsets_lib.TestSet]:
  """The test sets of --split read from TFDS (m4moe.data.tfds_corpus)."""
  from m4moe.data import tfds_corpus  # pylint: disable=g-import-not-at-top
  english = testsets_lib.ENGLISH
  pairs = tfds_corpus.split_pairs(
      _TFDS_NAME.value, split=_SPLIT.value, langs=_LANGUAGES.value,
      data_dir=_TFDS_DATA_DIR.value)
  sets = []
  for lang, lang_pairs in pairs.items():
    refs, sources = (tuple(p[0] for p in lang_pairs),
                     tuple(p[1] for p in lang_pairs))
    src, tgt = lang, english
    if _DIRECTION.value == "en_xx":
      src, tgt, sources, refs = english, lang, refs, sources
    sets.append(testsets_lib.TestSet(
        language=lang, source_lang=src, target_lang=tgt, sources=sources,
        references=refs, path=f"{_TFDS_NAME.value}:{_SPLIT.value}_{lang}"))
  return sets


def _load_testsets() -> tuple[list[testsets_lib.TestSet], dict[str, int]]:
  """(test sets of --split, training pairs per language) of the source.

  Raises:
    app.UsageError: no source, two sources, or one that cannot be read.
  """
  if bool(_CORPUS_DIR.value) == bool(_TFDS_NAME.value):
    raise app.UsageError("give exactly one of --corpus_dir and --tfds_name")
  try:
    if _TFDS_NAME.value:
      from m4moe.data import tfds_corpus  # pylint: disable=g-import-not-at-top
      sets = _limit(_tfds_testsets())
      _check_not_empty(sets)
      sizes = tfds_corpus.split_sizes(_TFDS_NAME.value, split="train",
                                      data_dir=_TFDS_DATA_DIR.value)
      return sets, sizes
    sets = _limit(testsets_lib.load_testsets(
        _CORPUS_DIR.value, split=_SPLIT.value, langs=_LANGUAGES.value,
        direction=_DIRECTION.value))
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  _check_not_empty(sets)
  try:  # read before the model is loaded: a damaged report fails fast
    return sets, testsets_lib.train_sizes(_CORPUS_DIR.value)
  except ValueError as e:
    sys.exit(f"m4moe-eval: error: {e}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not _OUTPUT.value:
    raise app.UsageError("--output is required")
  sets, train_sizes = _load_testsets()
  try:
    textio.check_output_file(_OUTPUT.value, flag="--output")
    if _HYPOTHESES_DIR.value:
      textio.check_output_dir(_HYPOTHESES_DIR.value, flag="--hypotheses_dir")
  except textio.OutputError as e:
    raise app.UsageError(str(e)) from e
  translator, files = translation_flags.load_translator_from_flags()
  translation_flags.check_language_pairs(
      translator, {(t.source_lang, t.target_lang) for t in sets if t.sources})
  result = _evaluate(translator, files, sets, train_sizes=train_sizes)
  _write_result(result)
  _print_summary(result, translator.stats)


def _evaluate(translator: translator_lib.Translator, files: rundir.RunFiles,
              sets: list[testsets_lib.TestSet], *,
              train_sizes: dict[str, int]) -> results.EvalResult:
  """Decodes and scores every test set.

  Each ``<lang>.hyp`` is written as soon as its language is decoded, so an
  interrupted run keeps the hypotheses it paid for; a full disk or an
  unwritable --hypotheses_dir ends the tool with a message saying what
  was kept.
  """
  hyp_dir = pathlib.Path(_HYPOTHESES_DIR.value or "")
  def translate(sources: Sequence[str], *, source_lang: str,
                target_lang: str) -> list[str]:
    out = translator.translate(sources, source_lang=source_lang,
                               target_lang=target_lang)
    if _HYPOTHESES_DIR.value:
      lang = target_lang if source_lang == "en" else source_lang
      textio.write_text_atomic(hyp_dir / f"{lang}.hyp",
                               "".join(o + "\n" for o in out))
    return out
  try:
    with cli.exit_on_disk_full(
        tool="m4moe-eval", action="writing the hypotheses",
        path=_HYPOTHESES_DIR.value or ".",
        kept="each <lang>.hyp is written atomically, so the files there are "
        "whole (earlier ones may be from this run); --output was not "
        "written yet"):
      result = evaluate_lib.evaluate(
          translate, sets, model=_MODEL_NAME.value or files.model_dir.name,
          kind=_KIND.value, metadata=_metadata(files, translator),
          train_sizes=train_sizes)
  except (scoring.ScoringError, translator_lib.TranslatorError) as e:
    sys.exit(f"m4moe-eval: error: {e}")
  except OSError as e:
    sys.exit(f"m4moe-eval: error: cannot write --hypotheses_dir="
             f"{_HYPOTHESES_DIR.value} ({e})")
  return dataclasses.replace(result, metadata={
      **result.metadata, "decode_stats": dataclasses.asdict(translator.stats),
      # Where <lang>.hyp lives (m4moe-report reads examples from it).
      "hypotheses_dir": (_here(hyp_dir) if _HYPOTHESES_DIR.value
                         else None)})


def _write_result(result: results.EvalResult) -> None:
  """Writes --output atomically, or exits saying the old file is intact.

  The decoding cannot be recovered from a half-written JSON, so the file is
  replaced whole or not at all.
  """
  try:
    with cli.exit_on_disk_full(
        tool="m4moe-eval", action=f"writing --output={_OUTPUT.value}",
        path=pathlib.Path(_OUTPUT.value).parent,
        kept="it is written atomically, so the previous file (if any) is "
        "intact; the decoding is lost"):
      results.write_eval_json(result, _OUTPUT.value)
  except OSError as e:
    sys.exit(f"m4moe-eval: error: cannot write --output={_OUTPUT.value} "
             f"({e}); nothing was written there")


def _print_summary(result: results.EvalResult,
                   stats: translator_lib.TranslationStats) -> None:
  """One line per language and the decoding's counts, for the terminal."""
  for lang, score in result.languages.items():
    if score.status == scoring.STATUS_EMPTY:
      print(f"{lang}: EMPTY test split (0 segments)")
    else:
      print(f"{lang}: BLEU {score.bleu:.2f} chrF++ {score.chrf:.2f} "
            f"({score.num_segments} segments, {score.bleu_signature})")
  print(f"{stats.sentences} sentences in {stats.seconds:.1f} s "
        f"({stats.empty} empty, {stats.truncated} inputs truncated, "
        f"{stats.length_limited} outputs cut at the decode-length limit)")
  print(f"Wrote {_OUTPUT.value}")


def run():
  cli.run_tool(main, module=__name__)


if __name__ == "__main__":
  run()
