"""Reading gettext catalogs (``.po`` and ``.mo``) into raw (English, X) pairs.

Catalogs are parsed with ``polib``. Each entry gives at most two pairs:

* a singular entry: ``(msgid, msgstr)``;
* a plural entry: the catalog's own ``Plural-Forms`` rule picks the forms:
  ``msgid`` pairs with ``msgstr[plural(1)]`` and ``msgid_plural`` with
  ``msgstr[plural(2)]`` (the form the language uses for one and for two of
  something; "2" is the first count English writes in the plural). The rule
  is evaluated with the standard library's C-expression compiler
  (``gettext.c2py``). A catalog without a rule gets the Germanic one
  (``n != 1``) and counts ``catalog:plural_header_missing``; an unparsable
  rule skips that catalog's plural entries and counts
  ``catalog:plural_header_broken`` with the file name.

Entry-level rules counted here: ``entry:obsolete``, ``entry:fuzzy``,
``entry:empty_source`` (also the header entry is not a pair),
``entry:untranslated`` (empty translation), ``entry:plural_form_missing``.

The language of a catalog comes from, in order: the directory above
``LC_MESSAGES`` (``.../de/LC_MESSAGES/app.mo``), the catalog's ``Language``
header when it is a valid locale, the file stem (``po/pt_BR.po``).
"""

from __future__ import annotations

import collections
import dataclasses
import gettext
import pathlib
from typing import Callable, Iterator

import polib

from m4moe.data import languages

CATALOG_SUFFIXES = (".po", ".mo")
# Counter key prefix naming a catalog whose Plural-Forms rule is broken.
BROKEN_PLURAL_PREFIX = "broken_plural_header_file:"
_GERMANIC = "n != 1"


class CatalogError(ValueError):
  """A catalog cannot be read; the message names the file (and line)."""


@dataclasses.dataclass(frozen=True)
class RawPair:
  """One (English, translation) pair straight from a catalog.

  Attributes:
    lang: normalised target-language code.
    source: English msgid (or msgid_plural) as written in the catalog.
    target: the translation.
    origin: file the pair came from (for the report).
  """

  lang: str
  source: str
  target: str
  origin: str


def _plural_rule(header: str | None, counts: collections.Counter,
                 path: str) -> Callable[[int], int] | None:
  """Compiles a ``Plural-Forms`` header value; None when it is broken."""
  expr = _GERMANIC
  if header is None:
    counts["catalog:plural_header_missing"] += 1
  else:
    parts = dict(p.strip().split("=", 1) for p in header.split(";")
                 if "=" in p)
    expr = parts.get("plural", "").strip()
  try:
    return gettext.c2py(expr)
  except (ValueError, SyntaxError, RecursionError):
    counts["catalog:plural_header_broken"] += 1
    counts[f"{BROKEN_PLURAL_PREFIX}{path}"] += 1
    return None


def _looks_like_locale(name: str) -> bool:
  try:
    languages.normalize_language(name)
  except languages.UnknownLanguageError:
    return False
  return True


def catalog_locale(path: pathlib.Path, header_language: str | None) -> str:
  """Best guess of a catalog's locale name (module docstring order)."""
  parts = path.parts
  if "LC_MESSAGES" in parts:
    idx = len(parts) - 1 - parts[::-1].index("LC_MESSAGES")
    if idx >= 1:
      return parts[idx - 1]
  if header_language and _looks_like_locale(header_language):
    return header_language
  if _looks_like_locale(path.stem):
    return path.stem
  raise languages.UnknownLanguageError(
      f"{path}: no locale directory, locale file name or Language header")


def load_catalog(path: pathlib.Path) -> polib._BaseFile:
  """Parses a ``.po`` or ``.mo`` file with polib.

  Raises:
    CatalogError: the file is unreadable, not valid UTF-8/declared encoding,
      or not a catalog; the message names the file and, for ``.po``, the
      line polib reported.
  """
  try:
    if path.suffix == ".mo":
      return polib.mofile(str(path))
    return polib.pofile(str(path))
  except (OSError, IOError, ValueError, UnicodeDecodeError, LookupError,
          IndexError, KeyError) as e:
    raise CatalogError(f"{path}: cannot parse catalog: {e}") from e


def _entry_pairs(entry, plural: Callable[[int], int] | None,
                 counts: collections.Counter) -> Iterator[tuple[str, str]]:
  if not entry.msgid_plural:
    if not entry.msgstr:
      counts["entry:untranslated"] += 1
      return
    yield entry.msgid, entry.msgstr
    return
  if plural is None:
    counts["entry:plural_skipped_broken_header"] += 1
    return
  forms = {int(k): v for k, v in entry.msgstr_plural.items()}
  for english, n in ((entry.msgid, 1), (entry.msgid_plural, 2)):
    text = forms.get(plural(n), "")
    if text:
      yield english, text
    else:
      counts["entry:plural_form_missing"] += 1


def read_catalog(path: pathlib.Path, *,
                 counts: collections.Counter) -> Iterator[RawPair]:
  """Yields the raw pairs of one catalog, counting skipped entries.

  Args:
    path: a ``.po`` or ``.mo`` file.
    counts: updated with ``entry:*`` and ``catalog:*`` counters.

  Raises:
    CatalogError: unreadable catalog (see :func:`load_catalog`).
    languages.UnknownLanguageError: the locale cannot be determined.
  """
  catalog = load_catalog(path)
  locale = catalog_locale(path, catalog.metadata.get("Language"))
  lang = languages.normalize_language(locale)
  if lang is None:
    counts["catalog:english_or_pseudo_locale"] += 1
    return
  plural = None
  if any(e.msgid_plural for e in catalog):
    plural = _plural_rule(catalog.metadata.get("Plural-Forms"), counts,
                          str(path))
  for entry in catalog:
    if getattr(entry, "obsolete", False):
      counts["entry:obsolete"] += 1
    elif "fuzzy" in getattr(entry, "flags", ()):
      counts["entry:fuzzy"] += 1
    elif not entry.msgid:
      counts["entry:empty_source"] += 1
    else:
      for source, target in _entry_pairs(entry, plural, counts):
        yield RawPair(lang, source, target, str(path))
