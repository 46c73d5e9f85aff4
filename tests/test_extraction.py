"""m4moe-export --language: a language's experts only, same translations."""

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from m4moe.inference import beam_search as decoding
from m4moe.inference import extraction
from m4moe.eval import export
import report_fixtures as fixtures
from m4moe.eval import translator as translator_lib

BEAM = decoding.BeamSearchConfig(beam_size=2, alpha=0.6, max_decode_length=12)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  """A tiny --route_by=language run (de, fr), briefly trained."""
  root = tmp_path_factory.mktemp("task_run")
  return fixtures.make_tiny_run(root, train_steps=40, route_by_language=True)


def _translator(run_dir):
  translator, _ = translator_lib.load_translator(
      run_dir, beam=BEAM, max_input_length=24, batch_size=4)
  return translator


def _cli(*args):
  return subprocess.run([sys.executable, "-m", "m4moe.cli.export", *args],
                        capture_output=True, text=True, timeout=600,
                        check=False)


def test_extracted_model_translates_its_language_like_the_full_model(
    run_dir):
  texts = fixtures.sentences(6, seed=4)
  full = _translator(run_dir)
  assert full.routes_by_language
  for language in fixtures.TRAINED_LANGUAGES:
    expected = full.translate(texts, source_lang=language)
    small = _translator(run_dir)
    report = extraction.extract_language(small.model, language=language)
    assert not small.routes_by_language
    assert [len(r.experts) for r in report.routes] == [2, 2]  # top2
    for route in report.routes:
      assert abs(sum(route.weights) - 1.0) < 1e-6  # renormalised top-2
    # Each MoE layer keeps 2 of 4 experts and loses its router.
    moe = small.model.config.moe
    per_expert = 2 * small.model.config.d_model * moe.expert_hidden_dim
    dropped = 2 * (2 * per_expert + 2 * 4) - 2 * 2  # experts, gates; + weights
    assert report.parameters_before - report.parameters_after == dropped
    assert small.translate(texts, source_lang=language) == expected
    # And the logits agree (routing per sentence, as decoding does).
    def pad(rows):
      width = max(map(len, rows))
      return tf.constant([r + [0] * (width - len(r)) for r in rows])
    inputs = pad([small.encode(t, tag=small.tag_id("en"))[0]
                  for t in texts[:2]])
    targets = pad([[*ids, 1] for ids in small.target_sp.encode(texts[:2])])
    index = moe.language_index(language)
    batch = {"inputs": inputs, "targets": targets,
             "inputs_languages": tf.fill(tf.shape(inputs), index),
             "targets_languages": tf.fill(tf.shape(targets), index)}
    want = full.model(batch, training=False, per_sentence_routing=True)
    got = small.model({"inputs": inputs, "targets": targets}, training=False,
                      per_sentence_routing=True)
    real = targets.numpy() > 0
    np.testing.assert_allclose(got.logits.numpy()[real],
                               want.logits.numpy()[real], atol=1e-5)


def test_saved_model_of_one_language(run_dir, tmp_path):
  text = pytest.importorskip("tensorflow_text")
  del text
  texts = fixtures.sentences(4, seed=5)
  expected = _translator(run_dir).translate(texts, source_lang="fr")
  proc = _cli(f"--model_dir={run_dir}", f"--export_dir={tmp_path}/fr",
              "--language=fr", "--beam_size=2", "--alpha=0.6",
              "--max_decode_length=12", "--max_input_length=24")
  assert proc.returncode == 0, proc.stderr
  assert "--language=fr: parameters " in proc.stdout
  loaded = tf.saved_model.load(str(tmp_path / "fr"))
  meta = json.loads(loaded.metadata.numpy())
  assert meta["source_languages"] == ["fr"]
  report = meta["extraction"]
  assert report["parameters_after"] < report["parameters_before"]
  assert (f"{report['parameters_before']:,} -> "
          f"{report['parameters_after']:,}") in proc.stdout
  out = loaded.signatures["translate"](
      sentences=tf.constant(texts), source_lang=tf.constant(["fr"] * 4))
  assert [t.decode() for t in out["translations"].numpy()] == expected
  with pytest.raises(tf.errors.InvalidArgumentError, match="unknown source"):
    loaded.signatures["translate"](sentences=tf.constant(["x"]),
                                   source_lang=tf.constant(["de"]))


