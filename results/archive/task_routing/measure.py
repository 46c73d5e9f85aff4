"""Full vs per-language SavedModels of a --route_by=language run.

  python measure.py --model_dir=RUN --export_root=DIR --corpus_dir=CORPUS \
      --split=test --max_sentences=200 --output=task_routing.json

For every language of the run: translates the first --max_sentences test
pairs with the full model (m4moe.eval.translator, the library m4moe-decode
uses) and with the SavedModel ``m4moe-export --language=xx`` wrote to
DIR/xx, scores both with sacreBLEU (BLEU, chrF++) and counts identical
outputs; records the parameter counts the export stored. Writes one JSON.
"""

from __future__ import annotations

import json
import pathlib
import sys

from absl import app
from absl import flags

_MODEL_DIR = flags.DEFINE_string("model_dir", None, "The trained run.")
_EXPORT_ROOT = flags.DEFINE_string("export_root", None,
                                   "Directory of the per-language exports.")
_CORPUS_DIR = flags.DEFINE_string("corpus_dir", None, "Built corpus.")
_SPLIT = flags.DEFINE_string("split", "test", "Corpus split to translate.")
_MAX_SENTENCES = flags.DEFINE_integer("max_sentences", 200,
                                      "Pairs per language (first ones).")
_BEAM_SIZE = flags.DEFINE_integer("beam_size", 4, "Beams (as the export).")
_ALPHA = flags.DEFINE_float("alpha", 0.6, "Length penalty (as the export).")
_MAX_DECODE_LENGTH = flags.DEFINE_integer(
    "max_decode_length", 64, "Most target tokens (as the export).")
_OUTPUT = flags.DEFINE_string("output", None, "JSON file to write.")


def main(argv):
  del argv
  for flag in (_MODEL_DIR, _EXPORT_ROOT, _CORPUS_DIR, _OUTPUT):
    if not flag.value:
      raise app.UsageError(f"--{flag.name} is required")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_text  # pylint: disable=g-import-not-at-top,unused-import
  from m4moe.inference import beam_search as decoding  # pylint: disable=g-import-not-at-top
  from m4moe.data import tsv  # pylint: disable=g-import-not-at-top
  from m4moe.eval import scoring  # pylint: disable=g-import-not-at-top
  from m4moe.eval import translator as translator_lib  # pylint: disable=g-import-not-at-top
  beam = decoding.BeamSearchConfig(beam_size=_BEAM_SIZE.value,
                                   alpha=_ALPHA.value,
                                   max_decode_length=_MAX_DECODE_LENGTH.value)
  translator, files = translator_lib.load_translator(
      _MODEL_DIR.value, beam=beam, batch_size=32)
  languages = files.config.moe.routing_languages
  if not languages:
    raise app.UsageError(f"{_MODEL_DIR.value} is not a --route_by=language "
                         "run")
  results = {"model_dir": str(files.model_dir), "split": _SPLIT.value,
             "beam_size": beam.beam_size, "alpha": beam.alpha,
             "max_decode_length": beam.max_decode_length, "languages": {}}
  for lang in languages:
    pairs, _ = tsv.read_pairs(pathlib.Path(_CORPUS_DIR.value) / _SPLIT.value
                              / f"{lang}.tsv")
    pairs = pairs[:_MAX_SENTENCES.value]
    sources = [other for _, other in pairs]
    references = [english for english, _ in pairs]
    full = translator.translate(sources, source_lang=lang)
    export = tf.saved_model.load(str(pathlib.Path(_EXPORT_ROOT.value) / lang))
    meta = json.loads(export.metadata.numpy())
    small = []
    for start in range(0, len(sources), 32):
      chunk = sources[start:start + 32]
      out = export.signatures["translate"](
          sentences=tf.constant(chunk), source_lang=tf.constant(
              [lang] * len(chunk)))
      small += [t.decode("utf-8") for t in out["translations"].numpy()]
    score_full = scoring.score_language(full, references, source_lang=lang,
                                        target_lang="en")
    score_small = scoring.score_language(small, references, source_lang=lang,
                                         target_lang="en")
    extraction = meta["extraction"]
    results["languages"][lang] = {
        "sentences": len(sources),
        "identical_outputs": sum(a == b for a, b in zip(full, small)),
        "bleu_full": score_full.bleu, "bleu_extracted": score_small.bleu,
        "chrf_full": score_full.chrf, "chrf_extracted": score_small.chrf,
        "parameters_full": extraction["parameters_before"],
        "parameters_extracted": extraction["parameters_after"],
        "experts": {r["layer"]: r["experts"] for r in extraction["routes"]}}
    print(lang, json.dumps(results["languages"][lang]), file=sys.stderr)
  pathlib.Path(_OUTPUT.value).write_text(
      json.dumps(results, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
  app.run(main)
