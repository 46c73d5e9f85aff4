"""The one ranking rule of the selections (m4moe.eval.dev_ranking)."""

from m4moe.eval import dev_ranking


def test_best_first_ranks_from_one_and_puts_unscored_last_in_order():
  ce = {"a": None, "b": 3.1, "c": 2.9, "d": None, "e": 3.1}
  ranked = dev_ranking.best_first(
      ce, score=lambda n: None if ce[n] is None else (ce[n],))
  # Ties keep the given order; candidates without a dev score come last.
  assert ranked == [(1, "c"), (2, "b"), (3, "e"), (4, "a"), (5, "d")]


def test_higher_is_better_metrics_rank_by_their_negation_then_tie_breaks():
  bleu = {"x": (20.0, 3.0), "y": (21.0, 3.5), "z": (20.0, 2.8)}
  ranked = dev_ranking.best_first(
      sorted(bleu), score=lambda n: (-bleu[n][0], bleu[n][1]))
  assert [name for _, name in ranked] == ["y", "z", "x"]
  assert dev_ranking.best_first([], score=lambda n: (n,)) == []
