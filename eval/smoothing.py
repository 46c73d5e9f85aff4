"""LOWESS trendlines (numpy only) for the ΔBLEU-per-language figure.

The smoother is Cleveland's LOWESS without robustness iterations: at every
x, a straight line is fitted by weighted least squares to the ``ceil(frac *
n)`` nearest points with tricube weights ``(1 - (d / d_max)^3)^3``, and the
fitted value at x is the trend. ``frac`` (default 0.5) sets how local the
trend is (at least 5 neighbours); with fewer than three points the
trend is the points' mean.
"""

from __future__ import annotations

import numpy as np

DESCRIPTION = ("LOWESS (locally weighted linear regression, tricube weights, "
               "no robustness iterations) over language rank, frac={frac}")


def lowess(x: np.ndarray, y: np.ndarray, *, frac: float = 0.5) -> np.ndarray:
  """Smoothed y at each x.

  Args:
    x: <float64>[n] positions (e.g. language rank, high -> low resource).
    y: <float64>[n] values (e.g. ΔBLEU); no NaNs.
    frac: fraction of the points in each local fit, in (0, 1].

  Returns:
    <float64>[n] the trend at every x.
  """
  if not 0 < frac <= 1:
    raise ValueError(f"--trend_frac={frac} is invalid: use a value in (0, 1]")
  x = np.asarray(x, np.float64)
  y = np.asarray(y, np.float64)
  if x.shape != y.shape or x.ndim != 1:
    raise ValueError(f"x and y must be equal 1-D arrays, got {x.shape}, "
                     f"{y.shape}")
  n = len(x)
  if n < 3:
    return np.full(n, y.mean() if n else np.nan)
  k = min(n, max(5, int(np.ceil(frac * n))))
  out = np.empty(n)
  for i in range(n):
    distance = np.abs(x - x[i])
    nearest = np.argsort(distance, kind="stable")[:k]
    d_max = distance[nearest].max()
    d_max = d_max * 1.0001 if d_max > 0 else 1.0
    w = (1 - (distance[nearest] / d_max) ** 3) ** 3
    out[i] = _weighted_line_at(x[nearest], y[nearest], w, x[i])
  return out


def _weighted_line_at(x: np.ndarray, y: np.ndarray, w: np.ndarray,
                      at: float) -> float:
  """Weighted least-squares line through (x, y), evaluated at ``at``."""
  sw = w.sum()
  mx, my = (w * x).sum() / sw, (w * y).sum() / sw
  var = (w * (x - mx) ** 2).sum()
  if var <= 1e-12:
    return float(my)
  slope = (w * (x - mx) * (y - my)).sum() / var
  return float(my + slope * (at - mx))
