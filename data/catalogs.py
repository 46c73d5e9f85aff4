"""Reading gettext catalogs (``.po`` and ``.mo``) into raw (English, X) pairs.

Catalogs are parsed with ``polib``. Each entry gives at most two pairs:

* a singular entry: ``(msgid, msgstr)``;
* a plural entry: the catalog's own ``Plural-Forms`` rule picks the forms:
  ``msgid`` pairs with ``msgstr[plural(1)]`` and ``msgid_plural`` with
  ``msgstr[plural(2)]`` (the form the language uses for one and for two of
  something; "2" is the first count English writes in the plural). The rule
  is evaluated with the standard library's C-expression compiler
  (``gettext.c2py``). A catalog without a rule gets the Germanic one
  (``n != 1``) and counts ``catalog:plural_header_missing``. A rule that does
  not parse, fails when evaluated (``n/0``) or picks a form outside
  ``0..nplurals-1`` for some n in 0..1000 skips that catalog's plural entries
  and is a ``catalog:plural_header_broken`` problem.

Entry-level rules counted here: ``entry:obsolete``, ``entry:fuzzy``,
``entry:empty_source`` (also the header entry is not a pair),
``entry:untranslated`` (empty translation), ``entry:plural_form_missing``.

Damaged catalogs give only the entries that can be trusted; each damage is a
:class:`Problem` naming the file (the build report lists them):

* ``catalog:po_unterminated_string``: a ``.po`` line whose string literal
  has no closing quote (polib would silently cut its last character). The
  entries owning such lines are dropped (``entry:po_syntax``); a broken
  header entry rejects the catalog (its charset and plural rule are
  unknown).
* ``catalog:mo_truncated``: a ``.mo`` whose string tables point past the end
  of the file (or at strings without their NUL terminator). Every ``.mo``'s
  tables are checked here; polib reads the intact ones, and a damaged one is
  read here, keeping the entries whose table slots and strings lie inside
  the file; the others count as ``entry:mo_out_of_bounds`` (and a
  kept one its charset cannot decode as ``entry:undecodable``). Without
  its header entry the catalog's plural entries are skipped
  (``entry:plural_skipped_no_header``). A ``.mo`` too short for its 28-byte
  header (empty) or with a wrong magic number is unreadable
  (:class:`CatalogError`).
* ``catalog:mojibake``: the catalog declares a legacy charset (say
  ISO-8859-1) but an entry's bytes are UTF-8 (``é`` read as ``Ã©``): valid
  UTF-8 that, read as UTF-8, has fewer controls, symbols and letters of a
  foreign script than read as declared. Such entries are dropped
  (``entry:mojibake``); ASCII entries and genuine legacy text (including
  short GB2312/EUC-JP/CP1251 strings that happen to be valid UTF-8) are
  kept.

The language of a catalog comes from, in order: the directory above
``LC_MESSAGES`` (``.../de/LC_MESSAGES/app.mo``) when its name is a valid
locale (every subtag checked, :func:`m4moe.data.languages.normalize_language`),
the catalog's ``Language`` header when it is a valid locale, the file stem
(``po/pt_BR.po``; not for catalogs under ``LC_MESSAGES``, whose stem is the
domain). A catalog whose directory is not a locale but whose header is is
listed as ``catalog:locale_from_header`` with its path; one with neither is
``catalog:unknown_language``, also with its path.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import gettext
import pathlib
import re
import struct
import unicodedata
from typing import Callable, Iterator

import polib

from m4moe.data import languages

CATALOG_SUFFIXES = (".po", ".mo")
_GERMANIC = "n != 1"
# The plural rule is checked on these counts (every n gettext programs
# commonly format, and rule boundaries such as n%100 up to 1000).
_PLURAL_CHECK_COUNTS = range(0, 1001)
_MO_MAGIC = 0x950412DE
_MO_HEADER = 28  # magic, revision, N, O, T, hash size, hash offset
_CHARSET = re.compile(r"charset\s*=\s*([\w.:-]+)", re.IGNORECASE)
# A .po keyword line or continuation line whose string literal is closed.
_PO_STRING_LINE = re.compile(
    r'^(?:(?P<kw>msgctxt|msgid_plural|msgid|msgstr(?:\[\d+\])?)\s+)?'
    r'(?P<lit>".*)$')
_PO_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"\s*')


class CatalogError(ValueError):
  """A catalog cannot be read; the message names the file (and line)."""


@dataclasses.dataclass(frozen=True)
class Problem:
  """A damaged part of a catalog or source tree, for the build report.

  Attributes:
    kind: counter name, e.g. ``"catalog:mo_truncated"``.
    where: file (or ``file:line``) concerned.
    reason: what is wrong and what was kept.
  """

  kind: str
  where: str
  reason: str


def _add_problem(problems: list[Problem], counts: collections.Counter,
                 kind: str, where: str, reason: str) -> None:
  counts[kind] += 1
  problems.append(Problem(kind, where, reason))


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
                 problems: list[Problem],
                 path: str) -> Callable[[int], int] | None:
  """Compiles and checks a ``Plural-Forms`` header; None when it is broken."""
  expr, nplurals = _GERMANIC, 2
  if header is None:
    counts["catalog:plural_header_missing"] += 1
  else:
    # Keys are the last word before "=": some catalogs repeat the header
    # name in the value ("Plural-Forms: nplurals=2; plural=n != 1;").
    parts = {key.replace(":", " ").split()[-1] if key.strip() else "": value
             for key, _, value in (p.partition("=") for p in header.split(";")
                                   if "=" in p)}
    expr = parts.get("plural", "").strip()
    try:
      nplurals = int(parts.get("nplurals", "").strip())
    except ValueError:
      nplurals = 0
  try:
    if nplurals < 1:
      raise ValueError(f"nplurals must be a positive integer in {header!r}")
    rule = gettext.c2py(expr)
    for n in _PLURAL_CHECK_COUNTS:
      form = rule(n)
      if not 0 <= form < nplurals:
        raise ValueError(f"plural({n}) = {form} is not a form in "
                         f"0..{nplurals - 1}")
  except Exception as e:  # pylint: disable=broad-except
    # c2py raises ValueError/SyntaxError/RecursionError; evaluating it
    # raises ZeroDivisionError (n/0, n%0) or anything the expression does.
    _add_problem(problems, counts, "catalog:plural_header_broken", path,
                 f"Plural-Forms {expr!r}: {type(e).__name__}: {e}; plural "
                 "entries skipped")
    return None
  return rule


def _looks_like_locale(name: str) -> bool:
  try:
    languages.normalize_language(name)
  except languages.UnknownLanguageError:
    return False
  return True


def catalog_locale(path: pathlib.Path, header_language: str | None, *,
                   notes: list[str] | None = None) -> str:
  """Best guess of a catalog's locale name (module docstring order).

  A directory above ``LC_MESSAGES`` whose name is not a locale (a symlink
  ``fr_link``) yields to the ``Language`` header, and ``notes`` gets a line
  saying so; such a catalog's file name (its gettext domain) is never
  taken for a locale.

  Raises:
    languages.UnknownLanguageError: naming the path and why each source of
      a locale failed.
  """
  parts = path.parts
  directory, why = None, ""
  if "LC_MESSAGES" in parts:
    idx = len(parts) - 1 - parts[::-1].index("LC_MESSAGES")
    if idx >= 1:
      directory = parts[idx - 1]
      try:
        languages.normalize_language(directory)
        return directory
      except languages.UnknownLanguageError as e:
        why = f" ({e})"
  if header_language and _looks_like_locale(header_language):
    if directory is not None and notes is not None:
      notes.append(f"directory {directory!r} is not a locale{why}; the "
                   f"catalog's Language header {header_language!r} decides")
    return header_language
  if directory is not None:
    raise languages.UnknownLanguageError(
        f"{path}: directory {directory!r} is not a locale{why} and the "
        f"catalog has no valid Language header ({header_language!r})")
  if _looks_like_locale(path.stem):
    return path.stem
  raise languages.UnknownLanguageError(
      f"{path}: no locale directory, locale file name or Language header")


def _mo_charset(header: bytes) -> str:
  match = _CHARSET.search(header.decode("ascii", errors="replace"))
  return match.group(1) if match else "utf-8"


def _mo_entry(msgid: bytes, msgstr: bytes, charset: str) -> polib.MOEntry:
  """One polib entry from the raw strings of a ``.mo`` table slot."""
  def text(raw: bytes) -> str:
    return raw.decode(charset)
  context = None
  if b"\x04" in msgid:
    raw_context, msgid = msgid.split(b"\x04", 1)
    context = text(raw_context)
  ids = msgid.split(b"\x00")
  if len(ids) > 1:
    return polib.MOEntry(
        msgctxt=context, msgid=text(ids[0]), msgid_plural=text(ids[1]),
        msgstr_plural={i: text(v) for i, v in enumerate(msgstr.split(b"\x00"))})
  return polib.MOEntry(msgctxt=context, msgid=text(msgid), msgstr=text(msgstr))


def _load_mo(path: pathlib.Path, counts: collections.Counter,
             problems: list[Problem]) -> polib.MOFile:
  """Validates a ``.mo``'s tables; polib reads it when they are intact.

  A table slot is trusted when the slot itself, and the string it points to
  plus that string's NUL terminator, lie inside the file.
  """
  data = path.read_bytes()
  order, n, o_off, t_off = _mo_layout(path, data)
  size = len(data)

  def string(table: int, i: int) -> bytes | None:
    slot = table + 8 * i
    if slot + 8 > size:
      return None
    length, offset = struct.unpack_from(f"{order}2I", data, slot)
    if offset + length >= size or data[offset + length] != 0:
      return None  # runs past the end, or its NUL terminator is missing
    return data[offset:offset + length]

  raw = [(string(o_off, i), string(t_off, i))
         for i in range(min(n, max(0, (size - min(o_off, t_off)) // 8)))]
  good = [(k, v) for k, v in raw if k is not None and v is not None]
  lost = n - len(good)
  if not lost:
    return polib.mofile(str(path))
  counts["entry:mo_out_of_bounds"] += lost
  header = next((v for k, v in good if k == b""), None)
  _add_problem(
      problems, counts, "catalog:mo_truncated", str(path),
      f"{lost} of {n} table entries point outside the {size}-byte file "
      f"(truncated or corrupt .mo); kept the {len(good)} inside it"
      + ("" if header is not None else
         "; header entry lost: plural entries skipped"))
  return _mo_from_entries(good, header=header, counts=counts)


def _mo_layout(path: pathlib.Path, data: bytes) -> tuple[str, int, int, int]:
  """(byte order, entry count, msgid table offset, msgstr table offset).

  A file too short for its header, with another magic number or a major
  revision this reader does not know has no table to salvage, so it is an
  error rather than a problem to count.

  Raises:
    CatalogError: the header is missing, foreign or of an unknown revision.
  """
  if len(data) < _MO_HEADER:
    raise CatalogError(
        f"{path}: {'empty' if not data else 'truncated'} .mo file "
        f"({len(data)} bytes; the header alone is {_MO_HEADER})")
  for order in ("<", ">"):
    if struct.unpack_from(f"{order}I", data)[0] == _MO_MAGIC:
      break
  else:
    raise CatalogError(f"{path}: not a .mo file (wrong magic number)")
  revision, n, o_off, t_off = struct.unpack_from(f"{order}4I", data, 4)
  if revision >> 16 not in (0, 1):
    raise CatalogError(f"{path}: unsupported .mo major revision "
                       f"{revision >> 16}")
  return order, n, o_off, t_off


def _mo_from_entries(good: list[tuple[bytes, bytes]], *,
                     header: bytes | None,
                     counts: collections.Counter) -> polib.MOFile:
  """A polib file built from the in-bounds entries of a damaged ``.mo``.

  polib cannot read a damaged file, so the entries that survived are
  decoded here; a plural entry is skipped without the header, which holds
  the charset and the plural rule it needs.
  """
  charset = _mo_charset(header or b"")
  mo = polib.MOFile(encoding=charset)
  if header is not None:
    for line in header.decode(charset).splitlines():
      key, _, value = line.partition(":")
      if key.strip():
        mo.metadata[key.strip()] = value.strip()
  for msgid, msgstr in good:
    if not msgid:
      continue
    try:
      entry = _mo_entry(msgid, msgstr, charset)
    except (UnicodeDecodeError, LookupError):
      counts["entry:undecodable"] += 1
      continue
    if entry.msgid_plural and header is None:
      counts["entry:plural_skipped_no_header"] += 1
      continue
    mo.append(entry)
  return mo


def _unterminated_lines(path: pathlib.Path) -> list[int]:
  """Numbers of the ``.po`` lines whose string literal is not closed."""
  bad = []
  # Quotes, backslashes and newlines are ASCII in every charset catalogs
  # use; str.splitlines would also split at latin-1 \x85 (a UTF-8 byte).
  text = path.read_bytes().decode("latin-1")
  for lineno, line in enumerate(text.split("\n"), start=1):
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
      continue  # comments, obsolete (#~) entries: never pairs
    match = _PO_STRING_LINE.match(stripped)
    if match is not None and not _PO_LITERAL.fullmatch(match["lit"]):
      bad.append(lineno)  # (lines matching nothing: polib rejects them)
  return bad


def _load_po(path: pathlib.Path, counts: collections.Counter,
             problems: list[Problem]) -> polib.POFile:
  """polib's parse, minus the entries owning an unterminated string.

  An entry owns the lines from its ``linenum`` (polib: its first comment or
  keyword line) to the next entry's; lines before the first entry are the
  header's.
  """
  if not path.is_file():  # polib would take the name for the contents
    raise CatalogError(f"{path}: not a regular file (polib reads .po files "
                       "by name); copy it to a file first")
  catalog = polib.pofile(str(path))
  bad = _unterminated_lines(path)
  if not bad:
    return catalog
  lines = ", ".join(str(lineno) for lineno in bad[:10])
  starts = sorted(e.linenum for e in catalog)
  if not starts or bad[0] < starts[0]:
    raise CatalogError(f"{path}: unterminated string in the header entry "
                       f"(line {lines}): charset and plural rule unknown")
  owners = {starts[bisect.bisect_right(starts, lineno) - 1] for lineno in bad}
  kept = polib.POFile(encoding=catalog.encoding)
  kept.metadata = catalog.metadata
  kept.extend(e for e in catalog if e.linenum not in owners)
  dropped = len(catalog) - len(kept)
  counts["entry:po_syntax"] += dropped
  _add_problem(problems, counts, "catalog:po_unterminated_string", str(path),
               f"unterminated string literal on line {lines}; dropped the "
               f"{dropped} entries owning those lines, kept {len(kept)}")
  return kept


def load_catalog(path: pathlib.Path, *, counts: collections.Counter,
                 problems: list[Problem]) -> polib._BaseFile:
  """Parses a ``.po`` or ``.mo`` file, keeping only trustworthy entries.

  Args:
    path: the catalog.
    counts: gets the ``entry:*``/``catalog:*`` counters of damaged parts.
    problems: gets a :class:`Problem` per damaged catalog (module docstring).

  Raises:
    CatalogError: the file is unreadable, not valid UTF-8/declared encoding,
      or not a catalog; the message names the file and, for ``.po``, the
      line polib reported.
  """
  try:
    if path.suffix == ".mo":
      return _load_mo(path, counts, problems)
    return _load_po(path, counts, problems)
  except (OSError, IOError, ValueError, UnicodeDecodeError, LookupError,
          IndexError, KeyError, struct.error) as e:
    if isinstance(e, CatalogError):
      raise
    raise CatalogError(f"{path}: cannot parse catalog: {e}") from e


def _oddities(text: str, script: str | None) -> int:
  """Characters of ``text`` unlikely in a translation into a language
  written in ``script`` (None: Latin): controls, symbols, letters of another
  script, and what UTF-8 bytes become in Latin-1: a lead byte U+00C2-U+00F4
  right before a continuation byte U+0080-U+00BF (``Ã©``, ``Â«``)."""
  odd = 0
  previous = ""
  for ch in text:
    if not ch.isascii():
      category = unicodedata.category(ch)
      if category[0] in "CS" or category == "No" or (
          category[0] == "L" and not languages.letter_in_script(ch, script)):
        odd += 1
      if "\u00c2" <= previous <= "\u00f4" and "\u0080" <= ch <= "\u00bf":
        odd += 1
    previous = ch
  return odd


def _is_mojibake(text: str, charset: str, script: str | None) -> bool:
  """Whether ``text``, decoded from ``charset``, was really UTF-8 bytes.

  The bytes must be valid UTF-8 (and not ASCII), and read as UTF-8 they
  must look more like the language than read as ``charset`` (fewer
  :func:`_oddities`): short GB2312, EUC-JP or CP1251 strings are sometimes
  valid UTF-8 too, but then they read as letters of a foreign script.
  """
  try:
    raw = text.encode(charset)
    if raw.isascii():
      return False
    as_utf8 = raw.decode("utf-8")
  except (UnicodeError, LookupError):
    return False
  return _oddities(as_utf8, script) < _oddities(text, script)


def _declared_charset(catalog: polib._BaseFile) -> str | None:
  """The catalog's non-UTF-8 charset, or None (UTF-8, or none declared)."""
  match = _CHARSET.search(catalog.metadata.get("Content-Type", ""))
  if match is None:
    return None
  charset = match.group(1).lower().replace("_", "-")
  return None if charset in ("utf-8", "utf8") else charset


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


