"""Tiny synthetic catalogs and corpora (no network, no real data).

They stand in for the real corpus wherever its size or download would be
in the way: the ``smoke`` recipe of ``m4moe-run`` builds its corpus from
the catalog tree written here, ``m4moe-bench input_pipeline`` measures a
corpus written here, and the tests use both.

Translations are English sentences transliterated letter by letter into the
language's script (Cyrillic for ``ru``, Katakana for ``ja``, CJK ideographs
for ``zh``; Latin languages get a reversed word order and a marker), so every
cleaning rule sees plausible input: the script check passes, sources and
targets differ, placeholders survive untouched.

:func:`make_catalog` builds a catalog (with ``special``, one entry of every
kind the cleaning rules drop or edit, counted in :data:`SPECIAL_COUNTS`)
and :func:`write_catalog` saves it as ``.po`` or ``.mo``;
:func:`write_corpus` writes a small built-corpus directory (the layout of
``corpus.py``).
"""

from __future__ import annotations

import pathlib
import random
import re

import polib

WORDS = ("open save close file folder window document image print copy paste "
         "delete rename select show hide the a new current all selected to "
         "from with settings color page text font size list view edit help "
         "recent search replace next previous item").split()
_PLACEHOLDER_TOKEN = re.compile(r"(%\w|\{\w+\})")
_SCRIPT_BASES = {"ru": 0x0430, "uk": 0x0430, "ja": 0x30A2, "zh_CN": 0x4E00,
                 "zh_TW": 0x5000, "el": 0x03B1}


def english_sentences(n: int, *, seed: int = 0, min_words: int = 3,
                      max_words: int = 9) -> list[str]:
  """``n`` distinct pseudo-English UI strings (first letter capitalised)."""
  rng = random.Random(seed)
  out, seen = [], set()
  while len(out) < n:
    words = rng.choices(WORDS, k=rng.randint(min_words, max_words))
    sentence = " ".join(words).capitalize()
    key = " ".join(words)
    if key not in seen:
      seen.add(key)
      out.append(sentence)
  return out


def translate(english: str, locale: str) -> str:
  """Deterministic fake translation of ``english`` into ``locale``."""
  base = _SCRIPT_BASES.get(locale)
  parts = _PLACEHOLDER_TOKEN.split(english)
  out = []
  for part in parts:
    if _PLACEHOLDER_TOKEN.fullmatch(part) or base is None:
      out.append(part)
    else:
      out.append("".join(chr(base + (ord(c.lower()) - 97) * 3)
                         if c.isascii() and c.isalpha() else c
                         for c in part))
  text = "".join(out)
  if base is None:
    text = " ".join(reversed(text.split(" "))) + f" ({locale})"
  return text


def _entry(msgid: str, msgstr: str, **kwargs) -> polib.POEntry:
  return polib.POEntry(msgid=msgid, msgstr=msgstr, **kwargs)


def make_catalog(locale: str, sentences: list[str], *,
                 plural_forms: str = "nplurals=2; plural=(n != 1);",
                 special: bool = True) -> polib.POFile:
  """A catalog translating ``sentences``, plus (``special``) one entry of
  each kind a cleaning rule drops or edits (see :data:`SPECIAL_COUNTS`)."""
  po = polib.POFile()
  po.metadata = {"Language": locale, "Content-Type":
                 "text/plain; charset=UTF-8", "Plural-Forms": plural_forms}
  for sentence in sentences:
    po.append(_entry(sentence, translate(sentence, locale)))
  if not special:
    return po
  def tr(text: str) -> str:
    return translate(text, locale)
  po.append(_entry("Fuzzy entry is skipped here", tr("Fuzzy entry"),
                   flags=["fuzzy"]))
  po.append(_entry("Obsolete entry is skipped", tr("Obsolete"),
                   obsolete=True))
  po.append(_entry("Untranslated entry stays empty", ""))
  po.append(_entry("Remove %s from the list", tr("Remove from the list")))
  po.append(_entry("Open the <b>bold</b> file",
                   tr("Open the <b>bold</b> file")))
  po.append(_entry("_Print the current page", tr("_Print the current page")))
  po.append(_entry("Identical source and target",
                   "Identical source and target"))
  po.append(_entry("Too short", tr("Too short")))
  po.append(_entry(" ".join(["word"] * 101), tr(" ".join(["word"] * 101))))
  po.append(polib.POEntry(msgid="Delete %d selected file",
                          msgid_plural="Delete %d selected files",
                          msgstr_plural={0: tr("Delete %d selected file"),
                                         1: tr("Delete %d selected files")}))
  return po


# Counter -> how many times one special catalog of a Latin-script language
# triggers it (the plural entry yields 2 pairs; "Too short" is 2 words).
SPECIAL_COUNTS = {
    "entry:fuzzy": 1, "entry:obsolete": 1, "entry:untranslated": 1,
    "placeholder_mismatch": 1, "markup": 1, "edit:accelerator": 1,
    "identical": 1, "too_short": 1, "too_long": 1,
}
SPECIAL_KEPT = 3  # accelerator entry + 2 plural pairs


def write_catalog(po: polib.POFile, path: pathlib.Path) -> pathlib.Path:
  """Saves ``po`` as ``.po`` or ``.mo`` according to ``path``'s suffix."""
  path.parent.mkdir(parents=True, exist_ok=True)
  if path.suffix == ".mo":
    po.save_as_mofile(str(path))
  else:
    po.save(str(path))
  return path


def write_corpus(root: pathlib.Path, *, sizes: dict[str, int],
                 dev: int = 5, test: int = 5, seed: int = 0) -> pathlib.Path:
  """Writes a built-corpus directory (``train/dev/test/<lang>.tsv``).

  Args:
    root: output directory.
    sizes: language code -> number of training pairs.
    dev: dev pairs per language.
    test: test pairs per language.
    seed: sentence choice.

  Returns:
    ``root``.
  """
  total = max(sizes.values()) + dev + test
  sentences = english_sentences(total, seed=seed, max_words=12)
  locale_of = {"zh_Hans": "zh_CN", "zh_Hant": "zh_TW"}
  for lang, n in sizes.items():
    locale = locale_of.get(lang, lang)
    chunks = {"dev": sentences[:dev], "test": sentences[dev:dev + test],
              "train": sentences[dev + test:dev + test + n]}
    for name, chunk in chunks.items():
      (root / name).mkdir(parents=True, exist_ok=True)
      (root / name / f"{lang}.tsv").write_text(
          "".join(f"{s}\t{translate(s, locale)}\n" for s in chunk),
          encoding="utf-8")
  return root
