"""Language codes: normalise gettext locale names and know each one's script.

Catalogs name their language as a gettext locale (``pt_BR``, ``sr@latin``,
``zh_CN.UTF-8``, ``nb_NO`` ...). The corpus uses one code per language:

* the region is dropped (``pt_BR`` -> ``pt``, ``ar_SA`` -> ``ar``), except for
  Chinese, where it selects the script: ``zh_CN``/``zh_SG``/``zh`` ->
  ``zh_Hans``, ``zh_TW``/``zh_HK``/``zh_MO`` -> ``zh_Hant``;
* a script modifier becomes a script suffix: ``sr@latin``/``sr_Latn`` ->
  ``sr_Latn``, ``uz@cyrillic`` -> ``uz_Cyrl``, ``be@latin`` -> ``be_Latn``;
  other modifiers (``ca@valencia``, ``sr@ijekavian``) are dropped;
* three-letter codes with a two-letter equivalent are shortened (``deu``,
  ``ger`` -> ``de``; ``ast`` stays); deprecated codes are mapped (``no`` ->
  ``nb``, ``iw`` -> ``he``, ``in`` -> ``id``, ``ji`` -> ``yi``, ``mo`` ->
  ``ro``);
* English (``en*``) and pseudo-locales (``qps-ploc``, ``x-test``, ``*@quot``,
  ``C``) are excluded: :func:`normalize_language` returns ``None`` for them;
* anything that is not an ISO 639 code the corpus knows (:mod:`iso639`:
  ISO 639-1, ISO 639-2 and a few ISO 639-3 codes used by localisation
  teams) raises :class:`UnknownLanguageError`, so a directory or file named
  ``gui`` or ``xq`` never becomes a language; so does a script, region or
  variant subtag that is not a registered one (:mod:`subtags`), so
  ``fr_link`` is not French in a script "Link" (a catalog directory with
  such a name yields to the catalog's ``Language`` header, see
  :func:`m4moe.data.catalogs.catalog_locale`).
"""

from __future__ import annotations

import re
import unicodedata

from m4moe.data import iso639
from m4moe.data import subtags as subtags_lib

_DEPRECATED = {"no": "nb", "iw": "he", "in": "id", "ji": "yi", "jw": "jv",
               "mo": "ro"}
_SCRIPT_MODIFIERS = {
    "latin": "Latn", "latn": "Latn", "cyrillic": "Cyrl", "cyrl": "Cyrl",
    "ijekavianlatin": "Latn", "arab": "Arab", "arabic": "Arab",
    "hans": "Hans", "hant": "Hant",
}
_HANT_REGIONS = ("TW", "HK", "MO")
_PSEUDO_MODIFIERS = ("quot", "boldquot", "piglatin", "test")
_PSEUDO_LANGUAGES = ("c", "posix", "qps", "qaa", "x", "xx", "zz", "pseudo",
                     "test", "templates", "source")
_LOCALE = re.compile(
    r"^(?P<lang>[A-Za-z]+)(?:[-_](?P<sub1>[A-Za-z0-9]+))?"
    r"(?:[-_](?P<sub2>[A-Za-z0-9]+))?(?:\.[\w-]+)?(?:@(?P<mod>[\w-]+))?$")

# Unicode character-name prefixes (the first word of unicodedata.name) of the
# letters a language written in a non-Latin script is expected to use.
_SCRIPT_PREFIXES = {
    "Cyrl": ("CYRILLIC",),
    "Arab": ("ARABIC",),
    "Hebr": ("HEBREW",),
    "Grek": ("GREEK",),
    "Hans": ("CJK",),
    "Hant": ("CJK",),
    "Jpan": ("CJK", "HIRAGANA", "KATAKANA"),
    "Kore": ("HANGUL", "CJK"),
    "Deva": ("DEVANAGARI",),
    "Beng": ("BENGALI",),
    "Guru": ("GURMUKHI",),
    "Gujr": ("GUJARATI",),
    "Orya": ("ORIYA",),
    "Taml": ("TAMIL",),
    "Telu": ("TELUGU",),
    "Knda": ("KANNADA",),
    "Mlym": ("MALAYALAM",),
    "Sinh": ("SINHALA",),
    "Thai": ("THAI",),
    "Laoo": ("LAO",),
    "Khmr": ("KHMER",),
    "Mymr": ("MYANMAR",),
    "Tibt": ("TIBETAN",),
    "Geor": ("GEORGIAN",),
    "Armn": ("ARMENIAN",),
    "Ethi": ("ETHIOPIC",),
    "Thaa": ("THAANA",),
    "Olck": ("OL",),
    "Mtei": ("MEETEI",),
}
_LANGUAGE_SCRIPTS = {
    "ru": "Cyrl", "uk": "Cyrl", "be": "Cyrl", "bg": "Cyrl", "mk": "Cyrl",
    "sr": "Cyrl", "kk": "Cyrl", "ky": "Cyrl", "tg": "Cyrl", "tt": "Cyrl",
    "mn": "Cyrl", "ba": "Cyrl", "cv": "Cyrl", "os": "Cyrl", "uz_Cyrl": "Cyrl",
    "ar": "Arab", "fa": "Arab", "ur": "Arab", "ps": "Arab", "ug": "Arab",
    "ckb": "Arab", "sd": "Arab", "ks": "Arab",
    "he": "Hebr", "yi": "Hebr", "el": "Grek",
    "zh_Hans": "Hans", "zh_Hant": "Hant", "ja": "Jpan", "ko": "Kore",
    "hi": "Deva", "mr": "Deva", "ne": "Deva", "sa": "Deva", "mai": "Deva",
    "kok": "Deva", "doi": "Deva", "brx": "Deva", "bn": "Beng", "as": "Beng",
    "mni": "Beng", "pa": "Guru", "gu": "Gujr", "or": "Orya", "ta": "Taml",
    "te": "Telu", "kn": "Knda", "ml": "Mlym", "si": "Sinh", "th": "Thai",
    "lo": "Laoo", "km": "Khmr", "my": "Mymr", "bo": "Tibt", "dz": "Tibt",
    "ka": "Geor", "hy": "Armn", "am": "Ethi", "ti": "Ethi", "dv": "Thaa",
    "sat": "Olck",
}


