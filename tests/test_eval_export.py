"""m4moe-export: a fresh process reproduces the library's translations."""

import json
import subprocess
import sys
import textwrap

import pytest

from m4moe.inference import beam_search as decoding
from m4moe.eval import export
import report_fixtures as fixtures
from m4moe.eval import translator as translator_lib


def test_missing_tensorflow_text_explains_the_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_text", None)
  with pytest.raises(export.ExportError,
                     match=r"pip install --no-deps 'tensorflow-text==2\.\d+"):
    export.require_tensorflow_text()


@pytest.mark.slow
def test_saved_model_reproduces_decode_in_a_fresh_process(tmp_path):
  pytest.importorskip("tensorflow_text")
  run_dir = fixtures.make_tiny_run(tmp_path / "tiny")
  beam = decoding.BeamSearchConfig(beam_size=2, alpha=0.6,
                                   max_decode_length=10)
  translator, _ = translator_lib.load_translator(
      run_dir, beam=beam, max_input_length=24, batch_size=2)
  texts = fixtures.sentences(5, seed=9)
  lines = [texts[0], "", " ".join(fixtures.WORDS), *texts[1:]]
  expected = translator.translate(lines, source_lang="fr")
  assert translator.stats.truncated == 1
  path = export.export_saved_model(translator, tmp_path / "export",
                                   metadata={"note": "test"})
  script = textwrap.dedent(f"""
      import json, sys
      import tensorflow as tf
      import tensorflow_text  # registers the SentencePiece ops
      m = tf.saved_model.load({str(path)!r})
      lines = json.loads(sys.stdin.read())
      out = m.signatures["translate"](
          sentences=tf.constant(lines, tf.string),
          source_lang=tf.constant(["fr"] * len(lines)))
      try:
        m.signatures["translate"](sentences=tf.constant(["x"]),
                                  source_lang=tf.constant(["xx"]))
        error = ""
      except tf.errors.InvalidArgumentError as e:
        error = e.message
      print(json.dumps({{
          "translations": [t.decode("utf-8") for t in
                           out["translations"].numpy()],
          "truncated": out["truncated"].numpy().tolist(),
          "metadata": json.loads(m.metadata.numpy()), "error": error}}))
  """)
  proc = subprocess.run([sys.executable, "-c", script],
                        input=json.dumps(lines), capture_output=True,
                        text=True, timeout=180, check=False)
  assert proc.returncode == 0, proc.stderr
  got = json.loads(proc.stdout.strip().splitlines()[-1])
  assert got["translations"] == expected
  assert got["truncated"] == [False, False, True, False, False, False, False]
  assert got["metadata"]["beam_size"] == 2 and got["metadata"]["note"] == (
      "test")
  assert "unknown source_lang (no <2xx> tag in the vocabulary" in got["error"]
  assert "xx" in got["error"]
