"""Per-language routing statistics on hand-checkable counts."""

import math

import numpy as np
import pytest

from m4moe.analysis import statistics as routing_analysis


def _forced():
  """Language l's first choice is always expert l, its second expert 3."""
  counts = np.zeros((3, 2, 4), np.int64)
  tokens = np.array([10, 20, 40])
  for lang in range(3):
    counts[lang, 0, lang] = tokens[lang]
    counts[lang, 1, 3] = tokens[lang]
  return counts, tokens


def test_routing_forced_by_language_has_maximal_mutual_information():
  counts, tokens = _forced()
  stats = routing_analysis.layer_statistics(counts, tokens,
                                            languages=["de", "fr", "ja"])
  first = stats["first_choice"]
  assert first["mutual_information"] == pytest.approx(math.log(3))
  assert first["normalized_mutual_information"] == pytest.approx(1.0)
  # Experts 0-2 serve one language each; expert 3 is nobody's first choice.
  assert first["expert_language_entropy"][:3] == pytest.approx([0, 0, 0])
  assert first["expert_language_entropy"][3] is None
  # Pooled: p(e | l) = 1/2 on expert l and 1/2 on expert 3, so
  # I = H(1/6, 1/6, 1/6, 1/2) - log 2 = (log 3) / 2: normalised 1/2.
  pooled = stats["any_choice"]
  assert pooled["mutual_information"] == pytest.approx(math.log(3) / 2)
  assert pooled["normalized_mutual_information"] == pytest.approx(0.5)
  assert pooled["expert_language_entropy_normalized"] == pytest.approx(
      [0, 0, 0, 1])
  assert stats["fractions"]["fr"] == [[0, 1, 0, 0], [0, 0, 0, 1]]
  # All of a language's tokens on one of 4 experts: max/mean load 4.
  assert stats["load"]["ja"]["max_over_mean"] == pytest.approx(4.0)
  assert stats["load"]["ja"]["cv"] == pytest.approx(math.sqrt(3))


def test_uniform_routing_has_zero_mutual_information():
  counts = np.full((4, 2, 8), 5, np.int64)
  tokens = np.full(4, 40)
  stats = routing_analysis.layer_statistics(
      counts, tokens, languages=["a", "b", "c", "d"])
  for view in ("first_choice", "any_choice"):
    assert stats[view]["mutual_information"] == pytest.approx(0, abs=1e-12)
    assert stats[view]["normalized_mutual_information"] == pytest.approx(
        0, abs=1e-12)
    assert stats[view]["expert_language_entropy"] == pytest.approx(
        [math.log(4)] * 8)
  assert stats["load"]["c"]["cv"] == pytest.approx(0)
  assert stats["load"]["c"]["max_over_mean"] == pytest.approx(1)


def test_partial_specialisation_matches_the_formula():
  # p(e | l0) = (1, 0); p(e | l1) = (1/2, 1/2); uniform language prior.
  counts = np.array([[[6, 0]], [[3, 3]]])
  stats = routing_analysis.layer_statistics(counts, np.array([6, 6]),
                                            languages=["x", "y"])
  h = lambda *p: -sum(q * math.log(q) for q in p if q > 0)
  want = h(0.75, 0.25) - 0.5 * h(0.5, 0.5)
  assert stats["first_choice"]["mutual_information"] == pytest.approx(want)
  assert stats["first_choice"]["normalized_mutual_information"] == (
      pytest.approx(want / math.log(2)))
  # p(l | e0) = (2/3, 1/3); expert 1 only sees y.
  assert stats["first_choice"]["expert_language_entropy"] == pytest.approx(
      [h(2 / 3, 1 / 3), 0])


def test_language_without_tokens_is_skipped_and_listed():
  counts, tokens = _forced()
  counts[1] = 0
  tokens[1] = 0
  stats = routing_analysis.layer_statistics(counts, tokens,
                                            languages=["de", "fr", "ja"])
  assert stats["languages"] == ["de", "ja"]
  assert stats["skipped_languages"] == ["fr"]
  assert stats["tokens"]["fr"] == 0 and "fr" not in stats["fractions"]
  assert stats["first_choice"]["normalized_mutual_information"] == (
      pytest.approx(1.0))


def test_single_language_has_no_normalised_mi():
  stats = routing_analysis.layer_statistics(
      np.array([[[2, 1]]]), np.array([3]), languages=["de"])
  assert stats["first_choice"]["mutual_information"] == pytest.approx(0)
  assert stats["first_choice"]["normalized_mutual_information"] is None


def test_inconsistent_counts_are_rejected():
  counts, tokens = _forced()
  with pytest.raises(ValueError, match="count each of its tokens once"):
    routing_analysis.layer_statistics(counts, tokens + 1,
                                      languages=["de", "fr", "ja"])
  with pytest.raises(ValueError, match=r"must be \[L, K, E\]"):
    routing_analysis.layer_statistics(counts, tokens, languages=["de"])