class UnknownLanguageError(ValueError):
  """A locale name is not a recognisable language code."""


def _is_pseudo(lang: str, mod: str | None) -> bool:
  return lang in _PSEUDO_LANGUAGES or (mod or "").lower() in _PSEUDO_MODIFIERS


def _subtag_kind(locale: str, sub: str) -> str:
  """"script", "region" or "variant" for a valid subtag of ``locale``.

  Raises:
    UnknownLanguageError: ``sub`` is none of them (by its shape, then by
      the tables of :mod:`m4moe.data.subtags`).
  """
  if len(sub) == 4 and sub.isalpha():
    if subtags_lib.is_script(sub):
      return "script"
    problem = "is not an ISO 15924 script code"
  elif (len(sub) == 2 and sub.isalpha()) or (len(sub) == 3 and
                                             sub.isdigit()):
    if subtags_lib.is_region(sub):
      return "region"
    problem = "is not an ISO 3166 region (or UN M.49 area) code"
  elif 5 <= len(sub) <= 8 or (len(sub) == 4 and sub[0].isdigit()):
    if subtags_lib.is_variant(sub):
      return "variant"
    problem = "is not a registered BCP 47 variant"
  else:
    problem = ("is neither a script (4 letters), a region (2 letters or 3 "
               "digits) nor a variant (5-8 characters)")
  raise UnknownLanguageError(f"locale {locale!r}: subtag {sub!r} {problem}, "
                             "so this is not a locale name")


def normalize_language(locale: str) -> str | None:
  """Maps a gettext locale name to the corpus language code.

  Args:
    locale: e.g. ``"pt_BR"``, ``"sr@latin"``, ``"zh_TW.UTF-8"``, ``"de"``.

  Returns:
    The normalised code (``"pt"``, ``"sr_Latn"``, ``"zh_Hant"``, ``"de"``), or
    ``None`` for English and pseudo-locales, which the corpus excludes.

  Raises:
    UnknownLanguageError: ``locale`` is not a known ISO 639 language code
      (:mod:`iso639`) with an optional ISO 15924 script, ISO 3166 region
      and BCP 47 variant (:mod:`subtags`) and gettext modifier.
  """
  match = _LOCALE.match(locale.strip())
  if not match:
    raise UnknownLanguageError(f"unrecognised locale name {locale!r}")
  lang = match["lang"].lower()
  mod = match["mod"]
  if _is_pseudo(lang, mod):
    return None
  if not 2 <= len(lang) <= 3:
    raise UnknownLanguageError(
        f"locale {locale!r}: {lang!r} is not a 2-3 letter ISO 639 code")
  lang = _DEPRECATED.get(lang, lang)
  if not iso639.is_language_code(lang):
    raise UnknownLanguageError(
        f"locale {locale!r}: {lang!r} is not an ISO 639 language code (if it "
        "is a real language, add it to m4moe.data.iso639.LOCALISATION_EXTRAS)")
  lang = iso639.shortest_code(lang)
  lang = _DEPRECATED.get(lang, lang)  # "nor" -> "no" -> "nb"
  if lang == "en":
    return None
  subtags = [s for s in (match["sub1"], match["sub2"]) if s]
  script = _SCRIPT_MODIFIERS.get((mod or "").lower())
  region = None
  for sub in subtags:
    kind = _subtag_kind(locale, sub)
    if kind == "script":
      script = sub.title()
    elif kind == "region":
      region = sub.upper()
  if lang == "zh":
    if script not in ("Hans", "Hant"):
      script = "Hant" if region in _HANT_REGIONS else "Hans"
    return f"zh_{script}"
  if script is None or _LANGUAGE_SCRIPTS.get(lang, "Latn") == script:
    return lang
  return f"{lang}_{script}"


def expected_script(lang: str) -> str | None:
  """ISO 15924 script a non-Latin language is written in, else ``None``."""
  if lang in _LANGUAGE_SCRIPTS:
    return _LANGUAGE_SCRIPTS[lang]
  if "_" in lang:
    suffix = lang.split("_", 1)[1]
    return suffix if suffix in _SCRIPT_PREFIXES else None
  return None


def letter_in_script(ch: str, script: str | None) -> bool:
  """Whether the letter ``ch`` belongs to ``script`` (None: Latin, the
  script of every language :func:`expected_script` has no entry for)."""
  prefixes = ("LATIN",) if script is None else _SCRIPT_PREFIXES[script]
  return unicodedata.name(ch, "").startswith(prefixes)


def script_fraction(text: str, script: str) -> float:
  """Fraction of the letters of ``text`` that belong to ``script``.

  Args:
    text: any string; non-letters (digits, punctuation, spaces) are ignored.
    script: a key of the script table, e.g. ``"Cyrl"``.

  Returns:
    A float in [0, 1]; 1.0 when ``text`` has no letters at all.
  """
  prefixes = _SCRIPT_PREFIXES[script]
  letters = [ch for ch in text if ch.isalpha()]
  if not letters:
    return 1.0
  hits = sum(1 for ch in letters
             if unicodedata.name(ch, "").startswith(prefixes))
  return hits / len(letters)


def language_tag(lang: str) -> str:
  """The target-language tag piece, e.g. ``"<2de>"``, ``"<2zh_Hant>"``."""
  return f"<2{lang}>"
