"""Decode every test set with a translation function and score it."""

from __future__ import annotations

import time
from typing import Any, Mapping, Protocol, Sequence

from absl import logging

from m4moe.eval import results
from m4moe.eval import scoring
from m4moe.eval import testsets as testsets_lib


class TranslateFn(Protocol):
  """``(sources, *, source_lang, target_lang) -> hypotheses`` (same order)."""

  def __call__(self, sources: Sequence[str], *, source_lang: str,
               target_lang: str) -> Sequence[str]:
    ...


def evaluate(translate: TranslateFn,
             testsets: Sequence[testsets_lib.TestSet], *, model: str,
             kind: str = "multilingual",
             metadata: Mapping[str, Any] | None = None,
             train_sizes: Mapping[str, int] | None = None
             ) -> results.EvalResult:
  """Translates and scores each test set.

  Every target language's BLEU tokenizer is checked before any decoding, so
  a missing ``sacrebleu[ja,ko]`` fails in a second, not after an hour.
  Empty test sets are kept with ``status="empty"``.

  Raises:
    scoring.ScoringError: a tokenizer needs missing extras.
    ValueError: the translation function returned the wrong number of lines.
  """
  for tokenize in sorted({scoring.tokenizer_for(t.target_lang)
                          for t in testsets if t.sources}):
    scoring.require_tokenizer(tokenize)
  train_sizes = train_sizes or {}
  scores = {}
  for testset in testsets:
    start = time.time()
    hyps = (list(translate(list(testset.sources),
                           source_lang=testset.source_lang,
                           target_lang=testset.target_lang))
            if testset.sources else [])
    if len(hyps) != len(testset.sources):
      raise ValueError(f"{testset.language}: translate returned {len(hyps)} "
                       f"lines for {len(testset.sources)} sources")
    scores[testset.language] = scoring.score_language(
        hyps, list(testset.references), source_lang=testset.source_lang,
        target_lang=testset.target_lang,
        train_size=train_sizes.get(testset.language))
    logging.info("%s: %d segments, BLEU %s, %.1f s", testset.language,
                 len(hyps), scores[testset.language].bleu, time.time() - start)
  return results.EvalResult(model=model, kind=kind,
                            metadata=dict(metadata or {}), languages=scores)