def read_catalog(path: pathlib.Path, *, counts: collections.Counter,
                 problems: list[Problem] | None = None) -> Iterator[RawPair]:
  """Yields the raw pairs of one catalog, counting skipped entries.

  Args:
    path: a ``.po`` or ``.mo`` file.
    counts: updated with ``entry:*`` and ``catalog:*`` counters.
    problems: gets a :class:`Problem` naming the file for each damage found
      (broken plural rule, truncated ``.mo``, unterminated ``.po`` string,
      mojibake); each is counted in ``counts`` too.

  Raises:
    CatalogError: unreadable catalog (see :func:`load_catalog`).
    languages.UnknownLanguageError: the locale cannot be determined.
  """
  problems = [] if problems is None else problems
  catalog = load_catalog(path, counts=counts, problems=problems)
  notes: list[str] = []
  locale = catalog_locale(path, catalog.metadata.get("Language"), notes=notes)
  for note in notes:
    _add_problem(problems, counts, "catalog:locale_from_header", str(path),
                 note)
  lang = languages.normalize_language(locale)
  if lang is None:
    counts["catalog:english_or_pseudo_locale"] += 1
    return
  plural = None
  if any(e.msgid_plural for e in catalog):
    plural = _plural_rule(catalog.metadata.get("Plural-Forms"), counts,
                          problems, str(path))
  charset = _declared_charset(catalog)
  script = languages.expected_script(lang)
  mojibake = 0
  for entry in catalog:
    if getattr(entry, "obsolete", False):
      counts["entry:obsolete"] += 1
    elif "fuzzy" in getattr(entry, "flags", ()):
      counts["entry:fuzzy"] += 1
    elif not entry.msgid:
      counts["entry:empty_source"] += 1
    elif charset and any(_is_mojibake(text, charset, script) for text in (
        entry.msgid, entry.msgid_plural, entry.msgstr,
        *entry.msgstr_plural.values())):
      mojibake += 1
    else:
      for source, target in _entry_pairs(entry, plural, counts):
        yield RawPair(lang, source, target, str(path))
  if mojibake:
    counts["entry:mojibake"] += mojibake
    _add_problem(problems, counts, "catalog:mojibake", str(path),
                 f"declares charset {charset} but {mojibake} entries are "
                 "UTF-8 bytes (mojibake); dropped them")
