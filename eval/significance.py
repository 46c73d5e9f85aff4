"""95% intervals and paired significance from sacrebleu's bootstrap resampling.

Thin wrappers over ``sacrebleu.significance`` (2.x); nothing here resamples
or tests by itself:

* :func:`resample` -- a system's corpus score on its test set and on
  ``n_samples`` bootstrap resamples of the test sentences, drawn by
  sacrebleu's ``_bootstrap_resample`` (what ``corpus_score(n_bootstrap=N)``
  and ``sacrebleu --confidence`` use). Its RNG is seeded from the
  ``SACREBLEU_SEED`` environment variable; :func:`resample` sets it to
  ``seed`` for the call, so every system resampled with the same seed and
  the same number of sentences is resampled with the *same* indices: their
  resampled scores are paired.
* :func:`interval` -- sacrebleu's ``estimate_ci``: the bootstrap mean μ and
  the half-width of the 2.5-97.5 percentile range; the interval is μ ± ci
  (as sacrebleu prints ``μ = 24.1 ± 1.2``).
* :func:`paired_difference` -- system minus reference on the same
  resamples: the difference's interval (``estimate_ci`` of the paired
  resampled differences) and the p-value of sacrebleu's paired bootstrap
  test (the statistic of ``significance._paired_bs_test``, counted by
  ``significance._compute_p_value``); for single systems it equals
  ``sacrebleu.significance.PairedTest(test_type="bs")`` exactly (a test
  checks it), except that equal scores get p = 1 (sacrebleu reports
  p = 1/(n+1), "significant", for two identical outputs).
* :func:`mean_resamples` -- the mean of several paired resamplings, index
  by index: several seeds of one model on one language (same indices), or
  several languages of a resource bucket (each resampled independently).

Scores are in sacrebleu's units (BLEU and chrF++ in 0-100).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import zlib
from typing import Iterator, Sequence

import numpy as np
from sacrebleu import significance as sb_significance
from sacrebleu.metrics import BLEU, CHRF

from m4moe.eval import scoring

METRICS = ("bleu", "chrf")
DEFAULT_SAMPLES = 1000
DEFAULT_SEED = 12345  # sacrebleu's default SACREBLEU_SEED
ALPHA = 0.05
_SEED_ENV = "SACREBLEU_SEED"


def make_metric(metric: str, *, target_lang: str) -> BLEU | CHRF:
  """The sacrebleu metric m4moe-eval scores with (see :mod:`scoring`)."""
  if metric == "bleu":
    return BLEU(tokenize=scoring.tokenizer_for(target_lang))
  if metric == "chrf":
    return CHRF(word_order=2)
  raise ValueError(f"metric={metric!r}: use one of {', '.join(METRICS)}")


def language_seed(base_seed: int, language: str) -> int:
  """A per-language resampling seed: ``base_seed + crc32(language) % 2**16``.

  Languages with equally many test sentences would otherwise be resampled
  with identical indices; every system of one language shares the seed, so
  its systems stay paired.
  """
  return base_seed + zlib.crc32(language.encode("utf-8")) % (1 << 16)


@contextlib.contextmanager
def sacrebleu_seed(seed: int) -> Iterator[None]:
  """Sets ``SACREBLEU_SEED`` (read by sacrebleu's resampling) for a block."""
  old = os.environ.get(_SEED_ENV)
  os.environ[_SEED_ENV] = str(int(seed))
  try:
    yield
  finally:
    if old is None:
      del os.environ[_SEED_ENV]
    else:
      os.environ[_SEED_ENV] = old


@dataclasses.dataclass(frozen=True)
class Resamples:
  """A corpus score and its bootstrap resampled scores.

  Attributes:
    score: the score on the test set as given.
    samples: ``[n_samples]`` scores on the resampled test sets (sample i of
      two paired resamplings used the same sentence indices).
  """

  score: float
  samples: np.ndarray


def resample(hypotheses: Sequence[str], references: Sequence[str], *,
             metric: str, target_lang: str, n_samples: int = DEFAULT_SAMPLES,
             seed: int = DEFAULT_SEED) -> Resamples:
  """Scores ``hypotheses`` and ``n_samples`` bootstrap resamples of them.

  Language tags are stripped as in :func:`scoring.score_language`.

  Raises:
    ValueError: hypotheses and references differ in number, no sentences,
      or ``n_samples`` < 2.
  """
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} "
                     "references")
  if not references:
    raise ValueError("no test sentences to resample")
  if n_samples < 2:
    raise ValueError(f"n_samples={n_samples}: need at least 2 resamples")
  scorer = make_metric(metric, target_lang=target_lang)
  hyps = [scoring.strip_language_tags(h) for h in hypotheses]
  refs = [[scoring.strip_language_tags(r) for r in references]]
  # pylint: disable=protected-access
  stats = scorer._extract_corpus_statistics(hyps, refs)
  score = scorer._aggregate_and_compute(stats).score
  with sacrebleu_seed(seed):
    _, scores = sb_significance._bootstrap_resample(stats, scorer, n_samples)
  # pylint: enable=protected-access
  return Resamples(score=float(score),
                   samples=np.array([s.score for s in scores], np.float64))


