"""Per-language sacrebleu scoring: BLEU and chrF++ with recorded signatures.

The BLEU tokenizer follows the *target* language: ``13a`` for English and
other space-delimited languages, ``zh`` for Chinese, ``ja-mecab`` for
Japanese and ``ko-mecab`` for Korean (the last two need
``pip install 'sacrebleu[ja,ko]'``; without it scoring fails up front with
that instruction rather than silently using another tokenizer). chrF++ is
``sacrebleu.metrics.CHRF(word_order=2)`` and needs no tokenizer.

Language tags (``<2en>`` ...) are stripped from hypotheses and references
before scoring, so a tag never counts as a matching word. An empty test split
yields a :class:`LanguageScore` with ``status="empty"`` and no scores, which
the report lists explicitly.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

from sacrebleu.metrics import BLEU, CHRF

STATUS_OK = "ok"
STATUS_EMPTY = "empty"

CJK_EXTRA_HINT = "pip install 'sacrebleu[ja,ko]'"

# Target-language code (prefix before "_" or "-") -> sacrebleu tokenizer.
_TOKENIZERS = {
    "zh": "zh",
    "yue": "zh",
    "ja": "ja-mecab",
    "ko": "ko-mecab",
}
DEFAULT_TOKENIZER = "13a"

_TAG = re.compile(r"<2[A-Za-z0-9_-]+>")
_SPACES = re.compile(r"\s+")


class ScoringError(RuntimeError):
  """Scoring cannot run as requested; the message says how to fix it."""


def base_language(code: str) -> str:
  """``zh_Hant`` -> ``zh``, ``pt-BR`` -> ``pt``, ``en`` -> ``en``."""
  return re.split(r"[_-]", code, maxsplit=1)[0].lower()


def tokenizer_for(target_lang: str) -> str:
  """The sacrebleu BLEU tokenizer for a target language code."""
  return _TOKENIZERS.get(base_language(target_lang), DEFAULT_TOKENIZER)


def require_tokenizer(tokenize: str) -> None:
  """Fails fast if a sacrebleu tokenizer's optional dependencies are missing.

  Raises:
    ScoringError: naming the tokenizer and the pip command that fixes it.
  """
  try:
    BLEU(tokenize=tokenize).corpus_score(["x"], [["x"]])
  except (RuntimeError, ImportError) as e:
    raise ScoringError(
        f"sacrebleu tokenizer {tokenize!r} is not usable here ({e}). "
        f"Install the optional extras: {CJK_EXTRA_HINT}") from e


def strip_language_tags(text: str) -> str:
  """Removes ``<2xx>`` tags anywhere and normalises surrounding spaces."""
  return _SPACES.sub(" ", _TAG.sub(" ", text)).strip()


@dataclasses.dataclass(frozen=True, kw_only=True)
class LanguageScore:
  """Scores of one language pair on one test split.

  Attributes:
    language: the non-English language of the pair (the report's x axis).
    source_lang, target_lang: direction of translation.
    num_segments: test sentences scored.
    status: ``"ok"`` or ``"empty"`` (no test sentences: no scores).
    bleu, chrf: corpus BLEU and chrF++ (None when empty).
    bleu_signature, chrf_signature: sacrebleu signatures (None when empty).
    tokenizer: the BLEU tokenizer used.
    train_size: training pairs of this language (None if unknown).
  """

  language: str
  source_lang: str
  target_lang: str
  num_segments: int
  status: str = STATUS_OK
  bleu: float | None = None
  chrf: float | None = None
  bleu_signature: str | None = None
  chrf_signature: str | None = None
  tokenizer: str = DEFAULT_TOKENIZER
  train_size: int | None = None

  def __post_init__(self) -> None:
    if self.status not in (STATUS_OK, STATUS_EMPTY):
      raise ValueError(f"status={self.status!r}: use 'ok' or 'empty'")
    if self.status == STATUS_OK and (self.bleu is None or self.chrf is None):
      raise ValueError(f"{self.language}: status 'ok' needs bleu and chrf")

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, values: dict[str, Any]) -> "LanguageScore":
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in known})


def score_language(hypotheses: Sequence[str], references: Sequence[str], *,
                   source_lang: str, target_lang: str,
                   train_size: int | None = None) -> LanguageScore:
  """Corpus BLEU and chrF++ of one language pair.

  Args:
    hypotheses: detokenised system outputs, one per segment.
    references: one reference per segment, same order.
    source_lang, target_lang: language codes of the pair.
    train_size: training pairs of the language, recorded as is.

  Raises:
    ValueError: hypotheses and references differ in number.
    ScoringError: the target's tokenizer needs missing extras.
  """
  if len(hypotheses) != len(references):
    raise ValueError(f"{source_lang}-{target_lang}: {len(hypotheses)} "
                     f"hypotheses for {len(references)} references")
  language = target_lang if base_language(source_lang) == "en" else source_lang
  tokenize = tokenizer_for(target_lang)
  common = dict(language=language, source_lang=source_lang,
                target_lang=target_lang, num_segments=len(references),
                tokenizer=tokenize, train_size=train_size)
  if not references:
    return LanguageScore(status=STATUS_EMPTY, **common)
  require_tokenizer(tokenize)
  hyps = [strip_language_tags(h) for h in hypotheses]
  refs = [[strip_language_tags(r) for r in references]]
  bleu = BLEU(tokenize=tokenize)
  chrf = CHRF(word_order=2)
  bleu_score = bleu.corpus_score(hyps, refs).score
  chrf_score = chrf.corpus_score(hyps, refs).score
  return LanguageScore(
      bleu=float(bleu_score), chrf=float(chrf_score),
      bleu_signature=f"BLEU|{bleu.get_signature()}",
      chrf_signature=f"chrF2++|{chrf.get_signature()}", **common)
