"""Ranking candidates on dev: the one ordering rule of every selection.

A selection (the study's screening of a dev-only recipe, the peer
comparison's choice of each system's recipe) reads dev scores only, so the
test split stays unseen by every choice. Both rank the same way: best
first by a score where lower is better, candidates with no dev score
(not trained or not evaluated yet) last in the order given, and rank
numbers from 1, so ties and gaps are decided in one place.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence, TypeVar

T = TypeVar("T")

# A candidate's dev score: compared as a tuple, lower is better; None when
# the candidate has none yet.
Score = Sequence[Any] | None


def best_first(candidates: Iterable[T], *,
               score: Callable[[T], Score]) -> list[tuple[int, T]]:
  """``(rank, candidate)`` pairs, rank 1 the best.

  Args:
    candidates: in the order to keep among those without a score.
    score: a candidate's dev score (lower is better; give ``-bleu`` for a
      higher-is-better metric, and tie-breakers after it), or None when
      it has none; such candidates are ranked after every scored one.
  """
  items = list(candidates)
  scores = [score(item) for item in items]
  order = sorted(range(len(items)), key=lambda i: (
      scores[i] is None, () if scores[i] is None else tuple(scores[i]), i))
  return [(rank, items[i]) for rank, i in enumerate(order, start=1)]
