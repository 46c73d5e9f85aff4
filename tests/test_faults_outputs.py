"""Fault injection on outputs and report inputs: unwritable paths are found
before any work, writes are atomic, eval JSONs are validated field by
field, summary.json is strict JSON."""

import json
import os
import subprocess
import sys

import pytest

from m4moe.eval import report
from m4moe.eval import results
from m4moe.eval import textio


def _cli(name, *args, stdin=b""):
  return subprocess.run([sys.executable, "-m", f"m4moe.cli.{name}", *args],
                        input=stdin, capture_output=True, timeout=180,
                        check=False)


def test_check_output_paths(tmp_path):
  (tmp_path / "a_file").write_text("x")
  (tmp_path / "a_dir").mkdir()
  (tmp_path / "full").mkdir()
  (tmp_path / "full" / "keep.txt").write_text("keep")
  assert textio.check_output_file(tmp_path / "new" / "deep" / "out.txt",
                                  flag="--output")
  assert textio.check_output_file(tmp_path / "a_file", flag="--output")
  with pytest.raises(textio.OutputError,
                     match=f"--output={tmp_path}/a_dir is a directory"):
    textio.check_output_file(tmp_path / "a_dir", flag="--output")
  with pytest.raises(textio.OutputError,
                     match=f"{tmp_path}/a_file is a file, not a directory"):
    textio.check_output_file(tmp_path / "a_file" / "x" / "out.txt",
                             flag="--output")
  with pytest.raises(textio.OutputError,
                     match="--output_dir=.*a_file is a file, not a dir"):
    textio.check_output_dir(tmp_path / "a_file", flag="--output_dir")
  assert textio.check_output_dir(tmp_path / "full", flag="--output_dir")
  with pytest.raises(textio.OutputError, match="exists and is not empty"):
    textio.check_output_dir(tmp_path / "full", flag="--export_dir",
                            must_be_empty=True)
  # Nothing was created by the checks.
  assert sorted(p.name for p in tmp_path.iterdir()) == [
      "a_dir", "a_file", "full"]


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
  path = tmp_path / "out.txt"
  textio.write_text_atomic(path, "old\n")
  textio.write_text_atomic(path, "new\n")
  assert path.read_text() == "new\n"
  assert oct(path.stat().st_mode & 0o777) == "0o644"

  def fail(*args):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(os, "replace", fail)
  with pytest.raises(OSError, match="No space left"):
    textio.write_text_atomic(path, "partial\n")
  with pytest.raises(OSError):
    textio.write_bytes_atomic(tmp_path / "fig.png", b"\x89PNG")
  assert path.read_text() == "new\n"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_decode_checks_output_before_loading_anything(tmp_path):
  (tmp_path / "a_file").write_text("x")
  (tmp_path / "a_dir").mkdir()
  # --model_dir does not exist: the output error must come first.
  for output, message in ((tmp_path / "a_dir", "is a directory"),
                          (tmp_path / "a_file" / "out.txt",
                           "is a file, not a directory")):
    proc = _cli("decode", f"--model_dir={tmp_path}/no_such_run",
                "--source_lang=de", f"--output={output}",
                stdin=b"open file\n")
    stderr = proc.stderr.decode()
    assert proc.returncode != 0
    assert f"--output={output}" in stderr and message in stderr
    assert "config.json" not in stderr and "Traceback" not in stderr
  assert (tmp_path / "a_file").read_text() == "x"
  assert not list((tmp_path / "a_dir").iterdir())


def test_eval_checks_outputs_before_loading_anything(tmp_path):
  corpus = tmp_path / "corpus"
  (corpus / "test").mkdir(parents=True)
  (corpus / "test" / "de.tsv").write_text("open file\tDatei öffnen\n",
                                          encoding="utf-8")
  (tmp_path / "a_file").write_text("x")
  proc = _cli("eval", f"--model_dir={tmp_path}/no_such_run",
              f"--corpus_dir={corpus}", f"--output={tmp_path}")
  stderr = proc.stderr.decode()
  assert proc.returncode != 0 and f"--output={tmp_path} is a directory" in (
      stderr)
  assert "Traceback" not in stderr
  proc = _cli("eval", f"--model_dir={tmp_path}/no_such_run",
              f"--corpus_dir={corpus}", f"--output={tmp_path}/e.json",
              f"--hypotheses_dir={tmp_path}/a_file")
  stderr = proc.stderr.decode()
  assert proc.returncode != 0
  assert f"--hypotheses_dir={tmp_path}/a_file is a file" in stderr
  assert not (tmp_path / "e.json").exists() and "Traceback" not in stderr


def test_export_refuses_a_non_empty_dir_before_loading(tmp_path):
  (tmp_path / "export").mkdir()
  (tmp_path / "export" / "mine.txt").write_text("not yours")
  proc = _cli("export", f"--model_dir={tmp_path}/no_such_run",
              f"--export_dir={tmp_path}/export")
  stderr = proc.stderr.decode()
  assert proc.returncode != 0
  assert f"--export_dir={tmp_path}/export exists and is not empty" in stderr
  assert "Traceback" not in stderr
  assert (tmp_path / "export" / "mine.txt").read_text() == "not yours"


def _eval_dict(**de):
  values = {"source_lang": "de", "target_lang": "en", "num_segments": 3,
            "status": "ok", "bleu": 12.5, "chrf": 40.0, "tokenizer": "13a",
            "bleu_signature": "sig", "chrf_signature": "sig",
            "train_size": 100, **de}
  return {"schema": results.SCHEMA, "model": "moe", "kind": "multilingual",
          "metadata": {"num_params": 10}, "languages": {"de": values}}


