"""Routing capture and m4moe-analyze-routing on a tiny trained MoE run."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from m4moe.analysis import capture as routing_capture
from m4moe.data import fixtures as data_fixtures
from m4moe.data import pipeline
import report_fixtures as fixtures
from m4moe.training import rundir
from m4moe.eval import translator as translator_lib

SIZES = {"ru": 30, "de": 50, "ja": 10}  # ordered: de, ru, ja


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  return fixtures.make_tiny_run(tmp_path_factory.mktemp("tiny"),
                                train_steps=16)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
  return data_fixtures.write_corpus(tmp_path_factory.mktemp("corpus"),
                                    sizes=SIZES, dev=7, test=2)


def _cli(*args):
  return subprocess.run(
      [sys.executable, "-m", "m4moe.cli.analyze_routing", *args],
      capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # a training CLI run end to end: `pytest -m slow`
def test_capture_agrees_with_the_layers_own_stats_and_restores(run_dir):
  files = rundir.find_run_files(run_dir)
  model = translator_lib.restore_model(files)
  routers = {n: l.router for n, l in routing_capture.moe_layers(model).items()}
  rng = np.random.default_rng(0)
  inputs = rng.integers(3, 300, size=(5, 11)).astype(np.int32)
  targets = rng.integers(3, 300, size=(5, 9)).astype(np.int32)
  inputs[2, 4:] = 0
  targets[0, 3:] = 0
  batch = {"inputs": tf.constant(inputs), "targets": tf.constant(targets)}
  with routing_capture.RoutingCapture(model) as capture:
    counts = capture.counts(batch)
  stats = model(batch, training=False).moe_stats
  assert set(counts) == set(stats) == {"encoder/layer_1/moe",
                                       "decoder/layer_1/moe"}
  real = {"encoder": int((inputs > 0).sum()),
          "decoder": int((targets > 0).sum())}
  for name, (c, tokens) in counts.items():
    assert tokens == real[name.split("/")[0]]  # padding excluded
    assert c.shape == (2, 4) and (c.sum(axis=1) == tokens).all()
    np.testing.assert_allclose(c[0] / tokens, stats[name].load.numpy(),
                               atol=1e-6)
  # The routers are back; the capture refuses to run outside its block.
  for name, layer in routing_capture.moe_layers(model).items():
    assert layer.router is routers[name]
  with pytest.raises(routing_capture.CaptureError, match="with"):
    capture.counts(batch)


def _real_tokens(corpus_dir, vocab_dir, lang, max_length):
  """Real source and target tokens of a language's dev pairs, cut."""
  tokenizers = pipeline.load_tokenizers(pathlib.Path(vocab_dir))
  rows = [line.split("\t") for line in
          (corpus_dir / "dev" / f"{lang}.tsv").read_text().splitlines()]
  sources, targets = tokenizers.encode_pairs(
      [lang] * len(rows), [r[0] for r in rows], [r[1] for r in rows])
  return (sum(min(len(s), max_length) for s in sources),
          sum(min(len(t), max_length) for t in targets),
          sum(len(s) > max_length or len(t) > max_length
              for s, t in zip(sources, targets)))


@pytest.mark.slow
def test_cli_writes_json_figures_and_html(run_dir, corpus_dir, tmp_path):
  out = tmp_path / "routing"
  proc = _cli(f"--model_dir={run_dir}", f"--corpus_dir={corpus_dir}",
              f"--output_dir={out}", "--batch_size=3")
  assert proc.returncode == 0, proc.stderr[-3000:]
  doc = json.loads((out / "routing.json").read_text())
  assert doc["languages"] == ["de", "ru", "ja"]  # high -> low resource
  assert doc["train_pairs"] == {"de": 50, "ru": 30, "ja": 10}
  assert doc["pairs"] == {"de": 7, "ru": 7, "ja": 7}
  vocab_dir = run_dir.parent / "vocab"
  for row, lang in enumerate(doc["languages"]):
    source, target, cut = _real_tokens(corpus_dir, vocab_dir, lang, 48)
    assert doc["truncated_pairs"][lang] == cut
    assert doc["layers"]["encoder/layer_1/moe"]["tokens"][lang] == source
    assert doc["layers"]["decoder/layer_1/moe"]["tokens"][lang] == target
    counts = np.asarray(doc["counts"]["encoder/layer_1/moe"][row])
    assert counts.shape == (2, 4) and (counts.sum(axis=1) == source).all()
  assert doc["truncated_pairs"]["ja"] > 0  # byte-fallback Katakana is long
  for layer in doc["layers"].values():
    for fractions in layer["fractions"].values():
      np.testing.assert_allclose(np.sum(fractions, axis=1), 1.0)
    nmi = layer["first_choice"]["normalized_mutual_information"]
    assert 0.0 <= nmi <= 1.0
  pngs = sorted(p.name for p in out.glob("*.png"))
  assert pngs == ["heatmap_decoder_layer_1_moe.png",
                  "heatmap_encoder_layer_1_moe.png", "overview.png"]
  for name in pngs:
    assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  page = (out / "routing.html").read_text()
  assert page.count('src="data:image/png;base64,') == 3
  assert "http" not in page.replace("http-equiv", "")
  assert "normalised MI (first choice)" in proc.stdout


