"""Which experts each language uses: statistics of per-language routing counts.

Pure numpy; the input of one MoE layer is ``counts <int64>[L, K, E]``, the
number of real (non-padding) tokens of language l whose k-th expert choice
is e (K = 2 for top-2: first and second choice), and ``tokens <int64>[L]``,
each language's real tokens. From them (:func:`layer_statistics`):

* ``fractions <float64>[L, K, E]``: p_k(e | l), the fraction of language
  l's tokens whose k-th choice is e (each row sums to 1);
* ``any``: p(e | l) over all K choices pooled, ``sum_k counts / (K tokens)``;
* mutual information I(language; expert) of the first choice and of the
  pooled choices, with **every language weighted equally** (p(l) = 1/L, so
  the dev-set sizes do not decide the answer): ``I = H(E) - H(E | L)``,
  normalised by the language entropy ``H(L) = log L``. The normalised MI is
  1 when every expert serves one language only (the language can be read
  off the expert) and 0 when every language routes alike;
* each expert's language entropy ``H(L | e)`` (nats, and normalised by
  ``log L``: 0 = one language only, 1 = all languages equally), None for an
  expert no token chose;
* load per language: the first-choice fractions, their coefficient of
  variation over experts and ``max_e p_1(e | l) * E`` (1 = balanced).

Languages without tokens are left out of every average and listed in
``skipped_languages``. Logarithms are natural (nats).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np


def _entropy(p: np.ndarray, axis: int = -1) -> np.ndarray:
  """Entropy (nats) of distributions along ``axis``; 0 log 0 = 0."""
  safe = np.where(p > 0, p, 1.0)
  return -np.sum(np.where(p > 0, p * np.log(safe), 0.0), axis=axis)


def mutual_information(p_expert_given_lang: np.ndarray) -> float:
  """I(L; E) in nats with a uniform prior over languages.

  Args:
    p_expert_given_lang: <float64>[L, E], each row a distribution.

  Returns:
    ``H(E) - mean_l H(E | l)``, in [0, log L].
  """
  p = np.asarray(p_expert_given_lang, np.float64)
  marginal = p.mean(axis=0)
  return float(max(0.0, _entropy(marginal) - _entropy(p).mean()))


def expert_language_entropy(p_expert_given_lang: np.ndarray) -> np.ndarray:
  """<float64>[E] H(L | e) in nats (uniform language prior); NaN if unused."""
  p = np.asarray(p_expert_given_lang, np.float64)
  total = p.sum(axis=0)  # [E]
  posterior = np.divide(p, total, out=np.zeros_like(p), where=total > 0)
  return np.where(total > 0, _entropy(posterior, axis=0), np.nan)


def _clean(value: Any) -> Any:
  """NaN -> None, numpy -> Python, for JSON."""
  if isinstance(value, np.ndarray):
    return [_clean(v) for v in value.tolist()]
  if isinstance(value, dict):
    return {k: _clean(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_clean(v) for v in value]
  if isinstance(value, (float, np.floating)):
    return None if math.isnan(value) else float(value)
  if isinstance(value, np.integer):
    return int(value)
  return value


def layer_statistics(counts: np.ndarray, tokens: np.ndarray, *,
                     languages: Sequence[str]) -> dict[str, Any]:
  """Every number of one MoE layer (see the module docstring), as JSON.

  Args:
    counts: <int64>[L, K, E] tokens of language l whose k-th choice is e.
    tokens: <int64>[L] real tokens of language l.
    languages: the L language codes, in row order.

  Returns:
    A JSON-ready dict; per-language values are keyed by language.

  Raises:
    ValueError: shapes disagree, or a language's choices do not add up to
      its tokens.
  """
  counts = np.asarray(counts, np.int64)
  tokens = np.asarray(tokens, np.int64)
  if counts.ndim != 3 or tokens.shape != counts.shape[:1] or (
      len(languages) != counts.shape[0]):
    raise ValueError(f"counts {counts.shape} must be [L, K, E] with tokens "
                     f"[L] {tokens.shape} and {len(languages)} languages")
  per_choice = counts.sum(axis=2)  # [L, K]
  if not np.all(per_choice == tokens[:, None]):
    raise ValueError("every k-th choice of a language must count each of "
                     f"its tokens once: choices {per_choice.tolist()} vs "
                     f"tokens {tokens.tolist()}")
  num_experts = counts.shape[2]
  present = tokens > 0
  kept = [lang for lang, ok in zip(languages, present) if ok]
  fractions = counts[present] / tokens[present, None, None]  # [L', K, E]
  pooled = fractions.mean(axis=1)  # [L', E]
  log_langs = math.log(len(kept)) if len(kept) > 1 else float("nan")

  def specialisation(p: np.ndarray) -> dict[str, Any]:
    mi = mutual_information(p) if kept else float("nan")
    entropy = (expert_language_entropy(p) if kept
               else np.full(num_experts, np.nan))
    return {"mutual_information": mi,
            "normalized_mutual_information": mi / log_langs,
            "expert_language_entropy": entropy,
            "expert_language_entropy_normalized": entropy / log_langs}

  first = fractions[:, 0]  # [L', E]
  load_cv = first.std(axis=1) / first.mean(axis=1) if kept else first[:, 0]
  return _clean({
      "num_experts": num_experts,
      "num_choices": counts.shape[1],
      "languages": kept,
      "skipped_languages": [l for l, ok in zip(languages, present) if not ok],
      "tokens": {l: int(t) for l, t in zip(languages, tokens)},
      "fractions": {l: fractions[i] for i, l in enumerate(kept)},
      "first_choice": specialisation(first),
      "any_choice": specialisation(pooled),
      "load": {l: {"fractions": first[i], "cv": load_cv[i],
                   "max_over_mean": first[i].max() * num_experts}
               for i, l in enumerate(kept)},
  })
