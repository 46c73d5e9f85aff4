r"""m4moe-export: a SavedModel with a ``translate`` signature.

Example:

  m4moe-export --model_dir=runs/moe --export_dir=export/moe \
      --beam_size=4 --alpha=0.6

Load it in any process (tensorflow-text must be imported first, to register
the SentencePiece ops the graph uses):

  import tensorflow as tf, tensorflow_text
  m = tf.saved_model.load("export/moe")
  m.signatures["translate"](sentences=tf.constant(["Datei öffnen"]),
                            source_lang=tf.constant(["de"]))["translations"]

--export_dir must not exist or be empty (an export is never overwritten);
it is checked before the model is restored, and the SavedModel appears
there only when complete (written to a temporary directory, then renamed).
The vocabulary must be the run's (recorded sha256) and --target_lang one
the run was trained to translate into; the accepted source languages are
those it was trained on into --target_lang.

Per-language extraction (Kudugunta et al. 2021; a model trained with
--route_by=language, see m4moe.moe.task_routing and m4moe.inference.extraction):

  m4moe-export --model_dir=runs/task_moe --export_dir=export/de \
      --language=de

keeps, in every MoE layer, only the experts that language's routing uses
(with their fixed combine weights) and drops the routers and the other
experts: a dense-like model whose translations of that language equal the
full model's. It accepts only that source language (or, for a non-English
--target_lang, that target). The parameter counts before and after are
printed. A token-routed model given --language is refused (no subset of
experts reproduces it).
"""

from __future__ import annotations

import pathlib
import sys

from absl import app
from absl import flags

from m4moe import cli
from m4moe.inference import extraction as extraction_lib
from m4moe.moe import task_routing
from m4moe.cli import translation_flags
from m4moe.eval import export as export_lib
from m4moe.eval import textio
from m4moe.eval import translator as translator_lib

_EXPORT_DIR = flags.DEFINE_string("export_dir", None,
                                  "SavedModel output directory.")
_LANGUAGE = flags.DEFINE_string(
    "language", None, "Export only the experts this routing language uses "
    "(a --route_by=language model): the source language for an English "
    "--target_lang, else the target. Empty: every expert.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not _EXPORT_DIR.value:
    raise app.UsageError("--export_dir is required")
  try:
    export_lib.require_tensorflow_text()
    textio.check_output_dir(_EXPORT_DIR.value, flag="--export_dir",
                            must_be_empty=True)
  except export_lib.ExportError as e:
    sys.exit(f"m4moe-export: error: {e}")
  except textio.OutputError as e:
    raise app.UsageError(str(e)) from e
  translator, files = translation_flags.load_translator_from_flags(
      per_batch_length=False)
  target_lang = translation_flags.TARGET_LANG.value
  metadata = {"model_dir": str(files.model_dir),
              "checkpoint": files.checkpoint,
              "config": files.config.to_dict()}
  source_languages = None
  try:
    translator.tag_id(target_lang)
    if _LANGUAGE.value:
      source_languages = _check_language(_LANGUAGE.value, target_lang)
      report = extraction_lib.extract_language(translator.model,
                                               language=_LANGUAGE.value)
      metadata["extraction"] = report.as_dict()
      print(f"--language={report.language}: parameters "
            f"{report.parameters_before:,} -> {report.parameters_after:,} "
            f"({report.parameters_after / report.parameters_before:.1%}); "
            "experts kept per MoE layer: " + ", ".join(
                f"{r.layer} {list(r.experts)}" for r in report.routes))
    with cli.exit_on_disk_full(
        tool="m4moe-export", action="writing the SavedModel",
        path=pathlib.Path(_EXPORT_DIR.value).absolute().parent,
        kept=f"nothing was left in --export_dir={_EXPORT_DIR.value} (the "
        "export is renamed into place only when complete)",
        needed_bytes=cli.tree_bytes(files.checkpoint)):
      path = export_lib.export_saved_model(
          translator, _EXPORT_DIR.value, target_lang=target_lang,
          metadata=metadata, source_languages=source_languages)
  except extraction_lib.ExtractionError as e:
    raise app.UsageError(str(e)) from e
  except (export_lib.ExportError, translator_lib.TranslatorError) as e:
    sys.exit(f"m4moe-export: error: {e}")
  except OSError as e:
    sys.exit(f"m4moe-export: error: cannot write --export_dir="
             f"{_EXPORT_DIR.value} ({e}); nothing was left there")
  print(f"Wrote SavedModel to {path} (signature 'translate': sentences "
        "<string>[B], source_lang <string>[B] -> translations, truncated)")


def _check_language(language: str, target_lang: str) -> list[str] | None:
  """The accepted source languages of a --language export (None: all).

  Raises:
    app.UsageError: --language is not the pair's routing language.
  """
  if target_lang == task_routing.ENGLISH:
    return [language]
  if language != target_lang:
    raise app.UsageError(
        f"--language={language} with --target_lang={target_lang}: a pair "
        "into a non-English language is routed by its target; pass "
        f"--language={target_lang}")
  return None


def run():
  cli.run_tool(main, module=__name__)


if __name__ == "__main__":
  run()