@pytest.mark.parametrize("change, field", [
    ({"bleu": float("nan")}, "languages.de.bleu: nan is not a finite score"),
    ({"bleu": float("inf")}, "languages.de.bleu: inf is not a finite score"),
    ({"bleu": 150.0}, "languages.de.bleu: 150.0 is not a finite score in "
     r"\[0, 100\]"),
    ({"chrf": -1.0}, "languages.de.chrf: -1.0 is not a finite"),
    ({"bleu": "12"}, "languages.de.bleu: '12' is not a number"),
    ({"num_segments": -3}, "languages.de.num_segments: -3 is not a "
     "non-negative integer"),
    ({"num_segments": True}, "languages.de.num_segments: True is not"),
    ({"train_size": 2.5}, "languages.de.train_size: 2.5 is not"),
    ({"source_lang": 7}, "languages.de.source_lang: 7 is not a string"),
])
def test_eval_json_fields_are_validated(tmp_path, change, field):
  path = tmp_path / "moe.json"
  # Python's json writes NaN/Infinity unless told not to: files like this
  # exist in the wild.
  path.write_text(json.dumps(_eval_dict(**change)))
  with pytest.raises(ValueError, match=f"{path}: invalid eval JSON: .*{field}"):
    results.read_eval_json(path)


@pytest.mark.parametrize("data, field", [
    ([1, 2], "top level: expected a JSON object"),
    ({**_eval_dict(), "languages": ["de"]}, "languages: expected an object"),
    ({**_eval_dict(), "metadata": {"num_params": -1}},
     "metadata.num_params: -1"),
    ({**_eval_dict(), "schema": "other/2"}, "schema: 'other/2'"),
    ({**_eval_dict(), "kind": "zero-shot"}, "kind: 'zero-shot'"),
])
def test_eval_json_structure_is_validated(tmp_path, data, field):
  path = tmp_path / "x.json"
  path.write_text(json.dumps(data))
  with pytest.raises(ValueError, match=f"{path}: .*{field}"):
    results.read_eval_json(path)
  assert results.validate_eval_dict(_eval_dict()) == []


def test_report_cli_names_file_and_field(tmp_path):
  good = tmp_path / "good.json"
  good.write_text(json.dumps(_eval_dict()))
  bad = tmp_path / "bad.json"
  bad.write_text(json.dumps(_eval_dict(chrf=float("nan"))))
  proc = _cli("report", f"--models={good},{bad}",
              f"--output_dir={tmp_path}/out")
  stderr = proc.stderr.decode()
  assert proc.returncode != 0
  assert f"{bad}: invalid eval JSON: languages.de.chrf: nan" in stderr
  assert "Traceback" not in stderr
  (tmp_path / "a_file").write_text("x")
  proc = _cli("report", f"--models={good}", f"--output_dir={tmp_path}/a_file")
  stderr = proc.stderr.decode()
  assert proc.returncode != 0
  assert f"--output_dir={tmp_path}/a_file is a file" in stderr
  assert "Traceback" not in stderr


def test_summary_non_finite_values_become_null_with_a_note():
  summary = report.strict_summary({"notes": ["earlier note"],
                                   "a": {"b": [1.0, float("nan")]},
                                   "c": float("-inf"), "d": 2.0})
  text = json.dumps(summary, allow_nan=False)  # strict JSON
  assert json.loads(text)["a"] == {"b": [1.0, None]}
  assert summary["c"] is None and summary["d"] == 2.0
  assert summary["nonfinite_as_null"] == ["a.b[1]", "c"]
  assert summary["notes"][0] == "earlier note"
  assert summary["notes"][1].startswith("2 non-finite value(s)")
  clean = report.strict_summary({"x": 1.5})
  assert clean["nonfinite_as_null"] == [] and "notes" not in clean
  assert clean["x"] == 1.5


def test_export_is_atomic_and_never_overwrites(tmp_path, monkeypatch):
  pytest.importorskip("tensorflow_text")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from m4moe.inference import beam_search as decoding  # pylint: disable=g-import-not-at-top
  from m4moe.eval import export  # pylint: disable=g-import-not-at-top
  import report_fixtures as fixtures  # pylint: disable=g-import-not-at-top
  from m4moe.eval import translator as translator_lib  # pylint: disable=g-import-not-at-top
  run_dir = fixtures.make_tiny_run(tmp_path / "tiny")
  translator, _ = translator_lib.load_translator(
      run_dir, beam=decoding.BeamSearchConfig(beam_size=1, alpha=0.0,
                                              max_decode_length=6))
  out = tmp_path / "out"
  out.mkdir()
  real_save = tf.saved_model.save

  def crash(module, path, **kwargs):
    real_save(module, path, **kwargs)  # a complete write, then a failure
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(tf.saved_model, "save", crash)
  with pytest.raises(OSError, match="No space left"):
    export.export_saved_model(translator, out / "model")
  assert not list(out.iterdir())  # no partial export, no temp dir left
  monkeypatch.setattr(tf.saved_model, "save", real_save)
  path = export.export_saved_model(translator, out / "model")
  assert (path / "saved_model.pb").is_file()
  assert sorted(p.name for p in out.iterdir()) == ["model"]
  metadata = json.loads(tf.saved_model.load(str(path)).metadata.numpy())
  assert metadata["source_languages"] == ["de", "fr"]  # trained into en
  before = sorted(p.name for p in path.iterdir())
  with pytest.raises(export.ExportError, match="exists and is not an empty"):
    export.export_saved_model(translator, path)
  assert sorted(p.name for p in path.iterdir()) == before
