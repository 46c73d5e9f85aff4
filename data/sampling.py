"""Temperature sampling over languages: ``p_l ∝ n_l^(1/T)``.

``T = 1`` samples in proportion to the data, ``T = 5`` is M4's setting,
``T -> inf`` (``math.inf``) is uniform over languages.
"""

from __future__ import annotations

import math
from typing import Mapping


def language_probabilities(sizes: Mapping[str, int], *,
                           temperature: float) -> dict[str, float]:
  """Sampling probability of each language.

  Args:
    sizes: language -> number of examples n_l (languages with 0 get 0).
    temperature: T >= 1 (any T > 0 is accepted; ``math.inf`` is uniform).

  Returns:
    language -> p_l, summing to 1, in the order of ``sizes``.

  Raises:
    ValueError: ``temperature <= 0`` or no language has examples.
  """
  if not temperature > 0:
    raise ValueError(f"temperature={temperature} must be > 0 (1: "
                     "proportional, 5: M4, inf: uniform)")
  if not any(n > 0 for n in sizes.values()):
    raise ValueError(f"no examples in any language: {dict(sizes)}")
  exponent = 0.0 if math.isinf(temperature) else 1.0 / temperature
  weights = {lang: (float(n) ** exponent if n > 0 else 0.0)
             for lang, n in sizes.items()}
  total = sum(weights.values())
  return {lang: w / total for lang, w in weights.items()}
