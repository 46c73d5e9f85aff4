"""The paper's Figure 6 (ΔBLEU per language) and router statistics plots.

x: languages ordered from high- to low-resource (training size); y: BLEU of
each multilingual model minus the bilingual baseline's. Each model gets its
points and one smoothed trendline (:mod:`m4moe.eval.smoothing`); the
baselines are the zero line. Drawn with matplotlib's object API on an Agg
canvas (no pyplot, no global state).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from m4moe.eval import comparison as comparison_lib
from m4moe.eval import smoothing
from m4moe.eval import training_logs

MAX_TICK_LABELS = 40


@dataclasses.dataclass(frozen=True)
class DeltaFigure:
  """The figure and the artists tests and callers may inspect.

  Attributes:
    figure: the matplotlib Figure (Agg canvas attached).
    trendlines: model -> its trendline (label ``"<model> trend"``).
    zero_line: the bilingual-baseline line at ΔBLEU = 0.
    smoother: a sentence describing the smoother.
    plotted: model -> languages with a ΔBLEU (in x order).
  """

  figure: Figure
  trendlines: Mapping[str, Line2D]
  zero_line: Line2D
  smoother: str
  plotted: Mapping[str, tuple[str, ...]]

  def save_png(self, path: str | pathlib.Path, *, dpi: int = 120) -> None:
    self.figure.savefig(str(path), format="png", dpi=dpi)


def delta_bleu_figure(comparison: comparison_lib.Comparison, *,
                      frac: float = 0.5,
                      title: str | None = None) -> DeltaFigure:
  """Draws ΔBLEU points and trendlines for every model of ``comparison``.

  The score is the comparison's metric (ΔchrF++ for ``metric="chrf"``);
  the default title is "Δ<metric> vs bilingual baselines".
  """
  metric = comparison.metric_name
  title = title or f"Δ{metric} vs bilingual baselines"
  languages = comparison.languages
  position = {lang: i for i, lang in enumerate(languages)}
  width = min(16.0, max(6.0, 0.18 * len(languages) + 4))
  figure = Figure(figsize=(width, 4.8))
  FigureCanvasAgg(figure)
  ax = figure.add_subplot(1, 1, 1)
  zero_line = ax.axhline(0.0, color="black", linewidth=1.0,
                         label=comparison_lib.BASELINE_NAME)
  colors = [f"C{i % 10}" for i in range(len(comparison.models))]
  trendlines, plotted = {}, {}
  for model, color in zip(comparison.models, colors):
    langs = tuple(l for l in languages
                  if comparison.delta[model][l] is not None)
    plotted[model] = langs
    x = np.array([position[l] for l in langs], np.float64)
    y = np.array([comparison.delta[model][l] for l in langs], np.float64)
    ax.scatter(x, y, s=12, alpha=0.35, color=color)
    (line,) = ax.plot(x, smoothing.lowess(x, y, frac=frac), color=color,
                      linewidth=2.0, label=f"{model} trend")
    trendlines[model] = line
  _label_axes(ax, languages, metric=metric)
  ax.set_title(title)
  ax.legend(loc="best", fontsize="small")
  figure.tight_layout()
  return DeltaFigure(figure=figure, trendlines=trendlines,
                     zero_line=zero_line,
                     smoother=smoothing.DESCRIPTION.format(frac=frac),
                     plotted=plotted)


def _label_axes(ax, languages, *, metric: str) -> None:
  step = max(1, int(np.ceil(len(languages) / MAX_TICK_LABELS)))
  ticks = list(range(0, len(languages), step))
  ax.set_xticks(ticks)
  ax.set_xticklabels([languages[i] for i in ticks], rotation=90,
                     fontsize="small")
  ax.set_xlim(-0.5, max(len(languages) - 0.5, 0.5))
  ax.set_xlabel("languages, high → low resource (training pairs)")
  ax.set_ylabel(f"Δ{metric} vs bilingual baseline")
  ax.grid(axis="y", alpha=0.3)


def router_figure(trajectories: Mapping[str, Sequence[
    training_logs.RouterPoint]]) -> Figure:
  """Load CV and dropped second choices vs step, one line per MoE model.

  Args:
    trajectories: model -> its :func:`training_logs.router_trajectory`.
  """
  figure = Figure(figsize=(10.0, 3.8))
  FigureCanvasAgg(figure)
  panels = (("load_cv_mean", "expert load CV (mean over layers)"),
            ("dropped_second", "dropped 2nd choices (fraction)"))
  for index, (field, label) in enumerate(panels):
    ax = figure.add_subplot(1, len(panels), index + 1)
    for model, points in trajectories.items():
      pairs = [(p.step, getattr(p, field)) for p in points
               if getattr(p, field) is not None]
      if pairs:
        steps, values = zip(*pairs)
        ax.plot(steps, values, label=model, linewidth=1.5)
    ax.set_xlabel("training step")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
  figure.tight_layout()
  return figure
