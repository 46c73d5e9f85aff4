r"""m4moe-export: a SavedModel with a ``translate`` signature.

Example:

  m4moe-export --model_dir=/work/runs/moe --export_dir=/work/export/moe \
      --beam_size=4 --alpha=0.6

Load it in any process (tensorflow-text must be imported first, to register
the SentencePiece ops the graph uses):

  import tensorflow as tf, tensorflow_text
  m = tf.saved_model.load("/work/export/moe")
  m.signatures["translate"](sentences=tf.constant(["Datei öffnen"]),
                            source_lang=tf.constant(["de"]))["translations"]

--export_dir must not exist or be empty (an export is never overwritten);
it is checked before the model is restored, and the SavedModel appears
there only when complete (written to a temporary directory, then renamed).
The vocabulary must be the run's (recorded sha256) and --target_lang one
the run was trained to translate into; the accepted source languages are
those it was trained on into --target_lang.
"""

from __future__ import annotations

import sys

from absl import app
from absl import flags

from m4moe.cli import translation_flags
from m4moe.eval import export as export_lib
from m4moe.eval import textio
from m4moe.eval import translator as translator_lib

_EXPORT_DIR = flags.DEFINE_string("export_dir", None,
                                  "SavedModel output directory.")


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
  try:
    translator.tag_id(target_lang)
    path = export_lib.export_saved_model(
        translator, _EXPORT_DIR.value, target_lang=target_lang,
        metadata={"model_dir": str(files.model_dir),
                  "checkpoint": files.checkpoint,
                  "config": files.config.to_dict()})
  except (export_lib.ExportError, translator_lib.TranslatorError) as e:
    sys.exit(f"m4moe-export: error: {e}")
  except OSError as e:
    sys.exit(f"m4moe-export: error: cannot write --export_dir="
             f"{_EXPORT_DIR.value} ({e}); nothing was left there")
  print(f"Wrote SavedModel to {path} (signature 'translate': sentences "
        "<string>[B], source_lang <string>[B] -> translations, truncated)")


def run():
  app.run(main)


if __name__ == "__main__":
  run()