@dataclasses.dataclass(frozen=True)
class Interval:
  """A point estimate with sacrebleu's 95% bootstrap interval μ ± ci.

  Attributes:
    score: the point estimate (score on the full test set, or a mean).
    mean: μ, the mean over the bootstrap resamples.
    ci: half-width of the resamples' 2.5-97.5 percentile range.
  """

  score: float
  mean: float
  ci: float

  @property
  def low(self) -> float:
    return self.mean - self.ci

  @property
  def high(self) -> float:
    return self.mean + self.ci

  def to_dict(self) -> dict[str, float]:
    return {"score": self.score, "mean": self.mean, "ci": self.ci,
            "low": self.low, "high": self.high}


def interval(resamples: Resamples) -> Interval:
  """sacrebleu's ``estimate_ci`` of the resampled scores."""
  mean, ci = sb_significance.estimate_ci(np.asarray(resamples.samples))
  return Interval(score=resamples.score, mean=float(mean), ci=float(ci))


@dataclasses.dataclass(frozen=True)
class Difference:
  """System minus reference, paired over the same resamples.

  Attributes:
    interval: the difference (score) and its 95% interval.
    p_value: sacrebleu's paired bootstrap p-value (two-sided; null: no
      difference).
    significant: ``p_value < alpha``.
  """

  interval: Interval
  p_value: float
  significant: bool

  def to_dict(self) -> dict[str, object]:
    return {**self.interval.to_dict(), "p_value": self.p_value,
            "significant": self.significant}


def paired_difference(system: Resamples, reference: Resamples, *,
                      alpha: float = ALPHA) -> Difference:
  """Paired bootstrap test of ``system`` against ``reference``.

  Both must come from the same test sentences resampled with the same seed
  (or be :func:`mean_resamples` of such).

  Raises:
    ValueError: different numbers of resamples.
  """
  sys_samples = np.asarray(system.samples)
  ref_samples = np.asarray(reference.samples)
  if sys_samples.shape != ref_samples.shape:
    raise ValueError(f"unpaired resamples: {sys_samples.shape} vs "
                     f"{ref_samples.shape}")
  delta = system.score - reference.score
  # The statistic of sacrebleu's _paired_bs_test.
  sample_diffs = np.abs(sys_samples - ref_samples)
  # pylint: disable=protected-access
  p_value = float(sb_significance._compute_p_value(
      sample_diffs - sample_diffs.mean(), abs(delta)))
  # pylint: enable=protected-access
  if delta == 0.0:
    # Equal scores are no evidence of a difference. sacrebleu's count (a
    # strict >) gives identical systems p = 1/(n+1) instead.
    p_value = 1.0
  diff = interval(Resamples(score=delta, samples=sys_samples - ref_samples))
  return Difference(interval=diff, p_value=p_value,
                    significant=p_value < alpha)


def mean_resamples(items: Sequence[Resamples]) -> Resamples:
  """Index-wise mean of several resamplings (and the mean of their scores).

  Raises:
    ValueError: no items, or different numbers of resamples.
  """
  if not items:
    raise ValueError("nothing to average")
  shapes = {np.asarray(i.samples).shape for i in items}
  if len(shapes) != 1:
    raise ValueError(f"resamplings of different sizes: {sorted(shapes)}")
  return Resamples(
      score=float(np.mean([i.score for i in items])),
      samples=np.mean([np.asarray(i.samples) for i in items], axis=0))