@pytest.mark.slow
def test_cli_bad_input_names_the_problem(run_dir, corpus_dir, tmp_path):
  proc = _cli(f"--model_dir={run_dir}", f"--corpus_dir={corpus_dir}",
              f"--output_dir={tmp_path}/o", "--languages=de,xx")
  assert proc.returncode != 0
  assert "--languages: xx has no" in proc.stderr
  proc = _cli(f"--model_dir={tmp_path}", f"--corpus_dir={corpus_dir}",
              f"--output_dir={tmp_path}/o")
  assert proc.returncode != 0 and "config.json not found" in proc.stderr
  proc = _cli(f"--model_dir={run_dir}", f"--corpus_dir={corpus_dir}",
              f"--output_dir={tmp_path}/o", "--split=train",
              f"--corpus_dir={tmp_path}")
  assert proc.returncode != 0 and "has no train/ directory" in proc.stderr
  bad = tmp_path / "bad"
  (bad / "dev").mkdir(parents=True)
  (bad / "dev" / "de.tsv").write_text("open file\tDatei\nno tab here\n")
  (bad / "dev" / "fr.tsv").write_text("\n")
  proc = _cli(f"--model_dir={run_dir}", f"--corpus_dir={bad}",
              f"--output_dir={tmp_path}/skipped")
  # A malformed line is skipped and reported with file:line (as training
  # does); the good pair is still analysed.
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert f"{bad}/dev/de.tsv:2: no tab" in proc.stderr
  report = json.loads((tmp_path / "skipped" / "routing.json").read_text())
  assert report["languages"] == ["de"], report["languages"]
  # The language without pairs is left out, and the JSON says so.
  assert report["empty_languages"] == ["fr"]
  (tmp_path / "file").write_text("")
  proc = _cli(f"--model_dir={run_dir}", f"--corpus_dir={corpus_dir}",
              f"--output_dir={tmp_path}/file")
  assert proc.returncode != 0 and "is a file" in proc.stderr
  dense = fixtures.make_tiny_run(tmp_path / "dense", moe=False)
  proc = _cli(f"--model_dir={dense}", f"--corpus_dir={corpus_dir}",
              f"--output_dir={tmp_path}/o")
  assert proc.returncode != 0 and "is a dense model" in proc.stderr
  assert not (tmp_path / "o").exists()


_WITH_PAIRS = """
import json, pathlib, sys
from m4moe.cli import analyze_routing
corpus, languages = pathlib.Path(sys.argv[1]), sys.argv[2].split(",")
print(json.dumps(analyze_routing.with_pairs(corpus, languages, split="dev")))
"""


def _with_pairs(corpus, languages):
  # In a process of its own: the CLI module defines absl flags (corpus_dir)
  # that another CLI module imported in the same test worker also defines.
  return subprocess.run(
      [sys.executable, "-c", _WITH_PAIRS, str(corpus), ",".join(languages)],
      capture_output=True, text=True, timeout=120, check=False)


def test_languages_without_pairs_are_left_out_and_named(tmp_path):
  (tmp_path / "dev").mkdir()
  (tmp_path / "dev" / "de.tsv").write_text("open file\tDatei\n")
  (tmp_path / "dev" / "fr.tsv").write_text("\n \n")
  (tmp_path / "dev" / "ja.tsv").write_text("")
  proc = _with_pairs(tmp_path, ["de", "fr", "ja"])
  assert proc.returncode == 0, proc.stderr
  assert json.loads(proc.stdout) == [["de"], ["fr", "ja"]]
  assert "has no pairs for fr, ja; left out" in proc.stderr
  proc = _with_pairs(tmp_path, ["fr", "ja"])
  assert proc.returncode == 1
  assert "has no pairs for fr, ja: nothing" in proc.stderr
