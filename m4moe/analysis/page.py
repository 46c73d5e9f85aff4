"""Figures and a self-contained HTML page of per-language routing.

Input: the JSON document of ``m4moe-analyze-routing`` (``layers``: layer ->
:func:`m4moe.analysis.statistics.layer_statistics`; ``languages``: high -> low
resource). Heatmaps show p_k(e | l), languages as rows (high-resource on
top), experts as columns. Drawn with matplotlib's object API on an Agg
canvas (no pyplot, no global state), as :mod:`m4moe.eval.figure` does.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from m4moe.eval import document as doc

_CHOICE_NAMES = ("first choice", "second choice")


def _matrix(layer: Mapping[str, Any], languages: Sequence[str],
            choice: int) -> np.ndarray:
  """<float64>[L, E] p_choice(e | l); NaN rows for languages without tokens."""
  rows = []
  for lang in languages:
    fractions = layer["fractions"].get(lang)
    rows.append(fractions[choice] if fractions is not None
                else [math.nan] * layer["num_experts"])
  return np.asarray(rows, np.float64)


def _choice_name(k: int) -> str:
  return _CHOICE_NAMES[k] if k < len(_CHOICE_NAMES) else f"choice {k + 1}"


def layer_heatmap(name: str, layer: Mapping[str, Any],
                  languages: Sequence[str]) -> Figure:
  """One panel per choice: languages x experts, colour = fraction."""
  choices = layer["num_choices"]
  height = 1.2 + 0.22 * max(len(languages), 4)
  width = 1.5 + choices * (1.0 + 0.3 * layer["num_experts"])
  figure = Figure(figsize=(width, height), layout="constrained")
  FigureCanvasAgg(figure)
  axes = figure.subplots(1, choices, squeeze=False)[0]
  nmi = layer["first_choice"]["normalized_mutual_information"]
  for k, ax in enumerate(axes):
    image = ax.imshow(_matrix(layer, languages, k), aspect="auto",
                      cmap="viridis", vmin=0.0, vmax=1.0,
                      interpolation="nearest")
    ax.set_title(_choice_name(k), fontsize=9)
    ax.set_xlabel("expert")
    ax.set_xticks(range(layer["num_experts"]))
    ax.set_yticks(range(len(languages)))
    ax.set_yticklabels(languages if k == 0 else [""] * len(languages),
                       fontsize=7)
  axes[0].set_ylabel("language (high → low resource)")
  figure.colorbar(image, ax=list(axes), label="fraction of tokens")
  figure.suptitle(f"{name}  (normalised MI, first choice: "
                  f"{_format(nmi)})", fontsize=10)
  return figure


def overview(layers: Mapping[str, Mapping[str, Any]],
             languages: Sequence[str]) -> Figure:
  """Small multiples: the first-choice heatmap of every layer."""
  names = list(layers)
  columns = min(4, len(names))
  rows = -(-len(names) // columns)
  figure = Figure(figsize=(3.2 * columns, 0.6 + rows * (0.8 + 0.16 *
                                                       len(languages))),
                  layout="constrained")
  FigureCanvasAgg(figure)
  axes = figure.subplots(rows, columns, squeeze=False)
  for index, ax in enumerate(axes.flat):
    if index >= len(names):
      ax.set_axis_off()
      continue
    layer = layers[names[index]]
    ax.imshow(_matrix(layer, languages, 0), aspect="auto", cmap="viridis",
              vmin=0.0, vmax=1.0, interpolation="nearest")
    nmi = layer["first_choice"]["normalized_mutual_information"]
    ax.set_title(f"{names[index]}\nnMI {_format(nmi)}", fontsize=8)
    ax.set_xticks([])
    ax.set_yticks(range(len(languages)))
    ax.set_yticklabels(languages if index % columns == 0
                       else [""] * len(languages), fontsize=6)
  figure.suptitle("first-choice expert per language (rows high → low "
                  "resource)", fontsize=10)
  return figure


def png_bytes(figure: Figure, *, dpi: int = 110) -> bytes:
  """A routing figure as PNG bytes (cropped: its size follows its content)."""
  return doc.png_bytes(figure, dpi=dpi, tight=True)


def _format(value: float | None) -> str:
  return "n/a" if value is None else f"{value:.3f}"


def _layer_table(layers: Mapping[str, Mapping[str, Any]]) -> doc.Table:
  """Specialisation per layer: mutual information, first and any choice."""
  rows = []
  for name, layer in layers.items():
    first, pooled = layer["first_choice"], layer["any_choice"]
    rows.append((name, _format(first["normalized_mutual_information"]),
                 _format(first["mutual_information"]),
                 _format(pooled["normalized_mutual_information"]),
                 ", ".join(layer["skipped_languages"]) or "-"))
  return doc.Table(("layer", "normalised MI (1st)", "MI nats (1st)",
                    "normalised MI (all choices)",
                    "languages without tokens"), tuple(rows))


def _language_table(document: Mapping[str, Any]) -> doc.Table:
  """Per language: training pairs, pairs analysed and pairs truncated."""
  sizes = document["train_pairs"]
  rows = tuple((l, str(sizes.get(l, "n/a")),
                str(document["pairs"].get(l, 0)),
                str(document["truncated_pairs"].get(l, 0)))
               for l in document["languages"])
  return doc.Table(("language", "training pairs", "pairs analysed",
                    "pairs truncated"), rows)


def html_page(document: Mapping[str, Any], *, overview_png: bytes,
              layer_pngs: Mapping[str, bytes]) -> str:
  """The self-contained routing.html (images inline as base64).

  Rendered by :func:`m4moe.eval.document.to_html`, the renderer of the
  evaluation report, so the page opens offline and fetches nothing.
  """
  layers = document["layers"]
  intro = (
      f"Model {document['model_dir']}, checkpoint {document['checkpoint']}, "
      f"split {document['split']}; teacher-forced, eval mode, real tokens "
      "only. Mutual information between language and expert with every "
      "language weighted equally, normalised by log(number of languages): "
      "1 = each expert serves one language, 0 = all languages route alike.")
  blocks: list[doc.Block] = [
      doc.Paragraph(intro),
      doc.Heading("Specialisation per layer"), _layer_table(layers),
      doc.Heading("Overview"),
      doc.Image("overview.png", overview_png, "overview"),
      doc.Heading("Layers"),
  ]
  for name in layers:
    blocks += [doc.Heading(name, level=3),
               doc.Image(f"heatmap_{name.replace('/', '_')}.png",
                         layer_pngs[name], name)]
  blocks += [doc.Heading("Languages"), _language_table(document)]
  return doc.to_html("Routing by language", blocks)
