"""report.html and routing.html open offline in a real browser.

Each page is written by the code the tools use (``m4moe-report``'s
``write_report``; ``m4moe-analyze-routing``'s statistics and page), on
small hand-made inputs, then rendered by headless Chromium (tests/browser.py):
every figure must decode, every table render with its rows, and nothing be
fetched but the page itself. Skipped, with the reason, where Chromium is not
installed (the README's test command installs Debian's ``chromium`` where
apt is available).
"""

import numpy as np
import pytest

import browser
from m4moe.analysis import page as page_lib
from m4moe.analysis import statistics
from m4moe.eval import report
from m4moe.eval import results
from m4moe.eval import scoring

pytestmark = pytest.mark.skipif(
    browser.chromium() is None,
    reason="Chromium not installed (Debian: apt-get install chromium); the "
           "README's test command installs it where apt is available")

_SIZES = {"de": 900, "ru": 400, "sw": 60}


def _eval(name, bleus, kind="multilingual"):
  languages = {
      lang: scoring.LanguageScore(
          language=lang, source_lang=lang, target_lang="en",
          train_size=_SIZES[lang], num_segments=10, bleu=float(bleu),
          chrf=2.0 * bleu, bleu_signature="BLEU|tok:13a",
          chrf_signature="chrF2++|nw:2")
      for lang, bleu in bleus.items()}
  return results.EvalResult(model=name, kind=kind, metadata={},
                            languages=languages)


def _assert_offline_and_whole(found, *, page, images, tables):
  assert [i for i in found["images"] if i["width"] == 0] == [], found
  assert len(found["images"]) == images
  rendered = [t for t in found["tables"] if t["rows"] > 1 and t["height"] > 0]
  assert len(rendered) >= tables, found["tables"]
  assert all(name.startswith(("data:", page.as_uri()))
             for name in found["fetched"]), found["fetched"]


def test_report_page_renders_offline(tmp_path):
  models = [_eval("moe", {"de": 31, "ru": 22, "sw": 12}),
            _eval("dense", {"de": 30, "ru": 21, "sw": 10})]
  baselines = [_eval(f"bi-{lang}", {lang: b}, kind="bilingual")
               for lang, b in {"de": 33, "ru": 20, "sw": 6}.items()]
  files = report.write_report(tmp_path / "report", models=models,
                              baselines=baselines)
  page = files.markdown.parent / "report.html"
  found = browser.inspect(page, scratch=tmp_path / "chromium")
  _assert_offline_and_whole(found, page=tmp_path / "chromium" / page.name,
                            images=len(found["images"]), tables=2)
  assert found["images"], "the report shows the ΔBLEU figure"


def test_routing_page_renders_offline(tmp_path):
  languages = ["de", "ru", "sw"]
  counts = np.array([[[6, 2, 1, 1], [1, 5, 2, 2]],
                     [[1, 7, 1, 1], [5, 1, 2, 2]],
                     [[2, 2, 5, 1], [2, 2, 1, 5]]], np.int64)  # [L, K, E]
  layers = {name: statistics.layer_statistics(
      counts, np.full(3, 10), languages=languages)
            for name in ("encoder/layer_1/moe", "decoder/layer_1/moe")}
  document = {"model_dir": "runs/smoke/models/moe", "checkpoint": "ckpt-20",
              "corpus_dir": "runs/smoke/corpus", "split": "dev",
              "direction": "x2en", "router": "top2", "languages": languages,
              "train_pairs": _SIZES, "pairs": {l: 5 for l in languages},
              "truncated_pairs": {l: 0 for l in languages},
              "layers": layers}
  pngs = {name: page_lib.png_bytes(page_lib.layer_heatmap(name, layer,
                                                          languages))
          for name, layer in layers.items()}
  page = tmp_path / "routing.html"
  page.write_text(page_lib.html_page(
      document, overview_png=page_lib.png_bytes(
          page_lib.overview(layers, languages)), layer_pngs=pngs))
  found = browser.inspect(page, scratch=tmp_path / "chromium")
  _assert_offline_and_whole(found, page=tmp_path / "chromium" / page.name,
                            images=3, tables=2)