def test_extraction_errors(run_dir, tmp_path):
  with pytest.raises(extraction.ExtractionError,
                     match="'xx' has no row in the per-language gate"):
    extraction.extract_language(_translator(run_dir).model, language="xx")
  token_run = fixtures.make_tiny_run(tmp_path / "token")
  with pytest.raises(extraction.ExtractionError, match="routes by token"):
    extraction.extract_language(_translator(token_run).model, language="de")
  proc = _cli(f"--model_dir={token_run}", f"--export_dir={tmp_path}/out",
              "--language=de")
  assert proc.returncode != 0
  assert "routes by token (--route_by=token)" in proc.stderr
  assert "Traceback" not in proc.stderr
  assert not (tmp_path / "out").exists()
  proc = _cli(f"--model_dir={run_dir}", f"--export_dir={tmp_path}/out",
              "--language=fr", "--target_lang=de")
  assert proc.returncode != 0 and "Traceback" not in proc.stderr
  assert "is routed by its target; pass --language=de" in proc.stderr
  assert not (tmp_path / "out").exists()


def test_full_language_routed_export_routes_each_row(run_dir, tmp_path):
  pytest.importorskip("tensorflow_text")
  translator = _translator(run_dir)
  texts = fixtures.sentences(3, seed=6)
  expected = {l: translator.translate(texts, source_lang=l)
              for l in fixtures.TRAINED_LANGUAGES}
  path = export.export_saved_model(translator, tmp_path / "all")
  loaded = tf.saved_model.load(str(path))
  out = loaded.signatures["translate"](
      sentences=tf.constant(texts * 2),
      source_lang=tf.constant(["de"] * 3 + ["fr"] * 3))
  got = [t.decode() for t in out["translations"].numpy()]
  assert got == expected["de"] + expected["fr"]


def test_shared_experts_are_kept_whole_by_the_extraction():
  from m4moe import config as config_lib  # pylint: disable=g-import-not-at-top
  from m4moe.model import transformer as model_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.load_model_config(
      "tiny/moe", src_vocab_size=50, tgt_vocab_size=40, d_model=16,
      num_heads=2, d_kv=8, d_ff=32, num_encoder_layers=2,
      num_decoder_layers=2, dropout_rate=0.0, attention_dropout_rate=0.0,
      max_length=24, num_experts=4, expert_hidden_dim=8, group_size=16,
      num_shared_experts=1, shared_expert_hidden_dim=12, route_by="language",
      routing_languages=fixtures.TRAINED_LANGUAGES)
  tf.random.set_seed(3)
  full = model_lib.Transformer(config=config)
  rng = np.random.default_rng(1)
  inputs = tf.constant(rng.integers(3, 50, size=(2, 7)), tf.int32)
  targets = tf.constant(rng.integers(3, 40, size=(2, 5)), tf.int32)
  language = fixtures.TRAINED_LANGUAGES[1]
  index = config.moe.language_index(language)
  want = full({"inputs": inputs, "targets": targets,
               "inputs_languages": tf.fill(tf.shape(inputs), index),
               "targets_languages": tf.fill(tf.shape(targets), index)},
              training=False, per_sentence_routing=True).logits.numpy()
  small = model_lib.Transformer(config=config)
  small({"inputs": inputs, "targets": targets,
         "inputs_languages": tf.fill(tf.shape(inputs), index),
         "targets_languages": tf.fill(tf.shape(targets), index)},
        training=False, per_sentence_routing=True)  # builds the variables
  for mine, theirs in zip(small.variables, full.variables):
    mine.assign(theirs)
  report = extraction.extract_language(small, language=language)
  got = small({"inputs": inputs, "targets": targets}, training=False,
              per_sentence_routing=True).logits.numpy()
  np.testing.assert_allclose(got, want, atol=1e-5)
  # The shared experts' weights stay (2 x M x Hs per MoE layer).
  kept = sum(int(v.shape.num_elements()) for v in small.variables
             if "shared" in v.name)
  assert kept == len(report.routes) * 2 * 16 * 12
