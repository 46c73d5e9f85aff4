"""How the report shows one number: a score, a count, an interval, a
difference with its significance mark, a spread over seeds.

Every table of the report (:mod:`.report_sections`, :mod:`.report_intervals`)
formats its cells here, so a missing value is the same dash and a score
has the same digits everywhere.
"""

from __future__ import annotations

from m4moe.eval import seeds as seeds_lib
from m4moe.eval import significance
from m4moe.eval import intervals as intervals_lib

DASH = "–"


def fmt(value: float | None, *, signed: bool = False,
         digits: int = 1) -> str:
  if value is None:
    return DASH
  return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def fmt_int(value: int | None) -> str:
  return DASH if value is None else f"{value:,}"


def fmt_ce(value: float | None, *, signed: bool = False) -> str:
  return fmt(value, signed=signed, digits=2)


def percent(value: float | None) -> str:
  return DASH if value is None else f"{100 * value:.1f}%"


def fmt3(value: float | None) -> str:
  return DASH if value is None else f"{value:.3f}"


def fmt_interval(cell: intervals_lib.Cell | None) -> str:
  """``24.1 ±1.2`` (sacrebleu's μ ± ci around the bootstrap mean)."""
  if cell is None or cell.interval is None:
    return DASH
  return f"{cell.interval.score:.1f} ±{cell.interval.ci:.1f}"


def fmt_difference(diff: significance.Difference | None, *,
                    with_p: bool = False) -> str:
  """``+2.1 ±0.9*`` (* = significant); ``with_p`` adds ``(p=0.003)``."""
  if diff is None:
    return DASH
  text = (f"{diff.interval.score:+.1f} ±{diff.interval.ci:.1f}"
          f"{'*' if diff.significant else ''}")
  return f"{text} (p={diff.p_value:.3f})" if with_p else text


def fmt_seed_difference(diff: seeds_lib.SeedDifference | None) -> str:
  """``+0.4, t -0.1–+0.9 (p=0.090)`` over seeds (* = significant)."""
  if diff is None:
    return DASH
  return (f"{diff.mean:+.1f}, t {diff.t_low:+.1f}–{diff.t_high:+.1f}"
          f"{'*' if diff.significant else ''} (p={diff.p_value:.3f})")


def fmt_spread(spread: seeds_lib.Spread | None, *,
                signed: bool = False) -> str:
  """``23.1–24.9, t 22.0–26.0`` over seeds; – for one seed."""
  if spread is None:
    return DASH
  sign = "+" if signed else ""
  text = f"{spread.min:{sign}.1f}–{spread.max:{sign}.1f}"
  if spread.t_low is not None:
    text += f", t {spread.t_low:{sign}.1f}–{spread.t_high:{sign}.1f}"
  return text
