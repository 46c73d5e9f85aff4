"""The routing page and the shared renderer (m4moe.eval.document)."""

import base64
import html.parser
import struct

import numpy as np
from matplotlib.figure import Figure

from m4moe.analysis import page
from m4moe.analysis import statistics
from m4moe.eval import document as doc


class _Collector(html.parser.HTMLParser):
  """Images, table cells and every URL-bearing attribute of a page."""

  def __init__(self):
    super().__init__()
    self.images, self.cells, self.urls = [], [], []
    self._cell = None

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    if tag == "img":
      self.images.append(attrs)
    for key in ("src", "href"):
      if key in attrs and not attrs[key].startswith("data:"):
        self.urls.append(attrs[key])
    if tag in ("td", "th"):
      self._cell = ""

  def handle_data(self, data):
    if self._cell is not None:
      self._cell += data

  def handle_endtag(self, tag):
    if tag in ("td", "th"):
      self.cells.append(self._cell)
      self._cell = None


def _document():
  languages = ["de", "ja"]
  # de always picks expert 0 and ja expert 1 as first choice: fully
  # specialised (normalised MI 1) in the encoder; uniform in the decoder.
  forced = np.array([[[10, 0], [0, 10]], [[0, 10], [10, 0]]], np.int64)
  uniform = np.array([[[5, 5], [5, 5]], [[5, 5], [5, 5]]], np.int64)
  layers = {
      name: statistics.layer_statistics(counts, np.array([10, 10]),
                                        languages=languages)
      for name, counts in (("encoder/layer_1/moe", forced),
                           ("decoder/layer_1/moe", uniform))}
  return {"model_dir": "runs/tiny", "checkpoint": "runs/tiny/ckpt-4",
          "split": "dev", "languages": languages, "layers": layers,
          "train_pairs": {"de": 50, "ja": None}, "pairs": {"de": 7, "ja": 7},
          "truncated_pairs": {"ja": 2}}


def test_routing_page_embeds_every_figure_and_fetches_nothing():
  pngs = {"encoder/layer_1/moe": b"\x89PNG enc", "decoder/layer_1/moe":
          b"\x89PNG dec"}
  text = page.html_page(_document(), overview_png=b"\x89PNG all",
                        layer_pngs=pngs)
  parsed = _Collector()
  parsed.feed(text)
  sources = [image["src"] for image in parsed.images]
  assert sources == [
      "data:image/png;base64," + base64.b64encode(png).decode("ascii")
      for png in (b"\x89PNG all", b"\x89PNG enc", b"\x89PNG dec")]
  assert parsed.urls == []
  cells = parsed.cells
  encoder = cells.index("encoder/layer_1/moe")
  # Normalised MI of a fully specialised layer is 1, mutual information
  # log(2) nats with two equally weighted languages.
  assert cells[encoder + 1:encoder + 3] == ["1.000", f"{np.log(2):.3f}"]
  decoder = cells.index("decoder/layer_1/moe")
  assert cells[decoder + 1:decoder + 3] == ["0.000", "0.000"]
  assert cells[cells.index("de"):cells.index("de") + 4] == ["de", "50", "7",
                                                            "0"]
  assert cells[cells.index("ja"):cells.index("ja") + 4] == ["ja", "None", "7",
                                                            "2"]


def _png_size(png: bytes) -> tuple[int, int]:
  assert png[:8] == b"\x89PNG\r\n\x1a\n"
  return struct.unpack(">II", png[16:24])  # IHDR width, height


def test_png_bytes_uses_the_figure_size_times_dpi_unless_cropped():
  figure = Figure(figsize=(2, 1))
  figure.add_axes((0.4, 0.4, 0.2, 0.2)).plot([0, 1], [0, 1])
  assert _png_size(doc.png_bytes(figure, dpi=50)) == (100, 50)
  width, height = _png_size(doc.png_bytes(figure, dpi=50, tight=True))
  assert width < 100 and height < 50
