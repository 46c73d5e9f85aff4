"""Cleaning rules for (English source, translation) pairs from UI catalogs.

:func:`clean_pair` applies the rules below in order and returns either the
cleaned pair or the name of the rule that dropped it; the corpus builder
counts every name in its build report, so nothing is dropped silently.
Catalog-level rules (fuzzy, obsolete, empty, untranslated) live in
``catalogs.py``; deduplication in ``corpus.py``.

Order (``DROP_RULES`` / ``EDIT_RULES`` name the counters):

1. NFC and whitespace: both sides are NFC-normalised, every run of white
   space (including tabs and newlines) becomes one space, ends are stripped.
   Counted as ``edit:whitespace_nfc`` when that changed anything.
2. Accelerators: ``_File``, ``&Open``, ``~Save`` lose the marker; a trailing
   CJK-style ``(_F)`` / ``(&F)`` is removed; ``&&`` becomes ``&``. Counted as
   ``edit:accelerator``.
3. ``empty_after_cleaning``: a side is empty after 1-2 (a white-space-only
   or accelerator-only translation).
4. ``markup``: pairs with XML/HTML tags or character entities are dropped.
5. ``placeholder_mismatch``: printf (``%s``, ``%1$s``, ``%.2f``), Python
   (``%(name)s``, ``{x}``, ``{0}``), Qt/KDE (``%1``) and shell/make
   (``$(ARG)``, ``${ARG}``) placeholders must form the same multiset on both
   sides (order may differ: translations reorder positional arguments).
   The printf space flag is not recognised, so "50% off" has no placeholder.
6. ``identical``: target equals source (case-insensitively): untranslated.
7. ``too_short`` / ``too_long``: English under ``min_words`` or over
   ``max_words`` white-space words.
8. ``source_not_english``: the English side has letters outside Latin.
9. ``wrong_script``: for a language with a non-Latin script, under
   ``min_script_fraction`` of the target's letters are in that script.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import unicodedata

from m4moe.data import languages

DROP_RULES = ("duplicate", "empty_after_cleaning", "markup", "placeholder_mismatch", "identical",
              "too_short", "too_long", "source_not_english", "wrong_script")
EDIT_RULES = ("edit:whitespace_nfc", "edit:accelerator")

_WHITESPACE = re.compile(r"\s+")
_PLACEHOLDER = re.compile(
    r"%(?:\d+\$)?[-+#0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|z|j|t|q)?"
    r"[diouxXeEfFgGcsSpaA@]"          # printf, incl. positional %1$s
    r"|%\([A-Za-z_][\w.]*\)[-+#0]*\d*(?:\.\d+)?[diouxXeEfFgGrsa]"  # %(n)s
    r"|\{[A-Za-z_0-9][\w.\[\]]*(?:![rsa])?(?::[^{}]*)?\}"  # {x}, {0}, {x:>3}
    r"|%\d+"                          # Qt / KDE %1
    r"|\$\([A-Za-z_][\w]*\)|\$\{[A-Za-z_][\w]*\}")  # $(ARG), ${ARG}
_MARKUP = re.compile(r"<\s*/?\s*[A-Za-z][\w:-]*(?:\s[^<>]*)?/?\s*>"
                     r"|&(?:[A-Za-z]+|#\d+|#x[0-9A-Fa-f]+);")
_CJK_ACCELERATOR_MARKED = re.compile(r"\s*[(（]\s*[_&~][A-Za-z0-9]\s*[)）]")
_CJK_ACCELERATOR_BARE = re.compile(r"(?<=[^\x00-\x7f])\s*[(（][A-Za-z0-9][)）]")
_WORD_ACCELERATOR = re.compile(r"(?<![\w&_~])_(?=\w)|[&~](?=\w)")
_NON_LATIN_LETTER = re.compile(r"[^\W\d_]")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CleaningConfig:
  """Thresholds of the cleaning rules.

  Attributes:
    min_words: English sources with fewer white-space words are dropped.
    max_words: English sources with more words are dropped.
    min_script_fraction: for non-Latin languages, the minimum fraction of the
      target's letters in the expected script.
  """

  min_words: int = 3
  max_words: int = 100
  min_script_fraction: float = 0.5

  def __post_init__(self):
    if not 1 <= self.min_words <= self.max_words:
      raise ValueError(
          f"--min_words={self.min_words}, --max_words={self.max_words}: need "
          "1 <= min_words <= max_words")
    if not 0.0 <= self.min_script_fraction <= 1.0:
      raise ValueError(f"--min_script_fraction={self.min_script_fraction} "
                       "must be in [0, 1]")


def normalize_text(text: str) -> str:
  """NFC, every white-space run to one space, stripped."""
  return _WHITESPACE.sub(" ", unicodedata.normalize("NFC", text)).strip()


def strip_accelerators(text: str) -> str:
  """Removes keyboard-accelerator markers (``_F``, ``&F``, ``Op~en``, ``(_F)``).

  ``_`` counts only at the start of a word (``file_name`` is left alone);
  ``&`` and ``~`` anywhere before a letter (KDE/LibreOffice put them
  mid-word). Text with markup or entities is left for the markup rule.
  """
  text = _CJK_ACCELERATOR_MARKED.sub("", text)
  text = _CJK_ACCELERATOR_BARE.sub("", text)
  if _MARKUP.search(text):
    return text
  text = text.replace("&&", "\x00")
  return _WORD_ACCELERATOR.sub("", text).replace("\x00", "&")


def placeholders(text: str) -> list[str]:
  """Sorted placeholders of ``text`` (``%%`` is a literal, not one)."""
  return sorted(_PLACEHOLDER.findall(text.replace("%%", "")))


def remove_placeholders(text: str) -> str:
  """``text`` with every placeholder (and ``%%``) replaced by a space."""
  return _PLACEHOLDER.sub(" ", text.replace("%%", " "))


def _script_ok(lang: str, target: str, config: CleaningConfig) -> bool:
  script = languages.expected_script(lang)
  if script is None:
    return True
  text = remove_placeholders(target)
  return languages.script_fraction(text, script) >= config.min_script_fraction


def _source_is_latin(source: str) -> bool:
  for ch in _NON_LATIN_LETTER.findall(source):
    if ord(ch) > 0x24F and not unicodedata.name(ch, "").startswith("LATIN"):
      return False
  return True


@dataclasses.dataclass(frozen=True)
class Cleaned:
  """Result of :func:`clean_pair`: the pair, or the rule that dropped it.

  Attributes:
    source: cleaned English text ("" when dropped).
    target: cleaned translation ("" when dropped).
    dropped_by: name of the drop rule (one of ``DROP_RULES``) or ``None``.
    edits: names of the edit rules that changed the pair.
  """

  source: str
  target: str
  dropped_by: str | None
  edits: tuple[str, ...] = ()


def _drop_reason(lang: str, source: str, target: str,
                 config: CleaningConfig) -> str | None:
  if not source or not target:
    return "empty_after_cleaning"
  if _MARKUP.search(source) or _MARKUP.search(target):
    return "markup"
  if placeholders(source) != placeholders(target):
    return "placeholder_mismatch"
  if source.casefold() == target.casefold():
    return "identical"
  words = len(source.split(" "))
  if words < config.min_words:
    return "too_short"
  if words > config.max_words:
    return "too_long"
  if not _source_is_latin(source):
    return "source_not_english"
  if not _script_ok(lang, target, config):
    return "wrong_script"
  return None


def clean_pair(lang: str, source: str, target: str, *,
               config: CleaningConfig) -> Cleaned:
  """Applies the cleaning rules (module docstring) to one pair.

  Args:
    lang: normalised language code of the target (see ``languages.py``).
    source: English text as it appears in the catalog.
    target: translation as it appears in the catalog.
    config: thresholds.

  Returns:
    A :class:`Cleaned` result.
  """
  edits = []
  norm_source, norm_target = normalize_text(source), normalize_text(target)
  if (norm_source, norm_target) != (source, target):
    edits.append("edit:whitespace_nfc")
  acc_source = normalize_text(strip_accelerators(norm_source))
  acc_target = normalize_text(strip_accelerators(norm_target))
  if (acc_source, acc_target) != (norm_source, norm_target):
    edits.append("edit:accelerator")
  reason = _drop_reason(lang, acc_source, acc_target, config)
  if reason is not None:
    return Cleaned("", "", reason, tuple(edits))
  return Cleaned(acc_source, acc_target, None, tuple(edits))


def new_counter() -> collections.Counter:
  """A counter with every rule name present (so reports list zeros too)."""
  return collections.Counter({name: 0 for name in DROP_RULES + EDIT_RULES})
